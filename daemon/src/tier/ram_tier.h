// RamTier: the newest committed checkpoints kept hot in node RAM, so a restore after a trainer
// failure copies from memory instead of reading the disk (issue 12; docs/DESIGN.md "Load").
//
// What it holds: a checkpoint's bytes stay in the daemon-owned arena extents that staged them —
// not a copy. A persisted rank's extents join its checkpoint's copy-to-be (AddRank: a
// "provisional" copy) instead of being freed; at COMMITTED the copy becomes hot (Commit): loads
// copy from it (Pin) and its row ('H' key, HotRecord) is written, so a restarted daemon finds it
// again (recovery adopts it through Insert only after every shard verified against the
// manifest). A rank whose shards were saved from registered regions (not from the arena) has no
// hot bytes: its blob is read from storage. A prefetch (ckptctl prefetch) makes a copy of blobs
// read from storage, one extent per blob (Insert).
//
// Resources, who owns them, what ends them:
//   - A hot copy (HotCopy) owns its extents (daemon-owned, taken by the Save). They are freed
//     (StagingArena::Free) when the copy is destroyed: when the tier's reference and every load's
//     pin are gone. A load pins the copy for its whole copy, and eviction only drops the tier's
//     reference, so bytes a load is copying are never reused under it.
//   - A provisional copy's extents are the tier's until Commit (then the HotCopy's) or eviction
//     or Drop (then freed at once: nothing pins a provisional copy).
//   - The 'H' row: written (unsynced) by Commit, deleted (unsynced) by eviction and Drop before
//     the tier's reference goes, so in the index's order a row never outlives the bytes' reuse.
//     A crash may still keep a row whose bytes did not survive (a segment lost with the machine);
//     recovery's verification drops it.
// Eviction (whole copies, least recently committed or loaded first):
//   - Reclaim: a reservation cannot find arena space (StagingArena calls it with no lock held):
//     committed copies first, then provisional ones — a save in flight loses its hot copy, never
//     its staging;
//   - the budget (bytes_max; 0: the arena's capacity) at AddRank, Commit and Insert;
//   - keep_per_job: a job keeps its newest keep_per_job steps hot;
//   - Drop: the checkpoint aborted, deleted, marked corrupt, or a load found a hot block that did
//     not verify (the load then reads storage).
// Threads: every method may be called from any thread at once. One lock (mu_), held for the
// tier's maps and its unsynced row writes (so rows land in the order of the decisions); extents
// are freed with it released. Lock order: callers' locks → mu_ → the index's; the arena is never
// called under mu_ (it calls Reclaim with its own lock released).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/index.pb.h"
#include "dataplane/arena.h"
#include "index/meta_store.h"

namespace ckptd {

// Blob bytes [blob_offset, blob_offset + length) of blob `blob_id` are in uid's arena segment at
// arena_offset.
struct HotRange {
  uint32_t blob_id = 0;
  uint64_t blob_offset = 0;
  uint64_t length = 0;
  uint32_t uid = 0;
  uint64_t arena_offset = 0;
};

// A daemon-owned arena extent holding hot bytes.
struct HotExtent {
  uint64_t id = 0;
  uint32_t uid = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Hot bytes handed to the tier: the ranges and the extents that hold them.
struct HotParts {
  std::vector<HotRange> ranges;
  std::vector<HotExtent> extents;
};

// One checkpoint's hot bytes; immutable. Frees its extents when destroyed.
class HotCopy {
 public:
  HotCopy(StagingArena* arena, std::vector<HotRange> ranges, std::vector<HotExtent> extents);
  ~HotCopy();
  HotCopy(const HotCopy&) = delete;
  HotCopy& operator=(const HotCopy&) = delete;

  // Where blob bytes [offset, offset + length) of `blob` are in the daemon's memory, when they
  // lie inside one hot range; nullptr otherwise (read them from storage).
  const uint8_t* Find(uint32_t blob, uint64_t offset, uint64_t length) const;
  // The same as the range holding them (its uid's segment and offset), or nullptr.
  const HotRange* FindRange(uint32_t blob, uint64_t offset, uint64_t length) const;
  uint64_t bytes() const { return bytes_; }  // of its extents
  v1::HotRecord Record() const;

 private:
  // The index of the range holding the bytes; ranges_.size() when none does.
  size_t IndexOf(uint32_t blob, uint64_t offset, uint64_t length) const;

  StagingArena* const arena_;
  std::vector<HotRange> ranges_;    // sorted by (blob_id, blob_offset), disjoint
  std::vector<const uint8_t*> at_;  // at_[i]: where ranges_[i]'s first byte is mapped
  std::vector<HotExtent> extents_;
  uint64_t bytes_ = 0;
};

class RamTier {
 public:
  using Key = std::pair<std::string, uint64_t>;  // (job, step)
  struct Options {
    uint64_t bytes_max = 0;     // 0: the arena's capacity
    uint32_t keep_per_job = 1;  // 0: off (AddRank and Insert refuse, nothing is kept)
  };
  // Borrows the arena and the index (they outlive it).
  RamTier(Options options, StagingArena* arena, MetaStore* meta);
  ~RamTier();  // drops every copy (extents freed when no load pins them; rows kept)

  bool enabled() const { return options_.keep_per_job > 0; }
  uint64_t budget_bytes() const;

  // A persisted rank's hot bytes join `key`'s provisional copy; the tier owns `extents` from
  // here (on false it took nothing: the caller frees them, as when the tier is off or they do
  // not fit the budget even after evicting others).
  bool AddRank(const Key& key, HotParts parts) ABSL_LOCKS_EXCLUDED(mu_);
  // `key` committed: its provisional copy (if any) becomes hot and its row is written; then
  // keep_per_job and the budget apply.
  void Commit(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // A copy made outside a save (recovery's adoption, a prefetch), hot at once and kept by
  // keep_per_job before the job's other steps (a prefetch of an older step asks for that one);
  // the tier owns the extents from here (on false it took nothing). `write_row`: false when the
  // row exists.
  bool Insert(const Key& key, HotParts parts, bool write_row) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `key`'s copy (provisional or hot); its row is deleted.
  void Drop(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // The hot copy of `key`, pinned while the pointer lives; null when it is not hot.
  std::shared_ptr<const HotCopy> Pin(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes of `key`'s hot copy; nullopt when it has none (provisional copies are not hot).
  std::optional<uint64_t> HotBytes(const Key& key) const ABSL_LOCKS_EXCLUDED(mu_);
  // The arena needs `bytes` more: evicts (see the top) until at least that much was handed back
  // or nothing is left; false when nothing was evicted.
  bool Reclaim(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    uint64_t hot_bytes = 0;          // committed copies
    uint64_t provisional_bytes = 0;  // of saves in flight
    uint64_t hot_checkpoints = 0;
    uint64_t evictions = 0;
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<const HotCopy> copy;  // set once committed
    std::vector<HotRange> ranges;         // provisional
    std::vector<HotExtent> extents;       // provisional
    uint64_t bytes = 0;
    uint64_t last_use = 0;
  };
  // What an eviction hands back, dealt with once mu_ is released.
  struct Victims {
    std::vector<std::shared_ptr<const HotCopy>> copies;
    std::vector<uint64_t> extent_ids;
  };
  void EvictLocked(std::map<Key, Entry>::iterator it, Victims* v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the least recently used entries other than `keep` until `bytes_` + `incoming` fits
  // the budget; false when it cannot.
  bool MakeRoomLocked(uint64_t incoming, const Key* keep, Victims* v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // keep_per_job for `job`: its newest hot steps stay (`keep`, if not null, counted first).
  void TrimJobLocked(const std::string& job, const Key* keep, Victims* v)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteRowLocked(const Key& key, const HotCopy& copy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(Victims v);

  const Options options_;
  StagingArena* const arena_;
  MetaStore* const meta_;
  mutable absl::Mutex mu_;
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd
