// CheckpointService: the daemon core as plain C++ over the generated API messages (testable
// without gRPC; daemon/src/rpc adapts it). One instance per daemon. It composes parts, each with
// its own lock; no lock another call waits on is held across an fsync, a synced index write, a
// directory removal, an index read or housekeeping's loop:
//
//   part                    lock                      owns
//   sessions (sessions.h)   SessionTable::mu_         sessions, their uids and Attach streams
//   lifecycle (this file,   mu_ ("lifecycle lock")    pending_ (PendingCheckpoint: one object per
//     pending_checkpoint.h)                           checkpoint being saved, phase enum with
//                                                     checked transitions), rewriting_, reshards_,
//                                                     abort retries, key epochs; changed_ signals
//   committer (committer.h) Committer::mu_ (queue     every synced index write, group-committed;
//                           only, never across I/O)   the write runs with no lock held
//   manifest cache          ManifestCache::mu_        verified manifests (catalog reads)
//     (manifest_cache.h)
//   loader (loader.h)       Loader::load_buffers_mu_  reusable read buffers; a load's reads,
//                           (taking/returning only)   checks and copies run with no lock held
//   the arena, regions      their own locks           staging memory, client regions
//   resharder (resharder.h) none (atomics per job)    the reshard pool; writes a reshard's blobs
//   RAM tier (ram_tier.h)   RamTier::mu_              hot checkpoints: the extents that staged
//                                                     them, kept after commit for restores
//   recovery (recovery.h)   none (start-up only)      sees the service through RecoveryHost
//
// Lock order: mu_ → (SessionTable::mu_, ManifestCache::mu_, Committer::mu_, the arena's and the
// region registry's locks); none of those calls back into the service. Index reads and synced
// writes happen with mu_ released: JournalUnlocked and ReadRowLocked drop it around the I/O and
// re-check what they need once it is held again (see ReadRowLocked's key epochs).
//
// Ownership: borrows every dependency in ServiceDeps (they outlive it).
// Threads: every public method may be called from any thread, concurrently. Methods that wait
// (Wait, Abort, ReserveExtents on a full arena) block the calling thread; the RPC layer runs them
// on its bounded waiter pool. Flushes, commits and abort records run on deps.flush_pool; loads,
// catalog calls and journal writes on the caller; housekeeping on its own thread; reshards on the
// reshard pool. GetStatus, Wait and ListCheckpoints take mu_ only briefly (no I/O under it), so
// they never queue behind a journal fsync.
//
// The save path (docs/DESIGN.md "Save", "Commit", "Durable"):
//   Save → validate → take the extents → journal the RankRecord (synced, committer) → answer
//   "staged" → flush the rank's blob from the arena (O_DIRECT) → fdatasync → journal "persisted"
//   (committer) → free the extents → once every rank is persisted: validate coverage, write the
//   manifest durably, record COMMITTED (synced, committer).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/storage.h"
#include "ckptd/v1/ckptd.pb.h"
#include "ckptd/v1/index.pb.h"
#include "common/align.h"
#include "common/clock.h"
#include "common/executor.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/single_flight.h"
#include "common/worker_pool.h"
#include "dataplane/arena.h"
#include "dataplane/gpu_staging.h"
#include "dataplane/region_registry.h"
#include "format/load_plan.h"
#include "format/manifest.h"
#include "index/committer.h"
#include "index/meta_store.h"
#include "metrics/metrics.h"
#include "options.h"
#include "service/checkpoints.h"
#include "service/hot_leases.h"
#include "service/loader.h"
#include "service/manifest_cache.h"
#include "service/pending_checkpoint.h"
#include "service/resharder.h"
#include "service/sessions.h"
#include "service/store_discovery.h"
#include "tier/local_tier.h"
#include "tier/peer_tier.h"
#include "tier/ram_tier.h"
#include "tier/remote_tier.h"
#include "tier/retention.h"

namespace ckptd {

struct ServiceDeps {
  const DaemonOptions* options = nullptr;
  MetaStore* meta = nullptr;
  Storage* storage = nullptr;
  StagingArena* arena = nullptr;
  RegionRegistry* regions = nullptr;
  Executor* flush_pool = nullptr;
  // The remote tier (tier/remote_tier.h); null when the daemon has none.
  Storage* remote = nullptr;
  // Copies between clients' GPU memory (CUDA IPC regions) and host memory; null: no GPU support
  // (a Save naming a gpu_source is then FAILED_PRECONDITION).
  GpuStaging* gpu = nullptr;
  // The time of housekeeping decisions (stage timeouts, the flush gate, unattached sessions) and
  // of recorded timestamps; see common/clock.h for what stays on real time. Default: the real
  // clock.
  const Clock* clock = RealClock();
  // The local tier as loads read it (load_io = buffered: through the page cache); null: storage.
  Storage* load_storage = nullptr;
  // Where events are counted for the metrics endpoint (metrics/metrics.h); null: not counted.
  Metrics* metrics = nullptr;
  // The peer tier (tier/peer_tier.h: replication of checkpoints spanning nodes, loads from
  // peers); null: none.
  PeerTier* peers = nullptr;
};

// A checkpoint's timings as log fields: its own phases, and each rank phase's slowest.
void AddTimingFields(LogScope& fields, const v1::CheckpointTimings& t);

class CheckpointService {
 public:
  explicit CheckpointService(ServiceDeps deps);
  ~CheckpointService();

  // At start, before serving (recovery.h lists the steps): repairs rows that do not parse,
  // finishes interrupted deletes, adopts verified manifests without a COMMITTED row, resumes
  // staged checkpoints from the arena (or aborts them when the arena was lost), aborts rows
  // without a manifest and verifies each job's newest manifest (CORRUPT ones are never latest).
  // What it cannot use is skipped and reported; only a failing index stops the start.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts the housekeeping thread (stage timeouts, dead sessions, stale reservations).
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // SIGTERM's first half, run while the RPC server still answers (status, list, wait): new saves
  // are refused (UNAVAILABLE) and, up to `grace`, the work in flight reaches its tiers —
  // checkpoints whose ranks are all staged flushed and committed, this node's part of a
  // checkpoint spanning nodes published, uploads to the remote tier made durable (checkpoints
  // still short of ranks are not waited for: they stay journaled). Logs, per checkpoint that was
  // in flight, the tiers it reached. Returns what is left of `grace` (for Shutdown).
  absl::Duration Drain(absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops housekeeping and waits up to `grace` for in-flight flushes and commits. Returns true
  // when nothing is left staged (the arena may be removed). *drained says whether the flush
  // threads finished; when false they are still running and the process should exit without
  // joining them (what they were doing stays journaled and resumes at the next start).
  bool Shutdown(absl::Duration grace, bool* drained = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Every call names its Caller (sessions.h): the kernel's word on who is calling. Calls on a job
  // are allowed to its owner (the uid whose Save created it); reads, Abort and Delete also to an
  // admin caller; anyone else gets PERMISSION_DENIED naming the job and its owner.
  absl::Status Hello(const Caller& caller, const v1::HelloRequest& req, v1::HelloResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The staging arena segment of `uid` (created on first use) for its session `session`: its
  // descriptor (borrowed from the arena; rpc/arena_fd_server.h hands it over), name and
  // residency. FAILED_PRECONDITION when `session` is not a live session of `uid`;
  // RESOURCE_EXHAUSTED as StagingArena::Segment.
  absl::StatusOr<ArenaGrant> ArenaFd(uint32_t uid, const std::string& session);
  // FAILED_PRECONDITION when `session` was handed an arena segment that has since been retired
  // (a process of its uid truncated it: StagingArena::Segment): its mapping and the extents it
  // reserved are gone; a new session (reconnect) maps the new segment. OK otherwise.
  absl::Status SessionArenaStatus(const std::string& session) const;
  // Binds session `id` to the caller's Attach stream (sessions.h); EndSession ends it when the
  // stream ends.
  absl::Status Attach(const Caller& caller, const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void EndSession(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Goodbye(const Caller& caller, const v1::GoodbyeRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReserveExtents(const Caller& caller, const v1::ReserveExtentsRequest& req,
                              v1::ReserveExtentsResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseExtents(const Caller& caller, const v1::ReleaseExtentsRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RegisterRegion(const Caller& caller, const v1::RegisterRegionRequest& req,
                              v1::RegisterRegionResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UnregisterRegion(const Caller& caller, const v1::UnregisterRegionRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Save(const Caller& caller, const v1::SaveRequest& req, v1::SaveResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Wait(const Caller& caller, const v1::WaitRequest& req, v1::CheckpointStatus* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Commit(const Caller& caller, const v1::CommitRequest& req,
                      v1::CheckpointStatus* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Abort(const Caller& caller, const v1::AbortRequest& req, v1::CheckpointStatus* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Load(const Caller& caller, const v1::LoadRequest& req, v1::LoadResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status ListJobs(const Caller& caller, const v1::ListJobsRequest& req,
                        v1::ListJobsResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ListCheckpoints(const Caller& caller, const v1::ListCheckpointsRequest& req,
                               v1::ListCheckpointsResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetStatus(const Caller& caller, const v1::GetStatusRequest& req,
                         v1::CheckpointStatus* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Inspect(const Caller& caller, const v1::InspectRequest& req,
                       v1::InspectResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Delete(const Caller& caller, const v1::DeleteRequest& req) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Latest(const Caller& caller, const v1::LatestRequest& req, v1::LatestResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Retention now (retention.cc; tier/retention.h has the rules): for `req.job` or every job
  // `caller` may delete, plans with keep_local / keep_remote and executes each step (unless
  // dry_run): "delete" as Delete does, "drop local" / "drop remote" by removing that tier's copy
  // (files first, then the row), each with the key claimed in rewriting_. A step that fails is
  // reported in its action's error; the others still run.
  absl::Status CollectGarbage(const Caller& caller, const v1::GcRequest& req, v1::GcResponse* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Brings a COMMITTED checkpoint into the RAM tier (prefetch.cc; the Prefetch RPC): its blobs
  // read from the fastest tier into daemon-owned extents of the job owner's segment, every shard
  // verified. FAILED_PRECONDITION when the RAM tier is off; RESOURCE_EXHAUSTED when it does not
  // fit the tier's budget or the arena.
  absl::Status Prefetch(const Caller& caller, const v1::PrefetchRequest& req,
                        v1::PrefetchResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts an offline reshard (reshard.cc); see the Reshard RPC.
  absl::Status Reshard(const Caller& caller, const v1::ReshardRequest& req,
                       v1::CheckpointStatus* resp) ABSL_LOCKS_EXCLUDED(mu_);
  // Re-reads a COMMITTED (or CORRUPT) checkpoint and checks its checksums (verify.cc; the
  // Verify RPC): each storage tier's manifest re-read and decoded, then every sampled block of
  // every shard on each tier asked for (local, remote, the RAM tier's hot copy), read in batches
  // of limits::kVerifyBatchBytes. Damage goes into *resp, not the status. The key is claimed in
  // verifying_ for the whole call (Delete and retention refuse it meanwhile); the hot copy is
  // pinned. NOT_FOUND, PERMISSION_DENIED (read access), INVALID_ARGUMENT (sample out of (0, 1]),
  // FAILED_PRECONDITION (another state; not on the tier asked for), ABORTED (being deleted).
  // Runs on the caller's thread (the RPC layer's load pool). `cancelled` (optional) is polled
  // between batches: true once the caller went away, which ends the call CANCELLED (the daemon
  // stopping ends it UNAVAILABLE).
  absl::Status Verify(const Caller& caller, const v1::VerifyRequest& req, v1::VerifyResponse* resp,
                      const std::function<bool()>& cancelled = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& instance_id() const { return instance_id_; }
  // The RAM tier's occupancy (hot and provisional bytes, evictions).
  RamTier::Stats ram_tier_stats() const { return ram_tier_.stats(); }
  // What the metrics endpoint reports as levels now (metrics/metrics.h): the arena, the RAM
  // tier, sessions, checkpoints in flight and the flush pool's queue (the caller adds its RPC
  // pools'). Takes mu_ briefly.
  Metrics::Levels MetricLevels() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Key = std::pair<std::string, uint64_t>;  // (job, step)

  // The time on deps_.clock, in Unix milliseconds.
  uint64_t NowMs() const { return deps_.clock->NowUnixMs(); }
  // Milliseconds from `unix_ms` to now on the service's clock (0 if it is not later).
  uint64_t MsAfter(uint64_t unix_ms) const {
    const uint64_t now = NowMs();
    return now > unix_ms ? now - unix_ms : 0;
  }
  // Seconds from `unix_ms` to now (0 when unset or in the future), for the metrics.
  double SecondsSince(uint64_t unix_ms) const {
    const uint64_t now = NowMs();
    return unix_ms == 0 || unix_ms > now ? 0.0 : static_cast<double>(now - unix_ms) / 1000.0;
  }
  // save.cc (AbortLocked, FinishAbortLocked, RecordAbort: abort.cc)
  // `id` if it is a live session of `caller` (SessionTable::Check).
  absl::StatusOr<std::string> SessionOf(const Caller& caller, const std::string& id) const;
  absl::Status ValidateSave(const v1::SaveRequest& req) const;
  // The checkpoint `req` stages into: the one being saved (no index read: the hot path of every
  // rank after the first), or a new one, after checking that no row exists, the key is not being
  // rewritten, `caller` may write the job (its owner row is read only then) and the open limits.
  // May release mu_ to read the rows (ReadRowLocked, JobOwner).
  absl::StatusOr<PendingCheckpoint*> FindOrOpenLocked(const Caller& caller,
                                                      const v1::SaveRequest& req,
                                                      v1::TierPolicy policy)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when opening one more checkpoint of `job` would pass
  // kOpenCheckpointsPerJobMax or kOpenCheckpointsMax.
  absl::Status CheckOpenLimitsLocked(uint32_t uid, const std::string& job,
                                     const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when the index volume has less than index_reserve_bytes free.
  absl::Status CheckIndexReserve(const std::string& what) const;
  absl::Status CheckItemsLocked(const PendingCheckpoint& p, const v1::SaveRequest& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Save's phases. Before the lock: the rank's record as far as the request and the session say
  // (arena generation, blob name, the client's timings).
  PendingRank NewRank(const Caller& caller, const std::string& session,
                      const v1::SaveRequest& req) const;
  // Under the lock: whether the rank may join `p` (its owner, still staging, the same world
  // size, tier policy and local world size as earlier ranks, not staged yet).
  absl::Status CheckRankJoinsLocked(const Caller& caller, const v1::SaveRequest& req,
                                    v1::TierPolicy policy, const PendingCheckpoint& p,
                                    const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under the lock, once rank `r` is journaled: it is staged (its timings), flushes are posted if
  // the gate is open, the answer filled in.
  void RankStagedLocked(PendingCheckpoint& p, uint32_t r, absl::Time started, uint64_t bytes,
                        const v1::SaveRequest& req, const std::string& what, v1::SaveResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resolves each shard's data to an extent (recorded in `rank`) or a leased region, and copies
  // the shards with a gpu_source from GPU memory into their extents (StageFromGpu).
  absl::Status ResolveSaveData(const std::string& session, const v1::SaveRequest& req,
                               PendingRank* rank) const;
  // The device → arena copies of one Save; returns once they are complete.
  absl::Status StageFromGpu(const std::string& session, const v1::SaveRequest& req) const;
  // The index rows journaling `p` (its summary, its owner once, and `ranks`' rows).
  std::vector<MetaStore::Write> JournalWritesLocked(const PendingCheckpoint& p,
                                                    const std::vector<uint32_t>& ranks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues JournalWritesLocked(p, ranks) at the committer (so rows of p land in the order they
  // were built) and awaits the synced group write with mu_ released (LevelDB's unlock around
  // the log write); p stays valid (journals_in_flight). Held on entry and exit.
  absl::Status JournalUnlocked(PendingCheckpoint& p, const std::vector<uint32_t>& ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::CheckpointSummary SummaryLocked(const PendingCheckpoint& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its timings so far: each rank's, and all staged / all persisted once reached.
  v1::CheckpointTimings TimingsLocked(const PendingCheckpoint& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillStatusLocked(const PendingCheckpoint& p, v1::CheckpointStatus* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartCommitLocked(PendingCheckpoint& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(PendingCheckpoint& p, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Abort of a checkpoint spanning nodes: refused but on the coordinator, where it is the abort
  // decision on the shared tier (the cluster thread writes it; waited for).
  absl::Status AbortAcrossNodesLocked(PendingCheckpoint& p, const v1::AbortRequest& req,
                                      v1::CheckpointStatus* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets an aborted, idle `p` (it is gone on return): the key enters rewriting_ ("being
  // aborted") until RecordAbort, posted to the flush pool, wrote the ABORTED row outside mu_,
  // then freed the extents of its unpersisted ranks and removed its files.
  void FinishAbortLocked(PendingCheckpoint& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An abort to record: the ABORTED row and the journal rows it removes (one synced write), and
  // the arena extents the checkpoint still holds (freed once that write is durable).
  struct AbortRecord {
    Key key;
    std::vector<MetaStore::Write> writes;
    std::vector<uint64_t> extent_ids;
    uint64_t attempts = 0;  // failed writes so far
    // Spanning nodes, on the coordinator: the abort decision to write to the shared tier first
    // (a serialized ClusterDecision; empty: none to write).
    std::string cluster_decision;
    // Saved under TIER_REMOTE (on one node): its blobs are on the store, removed with it.
    bool remove_remote = false;
  };
  // Writes `a`; on failure keeps it in unrecorded_aborts_ for housekeeping to post again (the
  // key stays in rewriting_, its extents allocated).
  void RecordAbort(AbortRecord a);
  void PostFlush(const Key& key, uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts the flush of every journaled rank of `p` not yet flushing or persisted: once all its
  // ranks are staged, it is committed partial, or flush_gate_ms passed since its first staged.
  void PostGatedFlushesLocked(PendingCheckpoint& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // flush.cc: one rank's flush on a pool thread (the blob itself: flush_.WriteRankBlob), in
  // four phases: take what to write (under the lock), write and journal it, hand its staged
  // bytes to the RAM tier (no lock held), record the result (under the lock).
  void FlushRank(const Key& key, uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  // The rank's record and leases, and the tier its blob goes to; false when the checkpoint is
  // aborting (nothing to write).
  bool TakeRankForFlush(const Key& key, uint32_t rank, v1::RankRecord* rec,
                        std::vector<RegionLease>* leases, Storage** to) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the rank's blob to `to` and journals "persisted" (synced).
  absl::Status WriteAndJournalRank(const Key& key, uint32_t rank,
                                   const std::vector<RegionLease>& leases, Storage* to,
                                   v1::RankRecord* rec) ABSL_LOCKS_EXCLUDED(mu_);
  // Deltas: the previous committed checkpoint of key's job on local storage, which a rank's
  // flush may reference (tier/delta.h); none when there is none or it cannot be read.
  std::optional<DeltaBase> DeltaBaseOf(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands a persisted rank's staged bytes to the RAM tier; returns the extents it took.
  std::vector<uint64_t> HandRankToRamTier(const Key& key, const v1::RankRecord& rec)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records the flush's result `st`: the rank persisted (its extents not in `hot_ids` freed), or
  // the checkpoint aborted; then commits, or finishes the abort, when that was the last flush.
  void FinishFlushLocked(const Key& key, uint32_t rank, const absl::Status& st, bool persisted,
                         v1::RankRecord rec, const std::vector<uint64_t>& hot_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // commit.cc
  void CommitCheckpoint(Key key);
  // Writes the manifest durably, then IndexCommitted. `timings` (when given) gets manifest_us and
  // committed_ms and is recorded with the checkpoint.
  absl::Status WriteCommitted(const Manifest& m, const std::string& dir, v1::TierPolicy policy,
                              v1::CheckpointTimings* timings = nullptr);
  // Records a durable manifest in the index (COMMITTED row with `timings`, item rows, journal
  // removed, the upload row when the policy has a remote tier), synced.
  // `journaled`: further ranks whose journal rows go too (a node's ranks that a partial commit
  // across nodes left out of the manifest).
  absl::Status IndexCommitted(const Manifest& m, const std::string& dir, CommittedTiers tiers = {},
                              const std::vector<uint32_t>& journaled = {},
                              const v1::CheckpointTimings& timings = {});
  // The tiers to read a COMMITTED checkpoint from, fastest first: local when its row says so,
  // then the remote tier when its copy there is durable. FAILED_PRECONDITION when none.
  absl::StatusOr<std::vector<Storage*>> ReadTiers(const v1::CheckpointRecord& rec);
  // Where the blobs and manifest of a checkpoint saved under `policy` are written: the remote
  // tier for TIER_REMOTE (straight from the arena), else local storage.
  Storage* BlobTier(v1::TierPolicy policy) const;
  // The tier policy a Save asks for, resolved against the daemon's default; FAILED_PRECONDITION
  // for a remote tier this daemon does not have, UNIMPLEMENTED for TIER_REMOTE.
  absl::StatusOr<v1::TierPolicy> ResolveTierPolicy(const v1::SaveRequest& req) const;
  // Fills summary->tiers' remote side from the upload row (read here) and progress.
  void FillRemoteTier(v1::CheckpointSummary* summary);
  // Fills summary->tiers' RAM side (ram, ram_bytes) from the RAM tier.
  void FillRamTier(v1::CheckpointSummary* summary) const;
  // Fills summary->tiers' part_peers and peer_degraded from the peer tier's repair (this node's
  // part of a checkpoint committed at the peer tier, while it is the job's newest).
  void FillPeerCopies(v1::CheckpointSummary* summary) const;
  // The hot bytes of a persisted rank saved from `rec`: its stored shards staged in the arena
  // (not replicas, not region-backed ones) and the extents holding them.
  HotParts HotBytesOfRank(const v1::RankRecord& rec) const;
  // hot.cc. Recovery: the RAM tier copy of a COMMITTED checkpoint a previous run left in the
  // arena (its 'H' row): its extents restored from segments of the same generation, every shard
  // it holds verified against the manifest, then hot again. NOT_FOUND when its segment is gone,
  // DATA_LOSS when a byte does not verify or an extent overlaps another, FAILED_PRECONDITION when
  // the checkpoint is no longer COMMITTED (the caller removes the row).
  absl::Status AdoptHot(const std::string& job, uint64_t step, const v1::HotRecord& rec);
  // hot.cc. Reads the COMMITTED checkpoint `key` (manifest `m`, on `tiers`) into new extents of
  // its job owner's segment (`caller_uid`'s when the job has no owner row), verifies every shard
  // and makes it hot; *read: the bytes read. Callers run it through prefetches_ (one per key).
  absl::Status PrefetchInto(const Key& key, uint32_t caller_uid, const std::vector<Storage*>& tiers,
                            const Manifest& m, uint64_t* read);
  // load.cc. For a Load of `key` that is not hot: with the hint, runs (or joins) its prefetch;
  // without, joins one in flight. The hot copy then, or null; *prefetched: bytes this call's
  // prefetch read. A prefetch that fails is logged and leaves the load to storage.
  std::shared_ptr<const HotCopy> HotAfterPrefetch(const Key& key, bool hint, uint32_t caller_uid,
                                                  const std::vector<Storage*>& tiers,
                                                  const Manifest& m, uint64_t* prefetched);
  // Wait(WAIT_FOR_REMOTE) of a COMMITTED checkpoint: RemoteTier::WaitDurable with mu_ released.
  absl::Status WaitRemoteLocked(const std::string& job, uint64_t step, absl::Time deadline,
                                v1::CheckpointStatus* resp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // load.cc
  // The verified manifest of (job, step), from the cache or storage. One that does not verify
  // (DATA_LOSS) marks a COMMITTED checkpoint CORRUPT.
  // `tiers`: where to read it, when the caller already has them (ReadTiers); else the row is
  // read to find them.
  absl::StatusOr<std::shared_ptr<const Manifest>> GetManifest(
      const std::string& job, uint64_t step,
      std::optional<std::vector<Storage*>> tiers = std::nullopt);
  // catalog.cc
  enum class Access { kRead, kWrite, kDelete };
  // OK when `caller` may do `access` to `job` (see Hello's comment); OK for a job that does not
  // exist yet. PERMISSION_DENIED naming the job, its owner and the caller otherwise.
  absl::Status CheckAccess(const Caller& caller, const std::string& job, Access access);
  // The same for a job whose owner (JobOwner) is known.
  static absl::Status AccessAllowed(const Caller& caller, const std::string& job,
                                    std::optional<uint32_t> owner, Access access);
  // The owner of `job`, if it has a record.
  absl::StatusOr<std::optional<uint32_t>> JobOwner(const std::string& job);
  // owners.cc: a job's owner is claimed once, atomically (docs/SECURITY.md "Ownership").
  // The owner of `job`: its row's, or, when it has none, `uid`, recorded now (a synced JobRecord
  // write, with mu_ released) — one claim at a time per job (owner_claims_), and a row read with
  // mu_ released is read again when a claim landed meanwhile (owner_claims_done_), so two
  // callers never both see "no owner" and both claim. Held on entry and exit (may release it).
  absl::StatusOr<uint32_t> ClaimJobOwnerLocked(const std::string& job, uint32_t uid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> ClaimJobOwner(const std::string& job, uint32_t uid)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adoption (from the store, or from a manifest after the index is lost): the job of `m` gets
  // the owner `m` records, mapped to a uid here (OwnerMap::LocalUid), claimed when the job has no
  // owner yet; a manifest of an older version (no owner) keeps the job's owner, or claims it for
  // this daemon's uid. PERMISSION_DENIED (not adopted) when the owner maps to no uid here or the
  // job here belongs to another uid.
  absl::Status AdoptOwner(const Manifest& m) ABSL_LOCKS_EXCLUDED(mu_);
  // A Save under TIER_REMOTE (its blobs flushed straight to the store) that may open its
  // checkpoint: the job's owner on the store is claimed first (RemoteTier::ClaimStoreOwner), for
  // the job's owner here (the caller's uid when it has none yet).
  absl::Status ClaimStoreOwnerToOpen(const Caller& caller, const v1::SaveRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What a manifest or node part of a job owned by `uid` records (OwnerMap::Record).
  v1::Owner OwnerRecordOf(uint32_t uid) const;
  absl::StatusOr<std::optional<v1::CheckpointRecord>> GetRecord(const std::string& job,
                                                                uint64_t step);
  // The newest COMMITTED step of `job` whose manifest verifies and that survives at least
  // `durable` (Survives).
  absl::StatusOr<uint64_t> LatestCommitted(const std::string& job,
                                           v1::Durability durable = v1::DURABLE_COMMITTED);
  // The "latest" form of a call: LatestCommitted after the store's catalog of `job` was refreshed,
  // answered (an error too) only once `caller` may read the job, adopted or not.
  absl::StatusOr<uint64_t> LatestReadable(const Caller& caller, const std::string& job,
                                          v1::Durability durable = v1::DURABLE_COMMITTED);
  // (job, step), committed with manifest `m`, survives `durable` (common.proto Durability): on
  // the store whole (its upload DURABLE, or committed there; at the peer tier, every node's
  // part uploaded: NodeUploadedPath), or for DURABLE_PEER also every blob on a peer.
  absl::StatusOr<bool> Survives(const std::string& job, uint64_t step, const Manifest& m,
                                v1::Durability durable);
  // `tiers` (ReadTiers) with the peer tier's reader before the remote store, for a checkpoint
  // with a remote tier on a daemon with peers (the blobs only: manifests are not on peers).
  std::vector<Storage*> WithPeers(const v1::CheckpointRecord& rec,
                                  std::vector<Storage*> tiers) const;
  // The peer tier of a checkpoint spanning nodes, from its manifest (Tiers.peer_nodes).
  static void FillPeerTier(const v1::ManifestHeader& h, v1::Tiers* out);
  // Repair (docs/PEERS.md "Repair"): this node's part of the checkpoint `h` (committed at the
  // peer tier, in `dir`) handed to the peer tier to keep copied; at Start, the part of each
  // job's newest such checkpoint. No lock held (WatchOwnParts reads the index and manifests).
  void WatchOwnPart(const v1::ManifestHeader& h, const std::string& dir);
  void WatchOwnParts() ABSL_LOCKS_EXCLUDED(mu_);
  // A Delete: the copies this node placed on its peers of (job, step) are dropped (best effort).
  void DropPeerCopies(const std::string& job, uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutRecordSync(const v1::CheckpointRecord& rec);
  // The index row of (job, step) in any state; DATA_LOSS when it does not parse. GetRecord is
  // the same except that a CORRUPT checkpoint is DATA_LOSS naming why, so every caller that would
  // use the checkpoint (Load, Save, Reshard, Wait) stops there; the catalog shows and deletes
  // CORRUPT ones through ReadRecord.
  absl::StatusOr<std::optional<v1::CheckpointRecord>> ReadRecord(const std::string& job,
                                                                 uint64_t step);
  // Steps of `job` whose row is COMMITTED, newest first (rows that do not parse are skipped).
  absl::StatusOr<std::vector<uint64_t>> CommittedSteps(const std::string& job);
  // Row reads outside the lifecycle lock. The row of a key changes only while the key is in
  // pending_, rewriting_ or reshards_ (recovery aside, before serving), and entering or leaving
  // them bumps the key's epoch (KeyChangedLocked). So a row read with mu_ released is still the
  // row once mu_ is taken again if the key's epoch did not move meanwhile; else it is read again.
  // Epochs are per hash bucket (kKeyEpochBuckets): another key in the bucket only costs a re-read.
  void KeyChangedLocked(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReadRecord (or GetRecord: `corrupt_is_error`) of `key` with mu_ released around the read;
  // returns with mu_ held and the row current as above (the key's maps unchanged too).
  absl::StatusOr<std::optional<v1::CheckpointRecord>> ReadRowLocked(const Key& key,
                                                                    bool corrupt_is_error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION while (job, step) is being written (a save or a reshard), ABORTED while
  // another Delete or a CORRUPT marking owns it (see rewriting_) or a verify reads it
  // (verifying_).
  absl::Status CheckDeletableLocked(const Key& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The delete itself, outside mu_, with the key in rewriting_ (or from recovery): records the
  // row DELETING (synced: the tombstone), removes the manifest, then the directory, then the
  // index rows (the checkpoint row last, synced). Each step is idempotent, so a delete that
  // failed or crashed is finished by the next Delete or by recovery.
  absl::Status RemoveCheckpoint(const std::string& job, uint64_t step, v1::CheckpointRecord rec);
  // Records a COMMITTED checkpoint whose manifest does not verify as CORRUPT (synced, outside
  // mu_), with `why` as its error. Does nothing when the row is no longer COMMITTED or the key is
  // being saved, resharded, deleted or marked already.
  absl::Status MarkCorrupt(const std::string& job, uint64_t step, const absl::Status& why);

  // recovery.h: a part of its own, run once at start (Recover); it sees the service only through
  // this RecoveryHost (recover.cc), which forwards to the methods above.
  class RecoveryAccess;

  // retention.cc
  // Plans one job's retention from its rows.
  absl::StatusOr<std::vector<RetentionStep>> PlanJobRetention(const std::string& job);
  // Executes one step; its error, if any.
  absl::Status ApplyRetention(const Caller& caller, const std::string& job,
                              const RetentionStep& step) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the local copy of a checkpoint whose remote copy is durable (key claimed).
  absl::Status DropLocalCopy(const std::string& job, uint64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // cluster.cc: checkpoints spanning nodes (the top of cluster.cc has the protocol).
  // What one step of the cluster thread needs of a checkpoint, copied under mu_.
  struct ClusterWork;
  // The cluster thread ("cluster"): every cluster_poll_ms (sooner when woken), one step for each
  // checkpoint spanning nodes; until Shutdown.
  void ClusterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ClusterWork> ClusterWorkLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClusterStep(ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // ClusterStep's parts. This node's part to the shared tier; false when it is not durable yet
  // (or the checkpoint is gone): the step ends.
  bool PublishOwnPart(ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // This node's part to its peers (PeerTier::Replicate), once per checkpoint and start; the
  // nodes that took it go into the part. False (w.unpublished says why) while a part committed
  // at the peer tier (TIER_LOCAL_AND_PEER) has fewer than peer_replicas copies: tried again.
  bool ReplicateOwnPart(ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // This node's part could not be published (w.unpublished): past the stage timeout the
  // coordinator decides abort, another node (after twice it) aborts here.
  void AbortUnpublished(const ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // Follows the decision on the shared tier, if any (commit, or abort here); true when the step
  // ends here (a decision followed, or one that cannot be read yet).
  bool FollowDecision(const ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // A node that is not the coordinator: waits for the decision, aborting after twice the stage
  // timeout.
  void AwaitCoordinator(const ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // The coordinator: decides abort (asked, or a stage timeout with ranks missing) or commit once
  // every rank is in a part (or the checkpoint is partial).
  void CoordinatorStep(ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PublishPart(const ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  // Coordinator: reads the parts not read yet into p.cluster.parts; returns all of them.
  absl::StatusOr<std::map<std::string, v1::NodePart>> ReadParts(const ClusterWork& w)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Coordinator: merges `parts` and builds the manifest (validated).
  absl::StatusOr<Manifest> BuildClusterManifest(const ClusterWork& w,
                                                const std::map<std::string, v1::NodePart>& parts)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DecideCommit(ClusterWork& w, const std::map<std::string, v1::NodePart>& parts)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DecideAbort(const ClusterWork& w, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Decided commit: the store's manifest (the coordinator writes it when missing) recorded
  // COMMITTED here.
  void FinishClusterCommit(const ClusterWork& w) ABSL_LOCKS_EXCLUDED(mu_);
  void CommitFromStore(const ClusterWork& w, Manifest m) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets what `key`'s checkpoint waits for (status); false when it is gone.
  bool SetWaitingFor(const Key& key, const std::string& what) ABSL_LOCKS_EXCLUDED(mu_);
  // Spanning nodes: the ranks in the node parts read from the shared tier (coordinator).
  absl::flat_hash_set<uint32_t> NodePartRanksLocked(const PendingCheckpoint& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillNodesLocked(const PendingCheckpoint& p, v1::CheckpointStatus* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool cluster_wake_ ABSL_GUARDED_BY(mu_) = false;  // a checkpoint needs the cluster thread now
  std::thread cluster_thread_;

  // store_catalog.cc: checkpoints other daemons committed to the store (the file's top says
  // when and how). Adopts (job, step) from the store when this node has no row of it and nothing
  // holds the key: true when adopted, false when it has a row, is busy or has no manifest there;
  // DATA_LOSS when the manifest does not verify; the store's and the index's errors.
  absl::StatusOr<bool> AdoptFromStore(const std::string& job, uint64_t step)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adopts every checkpoint of `scope` (a job, or "" for every job) on the store that this node
  // has no row of; what it cannot use goes to `problem` (null: the log). Errors: listing the
  // store, the index.
  absl::Status ScanStore(const std::string& scope, const std::function<void(std::string)>& problem)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Before answering a client about `scope`: ScanStore on discovery_'s thread, waited for at
  // most store_discovery_wait_ms (a failure or timeout is logged; the caller answers from the
  // index). Nothing without a remote tier. Never with mu_ held. `force`: StoreDiscovery's.
  void RefreshFromStore(const std::string& scope, bool force = false) ABSL_LOCKS_EXCLUDED(mu_);
  // ReadRecord (GetRecord: `corrupt_is_error`), and when this node has no row of (job, step):
  // RefreshFromStore(job), then again.
  absl::StatusOr<std::optional<v1::CheckpointRecord>> ReadRecordOrAdopt(
      const std::string& job, uint64_t step, bool corrupt_is_error = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  // housekeeping.cc
  // The housekeeping thread: a pass (stage timeouts, the flush gate, abort retries) under mu_,
  // then unattached sessions ended with mu_ released; until Shutdown.
  void Housekeeping() ABSL_LOCKS_EXCLUDED(mu_);
  // One pass (waits up to a tick first); false once stopping.
  bool HousekeepingPass() ABSL_LOCKS_EXCLUDED(mu_);
  // Retention every gc_interval_ms when keep_local or keep_remote is set (housekeeping's thread,
  // no lock held).
  void MaybeCollectGarbage() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time last_gc_ = absl::InfinitePast();  // housekeeping's thread only

  ServiceDeps deps_;
  std::string instance_id_;
  // Every synced index write (committer.h); its own lock, never held across the write.
  Committer committer_;
  // Uploads of committed checkpoints to the remote tier (its own lock and threads).
  RemoteTier remote_;
  // The flush gate, flush posting and the blob writes of the local tier (no lock of its own).
  LocalTier flush_;

  // The lifecycle lock (see the top): guards pending_ and every PendingCheckpoint in it,
  // rewriting_, reshards_, the abort retries, key_epochs_ and stopping_.
  mutable absl::Mutex mu_;
  // Executes loads (and reshard's reads) against verified manifests (loader.h).
  Loader loader_;
  absl::CondVar changed_;  // signalled on every checkpoint state change
  std::map<Key, std::unique_ptr<PendingCheckpoint>> pending_ ABSL_GUARDED_BY(mu_);
  SessionTable sessions_;
  // Offline reshards in progress, by target (reshard.cc: the lifecycle's side; the resharder
  // writes their blobs).
  std::map<Key, std::shared_ptr<ReshardJob>> reshards_ ABSL_GUARDED_BY(mu_);
  // reshard.cc
  // Claims job->target (refused while it exists, is being written or rewritten, or the source
  // is being rewritten), records its row and `first` (synced, mu_ released, the target held in
  // reshards_), then hands the job to the resharder.
  absl::Status ClaimAndStartReshard(const std::shared_ptr<ReshardJob>& job,
                                    std::vector<MetaStore::Write> first, v1::CheckpointStatus* resp)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The resharder's Done (a pool thread): commits the target's manifest, or records it ABORTED.
  void CommitReshard(ReshardJob& job, absl::StatusOr<Manifest> m) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishReshard(ReshardJob& job, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Abort / GetStatus of a reshard's target; false when `key` is no running reshard.
  bool CancelReshardLocked(const Key& key, const std::string& reason, v1::CheckpointStatus* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReshardStatusLocked(const Key& key, v1::CheckpointStatus* resp) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The target of a running reshard reading `source`, if any (Delete refuses such a source).
  std::optional<Key> ReshardReadingLocked(const Key& source) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // verify.cc. Claims `key` for a verify once its row is current (ReadRowLocked) and no delete
  // or CORRUPT marking owns it: its row (COMMITTED or CORRUPT), the key counted in verifying_.
  // NOT_FOUND, FAILED_PRECONDITION (another state), ABORTED (rewriting_). ReleaseVerify undoes it.
  absl::StatusOr<v1::CheckpointRecord> ClaimForVerify(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Verify's first phase: the request checked, the step it names ("latest" resolved), the
  // checkpoint adopted from the store if another daemon committed it, and read access checked.
  absl::StatusOr<uint64_t> VerifyStep(const Caller& caller, const v1::VerifyRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseVerify(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Verifies whose key is claimed, by key (a count: several may verify one checkpoint).
  // CheckDeletableLocked refuses these keys, so no Delete or retention step removes the files
  // under a verify.
  std::map<Key, uint32_t> verifying_ ABSL_GUARDED_BY(mu_);
  // Cancels reshards and joins their threads (Shutdown).
  void StopReshards();
  // Decoded manifests of recent commits and loads (its own lock; manifest_cache.h).
  ManifestCache manifest_cache_;
  // Hot checkpoints in the arena (ram_tier.h; its own lock). The arena's reclaimer evicts from
  // it; both are cleared before the service goes.
  RamTier ram_tier_{RamTier::Options{.bytes_max = deps_.options->ram_tier_bytes_max,
                                     .keep_per_job = deps_.options->ram_tier_keep_per_job},
                    deps_.arena, deps_.meta};
  // Hot copies clients copy out of themselves (hot_leases.h; its own lock), per session.
  HotLeases hot_leases_{deps_.clock, absl::Milliseconds(deps_.options->hot_lease_ms)};
  // Prefetches into the RAM tier in flight, one per checkpoint (hot.cc): a second Prefetch, or a
  // Load arriving meanwhile, waits for it instead of reading the checkpoint again.
  SingleFlight<Key> prefetches_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // Drain: new saves are refused
  // Keys whose row and files a catalog operation rewrites outside mu_, with what it does ("being
  // deleted": Delete's in-memory tombstone; "being marked CORRUPT"). Inserted under mu_ only
  // while the key is neither in pending_ nor in reshards_ and its row exists, so no Save or
  // Reshard can create it meanwhile (they see the row, or, in Save, this entry), and a second
  // Delete or marking is refused. Removed when the operation ends, after its last write.
  std::map<Key, std::string> rewriting_ ABSL_GUARDED_BY(mu_);
  // Jobs whose owner is being claimed (ClaimJobOwnerLocked: its JobRecord write in flight), and
  // how many claims have landed: an owner read with mu_ released is current if none landed since.
  absl::flat_hash_set<std::string> owner_claims_ ABSL_GUARDED_BY(mu_);
  uint64_t owner_claims_done_ ABSL_GUARDED_BY(mu_) = 0;
  static constexpr size_t kKeyEpochBuckets = 64;
  std::array<uint64_t, kKeyEpochBuckets> key_epochs_ ABSL_GUARDED_BY(mu_) = {};
  // Aborts whose synced ABORTED row failed (an index error) or that the flush pool refused,
  // retried by Housekeeping; Shutdown writes what is left after the pool drained.
  std::vector<AbortRecord> unrecorded_aborts_ ABSL_GUARDED_BY(mu_);
  // The last failure of each abort whose ABORTED row is not written yet (Abort answers it).
  std::map<Key, absl::Status> abort_write_failed_ ABSL_GUARDED_BY(mu_);
  absl::Time last_abort_retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread housekeeper_;
  // Scans of the store for checkpoints other daemons committed (its own lock and thread,
  // "discover-0"); shut down by Shutdown before the remote tier stops.
  // When RefreshFromStore last warned that the store did not answer (unix ms; rate limit).
  std::atomic<int64_t> last_discovery_warn_ms_{0};
  StoreDiscovery discovery_{[this](const std::string& scope) { return ScanStore(scope, nullptr); },
                            absl::Milliseconds(limits::kDiscoveryMinIntervalMs)};
  // The reshard data path (resharder.h: its pool, one thread per reshard that may run), last so it
  // is destroyed (joined) first: its threads call CommitReshard.
  Resharder resharder_{deps_.options, deps_.storage, &loader_, deps_.clock};
};

}  // namespace ckptd
