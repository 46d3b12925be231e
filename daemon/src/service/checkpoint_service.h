// CheckpointService: save, commit, load, catalog and recovery logic as plain C++ over the
// generated API messages (testable without gRPC; daemon/src/rpc adapts it). One instance per
// daemon.
//
// Ownership: borrows every dependency in ServiceDeps (they outlive it).
// Threads: every public method may be called from any thread, concurrently. Methods that wait
// (Wait, ReserveExtents on a full arena) block the calling thread; the RPC layer runs them on
// its bounded waiter pool. Flushes and commits run on deps.flush_pool, loads on the caller.
//
// The save path (DESIGN.md "Save", "Commit", "Durable"):
//   Save → validate → take the extents → journal the RankRecord (synced) → answer "staged" →
//   flush the rank's blob from the arena (O_DIRECT) → fdatasync → free the extents → once every
//   rank is persisted: validate coverage, write the manifest durably, record COMMITTED (synced).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/align.h"
#include "common/clock.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/storage.h"
#include "ckptd/v1/ckptd.pb.h"
#include "ckptd/v1/index.pb.h"
#include "dataplane/arena.h"
#include "dataplane/region_registry.h"
#include "common/limits.h"
#include "common/worker_pool.h"
#include "format/load_plan.h"
#include "format/manifest.h"
#include "index/meta_store.h"
#include "io/reader_pool.h"
#include "options.h"
#include "service/executor.h"
#include "service/sessions.h"

namespace ckptd {

struct ServiceDeps {
  const DaemonOptions* options = nullptr;
  MetaStore* meta = nullptr;
  Storage* storage = nullptr;
  StagingArena* arena = nullptr;
  RegionRegistry* regions = nullptr;
  Executor* flush_pool = nullptr;
  // The time of housekeeping decisions (stage timeouts, the flush gate, unattached sessions) and
  // of recorded timestamps; see common/clock.h for what stays on real time. Default: the real
  // clock.
  const Clock* clock = RealClock();
};

class BlobAppender;  // reshard.cc

// A lease on client memory (RegionLease or ExtentLease) held for one operation.
using MemoryLease = std::shared_ptr<const void>;

class CheckpointService {
 public:
  explicit CheckpointService(ServiceDeps deps);
  ~CheckpointService();

  // At start, before serving (recovery.cc lists the steps): repairs rows that do not parse,
  // finishes interrupted deletes, adopts verified manifests without a COMMITTED row, resumes
  // staged checkpoints from the arena (or aborts them when the arena was lost), aborts rows
  // without a manifest and verifies each job's newest manifest (CORRUPT ones are never latest).
  // What it cannot use is skipped and reported; only a failing index stops the start.
  absl::Status Recover();
  // Starts the housekeeping thread (stage timeouts, dead sessions, stale reservations).
  void Start();
  // Stops housekeeping and waits up to `grace` for in-flight flushes and commits. Returns true
  // when nothing is left staged (the arena may be removed). *drained says whether the flush
  // threads finished; when false they are still running and the process should exit without
  // joining them (what they were doing stays journaled and resumes at the next start).
  bool Shutdown(absl::Duration grace, bool* drained = nullptr);

  // Every call names its Caller (sessions.h): the kernel's word on who is calling. Calls on a job
  // are allowed to its owner (the uid whose Save created it); reads, Abort and Delete also to an
  // admin caller; anyone else gets PERMISSION_DENIED naming the job and its owner.
  absl::Status Hello(const Caller& caller, const v1::HelloRequest& req, v1::HelloResponse* resp);
  // The staging arena segment of `uid` (created on first use) for its session `session`: its
  // descriptor (borrowed from the arena; rpc/arena_fd_server.h hands it over), name and
  // residency. FAILED_PRECONDITION when `session` is not a live session of `uid`;
  // RESOURCE_EXHAUSTED as StagingArena::Segment.
  absl::StatusOr<ArenaGrant> ArenaFd(uint32_t uid, const std::string& session) const;
  // Binds session `id` to the caller's Attach stream (sessions.h); EndSession ends it when the
  // stream ends.
  absl::Status Attach(const Caller& caller, const std::string& id);
  void EndSession(const std::string& id);
  absl::Status Goodbye(const Caller& caller, const v1::GoodbyeRequest& req);
  absl::Status ReserveExtents(const Caller& caller, const v1::ReserveExtentsRequest& req,
                              v1::ReserveExtentsResponse* resp);
  absl::Status ReleaseExtents(const Caller& caller, const v1::ReleaseExtentsRequest& req);
  absl::Status RegisterRegion(const Caller& caller, const v1::RegisterRegionRequest& req,
                              v1::RegisterRegionResponse* resp);
  absl::Status UnregisterRegion(const Caller& caller, const v1::UnregisterRegionRequest& req);

  absl::Status Save(const Caller& caller, const v1::SaveRequest& req, v1::SaveResponse* resp);
  absl::Status Wait(const Caller& caller, const v1::WaitRequest& req, v1::CheckpointStatus* resp);
  absl::Status Commit(const Caller& caller, const v1::CommitRequest& req, v1::CheckpointStatus* resp);
  absl::Status Abort(const Caller& caller, const v1::AbortRequest& req, v1::CheckpointStatus* resp);
  absl::Status Load(const Caller& caller, const v1::LoadRequest& req, v1::LoadResponse* resp);

  absl::Status ListJobs(const Caller& caller, const v1::ListJobsRequest& req, v1::ListJobsResponse* resp);
  absl::Status ListCheckpoints(const Caller& caller, const v1::ListCheckpointsRequest& req,
                               v1::ListCheckpointsResponse* resp);
  absl::Status GetStatus(const Caller& caller, const v1::GetStatusRequest& req, v1::CheckpointStatus* resp);
  absl::Status Inspect(const Caller& caller, const v1::InspectRequest& req, v1::InspectResponse* resp);
  absl::Status Delete(const Caller& caller, const v1::DeleteRequest& req);
  absl::Status Latest(const Caller& caller, const v1::LatestRequest& req, v1::LatestResponse* resp);
  // Starts an offline reshard (reshard.cc); see the Reshard RPC.
  absl::Status Reshard(const Caller& caller, const v1::ReshardRequest& req, v1::CheckpointStatus* resp);

  const std::string& instance_id() const { return instance_id_; }

 private:
  using Key = std::pair<std::string, uint64_t>;  // (job, step)

  struct ItemMeta {
    v1::ItemKind kind = v1::ITEM_KIND_UNSPECIFIED;
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    std::vector<uint64_t> shape;
    v1::ObjectScope scope = v1::OBJECT_SCOPE_UNSPECIFIED;
    uint32_t first_rank = 0;
  };
  struct PendingRank {
    v1::RankRecord rec;
    std::vector<RegionLease> leases;  // region-backed shards, held until persisted
    std::vector<uint64_t> extent_ids;  // freed once persisted
    // Its journal row is durable. Only then is it flushed: a flush journals "persisted" over the
    // same row, which the rank's own journal write, landing later, would overwrite.
    bool journaled = false;
    bool persisted = false;
    bool flushing = false;
  };
  struct Pending {
    std::string job;
    uint64_t step = 0;
    uint32_t owner_uid = 0;     // the uid of its first Save; only it may add ranks
    bool job_recorded = false;  // the job's JobRecord (owner) is in the index
    uint32_t world_size = 0;
    uint64_t created_unix_ms = 0;
    uint64_t first_staged_unix_ms = 0;  // when its first rank staged (the flush gate's start)
    // Fixed when the checkpoint is created (options.checksum_block_bytes) and journaled with
    // every rank, so a restart with another option value does not mix block sizes.
    uint32_t checksum_block_bytes = 0;
    std::map<uint32_t, PendingRank> ranks;
    std::map<std::string, ItemMeta> items;
    // item '\0' RegionKey → (rank, shard index) of the copy that is stored.
    absl::flat_hash_map<std::string, std::pair<uint32_t, size_t>> stored_copy;
    v1::CheckpointState state = v1::STAGING;
    bool partial = false;
    bool committing = false;
    bool aborting = false;
    int flushes_in_flight = 0;
    // Journal writes running with mu_ released (JournalUnlocked): they pin the Pending — no
    // commit starts and no abort finishes while one is in flight — and run one at a time per
    // checkpoint (journal_busy), so its rows land in the order they were built.
    int journals_in_flight = 0;
    bool journal_busy = false;
    std::string error;
  };
  // The time on deps_.clock, in Unix milliseconds.
  uint64_t NowMs() const { return deps_.clock->NowUnixMs(); }
  // save.cc (AbortLocked, FinishAbortLocked, RecordAbort: abort.cc)
  // `id` if it is a live session of `caller` (SessionTable::Check).
  absl::StatusOr<std::string> SessionOf(const Caller& caller, const std::string& id) const;
  absl::Status ValidateSave(const v1::SaveRequest& req) const;
  // RESOURCE_EXHAUSTED when opening one more checkpoint of `job` would pass
  // kOpenCheckpointsPerJobMax or kOpenCheckpointsMax.
  absl::Status CheckOpenLimitsLocked(const std::string& job, const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when the index volume has less than index_reserve_bytes free.
  absl::Status CheckIndexReserve(const std::string& what) const;
  absl::Status CheckItemsLocked(const Pending& p, const v1::SaveRequest& req) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ResolveSaveData(const std::string& session, const v1::SaveRequest& req,
                               PendingRank* rank) const;
  // The index rows journaling `p` (its summary, its owner once, and `ranks`' rows).
  std::vector<MetaStore::Write> JournalWritesLocked(const Pending& p,
                                                    const std::vector<uint32_t>& ranks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes JournalWritesLocked(p, ranks) synced, with mu_ released around the write (LevelDB's
  // unlock around the log write); p stays valid (journals_in_flight). Held on entry and exit.
  absl::Status JournalUnlocked(Pending& p, const std::vector<uint32_t>& ranks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No flush, journal write or commit of `p` is in flight (an abort may finish).
  static bool IdleLocked(const Pending& p);
  v1::CheckpointSummary SummaryLocked(const Pending& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillStatusLocked(const Pending& p, v1::CheckpointStatus* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeStartCommitLocked(Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortLocked(Pending& p, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets an aborted, idle `p` (it is gone on return): the key enters rewriting_ ("being
  // aborted") until RecordAbort, posted to the flush pool, wrote the ABORTED row outside mu_,
  // then freed the extents of its unpersisted ranks and removed its files.
  void FinishAbortLocked(Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An abort to record: the ABORTED row and the journal rows it removes (one synced write), and
  // the arena extents the checkpoint still holds (freed once that write is durable).
  struct AbortRecord {
    Key key;
    std::vector<MetaStore::Write> writes;
    std::vector<uint64_t> extent_ids;
    uint64_t attempts = 0;  // failed writes so far
  };
  // Writes `a`; on failure keeps it in unrecorded_aborts_ for housekeeping to post again (the
  // key stays in rewriting_, its extents allocated).
  void RecordAbort(AbortRecord a);
  void PostFlush(const Key& key, uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts the flush of every journaled rank of `p` not yet flushing or persisted: once all its
  // ranks are staged, it is committed partial, or flush_gate_ms passed since its first staged.
  void PostGatedFlushesLocked(Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // flush.cc
  void FlushRank(Key key, uint32_t rank);
  absl::Status WriteRankBlob(const std::string& dir, const std::vector<RegionLease>& leases,
                             v1::RankRecord* rec);
  const uint8_t* ShardSource(std::optional<uint32_t> arena_uid, const v1::StagedShard& s,
                             const std::vector<RegionLease>& leases) const;

  // commit.cc
  void CommitCheckpoint(Key key);
  absl::StatusOr<Manifest> BuildManifestLocked(const Pending& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteCommitted(const Manifest& m, const std::string& dir);
  // Records a durable manifest in the index (COMMITTED row, item rows, journal removed), synced.
  absl::Status IndexCommitted(const Manifest& m, const std::string& dir);

  // load.cc
  // The verified manifest of (job, step), from the cache or storage. One that does not verify
  // (DATA_LOSS) marks a COMMITTED checkpoint CORRUPT.
  absl::StatusOr<std::shared_ptr<const Manifest>> GetManifest(const std::string& job,
                                                              uint64_t step);
  void CacheManifestLocked(const Key& key, std::shared_ptr<const Manifest> manifest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks one requested item and its destination; fills the planner's request, the destination
  // pointer (nullptr for 0 bytes) and the answer's entry.
  absl::Status ResolveLoadItem(const std::string& session, const Manifest& m,
                               const v1::LoadItemRequest& req, uint32_t rank,
                               std::vector<MemoryLease>* leases, PlanRequest* request,
                               uint8_t** dst, v1::LoadedItem* out) const;
  // Plan options for manifests with checksum blocks of `block_bytes`.
  PlanOptions LoadPlanOptions(uint32_t block_bytes) const;
  // Executes a plan of `m`: reads its runs in batches of at most options.load_buffer_bytes (the
  // next batch on a second thread while this one is verified), verifies every block used and
  // copies into dst[request] (each sized plan.request_bytes).
  absl::Status ReadPlan(const Manifest& m, const LoadPlan& plan, std::span<uint8_t* const> dst,
                        uint64_t* bytes_read);
  // A read buffer of at least `bytes` for a load. Buffers of load_buffer_bytes are kept for
  // reuse after their first use (touched once, so later loads do not fault them in page by
  // page), at most two per load thread; larger ones are allocated for the one load. Null when
  // memory is exhausted.
  AlignedBuffer AcquireLoadBuffer(uint64_t bytes);
  void ReturnLoadBuffer(AlignedBuffer buf, uint64_t bytes);
  absl::StatusOr<uint8_t*> ResolveDest(const std::string& session, const v1::MemRef& ref,
                                       uint64_t need_bytes, std::vector<MemoryLease>* leases,
                                       const std::string& what) const;

  // catalog.cc
  enum class Access { kRead, kWrite, kDelete };
  // OK when `caller` may do `access` to `job` (see Hello's comment); OK for a job that does not
  // exist yet. PERMISSION_DENIED naming the job, its owner and the caller otherwise.
  absl::Status CheckAccess(const Caller& caller, const std::string& job, Access access);
  // The owner of `job`, if it has a record.
  absl::StatusOr<std::optional<uint32_t>> JobOwner(const std::string& job);
  absl::StatusOr<std::optional<v1::CheckpointRecord>> GetRecord(const std::string& job,
                                                                uint64_t step);
  absl::StatusOr<uint64_t> LatestCommitted(const std::string& job);
  absl::Status PutRecordSync(const v1::CheckpointRecord& rec);
  // The index row of (job, step) in any state; DATA_LOSS when it does not parse. GetRecord is
  // the same except that a CORRUPT checkpoint is DATA_LOSS naming why, so every caller that would
  // use the checkpoint (Load, Save, Reshard, Wait) stops there; the catalog shows and deletes
  // CORRUPT ones through ReadRecord.
  absl::StatusOr<std::optional<v1::CheckpointRecord>> ReadRecord(const std::string& job,
                                                                 uint64_t step);
  // Steps of `job` whose row is COMMITTED, newest first (rows that do not parse are skipped).
  absl::StatusOr<std::vector<uint64_t>> CommittedSteps(const std::string& job);
  // FAILED_PRECONDITION while (job, step) is being written (a save or a reshard), ABORTED while
  // another Delete or a CORRUPT marking owns it (see rewriting_).
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

  // recovery.cc
  absl::Status AdoptManifests();
  absl::Status CheckCommittedRows();
  absl::Status ResumePending();
  absl::Status ResumeOne(const v1::CheckpointRecord& rec,
                         const std::vector<v1::RankRecord>& ranks);
  void AbortRecovered(const v1::CheckpointRecord& rec, const std::string& reason);
  void RemoveOrphanSegments();
  // Logs one entry recovery could not use (naming its path or index key) and keeps it for the
  // summary logged when recovery ends.
  void RecoveryProblem(std::string what);
  // Rows that do not parse: a checkpoint row is rebuilt from its manifest when that verifies,
  // recorded CORRUPT when a manifest is there but does not verify, else ABORTED (and its partial
  // files collected); job rows and keys that do not decode are reported and left alone.
  absl::Status RepairIndexRows();
  // Finishes every delete a crash interrupted (rows left DELETING).
  absl::Status FinishDeletes();
  // Per job, verifies the manifest of the newest COMMITTED checkpoint; one that does not verify
  // is marked CORRUPT and the next older one is verified, until one does.
  absl::Status VerifyNewestCommitted();

  void Housekeeping();

  ServiceDeps deps_;
  std::string instance_id_;

  mutable absl::Mutex mu_;
  absl::Mutex load_buffers_mu_;
  std::vector<AlignedBuffer> load_buffers_ ABSL_GUARDED_BY(load_buffers_mu_);
  absl::CondVar changed_;  // signalled on every checkpoint state change
  std::map<Key, std::unique_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  SessionTable sessions_;
  // Offline reshards in progress, by target (reshard.cc). Each runs on its own thread.
  struct ReshardJob;
  std::map<Key, std::shared_ptr<ReshardJob>> reshards_ ABSL_GUARDED_BY(mu_);
  // reshard.cc
  void RunReshard(std::shared_ptr<ReshardJob> job);
  absl::StatusOr<Manifest> WriteReshard(ReshardJob& job);
  // Appends the bytes of `whole` (a target tensor region, or an object's copy) read from the
  // source to `out`, growing shard->length() and the job's progress.
  absl::Status CopyShard(ReshardJob& job, const PlanRequest& whole, BlobAppender& out,
                         v1::ShardEntry* shard);
  void FinishReshard(ReshardJob& job, const absl::Status& status);
  // Abort / GetStatus of a reshard's target; false when `key` is no running reshard.
  bool CancelReshardLocked(const Key& key, const std::string& reason, v1::CheckpointStatus* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReshardStatusLocked(const Key& key, v1::CheckpointStatus* resp) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The target of a running reshard reading `source`, if any (Delete refuses such a source).
  std::optional<Key> ReshardReadingLocked(const Key& source) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels reshards and joins their threads (Shutdown).
  void StopReshards();
  // Decoded manifests of recent loads, least recently used evicted first (kManifestCacheMax).
  struct CachedManifest {
    std::shared_ptr<const Manifest> manifest;
    uint64_t last_used = 0;
  };
  std::map<Key, CachedManifest> manifest_cache_ ABSL_GUARDED_BY(mu_);
  uint64_t manifest_cache_tick_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Keys whose row and files a catalog operation rewrites outside mu_, with what it does ("being
  // deleted": Delete's in-memory tombstone; "being marked CORRUPT"). Inserted under mu_ only
  // while the key is neither in pending_ nor in reshards_ and its row exists, so no Save or
  // Reshard can create it meanwhile (they see the row, or, in Save, this entry), and a second
  // Delete or marking is refused. Removed when the operation ends, after its last write.
  std::map<Key, std::string> rewriting_ ABSL_GUARDED_BY(mu_);
  // Aborts whose synced ABORTED row failed (an index error), retried by Housekeeping.
  std::vector<AbortRecord> unrecorded_aborts_ ABSL_GUARDED_BY(mu_);
  // The last failure of each abort whose ABORTED row is not written yet (Abort answers it).
  std::map<Key, absl::Status> abort_write_failed_ ABSL_GUARDED_BY(mu_);
  absl::Time last_abort_retry_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // What recovery skipped or repaired (Recover only, before the service is used).
  std::vector<std::string> recovery_problems_;
  std::thread housekeeper_;
  // Bounded, named workers (limits.h), last so they are destroyed (joined) first: block checksums
  // of flushes ("crc-<i>"), blob reads of loads and reshards on long-lived io_uring rings
  // ("reader-<i>": reads go through the Storage plugin, so the pool has no Io of its own), and
  // reshards ("reshard-<i>", one per reshard that may run: kReshardJobsMax).
  WorkerPool checksum_pool_{"crc", limits::kChecksumPoolThreads, limits::kChecksumPoolQueueMax};
  ReaderPool reader_pool_{nullptr, ReaderPool::Options{}};
  WorkerPool reshard_pool_{"reshard", limits::kReshardPoolThreads, limits::kReshardQueueMax};
};

// "checkpoint job/7", for messages.
std::string CkptName(const std::string& job, uint64_t step);
// The job name is valid and the step within limits::kStepMax; INVALID_ARGUMENT otherwise.
absl::Status ValidateJobStep(const std::string& job, uint64_t step);
// The checksum block size a rank record was written with.
inline uint32_t RankBlockBytes(const v1::RankRecord& rec) {
  return rec.checksum_block_bytes() != 0 ? rec.checksum_block_bytes()
                                         : limits::kLegacyChecksumBlockBytes;
}
// Identifies the stored copy of a shard within a checkpoint: item + region (tensors), item +
// saving rank (per-rank objects), item (replicated objects). Equal keys are replicas.
std::string StoredCopyKey(const v1::ShardSpec& spec, uint32_t rank);

}  // namespace ckptd
