// Save, Wait and Commit of CheckpointService (Abort: abort.cc; sessions, extents, regions:
// session_calls.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "format/dtype.h"
#include "format/names.h"
#include "format/region.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

// The ranks saving through this daemon (0 in the request: all of them).
uint32_t LocalWorldSize(const v1::SaveRequest& req) {
  return req.local_world_size() == 0 ? req.world_size() : req.local_world_size();
}

// ValidateSave's parts.
// The world, rank and shard-count fields of a Save.
absl::Status ValidateSaveRanks(const v1::SaveRequest& req, const std::string& what) {
  if (req.world_size() == 0 || req.world_size() > limits::kWorldSizeMax) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": world_size ", req.world_size(),
                                                   " must be in [1, ", limits::kWorldSizeMax, "]"));
  }
  if (req.rank() >= req.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": rank ", req.rank(), " is not below world_size ", req.world_size()));
  }
  if (req.local_world_size() > req.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": local_world_size ",
                                                   req.local_world_size(), " is above world_size ",
                                                   req.world_size()));
  }
  if (static_cast<uint64_t>(req.shards_size()) > limits::kShardsPerSaveMax) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", req.shards_size(),
                                                   " shards in one Save; the limit is ",
                                                   limits::kShardsPerSaveMax));
  }
  return absl::OkStatus();
}

// One shard's description against its data: a valid tensor region or object, and data of
// exactly its bytes that names where they are. Returns the region's key ("" for an object).
absl::StatusOr<std::string> ValidateShardSpec(const v1::ShardSpec& s, const std::string& where) {
  uint64_t expect_bytes = 0;
  std::string region_key;
  if (s.has_tensor()) {
    const v1::TensorShardSpec& t = s.tensor();
    absl::StatusOr<uint32_t> elem = DTypeSize(t.dtype());
    if (!elem.ok()) return Annotate(elem.status(), where);
    std::vector<uint64_t> shape(t.global_shape().begin(), t.global_shape().end());
    CKPTD_RETURN_IF_ERROR(Annotate(NumElements(shape).status(), where));
    CKPTD_RETURN_IF_ERROR(Annotate(ValidateRegion(t.region(), shape), where));
    expect_bytes = RegionElements(t.region(), shape) * *elem;
    region_key = RegionKey(t.region(), shape);
  } else if (s.has_object()) {
    if (s.object().scope() != v1::REPLICATED && s.object().scope() != v1::PER_RANK) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": object scope must be REPLICATED or PER_RANK"));
    }
    if (s.data().length() > limits::kObjectBytesMax) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": object of ", s.data().length(),
                                                     " bytes exceeds the limit ",
                                                     limits::kObjectBytesMax));
    }
    expect_bytes = s.data().length();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(where, ": neither tensor nor object"));
  }
  if (s.data().length() != expect_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " ", s.has_tensor() ? DescribeRegion(s.tensor().region()) : "", ": data is ",
        s.data().length(), " bytes but the region holds ", expect_bytes));
  }
  if (expect_bytes > 0 && s.data().target_case() == v1::MemRef::TARGET_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data names no extent or region"));
  }
  return region_key;
}

// Two shards describe their item alike: kind, and dtype and global shape, or object scope.
bool SameItemDescription(const v1::ShardSpec& f, const v1::ShardSpec& s) {
  if (f.has_tensor() != s.has_tensor()) return false;
  if (!s.has_tensor()) return f.object().scope() == s.object().scope();
  return f.tensor().dtype() == s.tensor().dtype() &&
         std::equal(f.tensor().global_shape().begin(), f.tensor().global_shape().end(),
                    s.tensor().global_shape().begin(), s.tensor().global_shape().end());
}

// Distinct regions of one item in one Save may not overlap: which bytes would an element
// overlapped take? (Identical regions are refused before.) `items`: item -> its shards in this
// Save, in order. Linear in the shards (an item's regions are gathered once, not searched for
// among every shard per item: a Save of 100,000 items took minutes so).
absl::Status CheckNoOverlapInSave(const v1::SaveRequest& req,
                                  const absl::flat_hash_map<std::string, std::vector<int>>& items,
                                  const std::string& what) {
  std::vector<v1::Region> regions;
  for (const auto& [item, shards] : items) {
    if (shards.size() < 2) continue;
    const v1::ShardSpec& f = req.shards(shards.front());
    if (!f.has_tensor()) continue;
    regions.clear();
    for (int i : shards) regions.push_back(req.shards(i).tensor().region());
    std::vector<uint64_t> shape(f.tensor().global_shape().begin(), f.tensor().global_shape().end());
    CKPTD_RETURN_IF_ERROR(Annotate(CheckNoOverlap(shape, regions, item), what));
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointService::CheckpointService(ServiceDeps deps)
    : deps_(deps),
      instance_id_(RandomHexId()),
      committer_(deps.meta),
      remote_(deps.options, deps.meta, &committer_, deps.storage, deps.remote),
      flush_(deps.options, deps.storage, deps.arena, deps.flush_pool),
      loader_(deps.options, deps.storage, deps.arena, deps.regions, deps.gpu),
      sessions_(
          [this](const std::string& id) {
            // What the session held goes; leases of operations in flight keep their memory.
            deps_.arena->ReleaseSession(id);
            deps_.regions->DropSession(id);
            hot_leases_.DropSession(id);
          },
          deps.clock) {
  CKPTD_CHECK(deps_.clock != nullptr);
  deps_.arena->SetReclaimer([this](uint64_t bytes) { return ram_tier_.Reclaim(bytes); });
}

CheckpointService::~CheckpointService() {
  Shutdown(absl::ZeroDuration());
  deps_.arena->SetReclaimer(nullptr);  // before the RAM tier goes
}

absl::Status CheckpointService::CheckIndexReserve(const std::string& what) const {
  CKPTD_ASSIGN_OR_RETURN(uint64_t free_bytes, deps_.meta->AvailableBytes());
  if (free_bytes < deps_.options->index_reserve_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": the index volume of ", deps_.options->state_dir, " has ", free_bytes,
        " bytes free, below index_reserve_bytes = ", deps_.options->index_reserve_bytes,
        "; free space there (staged checkpoints are kept)"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::CheckOpenLimitsLocked(uint32_t uid, const std::string& job,
                                                      const std::string& what) const {
  // One uid's share first (docs/SECURITY.md "Per-uid shares"): the global limit must never be
  // reachable by one uid alone, or it could lock every other uid out for stage_timeout_ms.
  const uint64_t share =
      limits::UidShare(limits::kOpenCheckpointsMax, deps_.options->uid_share_percent);
  uint64_t mine = 0;
  for (const auto& [key, p] : pending_) mine += p->owner_uid == uid;
  if (mine >= share) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": uid ", uid, " has ", mine, " checkpoints being saved; its share is ", share,
        " (uid_share_percent of kOpenCheckpointsMax = ", limits::kOpenCheckpointsMax,
        "); wait for them to commit or abort them"));
  }
  if (pending_.size() >= limits::kOpenCheckpointsMax) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", pending_.size(), " checkpoints are being saved; the limit is ",
        limits::kOpenCheckpointsMax, " (kOpenCheckpointsMax); wait for them to commit"));
  }
  uint64_t open = 0;
  for (auto it = pending_.lower_bound(Key{job, 0}); it != pending_.end() && it->first.first == job;
       ++it) {
    ++open;
  }
  if (open >= limits::kOpenCheckpointsPerJobMax) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": job ", job, " has ", open, " checkpoints being saved; the limit is ",
                     limits::kOpenCheckpointsPerJobMax,
                     " (kOpenCheckpointsPerJobMax); wait for them to commit or abort them"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::ValidateSave(const v1::SaveRequest& req) const {
  CKPTD_RETURN_IF_ERROR(ValidateJobStep(req.job(), req.step()));
  const std::string what = CkptName(req.job(), req.step());
  CKPTD_RETURN_IF_ERROR(ValidateSaveRanks(req, what));
  absl::flat_hash_set<std::string> seen;  // item '\0' region: each stored copy once
  absl::flat_hash_map<std::string, std::vector<int>> items;  // item -> its shards in this Save
  for (int i = 0; i < req.shards_size(); ++i) {
    const v1::ShardSpec& s = req.shards(i);
    const std::string where = absl::StrCat(what, " rank ", req.rank(), " item \"", s.item(), "\"");
    CKPTD_RETURN_IF_ERROR(Annotate(ValidateItemName(s.item()), what));
    CKPTD_ASSIGN_OR_RETURN(std::string region_key, ValidateShardSpec(s, where));
    if (!seen.insert(absl::StrCat(s.item(), std::string(1, '\0'), region_key)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the same region is given twice in one Save"));
    }
    // Every shard of one item in one Save agrees on what the item is (kind, dtype, shape,
    // scope) — CheckItemsLocked compares against other ranks only.
    std::vector<int>& shards = items[s.item()];
    if (!shards.empty() && !SameItemDescription(req.shards(shards.front()), s)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shard ", i,
                       " describes the item differently (kind, dtype, global shape "
                       "or scope) than shard ",
                       shards.front(), " of the same Save"));
    }
    shards.push_back(i);
  }
  return CheckNoOverlapInSave(req, items, absl::StrCat(what, " rank ", req.rank()));
}

absl::Status CheckpointService::StageFromGpu(const std::string& session,
                                             const v1::SaveRequest& req) const {
  std::vector<DeviceCopy> copies;
  std::vector<MemoryLease> leases;  // the regions and extents, until the copies are done
  uint32_t uid = 0;
  for (const v1::ShardSpec& s : req.shards()) {
    if (!s.has_gpu_source()) continue;
    const v1::MemRef& src = s.gpu_source();
    const v1::MemRef& dst = s.data();
    std::string where = absl::StrCat(CkptName(req.job(), req.step()), " rank ", req.rank(),
                                     " item \"", s.item(), "\"");
    if (deps_.gpu == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": gpu_source given, but this daemon has no GPU support"));
    }
    if (src.target_case() != v1::MemRef::kRegionId || dst.target_case() != v1::MemRef::kExtentId ||
        src.length() != dst.length()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": gpu_source must name a CUDA region, data an extent, of the same length (",
          src.length(), " and ", dst.length(), " bytes)"));
    }
    if (dst.length() == 0) continue;
    absl::StatusOr<RegionLease> region =
        deps_.regions->Acquire(session, src.region_id(), src.offset(), src.length());
    if (!region.ok()) return Annotate(region.status(), where);
    if (!(*region)->on_device()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": gpu_source names region ", src.region_id(),
                       ", which is shared memory, not a CUDA region"));
    }
    // Leased for the copy: a Release of the extent meanwhile cannot hand its bytes to another
    // client while the DMA still writes them. (The lease ends before Take.)
    absl::StatusOr<ExtentLease> extent = deps_.arena->Lease(session, dst.extent_id());
    if (!extent.ok()) return Annotate(extent.status(), where);
    const ExtentInfo& e = **extent;
    CKPTD_RETURN_IF_ERROR(CheckInExtent(e, dst.offset(), dst.length(), where));
    uid = e.uid;
    copies.push_back(
        {(*region)->device(), GpuCopy{(*region)->device_addr(src.offset()),
                                      deps_.arena->Data(e) + dst.offset(), dst.length()}});
    leases.push_back(*std::move(region));
    leases.push_back(*std::move(extent));
  }
  if (copies.empty()) return absl::OkStatus();
  absl::Status st = deps_.gpu->CopyToArena(uid, copies);
  return Annotate(st, absl::StrCat(CkptName(req.job(), req.step()), " rank ", req.rank(),
                                   ": copying from GPU memory"));
}

absl::Status CheckpointService::ResolveSaveData(const std::string& session,
                                                const v1::SaveRequest& req,
                                                PendingRank* rank) const {
  CKPTD_RETURN_IF_ERROR(StageFromGpu(session, req));
  absl::flat_hash_set<uint64_t> extents;  // rank->extent_ids, for a linear dedup
  for (const v1::ShardSpec& s : req.shards()) {
    v1::StagedShard* st = rank->rec.add_shards();
    *st->mutable_spec() = s;
    st->mutable_spec()->clear_gpu_source();  // copied: the journal names the extent only
    const v1::MemRef& m = s.data();
    std::string where = absl::StrCat(CkptName(req.job(), req.step()), " rank ", req.rank(),
                                     " item \"", s.item(), "\"");
    if (m.length() == 0) continue;
    if (m.target_case() == v1::MemRef::kExtentId) {
      absl::StatusOr<ExtentInfo> e = deps_.arena->Lookup(session, m.extent_id());
      if (!e.ok()) return Annotate(e.status(), where);
      CKPTD_RETURN_IF_ERROR(CheckInExtent(*e, m.offset(), m.length(), where));
      st->set_extent_id(e->id);
      st->set_arena_offset(e->offset);
      st->set_extent_length(e->length);
      if (extents.insert(e->id).second) rank->extent_ids.push_back(e->id);
    } else {
      absl::StatusOr<RegionLease> lease =
          deps_.regions->Acquire(session, m.region_id(), m.offset(), m.length());
      if (!lease.ok()) return Annotate(lease.status(), where);
      if ((*lease)->on_device()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": data names CUDA region ", m.region_id(),
            "; GPU bytes are saved by naming the region as gpu_source and an extent as data"));
      }
      rank->leases.push_back(*std::move(lease));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::CheckItemsLocked(const PendingCheckpoint& p,
                                                 const v1::SaveRequest& req) const {
  for (const v1::ShardSpec& s : req.shards()) {
    auto it = p.items.find(s.item());
    if (it == p.items.end()) continue;
    const ItemMeta& m = it->second;
    std::string where = absl::StrCat(CkptName(req.job(), req.step()), " item \"", s.item(), "\"");
    if (s.has_tensor()) {
      std::vector<uint64_t> shape(s.tensor().global_shape().begin(),
                                  s.tensor().global_shape().end());
      if (m.kind != v1::TENSOR || m.dtype != s.tensor().dtype() || m.shape != shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": rank ", req.rank(), " saves it as ",
            std::string(DTypeName(s.tensor().dtype())), " ", DescribeShape(shape), " but rank ",
            m.first_rank, " saved it as ",
            m.kind == v1::TENSOR
                ? absl::StrCat(std::string(DTypeName(m.dtype)), " ", DescribeShape(m.shape))
                : "an object"));
      }
    } else if (m.kind != v1::OBJECT || m.scope != s.object().scope()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rank ", req.rank(),
                                                     " saves it as an object of another scope "
                                                     "or kind than rank ",
                                                     m.first_rank));
    }
  }
  return absl::OkStatus();
}

std::vector<MetaStore::Write> CheckpointService::JournalWritesLocked(
    const PendingCheckpoint& p, const std::vector<uint32_t>& ranks) const {
  std::vector<MetaStore::Write> writes;
  v1::CheckpointRecord rec;
  *rec.mutable_summary() = SummaryLocked(p);
  rec.set_dir(CheckpointDir(p.job, p.step));
  writes.push_back({keys::Checkpoint(p.job, p.step), rec.SerializeAsString()});
  if (!p.job_recorded) {
    v1::JobRecord job;
    job.set_owner_uid(p.owner_uid);
    job.set_created_unix_ms(p.created_unix_ms);
    writes.push_back({keys::Job(p.job), job.SerializeAsString()});
  }
  for (uint32_t r : ranks) {
    const PendingRank& pr = p.ranks.at(r);
    writes.push_back({keys::Rank(p.job, p.step, r), pr.rec.SerializeAsString()});
    v1::BlobRecord blob;
    blob.set_path(absl::StrCat(rec.dir(), "/", pr.rec.blob_name()));
    writes.push_back({keys::Blob(p.job, p.step, pr.rec.blob_name()), blob.SerializeAsString()});
  }
  return writes;
}

absl::Status CheckpointService::JournalUnlocked(PendingCheckpoint& p,
                                                const std::vector<uint32_t>& ranks) {
  ++p.journals_in_flight;
  // Queued under mu_, so the summary queued last (the newest) lands last.
  Committer::Ticket ticket =
      committer_.Enqueue(keys::Checkpoint(p.job, p.step), JournalWritesLocked(p, ranks));
  mu_.Unlock();
  absl::Status st = committer_.Await(ticket);
  mu_.Lock();
  --p.journals_in_flight;
  if (st.ok()) p.job_recorded = true;
  return st;
}

absl::StatusOr<PendingCheckpoint*> CheckpointService::FindOrOpenLocked(const Caller& caller,
                                                                       const v1::SaveRequest& req,
                                                                       v1::TierPolicy policy) {
  const Key key{req.job(), req.step()};
  const std::string what = CkptName(req.job(), req.step());
  // The job's owner matters only to the Save that opens the checkpoint, so only that one reads
  // its row (with mu_ released, before the checkpoint's row, as the checks below expect), and
  // claims the job when it has no owner yet (owners.cc): atomically, durably, before anything of
  // the checkpoint is opened. (The store is not scanned first: a node joining a checkpoint that
  // spans nodes after its commit learns it from the cluster protocol, which an adoption of the
  // key here would preempt. docs/SECURITY.md says what that leaves.)
  std::optional<absl::StatusOr<uint32_t>> owner;
  while (true) {
    if (auto it = pending_.find(key); it != pending_.end()) return it->second.get();
    if (!owner.has_value()) {
      owner = ClaimJobOwnerLocked(req.job(), caller.uid);
      continue;  // another rank may have opened it meanwhile
    }
    if (!owner->ok()) return owner->status();
    CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), **owner, Access::kWrite));
    // Read with mu_ released; the maps are checked after it, consistent with the row.
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> existing,
                           ReadRowLocked(key, /*corrupt_is_error=*/true));
    if (pending_.contains(key)) continue;  // another rank opened it meanwhile
    if (auto busy = rewriting_.find(key); busy != rewriting_.end()) {
      return absl::AbortedError(
          absl::StrCat(what, " is ", busy->second, "; retry once that has finished"));
    }
    if (draining_) {  // SIGTERM: ranks of open checkpoints are taken, new ones are not opened
      return absl::UnavailableError(absl::StrCat(
          what, ": the daemon is stopping (SIGTERM); save it again once it has restarted"));
    }
    if (existing) {
      return absl::AlreadyExistsError(
          absl::StrCat(what, " is already ", v1::CheckpointState_Name(existing->summary().state()),
                       "; delete it first or save another step"));
    }
    CKPTD_RETURN_IF_ERROR(CheckOpenLimitsLocked(caller.uid, req.job(), what));
    auto p = std::make_unique<PendingCheckpoint>(req.job(), req.step());
    p->owner_uid = caller.uid;
    p->job_recorded = true;  // claimed above
    p->world_size = req.world_size();
    p->created_unix_ms = NowMs();
    p->checksum_block_bytes = deps_.options->checksum_block_bytes;
    p->tier_policy = policy;
    p->local_world_size = LocalWorldSize(req);
    PendingCheckpoint* opened = pending_.emplace(key, std::move(p)).first->second.get();
    KeyChangedLocked(key);
    LogScope fields;
    fields.Str("event", "opened").Num("world_size", opened->world_size);
    fields.Str("tier_policy", v1::TierPolicy_Name(policy));
    spdlog::info("{} opened: world size {}, {}", what, opened->world_size,
                 v1::TierPolicy_Name(policy));
    return opened;
  }
}

absl::Status CheckpointService::Save(const Caller& caller, const v1::SaveRequest& req,
                                     v1::SaveResponse* resp) {
  const absl::Time started = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  CKPTD_RETURN_IF_ERROR(SessionArenaStatus(session));  // its extents' segment is intact
  CKPTD_RETURN_IF_ERROR(ValidateSave(req));
  const std::string what = CkptName(req.job(), req.step());
  CKPTD_RETURN_IF_ERROR(CheckIndexReserve(what));
  PendingRank rank = NewRank(caller, session, req);
  CKPTD_ASSIGN_OR_RETURN(const v1::TierPolicy policy, ResolveTierPolicy(req));
  CKPTD_RETURN_IF_ERROR(ResolveSaveData(session, req, &rank));
  if (policy == v1::TIER_REMOTE) CKPTD_RETURN_IF_ERROR(ClaimStoreOwnerToOpen(caller, req));

  absl::MutexLock lock(&mu_);
  CKPTD_ASSIGN_OR_RETURN(PendingCheckpoint * found, FindOrOpenLocked(caller, req, policy));
  PendingCheckpoint& p = *found;
  CKPTD_RETURN_IF_ERROR(CheckRankJoinsLocked(caller, req, policy, p, what));
  rank.rec.set_checksum_block_bytes(p.checksum_block_bytes);
  CKPTD_RETURN_IF_ERROR(CheckItemsLocked(p, req));
  CKPTD_RETURN_IF_ERROR(deps_.arena->Take(session, rank.extent_ids));

  const uint32_t r = req.rank();
  const uint64_t bytes = p.AddRank(r, std::move(rank));

  CKPTD_SYNC_POINT("save.before_journal");
  absl::Status journaled = JournalUnlocked(p, {r});
  if (!journaled.ok() && !p.aborting()) {
    // The rank cannot be forgotten alone: while the lock was released other ranks may have
    // staged replicas of its shards (stored_copy) and been journaled so. The checkpoint is
    // aborted (its extents freed); the client gets the index's error.
    AbortLocked(p, absl::StrCat("journaling rank ", r, " failed: ", journaled.message()));
    return Annotate(journaled, absl::StrCat(what, ": journaling rank ", r,
                                            " (the checkpoint "
                                            "is aborted; save the next step)"));
  }
  if (p.aborting()) {
    // Aborted while the journal was written: the abort finishes now if nothing else runs.
    std::string why = absl::StrCat(what, " was aborted: ", p.error);
    if (p.idle()) FinishAbortLocked(p);  // p is gone after this line
    return absl::AbortedError(why);
  }
  CKPTD_SYNC_POINT("save.journaled");
  RankStagedLocked(p, r, started, bytes, req, what, resp);
  return absl::OkStatus();
}

PendingRank CheckpointService::NewRank(const Caller& caller, const std::string& session,
                                       const v1::SaveRequest& req) const {
  PendingRank rank;
  rank.rec.set_rank(req.rank());
  // The segment the session mapped, where its extents are (the uid's current one may be newer:
  // a damaged segment retired meanwhile is read, guarded, and its flush fails).
  std::string generation = sessions_.ArenaGeneration(session);
  rank.rec.set_arena_generation(generation.empty() ? deps_.arena->Generation(caller.uid)
                                                   : generation);
  rank.rec.set_blob_name(BlobName(req.rank()));
  v1::RankTimings* timings = rank.rec.mutable_timings();
  timings->set_rank(req.rank());
  timings->set_reserve_us(req.client_reserve_us());
  timings->set_copy_us(req.client_copy_us());
  return rank;
}

absl::Status CheckpointService::CheckRankJoinsLocked(const Caller& caller,
                                                     const v1::SaveRequest& req,
                                                     v1::TierPolicy policy,
                                                     const PendingCheckpoint& p,
                                                     const std::string& what) const {
  if (p.owner_uid != caller.uid) {
    return absl::PermissionDeniedError(absl::StrCat(what, " is being saved by uid ", p.owner_uid,
                                                    "; ", DescribeCaller(caller),
                                                    " may not add ranks to it"));
  }
  if (!p.staging()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is ", v1::CheckpointState_Name(p.api_state()), "; it takes no more ranks"));
  }
  if (p.world_size != req.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", req.rank(), " says world_size ",
                                                   req.world_size(), " but earlier ranks said ",
                                                   p.world_size));
  }
  if (p.tier_policy != policy) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": rank ", req.rank(), " asks for tier policy ", v1::TierPolicy_Name(policy),
        " but earlier ranks asked for ", v1::TierPolicy_Name(p.tier_policy)));
  }
  if (p.local_world_size != LocalWorldSize(req)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", req.rank(),
                                                   " says local_world_size ", LocalWorldSize(req),
                                                   " but earlier ranks said ", p.local_world_size));
  }
  if (p.ranks.contains(req.rank())) {
    return absl::AlreadyExistsError(
        absl::StrCat(what, ": rank ", req.rank(), " is already staged"));
  }
  return absl::OkStatus();
}

void CheckpointService::RankStagedLocked(PendingCheckpoint& p, uint32_t r, absl::Time started,
                                         uint64_t bytes, const v1::SaveRequest& req,
                                         const std::string& what, v1::SaveResponse* resp) {
  PendingRank& staged = p.ranks.at(r);
  staged.Transition(RankPhase::kJournaling, RankPhase::kJournaled);
  // Its timings so far are in memory (the next journal row of the rank, "persisted", has them).
  staged.staged_at = absl::Now();
  staged.rec.mutable_timings()->set_staged_us(MicrosBetween(started, staged.staged_at));
  staged.rec.mutable_timings()->set_staged_at_ms(MsAfter(p.created_unix_ms));
  if (p.first_staged_unix_ms == 0) p.first_staged_unix_ms = NowMs();
  // The flush gate (tier/local_tier.h): flushes start once every rank is staged, or at the
  // latest flush_gate_ms after the first one.
  if (flush_.GateOpen(p.ranks.size(), p.expected_ranks(), p.first_staged_unix_ms, NowMs())) {
    PostGatedFlushesLocked(p);
  }
  changed_.SignalAll();
  resp->set_state(p.api_state());
  resp->set_bytes_staged(bytes);
  {
    const v1::RankTimings& t = staged.rec.timings();
    LogScope fields;
    fields.Str("event", "rank_staged").Num("bytes", bytes).Num("staged_us", t.staged_us());
    fields.Num("reserve_us", t.reserve_us()).Num("copy_us", t.copy_us());
    spdlog::debug("{} rank {} staged ({} shards, {} bytes)", what, r, req.shards_size(), bytes);
  }
  if (p.ranks.size() == p.expected_ranks()) {
    LogScope fields;
    fields.Str("event", "all_staged").Num("ranks", p.ranks.size());
    fields.Num("all_staged_ms", MsAfter(p.created_unix_ms));
    spdlog::info("{}: every rank staged ({} ranks)", what, p.ranks.size());
  }
}

void CheckpointService::PostFlush(const Key& key, uint32_t rank) {
  PendingCheckpoint& p = *pending_.at(key);
  PendingRank& pr = p.ranks.at(rank);
  pr.Transition(RankPhase::kJournaled, RankPhase::kFlushing);
  ++p.flushes_in_flight;
  if (!flush_.Post([this, key, rank] { FlushRank(key, rank); })) {
    // The pool only refuses while shutting down: the rank stays journaled and resumes at start.
    --p.flushes_in_flight;
    pr.Transition(RankPhase::kFlushing, RankPhase::kJournaled);
  }
}

void CheckpointService::PostGatedFlushesLocked(PendingCheckpoint& p) {
  if (p.aborting()) return;
  for (auto& [r, pr] : p.ranks) {
    if (pr.phase() == RankPhase::kJournaled) PostFlush(Key{p.job, p.step}, r);
  }
}

void CheckpointService::MaybeStartCommitLocked(PendingCheckpoint& p) {
  if (p.phase() != CheckpointPhase::kPersisting || !p.ready_to_commit()) return;
  if (p.multi_node()) {
    // The cluster thread publishes this node's part and commits with the others (cluster.cc).
    p.Transition(CheckpointPhase::kPersisting, CheckpointPhase::kAwaitingCluster);
    p.cluster.waiting_for = "publishing this node's part";
    cluster_wake_ = true;
    changed_.SignalAll();
    return;
  }
  p.Transition(CheckpointPhase::kPersisting, CheckpointPhase::kCommitting);
  Key key{p.job, p.step};
  if (!deps_.flush_pool->Post([this, key] { CommitCheckpoint(key); })) {
    // Shutting down: it stays journaled and commits after the next start.
    p.Transition(CheckpointPhase::kCommitting, CheckpointPhase::kPersisting);
  }
}

absl::Status CheckpointService::Commit(const Caller& caller, const v1::CommitRequest& req,
                                       v1::CheckpointStatus* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobStep(req.job(), req.step()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kWrite));
  const std::string what = CkptName(req.job(), req.step());
  if (!req.partial()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": Commit is only for intentionally partial sets (partial=true); a complete "
                     "checkpoint commits by itself once all ranks are staged"));
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(Key{req.job(), req.step()});
  if (it == pending_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is not being saved"));
  }
  PendingCheckpoint& p = *it->second;
  // Checked again on what was found: the check above passes for a job with no owner yet.
  CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), p.owner_uid, Access::kWrite));
  if (p.aborting()) return absl::AbortedError(absl::StrCat(what, " was aborted: ", p.error));
  if (p.committing()) {  // already being committed: nothing to journal (and no row to race)
    FillStatusLocked(p, resp);
    return absl::OkStatus();
  }
  if (p.multi_node() && !p.coordinator()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     " spans nodes and this daemon does not hold rank 0: commit it partial on the "
                     "coordinator (the daemon of rank 0), which commits the node parts there are"));
  }
  p.partial = true;
  if (p.staging()) p.Transition(CheckpointPhase::kStaging, CheckpointPhase::kPersisting);
  // The partial flag; the commit decides anyway. p stays valid across the write (pinned).
  JournalUnlocked(p, {}).IgnoreError();
  if (p.aborting()) {
    std::string why = absl::StrCat(what, " was aborted: ", p.error);
    if (p.idle()) FinishAbortLocked(p);
    return absl::AbortedError(why);
  }
  PostGatedFlushesLocked(p);
  MaybeStartCommitLocked(p);
  FillStatusLocked(p, resp);
  changed_.SignalAll();
  return absl::OkStatus();
}

}  // namespace ckptd
