// StagingArena: the daemon's staging memory — staging_bytes_max carved into 4 KiB-aligned
// extents. Clients map it and copy each shard straight into an extent they reserved (the one
// copy); the daemon writes blobs from it with O_DIRECT and never copies an extent.
//
// One segment per uid (docs/DESIGN.md invariant 6: a client reaches only staging memory of its own
// uid). The arena is one offset space and one allocator, but the bytes of an extent live in the
// segment of the uid that reserved it: a segment is a named shared-memory object of the full
// size, mode 0600, owned by the daemon, which no client can open by name; a client receives the
// descriptor of its own uid's segment over the daemon's arena socket (SCM_RIGHTS, rpc/
// arena_fd_server.h), so another uid's staged bytes are not in any memory it can map. Named
// (not memfds) so that a restarted daemon finds them again and resumes what was staged.
//
// Physical memory stays within staging_bytes_max: every offset range is populated in at most
// one segment ("resident" there). A reservation makes its range resident in its uid's segment:
// the pages are punched out of the segment that held them before (they were free, no extent
// there) and faulted into the new one (MADV_POPULATE_WRITE, which also zeroes them: fallocate
// would allocate them 3x faster but leave the zeroing to the client's first write, inside its
// save's stall), so a full /dev/shm is an error here, never a SIGBUS in a client's copy. With one
// training uid (the usual node) the whole arena
// becomes resident in its segment when that segment is created — what pre-faulting at start
// did — and no reservation pays for faults again. A client may fault pages into free ranges of
// its own segment by writing there; those are its own (charged to its memory cgroup), are
// punched when the range goes to another uid, and never hold another uid's bytes.
//
// Segment lifecycle: created (journaled through the SegmentJournalFn, synced, before any client
// learns of it) when its uid first asks for it (the arena socket) or reserves, or adopted at
// start when it is exactly what a previous run of this daemon created (a regular file owned by the
// daemon's euid, mode 0600, the size, and the generation and uid in its header page); never
// destroyed while the daemon runs; unlinked at a clean stop with nothing staged. At most
// limits::kArenaSegmentsMax segments (uids).
//
// Extent lifecycle (who owns it, what ends it):
//   Reserve → owned by a session, until Release by that session or the session's end (a
//   reservation never expires behind the client's back: client.h promises an Allocate()d buffer
//   stays valid while it exists);
//   Take (a Save) → owned by the daemon, until Free after persist or abort.
// Leases: an operation that reads or writes a reserved extent for its client (a Load into it)
// holds an ExtentLease for the whole operation. Release or session end of a leased extent only
// detaches it from the session; its bytes go back to the free list when the last lease is
// dropped, so they are never re-issued to another client while the daemon still writes them.
// Take refuses a leased extent.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd {

struct ExtentInfo {
  uint64_t id = 0;
  uint64_t offset = 0;  // into the segment, 4 KiB aligned
  uint64_t length = 0;  // multiple of 4 KiB
  uint32_t uid = 0;     // whose segment holds its bytes
  std::string session;  // reserving session; empty once the daemon owns it or it was released
  bool daemon_owned = false;
  uint32_t leases = 0;    // operations using it now (ExtentLease)
  bool released = false;  // released while leased: freed when the last lease goes
  // Counted in its uid's share (ArenaOptions::uid_share_percent): reserved or staged, until it
  // is freed or passes to the RAM tier (Uncharge).
  bool charged = false;
};

// One uid's segment, as the journal records it and the operator sees it.
struct ArenaSegmentInfo {
  uint32_t uid = 0;
  std::string name;        // shm_open() name
  std::string generation;  // random, 32 hex characters, in the segment's header page
  bool adopted = false;    // created by a previous run of this daemon
};

// What a client gets to map its uid's segment: the descriptor (borrowed from the arena), the
// segment's name and generation, and whether every page is resident (map with MAP_POPULATE).
struct ArenaGrant {
  int fd = -1;
  std::string name;
  std::string generation;
  bool resident = false;
};

struct ArenaOptions {
  // Segment names are name_prefix + "arena-u<uid>-<16 random hex>", e.g. "/ckptd-1a2b3c4d-".
  std::string name_prefix;
  uint64_t size_bytes = 0;   // of the offset space (and each segment), header page included
  bool prefault = true;      // fault pages in when a range becomes resident (else at first touch)
  bool mlock_pages = false;  // lock resident pages (MLOCK_ONFAULT)
  // The daemon's state dir (absolute), recorded in each segment's header page: a segment whose
  // state dir is gone belongs to no daemon any more (RemoveAbandonedSegments).
  std::string state_dir;
  // One uid's share of the arena (docs/SECURITY.md "Per-uid shares"): the percentage of the
  // capacity its charged extents (reserved, or staged and not yet persisted) may hold. A
  // reservation past it waits for the uid's own bytes to go, then RESOURCE_EXHAUSTED naming
  // uid_arena_share_percent and the uid; other uids' reservations never wait for it. 100: off.
  uint32_t uid_share_percent = 100;
};

// Removes every arena segment in /dev/shm owned by this euid whose header names a state dir that
// no longer exists (a daemon stopped with hot checkpoints kept its segments for its next start,
// and then its state dir was deleted). Returns how many were removed; logs each.
size_t RemoveAbandonedSegments();

class StagingArena;

// A hold on one reserved extent for the duration of an operation. Dropping the last copy ends
// it (and frees the extent if it was released meanwhile). Must not outlive the arena.
using ExtentLease = std::shared_ptr<const ExtentInfo>;

// OK when [offset, offset + length) lies inside extent `e`; else OUT_OF_RANGE "<what>: bytes [..)
// are outside extent <id> (<n> bytes)". The one bounds check of client-named extent bytes.
absl::Status CheckInExtent(const ExtentInfo& e, uint64_t offset, uint64_t length,
                           const std::string& what);

class StagingArena {
 public:
  // Makes a new segment durable before it is used (the daemon journals name and generation with
  // a synced index write); an error fails the segment's creation and removes it.
  using SegmentJournalFn = std::function<absl::Status(const ArenaSegmentInfo&)>;

  // An arena with no segments yet. INVALID_ARGUMENT for a size that is not a multiple of 4 KiB
  // or leaves no room after the header page.
  static absl::StatusOr<std::unique_ptr<StagingArena>> Create(ArenaOptions options,
                                                              SegmentJournalFn journal);
  ~StagingArena();  // unmaps and closes; does not unlink (staged data survives a restart)

  // Start-up, before any client: adopts the segment a previous run created for `uid`, only if it
  // is exactly what that run created (see the header comment); FAILED_PRECONDITION otherwise
  // (never adopted, never touched), NOT_FOUND when it is gone, ALREADY_EXISTS when `uid` has one.
  absl::Status Adopt(uint32_t uid, const std::string& name, const std::string& generation);

  // The segment of `uid`, created on first use (O_EXCL under a random name; journaled). When it
  // is the arena's first segment (and prefault is set), the free arena is made resident in it by
  // a background thread, chunk by chunk (seconds per GiB on a cold tmpfs: not in a Hello).
  // RESOURCE_EXHAUSTED when /dev/shm cannot hold it or kArenaSegmentsMax uids have one; INTERNAL
  // for other syscalls.
  // Damage: a process of `uid` holds the segment's descriptor and may truncate (or grow) it. Each
  // call checks the segment's size first (one fstat); a segment that is not its size any more is
  // retired — its name unlinked, kept mapped (staged bytes still in it are read under the memory
  // guard, so their flush fails cleanly and their checkpoint aborts), no longer handed out or
  // reserved from — and a new segment (a new generation) is created for the uid's new sessions.
  // Sessions handed the retired one are refused by the service (SessionArenaStatus). At most
  // limits::kArenaSegmentRetiresMax retirements per uid: past it, RESOURCE_EXHAUSTED until the
  // daemon restarts.
  absl::StatusOr<ArenaSegmentInfo> Segment(uint32_t uid);
  // `uid`'s segment if it has one (nothing is created).
  std::optional<ArenaSegmentInfo> ExistingSegment(uint32_t uid) const;
  // The open descriptor of `uid`'s segment, to hand to a client of that uid (SCM_RIGHTS).
  // Borrowed: valid while the arena lives. NOT_FOUND when `uid` has no segment.
  absl::StatusOr<int> SegmentFd(uint32_t uid) const;
  std::vector<ArenaSegmentInfo> segments() const;
  // Whether (dev, ino) is one of the arena's segments (so it is refused as a client region).
  bool IsSegment(uint64_t dev, uint64_t ino) const;
  // The segment with `generation`; nullopt when none (e.g. the bytes staged there did not
  // survive a restart).
  std::optional<ArenaSegmentInfo> SegmentOfGeneration(const std::string& generation) const;
  // Whether `uid`'s segment holds the pages of the whole arena (so mapping it with MAP_POPULATE
  // allocates nothing).
  bool FullyResident(uint32_t uid) const;
  // The generation of `uid`'s segment ("" when it has none).
  std::string Generation(uint32_t uid) const;
  // Where the bytes at `offset` of the segment with `generation` are mapped in the daemon, a
  // retired segment included (its bytes may be gone: callers read it under the memory guard);
  // nullptr when no segment has that generation.
  uint8_t* AtGeneration(const std::string& generation, uint64_t offset) const;
  // Whether the segment with `generation` was retired (see Segment()).
  bool Retired(const std::string& generation) const;

  // Where the bytes at `offset` of `uid`'s segment are mapped in the daemon (for the daemon's
  // life: a segment is never unmapped or moved while it runs). The segment must
  // exist (CHECKed: callers name only extents and journaled offsets of existing segments).
  uint8_t* At(uint32_t uid, uint64_t offset) const;
  uint8_t* Data(const ExtentInfo& e) const { return At(e.uid, e.offset); }

  uint64_t size_bytes() const { return options_.size_bytes; }
  uint64_t capacity_bytes() const;  // bytes extents can use
  uint64_t free_bytes() const;
  // Reservations that had to wait for space since start (done or timed out), and their waits;
  // and the reservations waiting right now, by the budget that holds them back: the arena's bytes
  // (every range is reserved, staged and not yet persisted, or hot and pinned by a load) or the
  // uid's share (uid_arena_share_percent). A wait is never silent: it is counted here (the
  // ckptd_reserve_waiting metric), logged once when it starts naming the budget and what holds
  // it, and a timeout's RESOURCE_EXHAUSTED names both.
  struct ReserveWaits {
    uint64_t count = 0;
    double seconds = 0;
    uint64_t waiting_arena_bytes = 0;  // reservations waiting now for the arena's bytes
    uint64_t waiting_uid_share = 0;    // ... for their uid's share
    uint64_t waiting_bytes = 0;        // the bytes they ask, together
  };
  ReserveWaits reserve_waits() const;
  // Bytes the first segment's background faulting (Segment()) has still to fault in; 0 once it is
  // done or when none runs. A reservation of a range it has not reached faults it itself.
  uint64_t prefault_left_bytes() const;
  // What holds the arena's bytes now, for a reservation's wait and its error: "<r> reserved by
  // clients, <s> staged and not yet persisted (the flush queue), <h> kept by the RAM tier".
  std::string HoldersText() const;

  // Reserves one extent per size (rounded up to 4 KiB), all or none, for `session` of `uid`, in
  // `uid`'s segment (created if needed) and resident there. Waits up to `timeout` for space; then
  // RESOURCE_EXHAUSTED stating the bytes asked and free. A request that could never fit fails at
  // once. INVALID_ARGUMENT for a zero size; RESOURCE_EXHAUSTED when /dev/shm cannot hold the pages.
  absl::StatusOr<std::vector<ExtentInfo>> Reserve(const std::string& session, uint32_t uid,
                                                  std::span<const uint64_t> sizes,
                                                  absl::Duration timeout);
  // The extent `id` if `session` reserved it (and it is not yet taken). NOT_FOUND otherwise,
  // naming the id.
  absl::StatusOr<ExtentInfo> Lookup(const std::string& session, uint64_t id) const;
  // Leases extent `id` of `session` for one operation (see the header comment). NOT_FOUND as
  // Lookup.
  absl::StatusOr<ExtentLease> Lease(const std::string& session, uint64_t id);
  // Transfers ownership of reserved extents to the daemon (a Save). All or none. NOT_FOUND for
  // an id not reserved by `session`, INVALID_ARGUMENT for an id named twice, FAILED_PRECONDITION
  // for an extent a load is writing right now.
  absl::Status Take(const std::string& session, std::span<const uint64_t> ids);
  // Frees daemon-owned extents (after persist or abort).
  void Free(std::span<const uint64_t> ids);
  // Daemon-owned extents that passed to the RAM tier (reclaimable by any reservation): no longer
  // counted in their uid's share. Unknown ids are skipped.
  void Uncharge(std::span<const uint64_t> ids);
  // Bytes `uid`'s charged extents hold, and the most they may (its share).
  uint64_t charged_bytes(uint32_t uid) const;
  uint64_t uid_share_bytes() const;
  // Client release of its own reserved extents, all or none. NOT_FOUND names the first unknown
  // id, INVALID_ARGUMENT an id named twice. Leased extents are freed when their lease ends.
  absl::Status Release(const std::string& session, std::span<const uint64_t> ids);
  // Releases every extent still reserved by `session` (its end), as Release does.
  void ReleaseSession(const std::string& session);
  // Extents reserved by sessions (not yet taken by a Save), and how many of those are leased.
  size_t reserved_count() const;
  // Recovery: marks [offset, offset+length) of `uid`'s (adopted) segment as a daemon-owned
  // extent with id `id`. DATA_LOSS when it does not fit or overlaps another.
  absl::Status Restore(uint64_t id, uint32_t uid, uint64_t offset, uint64_t length);
  // Removes every segment's name (clean shutdown with nothing staged).
  void Unlink();
  // Called (with no arena lock held) when a reservation finds no space, before it waits: asked
  // for `bytes`, it may free daemon-owned extents it holds (the RAM tier's eviction) and returns
  // whether it freed any (the reservation then tries again at once). Set before serving.
  using ReclaimFn = std::function<bool(uint64_t bytes)>;
  void SetReclaimer(ReclaimFn fn);
  // Daemon-owned extents became reclaimable without being freed (the RAM tier took a persisted
  // rank's extents): wakes the reservations waiting for space, so they ask the reclaimer again
  // instead of sleeping until their deadline.
  void WakeReservations();

 private:
  struct Seg;
  // Who holds the pages of an offset range: a uid, nobody, or unknown (after a restart).
  static constexpr uint32_t kNobody = UINT32_MAX;
  static constexpr uint32_t kAnyone = UINT32_MAX - 1;
  struct Span {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t holder = kNobody;  // before the claim
  };

  explicit StagingArena(ArenaOptions options, SegmentJournalFn journal);
  absl::StatusOr<std::unique_ptr<Seg>> NewSegment(uint32_t uid);
  // The uid's segment in use (never a retired one), or null.
  Seg* Find(uint32_t uid) const;
  // Segment()'s damage check: OK, or why `s` must be retired.
  absl::Status CheckIntact(const Seg& s) const;
  // Retires `s` (create_mu_ held): marks it, unlinks its name, forgets which ranges its uid held.
  void RetireLocked(Seg* s, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(create_mu_);
  std::optional<uint64_t> AllocateLocked(uint64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserve's allocation: all or none, waiting (mu_ released meanwhile) up to `timeout`.
  absl::StatusOr<std::vector<ExtentInfo>> AllocateAllLocked(const std::string& session,
                                                            uint32_t uid,
                                                            std::span<const uint64_t> sizes,
                                                            uint64_t total, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that `uid` holds [offset, offset+length); returns the parts another holder had.
  std::vector<Span> ClaimLocked(uint64_t offset, uint64_t length, uint32_t uid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Punches `spans` out of the segments that held them and faults them into `uid`'s.
  absl::Status MakeResident(uint32_t uid, const std::vector<Span>& spans);
  // MakeResident's second half: punches `spans` out of `others` and faults them into `mine`.
  absl::Status FaultSpans(Seg* mine, const std::vector<Seg*>& others,
                          const std::vector<Span>& spans);
  // The first segment's background faulting (see Segment()). It pauses while a reservation faults
  // a range in itself (reservations_faulting_), which would otherwise share the CPU with it.
  void PrefaultLoop(uint32_t uid);
  // Detaches a reserved extent from its session: freed now, or when its last lease ends.
  void ReleaseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(uint64_t id);
  // INVALID_ARGUMENT when an id appears twice.
  static absl::Status CheckDistinct(std::span<const uint64_t> ids, const char* what);
  void FreeRangeLocked(uint64_t offset, uint64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees extent `it` (its range and its charge) and forgets it.
  void EraseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnchargeLocked(ExtentInfo& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t LargestFreeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string HoldersTextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AllocateAllLocked's wait for `budget` (kArenaBytes or kUidShare): counted in waiting_*, logged
  // when it starts; true when the deadline passed.
  enum class Budget { kNone, kArenaBytes, kUidShare };
  bool WaitForSpaceLocked(Budget budget, Budget* waiting, uint32_t uid, uint64_t total,
                          absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ArenaOptions options_;
  const SegmentJournalFn journal_;

  // Segments: created one at a time (create_mu_ is held across the synced journal write and the
  // first segment's faulting, and taken by nothing else); segs_ is only appended to.
  absl::Mutex create_mu_;
  mutable absl::Mutex seg_mu_;
  std::vector<std::unique_ptr<Seg>> segs_ ABSL_GUARDED_BY(seg_mu_);
  // Retirements per uid (Segment(): damaged segments).
  absl::flat_hash_map<uint32_t, uint32_t> retired_ ABSL_GUARDED_BY(create_mu_);

  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset → length, coalesced
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserve_waits_ ABSL_GUARDED_BY(mu_) = 0;
  double reserve_wait_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waiting_arena_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waiting_share_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t waiting_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // offset → (length, holder): which segment holds the pages of each range, coalesced.
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> resident_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, ExtentInfo> extents_ ABSL_GUARDED_BY(mu_);
  ReclaimFn reclaimer_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint32_t, uint64_t> charged_ ABSL_GUARDED_BY(mu_);  // uid → bytes

  // Background faulting of the first segment: the chunk being faulted now (claimed for
  // prefault_uid_, still free in the allocator). Another uid's claim of it waits until it is
  // done, so its punch never races the faulting; the destructor stops and joins the thread.
  std::thread prefault_thread_;
  std::atomic<bool> stop_prefault_{false};
  uint32_t prefault_uid_ ABSL_GUARDED_BY(mu_) = kNobody;
  uint64_t inflight_offset_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t inflight_length_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t reservations_faulting_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar inflight_done_;
};

// Extent ids of different daemon instances never collide: each instance starts at a random base.
uint64_t RandomExtentIdBase();
// 16 random bytes as 32 hex characters.
std::string RandomHexId();

}  // namespace ckptd
