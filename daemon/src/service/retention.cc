// Retention of CheckpointService: the catalog's side of tier/retention.h — reading each job's
// COMMITTED rows and upload rows into a plan, and executing it (Delete, or one tier's copy
// removed with the key claimed in rewriting_, files first, then the row).
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<std::vector<RetentionStep>> CheckpointService::PlanJobRetention(
    const std::string& job) {
  std::vector<RetainedCheckpoint> newest_first;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::CheckpointPrefix(job), "", 0, [&](std::string_view, std::string_view value) {
        v1::CheckpointRecord rec;
        if (rec.ParseFromArray(value.data(), static_cast<int>(value.size())) &&
            rec.summary().state() == v1::COMMITTED && rec.summary().job() == job) {
          newest_first.push_back(RetainedCheckpoint{
              .step = rec.summary().step(),
              .local = rec.summary().tiers().local() || rec.summary().tiers().local_part()});
        }
        return true;
      }));
  std::reverse(newest_first.begin(), newest_first.end());  // the scan is in step order
  if (remote_.enabled()) {
    CKPTD_ASSIGN_OR_RETURN(auto uploads, remote_.ReadRows(job));
    for (RetainedCheckpoint& c : newest_first) {
      auto row = uploads.find(c.step);
      if (row == uploads.end()) continue;
      c.remote = row->second.upload().state() == v1::UPLOAD_DURABLE;
      c.upload_pending = !c.remote;
    }
  }
  const DaemonOptions::RetentionRule policy = deps_.options->RetentionOf(job);
  return PlanRetention(newest_first, policy.keep_local, policy.keep_remote, policy.keep_every);
}

absl::Status CheckpointService::CollectGarbage(const Caller& caller, const v1::GcRequest& req,
                                               v1::GcResponse* resp) {
  std::vector<std::string> jobs;
  if (!req.job().empty()) {
    CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
    CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kDelete));
    jobs.push_back(req.job());
  } else {
    std::vector<std::pair<std::string, std::optional<uint32_t>>> all;
    CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
        keys::JobPrefix(), "", 0, [&](std::string_view key, std::string_view value) {
          absl::StatusOr<std::string> job = keys::DecodeJob(key);
          v1::JobRecord jr;
          if (job.ok() && jr.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
            all.emplace_back(*job, jr.owner_uid());
          }
          return true;
        }));
    for (const auto& [job, owner] : all) {
      if (AccessAllowed(caller, job, owner, Access::kDelete).ok()) jobs.push_back(job);
    }
  }
  if (!deps_.options->RetentionOn()) return absl::OkStatus();
  for (const std::string& job : jobs) {
    CKPTD_ASSIGN_OR_RETURN(std::vector<RetentionStep> plan, PlanJobRetention(job));
    for (const RetentionStep& step : plan) {
      v1::GcAction* a = resp->add_actions();
      a->set_job(job);
      a->set_step(step.step);
      a->set_action(RetentionActionName(step.action));
      a->set_why(step.why);
      if (req.dry_run()) continue;
      absl::Status st = ApplyRetention(caller, job, step);
      if (!st.ok()) a->set_error(st.ToString());
      spdlog::info("retention: {} {} ({}){}", RetentionActionName(step.action),
                   CkptName(job, step.step), step.why,
                   st.ok() ? "" : absl::StrCat(": failed: ", st.ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::ApplyRetention(const Caller& caller, const std::string& job,
                                               const RetentionStep& step) {
  if (step.action == RetentionAction::kDelete) {
    v1::DeleteRequest del;
    del.set_job(job);
    del.set_step(step.step);
    return Delete(caller, del);
  }
  const Key key{job, step.step};
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(job));
  {
    absl::MutexLock lock(&mu_);
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                           ReadRowLocked(key, /*corrupt_is_error=*/true));
    CKPTD_RETURN_IF_ERROR(CheckDeletableLocked(key));
    if (!rec || rec->summary().state() != v1::COMMITTED) {
      return absl::FailedPreconditionError(
          absl::StrCat(CkptName(job, step.step), " is no longer COMMITTED"));
    }
    rewriting_.emplace(key, "being trimmed by retention");
    KeyChangedLocked(key);
    manifest_cache_.Erase(key);
  }
  absl::Status st = step.action == RetentionAction::kDropRemote
                        ? remote_.Remove(job, step.step, CheckpointDir(job, step.step), owner)
                        : DropLocalCopy(job, step.step);
  absl::MutexLock lock(&mu_);
  rewriting_.erase(key);
  KeyChangedLocked(key);
  manifest_cache_.Erase(key);
  changed_.SignalAll();
  return st;
}

absl::Status CheckpointService::DropLocalCopy(const std::string& job, uint64_t step) {
  // The remote copy must be durable before the local one goes (the plan says so; the row is
  // checked again here, with the key claimed).
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::UploadRecord> row, remote_.ReadRow(job, step));
  if (!row || row->upload().state() != v1::UPLOAD_DURABLE) {
    return absl::FailedPreconditionError(
        absl::StrCat(CkptName(job, step), " has no durable remote copy; its local copy stays"));
  }
  const std::string dir = CheckpointDir(job, step);
  // Files first (the manifest first), then the row: a crash between leaves a row whose local
  // manifest is gone, which recovery records as on the remote tier only.
  CKPTD_RETURN_IF_ERROR(deps_.storage->RemoveAll(absl::StrCat(dir, "/", kManifestFileName)));
  CKPTD_RETURN_IF_ERROR(deps_.storage->RemoveAll(dir));
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, ReadRecord(job, step));
  if (!rec) return absl::OkStatus();
  rec->mutable_summary()->mutable_tiers()->set_local(false);
  rec->mutable_summary()->mutable_tiers()->set_local_part(false);
  return PutRecordSync(*rec);
}

}  // namespace ckptd
