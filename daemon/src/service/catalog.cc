// Catalog: list, status, inspect, latest and delete, answered from the index (and, for
// checkpoints being saved, from the in-memory state, which is fresher).
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "format/names.h"
#include "index/keys.h"
#include "common/limits.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

uint32_t PageSize(uint32_t asked, uint32_t def, uint32_t max) {
  return asked == 0 ? def : std::min(asked, max);
}

}  // namespace

absl::StatusOr<std::optional<v1::CheckpointRecord>> CheckpointService::GetRecord(
    const std::string& job, uint64_t step) {
  CKPTD_ASSIGN_OR_RETURN(std::optional<std::string> raw,
                         deps_.meta->Get(keys::Checkpoint(job, step)));
  if (!raw) return std::nullopt;
  v1::CheckpointRecord rec;
  if (!rec.ParseFromString(*raw)) {
    return absl::DataLossError(absl::StrCat("index row of checkpoint ", job, "/", step,
                                            " does not parse"));
  }
  return rec;
}

absl::StatusOr<std::optional<uint32_t>> CheckpointService::JobOwner(const std::string& job) {
  CKPTD_ASSIGN_OR_RETURN(std::optional<std::string> raw, deps_.meta->Get(keys::Job(job)));
  if (!raw) return std::nullopt;
  v1::JobRecord rec;
  if (!rec.ParseFromString(*raw)) {
    return absl::DataLossError(absl::StrCat("index row of job ", job, " does not parse"));
  }
  return rec.owner_uid();
}

absl::Status CheckpointService::CheckAccess(const Caller& caller, const std::string& job,
                                           Access access) {
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(job));
  if (!owner || *owner == caller.uid) return absl::OkStatus();
  if (caller.admin && access != Access::kWrite) return absl::OkStatus();
  const char* what = access == Access::kRead ? "read" : access == Access::kWrite ? "write" : "delete";
  return absl::PermissionDeniedError(absl::StrCat("job ", job, " belongs to uid ", *owner, "; ",
                                                  DescribeCaller(caller), " may not ", what,
                                                  " it"));
}

absl::Status CheckpointService::PutRecordSync(const v1::CheckpointRecord& rec) {
  MetaStore::Write w{keys::Checkpoint(rec.summary().job(), rec.summary().step()),
                     rec.SerializeAsString()};
  return deps_.meta->Commit({&w, 1}, /*sync=*/true);
}

absl::StatusOr<uint64_t> CheckpointService::LatestCommitted(const std::string& job) {
  std::optional<uint64_t> latest;
  absl::Status parse = absl::OkStatus();
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::CheckpointPrefix(job), "", 0, [&](std::string_view key, std::string_view value) {
        v1::CheckpointRecord rec;
        if (!rec.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          parse = absl::DataLossError(absl::StrCat("index row ", key.size(), " does not parse"));
          return false;
        }
        if (rec.summary().state() == v1::COMMITTED) latest = rec.summary().step();
        return true;
      }));
  CKPTD_RETURN_IF_ERROR(parse);
  if (!latest) {
    return absl::NotFoundError(absl::StrCat("job ", job, " has no committed checkpoint"));
  }
  return *latest;
}

absl::Status CheckpointService::Latest(const Caller& caller, const v1::LatestRequest& req, v1::LatestResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  CKPTD_ASSIGN_OR_RETURN(uint64_t step, LatestCommitted(req.job()));
  resp->set_step(step);
  return absl::OkStatus();
}

absl::Status CheckpointService::ListJobs(const Caller& /*caller: every uid may list jobs and owners*/, const v1::ListJobsRequest& req,
                                         v1::ListJobsResponse* resp) {
  uint32_t page = PageSize(req.page_size(), limits::kListPageSizeDefault, limits::kListPageSizeMax);
  std::string start_after = req.page_token().empty() ? "" : keys::Job(req.page_token());
  std::vector<std::pair<std::string, v1::JobRecord>> jobs;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(keys::JobPrefix(), start_after, page + 1,
                                         [&](std::string_view key, std::string_view value) {
                                           absl::StatusOr<std::string> job = keys::DecodeJob(key);
                                           v1::JobRecord jr;
                                           jr.ParseFromArray(value.data(),
                                                             static_cast<int>(value.size()));
                                           if (job.ok()) jobs.emplace_back(*job, jr);
                                           return true;
                                         }));
  if (jobs.size() > page) {
    jobs.resize(page);
    resp->set_next_page_token(jobs.back().first);
  }
  for (const auto& [job, jr] : jobs) {
    v1::JobSummary* s = resp->add_jobs();
    s->set_job(job);
    s->set_owner_uid(jr.owner_uid());
    uint64_t count = 0;
    CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
        keys::CheckpointPrefix(job), "", 0, [&](std::string_view, std::string_view value) {
          v1::CheckpointRecord rec;
          rec.ParseFromArray(value.data(), static_cast<int>(value.size()));
          ++count;
          if (rec.summary().state() == v1::COMMITTED) {
            s->set_has_committed(true);
            s->set_latest_committed_step(rec.summary().step());
          }
          return true;
        }));
    s->set_checkpoint_count(count);
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::ListCheckpoints(const Caller& caller, const v1::ListCheckpointsRequest& req,
                                                v1::ListCheckpointsResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  uint32_t page = PageSize(req.page_size(), limits::kListPageSizeDefault, limits::kListPageSizeMax);
  std::string start_after;
  if (!req.page_token().empty()) {
    uint64_t step = 0;
    if (!absl::SimpleAtoi(req.page_token(), &step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_token \"", req.page_token(), "\" is not one this daemon gave"));
    }
    start_after = keys::Checkpoint(req.job(), step);
  }
  std::vector<v1::CheckpointRecord> recs;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(keys::CheckpointPrefix(req.job()), start_after,
                                         page + 1, [&](std::string_view, std::string_view v) {
                                           recs.emplace_back();
                                           recs.back().ParseFromArray(
                                               v.data(), static_cast<int>(v.size()));
                                           return true;
                                         }));
  if (recs.size() > page) {
    recs.resize(page);
    resp->set_next_page_token(absl::StrCat(recs.back().summary().step()));
  }
  absl::MutexLock lock(&mu_);
  for (const v1::CheckpointRecord& rec : recs) {
    auto it = pending_.find(Key{req.job(), rec.summary().step()});
    *resp->add_checkpoints() = it != pending_.end() ? SummaryLocked(*it->second) : rec.summary();
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::GetStatus(const Caller& caller, const v1::GetStatusRequest& req,
                                          v1::CheckpointStatus* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(Key{req.job(), req.step()});
    if (it != pending_.end()) {
      FillStatusLocked(*it->second, resp);
      return absl::OkStatus();
    }
    if (ReshardStatusLocked(Key{req.job(), req.step()}, resp)) return absl::OkStatus();
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         GetRecord(req.job(), req.step()));
  if (!rec) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", req.job(), "/", req.step(), " does not exist"));
  }
  *resp->mutable_summary() = rec->summary();
  if (rec->summary().state() == v1::COMMITTED) {
    resp->set_bytes_staged(rec->summary().bytes());
    resp->set_bytes_persisted(rec->summary().bytes());
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::Inspect(const Caller& caller, const v1::InspectRequest& req,
                                        v1::InspectResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  const std::string what = absl::StrCat("checkpoint ", req.job(), "/", req.step());
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         GetRecord(req.job(), req.step()));
  if (!rec) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  *resp->mutable_summary() = rec->summary();
  if (rec->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", v1::CheckpointState_Name(rec->summary().state()),
                     "; only COMMITTED checkpoints have items to inspect"));
  }
  uint32_t page =
      PageSize(req.page_size(), limits::kInspectPageSizeDefault, limits::kInspectPageSizeMax);
  if (req.items_size() > 0) {
    if (static_cast<uint32_t>(req.items_size()) > limits::kInspectPageSizeMax) {
      return absl::InvalidArgumentError(absl::StrCat("inspect of ", req.items_size(),
                                                     " named items; the limit is ",
                                                     limits::kInspectPageSizeMax));
    }
    for (const std::string& name : req.items()) {
      CKPTD_ASSIGN_OR_RETURN(std::optional<std::string> raw,
                             deps_.meta->Get(keys::Item(req.job(), req.step(), name)));
      if (!raw) {
        return absl::NotFoundError(absl::StrCat("item \"", name, "\" is not in ", what));
      }
      v1::ItemRecord ir;
      ir.ParseFromString(*raw);
      *resp->add_items() = ir.info();
    }
    return absl::OkStatus();
  }
  std::string start_after =
      req.page_token().empty() ? "" : keys::Item(req.job(), req.step(), req.page_token());
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(keys::ItemPrefix(req.job(), req.step()), start_after,
                                         page + 1, [&](std::string_view, std::string_view v) {
                                           v1::ItemRecord ir;
                                           ir.ParseFromArray(v.data(), static_cast<int>(v.size()));
                                           *resp->add_items() = ir.info();
                                           return true;
                                         }));
  if (static_cast<uint32_t>(resp->items_size()) > page) {
    resp->mutable_items()->RemoveLast();
    resp->set_next_page_token(resp->items(resp->items_size() - 1).name());
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::Delete(const Caller& caller, const v1::DeleteRequest& req) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kDelete));
  const std::string what = absl::StrCat("checkpoint ", req.job(), "/", req.step());
  const std::string dir = CheckpointDir(req.job(), req.step());
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(Key{req.job(), req.step()});
    if (it != pending_.end() || reshards_.contains(Key{req.job(), req.step()})) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " is being written (",
          it != pending_.end() ? v1::CheckpointState_Name(it->second->state) : "a reshard",
          "); abort it first"));
    }
    manifest_cache_.erase(Key{req.job(), req.step()});
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         GetRecord(req.job(), req.step()));
  if (!rec) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  // The manifest goes first: a crash after this leaves an index row without a manifest, which
  // recovery aborts — never a deleted checkpoint that comes back.
  CKPTD_RETURN_IF_ERROR(deps_.storage->RemoveAll(absl::StrCat(dir, "/", kManifestFileName)));
  std::vector<MetaStore::Write> writes{{keys::Checkpoint(req.job(), req.step()), std::nullopt}};
  CKPTD_RETURN_IF_ERROR(deps_.meta->Commit(writes, /*sync=*/false));
  CKPTD_RETURN_IF_ERROR(deps_.meta->DeletePrefix(keys::ItemPrefix(req.job(), req.step()), true));
  CKPTD_RETURN_IF_ERROR(deps_.storage->RemoveAll(dir));
  spdlog::info("{} deleted", what);
  return absl::OkStatus();
}

}  // namespace ckptd
