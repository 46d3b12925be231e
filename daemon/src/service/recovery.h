// Recovery: the daemon's start, before it serves (docs/DESIGN.md "Recovery"). The manifest on
// storage is the truth; the index is the node's journal. Run() makes them agree, in this order
// (each step a named sync point, so the crash matrix can stop the daemon between any two):
//   1. RepairIndexRows: a checkpoint row that does not parse is rebuilt from its manifest when
//      that verifies, recorded CORRUPT when a manifest is there but does not verify, else ABORTED
//      (its partial files collected); job rows and keys that do not decode are reported;
//   2. FinishDeletes: rows left DELETING (a crashed Delete's tombstone) are deleted to the end;
//   3. AdoptManifests: every verified manifest whose row is not COMMITTED is indexed COMMITTED (a
//      crash between the manifest rename and the row, or a directory copied in from elsewhere);
//      then, with a remote tier, every verified manifest on the store of a checkpoint this node
//      has no row of is indexed COMMITTED on the remote tier alone (a store that cannot be listed
//      is a reported problem, not a failed start);
//   4. ResumePending: STAGING/PERSISTING rows resume from the arena when it is the one they were
//      staged into (same generation: their extents are restored and their flushes posted), else
//      they are ABORTED and their files removed; interrupted reshards are ABORTED (their source
//      is intact); ABORTED rows' leftover files are collected;
//   5. CheckCommittedRows: COMMITTED rows whose manifest is gone are kept COMMITTED on the
//      remote tier alone when it holds a durable copy, else marked MISSING with their files and
//      rows kept (never ABORTED: removing data is an operator's decision; a MISSING row whose
//      manifest is put back is adopted COMMITTED again by step 3 of the next start); local
//      files of a checkpoint read from the remote tier alone are removed (a spanning node
//      stopped before removing its blobs);
//   6. VerifyNewestCommitted: per job the newest COMMITTED manifest is verified; one that does not
//      verify is recorded CORRUPT and the next older one is verified, so `latest` always loads;
//   7. AdoptHotCopies: each RAM tier row ('H') whose bytes are still in the arena's segments (same
//      generation) and verify against the manifest is hot again; any other row is removed (its
//      checkpoint is read from storage).
// What it cannot use it skips, names (path or index key) in the log and counts in one summary
// line; only a failing index, or a data dir whose root cannot be listed, stops the start.
//
// Ownership: a short-lived object on the start-up thread (CheckpointService::Recover). It sees the
// daemon only through RecoveryHost: the stores it reads and repairs, and the service's operations
// on the catalog and the lifecycle, which fill the lifecycle's state (pending checkpoints, the
// committer, the manifest cache) by the service's own rules. It owns only its list of problems.
// Threads: the start-up thread only, before the service serves and before housekeeping starts:
// nothing races it but the flushes of checkpoints it resumed (RecoveryHost::Resume takes the
// lifecycle lock).
// Errors (Run): the index's errors and a data dir whose root cannot be listed; everything else is
// a reported problem, not an error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/storage.h"
#include "ckptd/v1/index.pb.h"
#include "dataplane/arena.h"
#include "format/manifest.h"
#include "index/meta_store.h"
#include "service/checkpoints.h"
#include "service/pending_checkpoint.h"

namespace ckptd {

// What recovery may use of the daemon. CheckpointService implements it (recover.cc) by
// forwarding to its own operations; each behaves as the service's method of that name.
class RecoveryHost {
 public:
  // The stores recovery reads and repairs (borrowed; they outlive it).
  struct Stores {
    MetaStore* meta = nullptr;
    Storage* storage = nullptr;  // the local tier
    Storage* remote = nullptr;   // the remote tier; null: this daemon has none
    StagingArena* arena = nullptr;
    uint32_t checksum_block_bytes = 0;  // the daemon's default block size
  };
  virtual ~RecoveryHost() = default;
  virtual Stores stores() const = 0;

  // The catalog. A synced write of the checkpoint's row.
  virtual absl::Status PutRecordSync(const v1::CheckpointRecord& rec) = 0;
  // Records a durable manifest COMMITTED (rows, journal removed, upload row), synced, after
  // adopting the owner it records (CheckpointService::AdoptOwner): PERMISSION_DENIED, nothing
  // recorded, when that owner maps to no uid here or the job here is another uid's.
  virtual absl::Status IndexCommitted(const Manifest& m, const std::string& dir,
                                      CommittedTiers tiers) = 0;
  // The row of (job, step) in any state; DATA_LOSS when it does not parse.
  virtual absl::StatusOr<std::optional<v1::CheckpointRecord>> ReadRecord(const std::string& job,
                                                                         uint64_t step) = 0;
  virtual absl::StatusOr<std::optional<uint32_t>> JobOwner(const std::string& job) = 0;
  // The tiers a COMMITTED checkpoint is read from, fastest first.
  virtual absl::StatusOr<std::vector<Storage*>> ReadTiers(const v1::CheckpointRecord& rec) = 0;
  // The verified manifest (kept in the manifest cache); DATA_LOSS marks the checkpoint CORRUPT.
  virtual absl::StatusOr<std::shared_ptr<const Manifest>> GetManifest(const std::string& job,
                                                                      uint64_t step) = 0;
  // Finishes a delete (idempotent steps; the row is DELETING).
  virtual absl::Status RemoveCheckpoint(const std::string& job, uint64_t step,
                                        v1::CheckpointRecord rec) = 0;
  // Adopts the remote tier's checkpoints this node has no row of (only with a remote tier).
  virtual absl::Status ScanStore(const std::string& scope,
                                 const std::function<void(std::string)>& problem) = 0;

  // The lifecycle: enters a checkpoint rebuilt from its journal (its key is free), posts the
  // flushes of its ranks not persisted and starts its commit when it is complete.
  virtual void Resume(std::unique_ptr<PendingCheckpoint> p) = 0;
  // The RAM tier: adopts the hot copy `rec` describes, verified (CheckpointService::AdoptHot).
  virtual absl::Status AdoptHot(const std::string& job, uint64_t step,
                                const v1::HotRecord& rec) = 0;
};

class Recovery {
 public:
  explicit Recovery(RecoveryHost& host) : host_(host), stores_(host.stores()) {}
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // Steps 1..6 above, then the summary line.
  absl::Status Run();

 private:
  absl::Status RepairIndexRows();
  absl::Status FinishDeletes();
  // From local storage (the remote tier's are RecoveryHost::ScanStore's: only checkpoints this
  // node has no row of, recorded on the remote tier alone, as while it runs).
  absl::Status AdoptManifests();
  // AdoptManifests for one checkpoint dir: its manifest, when it verifies and the checkpoint's
  // row is neither COMMITTED nor DELETING, indexed COMMITTED (a manifest of a part committed at
  // the peer tier excepted). What cannot be read is a Problem, skipped; errors are the index's.
  absl::Status AdoptManifest(const std::string& job, uint64_t step);
  // AdoptManifest's answer to a manifest that does not verify (`why`): a MISSING row becomes
  // CORRUPT (files kept), a CORRUPT one stays so; any other is a Problem, never exposed.
  absl::Status ManifestNotVerified(const std::string& job, uint64_t step,
                                   const std::optional<v1::CheckpointRecord>& rec,
                                   const absl::Status& why);
  absl::Status ResumePending();
  // Rebuilds one journaled checkpoint from its rows and enters it into the lifecycle.
  absl::Status ResumeOne(const v1::CheckpointRecord& rec, const std::vector<v1::RankRecord>& ranks);
  // ResumeOne's first phase: the checkpoint its summary describes, with no rank yet;
  // FAILED_PRECONDITION when it needs a tier this daemon no longer has.
  absl::StatusOr<std::unique_ptr<PendingCheckpoint>> ResumedCheckpoint(
      const v1::CheckpointSummary& s);
  // ResumeOne's second phase, per rank: its extents restored from the adopted arena segment
  // (unless persisted) and the rank entered into `p`; DATA_LOSS when its staged bytes are gone.
  absl::Status ResumeRank(const v1::RankRecord& rr, PendingCheckpoint* p);
  // Records `rec` ABORTED with `reason` (files removed first, then the row, then its journal).
  void AbortRecovered(const v1::CheckpointRecord& rec, const std::string& reason);
  absl::Status CheckCommittedRows();
  // CheckCommittedRows for one row, by where the checkpoint is committed: at the peer tier
  // (CheckPeerTierPart), on the remote tier alone (RemoveLocalLeftovers), or with a local copy
  // whose manifest, when gone, is restored from the store (RestoreFromStore) or marked MISSING.
  absl::Status CheckCommittedRow(v1::CheckpointRecord& rec);
  absl::Status CheckPeerTierPart(v1::CheckpointRecord& rec);
  void RemoveLocalLeftovers(const v1::CheckpointRecord& rec);
  // Whether the store's complete copy of `rec` is now indexed COMMITTED in its place.
  bool RestoreFromStore(const v1::CheckpointRecord& rec, const std::string& path);
  absl::Status MarkMissing(v1::CheckpointRecord& rec, const std::string& path);
  absl::Status VerifyNewestCommitted();
  absl::Status AdoptHotCopies();
  // Logs one entry recovery could not use (naming its path or index key) and keeps it for the
  // summary.
  void Problem(std::string what);

  RecoveryHost& host_;
  const RecoveryHost::Stores stores_;
  std::vector<std::string> problems_;
};

}  // namespace ckptd
