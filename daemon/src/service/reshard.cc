// Offline reshard: a background job that reads a COMMITTED checkpoint through the load planner
// and writes a new checkpoint in the layout a spec describes (format/reshard_spec.h). The target
// is recorded PERSISTING (synced) before any byte is written, so a crash leaves a row recovery
// aborts and collects; the target's manifest is written last through the same durable path as a
// save's, so the new checkpoint appears atomically. The source is never written.
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/align.h"
#include "format/blob_layout.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/names.h"
#include "format/region.h"
#include "format/reshard_spec.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

struct CheckpointService::ReshardJob {
  Key source;
  Key target;
  ReshardSpec spec;
  std::shared_ptr<const Manifest> src;
  std::vector<Storage*> src_tiers;  // where the source is read from (ReadTiers)
  v1::CheckpointRecord rec;         // the target's row (PERSISTING until done)
  uint32_t world_size = 1;
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<bool> cancel{false};
  std::string cancel_reason;
};

// Appends shards to one blob through an aligned buffer, placed as the blob layout says
// (format/blob_layout.h): full buffers are written with O_DIRECT at aligned offsets, zero padding
// goes before each shard up to its offset, and every shard's block checksums are computed as its
// bytes stream through.
class BlobAppender {
 public:
  BlobAppender(std::unique_ptr<BlobWriter> w, uint32_t block_bytes)
      : w_(std::move(w)), crcs_(block_bytes) {
    buf_ = AllocateAligned(limits::kReshardChunkBytes);
  }
  bool ok() const { return buf_ != nullptr; }
  // Starts a shard where the layout places the next one (after zero padding).
  absl::Status BeginShard() {
    CKPTD_RETURN_IF_ERROR(PadTo(layout_.next_offset()));
    shard_bytes_ = 0;
    return absl::OkStatus();
  }
  absl::Status Append(const uint8_t* p, uint64_t n) {
    shard_bytes_ += n;
    for (uint64_t left = n; left > 0;) {
      uint64_t take = std::min(left, limits::kReshardChunkBytes - used_);
      std::memcpy(buf_.get() + used_, p, take);
      crcs_.Update(p, take);
      used_ += take, p += take, left -= take;
      if (used_ == limits::kReshardChunkBytes) CKPTD_RETURN_IF_ERROR(Spill());
    }
    return absl::OkStatus();
  }
  // Ends the shard begun last: its place in the blob, and its block crcs into *crcs (the short
  // last block included).
  absl::StatusOr<ShardPlacement> EndShard(std::vector<uint32_t>* crcs) {
    *crcs = crcs_.Finish();
    CKPTD_ASSIGN_OR_RETURN(ShardPlacement placed, layout_.Append(shard_bytes_));
    CKPTD_CHECK(placed.length == 0 || placed.offset + placed.length == written_ + used_);
    return placed;
  }
  // Writes the rest (padded to the layout's size) and syncs; returns the blob's size.
  absl::StatusOr<uint64_t> Finish() {
    CKPTD_RETURN_IF_ERROR(PadTo(layout_.size_bytes()));
    if (used_ > 0) CKPTD_RETURN_IF_ERROR(Spill());
    CKPTD_RETURN_IF_ERROR(w_->Sync());
    return layout_.size_bytes();
  }

 private:
  // Zeroes up to blob offset `end`, which the layout aligns: the buffer (a multiple of the
  // alignment, spilled whole) always has room for it.
  absl::Status PadTo(uint64_t end) {
    CKPTD_CHECK(end >= written_ + used_ && end - written_ <= limits::kReshardChunkBytes);
    uint64_t pad = end - written_ - used_;
    std::memset(buf_.get() + used_, 0, pad);
    used_ += pad;
    if (used_ == limits::kReshardChunkBytes) CKPTD_RETURN_IF_ERROR(Spill());
    return absl::OkStatus();
  }
  absl::Status Spill() {
    IoSlice s{buf_.get(), used_, written_};
    CKPTD_RETURN_IF_ERROR(w_->Write(std::span<const IoSlice>(&s, 1)));
    written_ += used_;
    used_ = 0;
    return absl::OkStatus();
  }

  std::unique_ptr<BlobWriter> w_;
  BlobLayout layout_;
  BlockCrcStream crcs_;
  AlignedBuffer buf_;
  uint64_t used_ = 0;         // bytes in buf_
  uint64_t written_ = 0;      // bytes written to the blob before buf_
  uint64_t shard_bytes_ = 0;  // of the shard begun last
};

absl::Status CheckpointService::Reshard(const Caller& caller, const v1::ReshardRequest& req,
                                        v1::CheckpointStatus* resp) {
  const std::string target_job = req.target_job().empty() ? req.job() : req.target_job();
  CKPTD_RETURN_IF_ERROR(ValidateJobStep(req.job(), req.step()));
  CKPTD_RETURN_IF_ERROR(ValidateJobStep(target_job, req.target_step()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, target_job, Access::kWrite));
  const std::string src_name = CkptName(req.job(), req.step());
  const std::string dst_name = CkptName(target_job, req.target_step());
  CKPTD_ASSIGN_OR_RETURN(ReshardSpec spec, ParseReshardSpec(req.spec()));
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> src, GetRecord(req.job(), req.step()));
  if (!src) return absl::NotFoundError(absl::StrCat(src_name, " does not exist"));
  if (src->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(src_name, " is ", v1::CheckpointState_Name(src->summary().state()),
                     "; only COMMITTED checkpoints can be resharded"));
  }
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> m, GetManifest(req.job(), req.step()));
  if (m->header.partial()) {
    return absl::FailedPreconditionError(absl::StrCat(
        src_name, " was committed as partial; only complete checkpoints can be resharded"));
  }
  auto job = std::make_shared<ReshardJob>();
  job->source = Key{req.job(), req.step()};
  job->target = Key{target_job, req.target_step()};
  job->spec = std::move(spec);
  job->src = m;
  CKPTD_ASSIGN_OR_RETURN(job->src_tiers, ReadTiers(*src));
  for (const v1::ItemEntry& item : m->items) {
    const ReshardRule* rule =
        item.kind() == v1::TENSOR ? MatchRule(job->spec, item.name()) : nullptr;
    if (rule != nullptr) job->world_size = std::max(job->world_size, RuleWorldSize(*rule));
    // Per-rank objects keep their saving rank, which must stay below the world size.
    for (const v1::ShardEntry& s : item.shards()) {
      if (item.kind() == v1::OBJECT && item.scope() == v1::PER_RANK) {
        job->world_size = std::max(job->world_size, s.saved_by_rank() + 1);
      }
    }
  }
  v1::CheckpointSummary* s = job->rec.mutable_summary();
  s->set_job(target_job);
  s->set_step(req.target_step());
  s->set_state(v1::PERSISTING);
  s->set_world_size(job->world_size);
  s->set_bytes(m->header.total_bytes());
  s->set_created_unix_ms(NowMs());
  s->set_item_count(m->items.size());
  s->set_origin(absl::StrCat("reshard of ", src_name, " (", job->spec.text, ")"));
  job->rec.set_dir(CheckpointDir(target_job, req.target_step()));
  // The target's row, and its job's owner when the job is new: the caller, as a Save's first
  // journal write records it (found by the simulation: the job was left to the commit, which
  // records the daemon's own uid, and the caller could not read what it had resharded).
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> target_owner, JobOwner(target_job));
  std::vector<MetaStore::Write> first{
      {keys::Checkpoint(target_job, req.target_step()), job->rec.SerializeAsString()}};
  if (!target_owner) {
    v1::JobRecord jr;
    jr.set_owner_uid(caller.uid);
    jr.set_created_unix_ms(s->created_unix_ms());
    first.push_back({keys::Job(target_job), jr.SerializeAsString()});
  }

  return ClaimAndStartReshard(job, std::move(first), resp);
}

absl::Status CheckpointService::ClaimAndStartReshard(const std::shared_ptr<ReshardJob>& job,
                                                     std::vector<MetaStore::Write> first,
                                                     v1::CheckpointStatus* resp) {
  const std::string src_name = CkptName(job->source.first, job->source.second);
  const std::string dst_name = CkptName(job->target.first, job->target.second);
  absl::MutexLock lock(&mu_);
  // Read with mu_ released; everything below is checked after it (ReadRowLocked).
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> existing,
                         ReadRowLocked(job->target, /*corrupt_is_error=*/true));
  if (stopping_) return absl::UnavailableError("the daemon is shutting down");
  if (reshards_.size() >= limits::kReshardJobsMax) {
    return absl::ResourceExhaustedError(absl::StrCat(
        reshards_.size(), " reshards are running; the limit is ", limits::kReshardJobsMax));
  }
  if (auto busy = rewriting_.find(job->source); busy != rewriting_.end()) {
    return absl::AbortedError(
        absl::StrCat(src_name, " is ", busy->second, "; it cannot be resharded"));
  }
  if (existing || pending_.contains(job->target) || reshards_.contains(job->target) ||
      rewriting_.contains(job->target)) {
    return absl::AlreadyExistsError(
        absl::StrCat(dst_name, " already exists; delete it first or choose another target step"));
  }
  // The target is claimed in reshards_ first, so the synced row is written without mu_; an
  // Abort meanwhile sets job->cancel and the thread, once started, finishes it as ABORTED.
  reshards_[job->target] = job;
  KeyChangedLocked(job->target);
  mu_.Unlock();
  absl::Status put =
      committer_.Commit(keys::Checkpoint(job->target.first, job->target.second), std::move(first));
  if (put.ok()) CKPTD_SYNC_POINT("reshard.target_recorded");
  mu_.Lock();
  if (!put.ok()) {
    reshards_.erase(job->target);
    KeyChangedLocked(job->target);
    changed_.SignalAll();
    return Annotate(put, absl::StrCat(dst_name, ": recording the reshard"));
  }
  *resp->mutable_summary() = job->rec.summary();
  spdlog::info("{}: {} started", dst_name, job->rec.summary().origin());
  // Never full: the pool's queue holds kReshardJobsMax and reshards_ admits no more; refused only
  // once the daemon is shutting down, when the job ends ABORTED at once.
  absl::Status posted =
      reshard_pool_.Post([this, job] { RunReshard(job); }, WorkerPool::WhenFull::kRefuse);
  if (!posted.ok()) {
    mu_.Unlock();
    FinishReshard(*job, posted);
    mu_.Lock();
    return Annotate(posted, absl::StrCat(dst_name, ": starting the reshard"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::CopyShard(ReshardJob& job, const PlanRequest& whole,
                                          BlobAppender& out, v1::ShardEntry* shard) {
  // Tensors go through the bounded buffer in chunks contiguous in the shard; objects whole.
  std::vector<PlanRequest> parts = {whole};
  if (whole.item->kind() == v1::TENSOR) {
    std::vector<uint64_t> shape(whole.item->shape().begin(), whole.item->shape().end());
    CKPTD_ASSIGN_OR_RETURN(uint32_t elem, DTypeSize(whole.item->dtype()));
    parts.clear();
    for (v1::Region& part :
         ContiguousChunks(shape, whole.region, limits::kReshardChunkBytes / elem)) {
      parts.push_back(PlanRequest{whole.item, std::move(part), nullptr});
    }
  }
  const PlanOptions options = loader_.LoadPlanOptions(job.src->header.checksum_block_bytes());
  std::vector<uint8_t> chunk;
  for (const PlanRequest& part : parts) {
    if (deps_.options->debug_reshard_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(deps_.options->debug_reshard_delay_ms));
    }
    if (job.cancel.load()) return absl::CancelledError(job.cancel_reason);
    CKPTD_ASSIGN_OR_RETURN(LoadPlan plan, PlanLoad(*job.src, std::span(&part, 1), options));
    chunk.resize(plan.request_bytes[0]);
    uint8_t* dst = chunk.data();
    std::vector<uint64_t> read(job.src_tiers.size());
    CKPTD_RETURN_IF_ERROR(
        loader_.ReadPlan(*job.src, plan, std::span(&dst, 1), job.src_tiers, read));
    CKPTD_RETURN_IF_ERROR(out.Append(chunk.data(), chunk.size()));
    shard->set_length(shard->length() + chunk.size());
    job.bytes_done += chunk.size();
  }
  return absl::OkStatus();
}

absl::StatusOr<Manifest> CheckpointService::WriteReshard(ReshardJob& job) {
  const Manifest& src = *job.src;
  const std::string dir = CheckpointDir(job.target.first, job.target.second);
  const uint32_t block = deps_.options->checksum_block_bytes;
  Manifest m;
  for (const v1::ItemEntry& item : src.items) {
    v1::ItemEntry e = item;
    e.clear_shards();
    m.items.push_back(std::move(e));
  }
  for (uint32_t rank = 0; rank < job.world_size; ++rank) {
    std::unique_ptr<BlobAppender> out;
    for (size_t i = 0; i < src.items.size(); ++i) {
      const v1::ItemEntry& item = src.items[i];
      std::vector<std::pair<const v1::ShardEntry*, v1::Region>> mine;
      if (item.kind() == v1::TENSOR) {
        std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
        for (auto& [r, region] : TargetRegions(job.spec, item.name(), shape)) {
          if (r == rank) mine.emplace_back(nullptr, std::move(region));
        }
      } else {
        for (const v1::ShardEntry& s : item.shards()) {
          uint32_t owner = item.scope() == v1::PER_RANK ? s.saved_by_rank() : 0;
          if (owner == rank) mine.emplace_back(&s, v1::Region());
        }
      }
      for (auto& [object, region] : mine) {
        if (out == nullptr) {
          CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> w,
                                 deps_.storage->CreateBlob(absl::StrCat(dir, "/", BlobName(rank))));
          out = std::make_unique<BlobAppender>(std::move(w), block);
          if (!out->ok()) return absl::ResourceExhaustedError("reshard write buffer");
        }
        v1::ShardEntry* shard = m.items[i].add_shards();
        shard->set_blob_id(rank);
        // The target rank writing it: a per-rank object keeps its saving rank (owner == rank);
        // a replicated one belongs to rank 0 of the target, whatever rank stored it in the
        // source (which may be beyond the target's world size).
        shard->set_saved_by_rank(rank);
        CKPTD_RETURN_IF_ERROR(out->BeginShard());
        if (object == nullptr) *shard->mutable_region() = region;
        CKPTD_RETURN_IF_ERROR(CopyShard(job, PlanRequest{&item, region, object}, *out, shard));
        std::vector<uint32_t> crcs;
        CKPTD_ASSIGN_OR_RETURN(ShardPlacement placed, out->EndShard(&crcs));
        shard->set_offset(placed.offset);
        for (uint32_t c : crcs) shard->add_block_crc32c(c);
      }
    }
    if (out != nullptr) {
      CKPTD_ASSIGN_OR_RETURN(uint64_t size, out->Finish());
      CKPTD_SYNC_POINT("reshard.blob_written");
      *m.header.add_blobs() = MakeBlobInfo(rank, size);
    }
    m.header.add_ranks_present(rank);
  }
  v1::ManifestHeader& h = m.header;
  h.set_format_version(kManifestFormatVersion);
  h.set_job(job.target.first);
  h.set_step(job.target.second);
  h.set_world_size(job.world_size);
  h.set_partial(src.header.partial());
  h.set_created_unix_ms(job.rec.summary().created_unix_ms());
  h.set_committed_unix_ms(NowMs());
  h.set_checksum_block_bytes(block);
  h.set_total_bytes(src.header.total_bytes());
  h.set_item_count(m.items.size());
  h.set_origin(job.rec.summary().origin());
  return m;
}

void CheckpointService::RunReshard(const std::shared_ptr<ReshardJob>& job) {
  absl::StatusOr<Manifest> m = WriteReshard(*job);
  absl::Status st = m.status();
  if (st.ok() && job->cancel.load()) st = absl::CancelledError(job->cancel_reason);
  if (st.ok()) {
    st = WriteCommitted(*m, CheckpointDir(job->target.first, job->target.second), v1::TIER_LOCAL);
  }
  if (st.ok()) {
    CKPTD_SYNC_POINT("reshard.committed");
    absl::MutexLock lock(&mu_);
    manifest_cache_.Put(job->target, std::make_shared<const Manifest>(*std::move(m)));
  }
  // Last: once the job has left reshards_, Shutdown no longer waits for this thread and the
  // service may be destroyed (found by the simulation: caching the manifest after this touched a
  // destroyed service — heap corruption after a restart that followed a reshard).
  FinishReshard(*job, st);
}

void CheckpointService::FinishReshard(ReshardJob& job, const absl::Status& status) {
  const std::string name = CkptName(job.target.first, job.target.second);
  if (status.ok()) {
    spdlog::info("{} COMMITTED ({})", name, job.rec.summary().origin());
  } else {
    spdlog::warn("{} ABORTED: {}", name, status.ToString());
    absl::Status removed = deps_.storage->RemoveAll(job.rec.dir());
    if (!removed.ok()) spdlog::error("removing {}: {}", job.rec.dir(), removed.ToString());
    CKPTD_SYNC_POINT("reshard.abort_files_removed");
    v1::CheckpointRecord rec = job.rec;
    rec.mutable_summary()->set_state(v1::ABORTED);
    rec.mutable_summary()->set_error(std::string(status.message()));
    absl::Status put = PutRecordSync(rec);
    if (!put.ok()) spdlog::error("recording abort of {}: {}", name, put.ToString());
  }
  absl::MutexLock lock(&mu_);
  if (reshards_.erase(job.target) != 0) KeyChangedLocked(job.target);
  changed_.SignalAll();
}

bool CheckpointService::CancelReshardLocked(const Key& key, const std::string& reason,
                                            v1::CheckpointStatus* resp) {
  auto it = reshards_.find(key);
  if (it == reshards_.end()) return false;
  ReshardJob& job = *it->second;
  if (!job.cancel.load()) {
    job.cancel_reason = absl::StrCat(
        "cancelled: ", reason.empty() ? "aborted by a client" : reason.substr(0, 1024));
    job.cancel = true;
  }
  ReshardStatusLocked(key, resp);
  resp->mutable_summary()->set_state(v1::ABORTED);
  return true;
}

std::optional<CheckpointService::Key> CheckpointService::ReshardReadingLocked(
    const Key& source) const {
  for (const auto& [target, job] : reshards_) {
    if (job->source == source) return target;
  }
  return std::nullopt;
}

bool CheckpointService::ReshardStatusLocked(const Key& key, v1::CheckpointStatus* resp) const {
  auto it = reshards_.find(key);
  if (it == reshards_.end()) return false;
  *resp->mutable_summary() = it->second->rec.summary();
  resp->set_bytes_staged(it->second->bytes_done.load());
  resp->set_bytes_persisted(it->second->bytes_done.load());
  return true;
}

void CheckpointService::StopReshards() {
  std::vector<std::shared_ptr<ReshardJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, job] : reshards_) {
      job->cancel_reason = "cancelled: the daemon is shutting down";
      job->cancel = true;
      jobs.push_back(job);
    }
  }
  // Each job removes itself once its thread has cleaned up.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::map<Key, std::shared_ptr<ReshardJob>>* r) { return r->empty(); }, &reshards_));
}

}  // namespace ckptd
