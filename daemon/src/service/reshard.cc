// Offline reshard, the lifecycle's side (the data path is resharder.h's): the Reshard RPC checks
// the source and claims the target key in reshards_ (beside pending_ and rewriting_, under the
// lifecycle lock), records the target PERSISTING (synced) before any byte is written, so a crash
// leaves a row recovery aborts and collects, and hands the job to the resharder. When its blobs
// are written, the target's manifest goes through the same durable path as a save's
// (WriteCommitted), so the new checkpoint appears atomically; a failure or a cancel records it
// ABORTED with its files removed. The source is never written.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "format/names.h"
#include "format/reshard_spec.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

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
  // A source another daemon committed to the store is adopted first (as for a load); its owner
  // is checked once it is (owners.cc), before anything of it is read.
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> src,
                         ReadRecordOrAdopt(req.job(), req.step(), /*corrupt_is_error=*/true));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));  // before NOT_FOUND
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
  job->src_tiers = WithPeers(*src, std::move(job->src_tiers));
  job->world_size = ReshardWorldSize(job->spec, *m);
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
  // The target job's owner: claimed for the caller when the job is new, as a Save's first claims
  // it (owners.cc; found by the simulation: the job was left to the commit, which recorded the
  // daemon's own uid, and the caller could not read what it had resharded), before its row.
  CKPTD_ASSIGN_OR_RETURN(job->owner_uid, ClaimJobOwner(target_job, caller.uid));
  CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, target_job, job->owner_uid, Access::kWrite));
  std::vector<MetaStore::Write> first{
      {keys::Checkpoint(target_job, req.target_step()), job->rec.SerializeAsString()}};

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
  absl::Status posted = resharder_.Start(
      job, [this](ReshardJob& j, absl::StatusOr<Manifest> m) { CommitReshard(j, std::move(m)); });
  if (!posted.ok()) {
    mu_.Unlock();
    FinishReshard(*job, posted);
    mu_.Lock();
    return Annotate(posted, absl::StrCat(dst_name, ": starting the reshard"));
  }
  return absl::OkStatus();
}

void CheckpointService::CommitReshard(ReshardJob& job, absl::StatusOr<Manifest> m) {
  absl::Status st = m.status();
  if (st.ok() && job.cancel.load()) st = absl::CancelledError(job.cancel_reason);
  if (st.ok()) {
    *m->header.mutable_owner() = OwnerRecordOf(job.owner_uid);
    st = WriteCommitted(*m, CheckpointDir(job.target.first, job.target.second), v1::TIER_LOCAL);
  }
  if (st.ok()) {
    CKPTD_SYNC_POINT("reshard.committed");
    absl::MutexLock lock(&mu_);
    manifest_cache_.Put(job.target, std::make_shared<const Manifest>(*std::move(m)));
  }
  // Last: once the job has left reshards_, Shutdown no longer waits for this thread and the
  // service may be destroyed (found by the simulation: caching the manifest after this touched a
  // destroyed service — heap corruption after a restart that followed a reshard).
  FinishReshard(job, st);
}

void CheckpointService::FinishReshard(ReshardJob& job, const absl::Status& status) {
  const std::string name = CkptName(job.target.first, job.target.second);
  if (deps_.metrics != nullptr) {
    deps_.metrics->Reshard(job.target.first, status.ok() ? "committed" : "aborted");
  }
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
