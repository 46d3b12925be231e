// Catalog: list, status, inspect, latest and delete, answered from the index (and, for
// checkpoints being saved, from the in-memory state, which is fresher).
//
// Delete is linearized with Save, Reshard and commit of the same (job, step) by a tombstone:
//   1. under mu_: its row is read (ReadRowLocked: with mu_ released around the read, and read
//      again unless the key's epoch stayed put, so the row is current once mu_ is held); refused
//      while the key is being written (pending_ or reshards_) or already being deleted; else the
//      key enters rewriting_ ("being deleted"). From here no Save or Reshard can create the key:
//      the row exists until step 4, and Save also names the delete. Save checks the row the same
//      way: a Save cannot slip in between "no pending save" and "row read".
//   2. outside mu_: the row is recorded DELETING with a synced write, so a crash at any later
//      point leaves a tombstone recovery finishes (and never a manifest it would adopt back);
//   3. the manifest is removed, then the directory: nothing else writes there now, so the
//      removal cannot race a new save's files;
//   4. the item/rank/blob rows go, then the checkpoint row itself (synced, last);
//   5. under mu_: the key leaves rewriting_, and a Save of the step may start afresh.
// Neither the synced writes nor the removal happen under mu_. A delete that fails half way
// leaves the row DELETING (shown so); Delete again or a restart finishes it.
//
// Verification of manifests (docs/DESIGN.md "Recovery": never expose a manifest that does not
// verify). A manifest is verified (decoded: framing, checksums, and its job/step) when it is
// adopted at start, for the newest COMMITTED checkpoint of every job at start, and whenever
// Latest (or a Load of "latest") picks a candidate that is not in the manifest cache. One that
// does not verify is recorded CORRUPT: Latest then answers the newest older checkpoint that
// verifies, and a Load of the corrupt one by number is DATA_LOSS. Older checkpoints are not read
// at start (that would read every manifest); one of them that is corrupt fails its load with
// DATA_LOSS from the manifest decode and is marked once Latest or a restart reaches it. A CORRUPT
// row whose manifest verifies again at a later start (restored by an operator) is adopted back.
#include <algorithm>
#include <set>

#include "absl/hash/hash.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

uint32_t PageSize(uint32_t asked, uint32_t def, uint32_t max) {
  return asked == 0 ? def : std::min(asked, max);
}

// What using a CORRUPT or MISSING checkpoint answers.
absl::Status CorruptError(const std::string& job, uint64_t step, const std::string& why,
                          v1::CheckpointState state = v1::CORRUPT) {
  return absl::DataLossError(absl::StrCat(CkptName(job, step), " is ",
                                          v1::CheckpointState_Name(state), ": ", why,
                                          "; load another step (latest skips it) or delete it"));
}

bool Damaged(v1::CheckpointState state) { return state == v1::CORRUPT || state == v1::MISSING; }

}  // namespace

absl::StatusOr<std::optional<v1::CheckpointRecord>> CheckpointService::ReadRecord(
    const std::string& job, uint64_t step) {
  CKPTD_ASSIGN_OR_RETURN(std::optional<std::string> raw,
                         deps_.meta->Get(keys::Checkpoint(job, step)));
  if (!raw) return std::nullopt;
  v1::CheckpointRecord rec;
  if (!rec.ParseFromString(*raw)) {
    return absl::DataLossError(absl::StrCat("index row of checkpoint ", job, "/", step,
                                            " does not parse (a restart repairs it)"));
  }
  return rec;
}

void CheckpointService::KeyChangedLocked(const Key& key) {
  ++key_epochs_[absl::HashOf(key.first, key.second) % kKeyEpochBuckets];
}

absl::StatusOr<std::optional<v1::CheckpointRecord>> CheckpointService::ReadRowLocked(
    const Key& key, bool corrupt_is_error) {
  const size_t bucket = absl::HashOf(key.first, key.second) % kKeyEpochBuckets;
  while (true) {
    const uint64_t epoch = key_epochs_[bucket];
    mu_.Unlock();
    absl::StatusOr<std::optional<v1::CheckpointRecord>> rec =
        corrupt_is_error ? GetRecord(key.first, key.second) : ReadRecord(key.first, key.second);
    mu_.Lock();
    if (key_epochs_[bucket] == epoch) return rec;
  }
}

absl::StatusOr<std::optional<v1::CheckpointRecord>> CheckpointService::GetRecord(
    const std::string& job, uint64_t step) {
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, ReadRecord(job, step));
  if (rec && Damaged(rec->summary().state())) {
    return CorruptError(job, step, rec->summary().error(), rec->summary().state());
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
  return AccessAllowed(caller, job, owner, access);
}

absl::Status CheckpointService::AccessAllowed(const Caller& caller, const std::string& job,
                                              std::optional<uint32_t> owner, Access access) {
  if (!owner || *owner == caller.uid) return absl::OkStatus();
  if (caller.admin && access != Access::kWrite) return absl::OkStatus();
  const char* what = access == Access::kRead    ? "read"
                     : access == Access::kWrite ? "write"
                                                : "delete";
  return absl::PermissionDeniedError(absl::StrCat("job ", job, " belongs to uid ", *owner, "; ",
                                                  DescribeCaller(caller), " may not ", what,
                                                  " it"));
}

absl::Status CheckpointService::PutRecordSync(const v1::CheckpointRecord& rec) {
  std::string key = keys::Checkpoint(rec.summary().job(), rec.summary().step());
  std::vector<MetaStore::Write> w{{key, rec.SerializeAsString()}};
  return committer_.Commit(key, std::move(w));
}

absl::StatusOr<std::vector<uint64_t>> CheckpointService::CommittedSteps(const std::string& job) {
  std::vector<uint64_t> steps;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::CheckpointPrefix(job), "", 0, [&](std::string_view, std::string_view value) {
        v1::CheckpointRecord rec;
        if (rec.ParseFromArray(value.data(), static_cast<int>(value.size())) &&
            rec.summary().state() == v1::COMMITTED) {
          steps.push_back(rec.summary().step());
        }
        return true;
      }));
  std::reverse(steps.begin(), steps.end());  // the scan is in step order
  return steps;
}

absl::StatusOr<uint64_t> CheckpointService::LatestCommitted(const std::string& job,
                                                            v1::Durability durable) {
  CKPTD_ASSIGN_OR_RETURN(std::vector<uint64_t> steps, CommittedSteps(job));
  bool less_durable = false;  // some step verified, but survives less than asked
  for (uint64_t step : steps) {
    // From the manifest cache when it is there (every commit and verified load puts it there).
    absl::StatusOr<std::shared_ptr<const Manifest>> m = GetManifest(job, step);
    if (m.ok()) {
      if (durable == v1::DURABLE_COMMITTED) return step;
      CKPTD_ASSIGN_OR_RETURN(bool survives, Survives(job, step, **m, durable));
      if (survives) return step;
      less_durable = true;
      continue;
    }
    if (absl::IsDataLoss(m.status())) continue;  // GetManifest marked it CORRUPT
    // Deleted meanwhile: the next older one. Otherwise the manifest could not be read at all.
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, ReadRecord(job, step));
    if (rec && rec->summary().state() == v1::COMMITTED) {
      return Annotate(m.status(), absl::StrCat("reading the manifest of ", CkptName(job, step)));
    }
  }
  if (less_durable) {
    return absl::NotFoundError(absl::StrCat("job ", job, " has no committed checkpoint that is ",
                                            v1::Durability_Name(durable),
                                            " (newer ones survive less)"));
  }
  return absl::NotFoundError(absl::StrCat("job ", job, " has no committed checkpoint",
                                          steps.empty() ? "" : " whose manifest verifies"));
}

absl::StatusOr<bool> CheckpointService::Survives(const std::string& job, uint64_t step,
                                                 const Manifest& m, v1::Durability durable) {
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, ReadRecord(job, step));
  if (!rec || rec->summary().state() != v1::COMMITTED) return false;
  const v1::CheckpointSummary& s = rec->summary();
  if (durable == v1::DURABLE_PEER && m.header.blobs_on_nodes() &&
      s.tiers().blobs_without_peer_copy() == 0) {
    return true;  // committed at the peer tier: every blob on its node and a peer
  }
  if (!remote_.enabled()) return s.tiers().remote();
  if (m.header.blobs_on_nodes()) {
    // On the store whole once every node that wrote a blob uploaded its own (remote_every).
    std::set<std::string> nodes;
    for (const v1::BlobInfo& b : m.header.blobs()) {
      if (b.size_bytes() > 0) nodes.insert(b.node());
    }
    for (const std::string& node : nodes) {
      CKPTD_ASSIGN_OR_RETURN(bool there,
                             remote_.remote()->Exists(NodeUploadedPath(rec->dir(), node)));
      if (!there) return false;
    }
    return true;
  }
  if (s.tiers().remote()) return true;
  if (!HasRemoteTier(s.tier_policy())) return false;
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::UploadRecord> row, remote_.ReadRow(job, step));
  return row && row->upload().state() == v1::UPLOAD_DURABLE;
}

absl::Status CheckpointService::MarkCorrupt(const std::string& job, uint64_t step,
                                            const absl::Status& why) {
  const Key key{job, step};
  v1::CheckpointRecord rec;
  {
    // The row is read as Delete does (ReadRowLocked: current once mu_ is held): while the key is
    // in rewriting_ the row stays COMMITTED (Delete is refused), so no Save can create the key
    // before the CORRUPT row lands.
    absl::MutexLock lock(&mu_);
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> found,
                           ReadRowLocked(key, /*corrupt_is_error=*/false));
    if (pending_.contains(key) || reshards_.contains(key) || rewriting_.contains(key)) {
      return absl::OkStatus();
    }
    if (!found || found->summary().state() != v1::COMMITTED) return absl::OkStatus();
    rec = *std::move(found);
    rewriting_.emplace(key, "being marked CORRUPT");
    KeyChangedLocked(key);
    manifest_cache_.Erase(key);
  }
  rec.mutable_summary()->set_state(v1::CORRUPT);
  rec.mutable_summary()->set_error(
      absl::StrCat("its manifest does not verify: ", why.message()).substr(0, 4096));
  spdlog::error("{} is CORRUPT (no longer visible to load and latest): {}", CkptName(job, step),
                why.ToString());
  absl::Status st = PutRecordSync(rec);
  ram_tier_.Drop(key);
  if (deps_.metrics != nullptr) deps_.metrics->CheckpointEnded(job, "corrupt", -1);
  absl::MutexLock lock(&mu_);
  rewriting_.erase(key);
  KeyChangedLocked(key);
  changed_.SignalAll();
  return Annotate(st, absl::StrCat("recording ", CkptName(job, step), " CORRUPT"));
}

absl::Status CheckpointService::Latest(const Caller& caller, const v1::LatestRequest& req,
                                       v1::LatestResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (!v1::Durability_IsValid(req.durable())) {
    return absl::InvalidArgumentError(absl::StrCat("latest of job ", req.job(), ": durability ",
                                                   static_cast<int>(req.durable()),
                                                   " is not one this daemon knows"));
  }
  CKPTD_ASSIGN_OR_RETURN(uint64_t step, LatestReadable(caller, req.job(), req.durable()));
  resp->set_step(step);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> CheckpointService::LatestReadable(const Caller& caller,
                                                           const std::string& job,
                                                           v1::Durability durable) {
  RefreshFromStore(job);  // another daemon may have committed a newer one
  absl::StatusOr<uint64_t> step = LatestCommitted(job, durable);
  // Again once adopted, before any answer, an error too (it may name the job's steps and paths):
  // the caller's check before the refresh passes for a job with no owner yet (owners.cc).
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, job, Access::kRead));
  return step;
}

absl::Status CheckpointService::ListJobs(
    const Caller& /*caller: every uid may list jobs and owners*/, const v1::ListJobsRequest& req,
    v1::ListJobsResponse* resp) {
  uint32_t page = PageSize(req.page_size(), limits::kListPageSizeDefault, limits::kListPageSizeMax);
  if (req.page_token().empty()) RefreshFromStore("");
  std::string start_after = req.page_token().empty() ? "" : keys::Job(req.page_token());
  std::vector<std::pair<std::string, v1::JobRecord>> jobs;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::JobPrefix(), start_after, page + 1, [&](std::string_view key, std::string_view value) {
        absl::StatusOr<std::string> job = keys::DecodeJob(key);
        v1::JobRecord jr;
        if (!jr.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          jr.Clear();  // listed, owner unknown (0)
        }
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
          ++count;
          if (rec.ParseFromArray(value.data(), static_cast<int>(value.size())) &&
              rec.summary().state() == v1::COMMITTED) {
            s->set_has_committed(true);
            s->set_latest_committed_step(rec.summary().step());
          }
          return true;
        }));
    s->set_checkpoint_count(count);
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::ListCheckpoints(const Caller& caller,
                                                const v1::ListCheckpointsRequest& req,
                                                v1::ListCheckpointsResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  uint32_t page = PageSize(req.page_size(), limits::kListPageSizeDefault, limits::kListPageSizeMax);
  std::string start_after;
  if (req.page_token().empty()) RefreshFromStore(req.job());
  if (!req.page_token().empty()) {
    uint64_t step = 0;
    if (!absl::SimpleAtoi(req.page_token(), &step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_token \"", req.page_token(), "\" is not one this daemon gave"));
    }
    start_after = keys::Checkpoint(req.job(), step);
  }
  // A row that does not parse is listed with no state and an error saying so (a restart repairs
  // it); a key that does not decode is not a checkpoint of this job and is skipped.
  std::vector<v1::CheckpointRecord> recs;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::CheckpointPrefix(req.job()), start_after, 0,
      [&](std::string_view key, std::string_view v) {
        absl::StatusOr<std::pair<std::string, uint64_t>> id = keys::DecodeCheckpoint(key);
        if (!id.ok() || id->first != req.job()) return true;
        v1::CheckpointRecord& rec = recs.emplace_back();
        if (!rec.ParseFromArray(v.data(), static_cast<int>(v.size())) ||
            rec.summary().job() != req.job() || rec.summary().step() != id->second) {
          rec.Clear();
          rec.mutable_summary()->set_error("its index row does not parse (a restart repairs it)");
        }
        rec.mutable_summary()->set_job(req.job());
        rec.mutable_summary()->set_step(id->second);
        return recs.size() <= page;  // one more than a page says whether another follows
      }));
  // Again once adopted and listed (owners.cc): the check above passes for a job with no owner.
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (recs.size() > page) {
    recs.resize(page);
    resp->set_next_page_token(absl::StrCat(recs.back().summary().step()));
  }
  std::map<uint64_t, v1::UploadRecord> uploads;
  if (remote_.enabled()) {
    CKPTD_ASSIGN_OR_RETURN(uploads, remote_.ReadRows(req.job()));
  }
  for (v1::CheckpointRecord& rec : recs) {
    auto row = uploads.find(rec.summary().step());
    if (rec.summary().state() == v1::COMMITTED && row != uploads.end()) {
      remote_.Fill(req.job(), rec.summary().step(), row->second,
                   rec.mutable_summary()->mutable_tiers());
    }
  }
  for (v1::CheckpointRecord& rec : recs) {
    if (rec.summary().state() == v1::COMMITTED) {
      FillRamTier(rec.mutable_summary());
      FillPeerCopies(rec.mutable_summary());
    }
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
    // The owner is checked again on what is found (the check above passes for a job that had
    // no owner yet): the saver's, the reshard's, or, for a row, the job's once adopted.
    auto it = pending_.find(Key{req.job(), req.step()});
    if (it != pending_.end()) {
      CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), it->second->owner_uid, Access::kRead));
      FillStatusLocked(*it->second, resp);
      return absl::OkStatus();
    }
    if (auto r = reshards_.find(Key{req.job(), req.step()}); r != reshards_.end()) {
      CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), r->second->owner_uid, Access::kRead));
    }
    if (ReshardStatusLocked(Key{req.job(), req.step()}, resp)) return absl::OkStatus();
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         ReadRecordOrAdopt(req.job(), req.step()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (!rec) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", req.job(), "/", req.step(), " does not exist"));
  }
  *resp->mutable_summary() = rec->summary();
  *resp->mutable_timings() = rec->timings();
  if (rec->summary().state() == v1::COMMITTED) {
    resp->set_bytes_staged(rec->summary().bytes());
    resp->set_bytes_persisted(rec->summary().bytes());
    FillRemoteTier(resp->mutable_summary());
    FillRamTier(resp->mutable_summary());
    FillPeerCopies(resp->mutable_summary());
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::Inspect(const Caller& caller, const v1::InspectRequest& req,
                                        v1::InspectResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  const std::string what = absl::StrCat("checkpoint ", req.job(), "/", req.step());
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         ReadRecordOrAdopt(req.job(), req.step()));
  // Again once adopted and found (owners.cc): the check above passes for a job with no owner.
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (!rec) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  *resp->mutable_summary() = rec->summary();
  if (Damaged(rec->summary().state())) {  // as a load of it: clients inspect first
    return CorruptError(req.job(), req.step(), rec->summary().error(), rec->summary().state());
  }
  if (rec->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", v1::CheckpointState_Name(rec->summary().state()),
                     "; only COMMITTED checkpoints have items to inspect"));
  }
  FillRamTier(resp->mutable_summary());
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
      if (!ir.ParseFromString(*raw)) {
        return absl::DataLossError(
            absl::StrCat("the index row of item \"", name, "\" of ", what, " does not parse"));
      }
      *resp->add_items() = ir.info();
    }
    return absl::OkStatus();
  }
  std::string start_after =
      req.page_token().empty() ? "" : keys::Item(req.job(), req.step(), req.page_token());
  absl::Status parsed = absl::OkStatus();
  const std::string prefix = keys::ItemPrefix(req.job(), req.step());
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      prefix, start_after, page + 1, [&](std::string_view key, std::string_view v) {
        v1::ItemRecord ir;
        if (!ir.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
          parsed = absl::DataLossError(absl::StrCat("the index row of item \"",
                                                    std::string(key.substr(prefix.size())),
                                                    "\" of ", what, " does not parse"));
          return false;
        }
        *resp->add_items() = ir.info();
        return true;
      }));
  CKPTD_RETURN_IF_ERROR(parsed);
  if (static_cast<uint32_t>(resp->items_size()) > page) {
    resp->mutable_items()->RemoveLast();
    resp->set_next_page_token(resp->items(resp->items_size() - 1).name());
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::CheckDeletableLocked(const Key& key) const {
  const std::string what = CkptName(key.first, key.second);
  auto it = pending_.find(key);
  if (it != pending_.end() || reshards_.contains(key)) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " is being written (",
        it != pending_.end() ? v1::CheckpointState_Name(it->second->api_state()) : "a reshard",
        "); abort it first"));
  }
  if (std::optional<Key> target = ReshardReadingLocked(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is the source of a running reshard to ",
                     CkptName(target->first, target->second), "; wait for it or abort it first"));
  }
  auto busy = rewriting_.find(key);
  if (busy != rewriting_.end()) {
    return absl::AbortedError(
        absl::StrCat(what, " is already ", busy->second, "; retry once that has finished"));
  }
  if (verifying_.contains(key)) {  // verify.cc: its files are being read
    return absl::AbortedError(
        absl::StrCat(what, " is being verified; retry once that has finished"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::Delete(const Caller& caller, const v1::DeleteRequest& req) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kDelete));
  const std::string what = CkptName(req.job(), req.step());
  const Key key{req.job(), req.step()};
  // A checkpoint another daemon committed to the store is adopted first (a delete is of every
  // tier), so its owner is this job's here when checked below. A row that does not parse is
  // deleted all the same (DATA_LOSS here).
  ReadRecordOrAdopt(req.job(), req.step()).status().IgnoreError();
  // Once adopted, before any answer about the key (NOT_FOUND, or what is writing it, would tell
  // another uid which steps the job has); checked again below, once the row is found.
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kDelete));
  v1::CheckpointRecord rec;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::optional<v1::CheckpointRecord>> found =
        ReadRowLocked(key, /*corrupt_is_error=*/false);
    CKPTD_RETURN_IF_ERROR(CheckDeletableLocked(key));
    if (!found.ok() && !absl::IsDataLoss(found.status())) return found.status();
    if (found.ok() && !*found) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
    if (found.ok()) {
      rec = **found;
    } else {  // a row that does not parse is deleted all the same
      rec.mutable_summary()->set_job(req.job());
      rec.mutable_summary()->set_step(req.step());
      rec.set_dir(CheckpointDir(req.job(), req.step()));
    }
    rewriting_.emplace(key, "being deleted");
    KeyChangedLocked(key);
    manifest_cache_.Erase(key);
  }
  // Again, now that the row was found (owners.cc: its job's owner row was written before it, and
  // never changes): the check above passes for a job that had no owner yet.
  const absl::Status allowed = CheckAccess(caller, req.job(), Access::kDelete);
  absl::Status st =
      allowed.ok() ? RemoveCheckpoint(req.job(), req.step(), std::move(rec)) : allowed;
  {
    absl::MutexLock lock(&mu_);
    rewriting_.erase(key);
    KeyChangedLocked(key);
    manifest_cache_.Erase(key);  // a load that raced the delete may have cached it again
    changed_.SignalAll();
  }
  if (!allowed.ok()) return allowed;
  if (!st.ok()) {
    spdlog::error("deleting {}: {}", what, st.ToString());
    return Annotate(st, absl::StrCat("deleting ", what,
                                     " (if it shows DELETING now, delete it "
                                     "again or restart the daemon to finish)"));
  }
  spdlog::info("{} deleted", what);
  return absl::OkStatus();
}

void CheckpointService::DropPeerCopies(const std::string& job, uint64_t step) {
  if (deps_.peers == nullptr || !remote_.enabled()) return;
  // The copies this node placed, as the store's manifest names them, and wherever repair placed
  // them since (best effort: a peer's budget evicts what is not dropped).
  absl::StatusOr<Manifest> m = ReadManifest(*remote_.remote(), job, step);
  std::set<std::string> nodes;
  if (m.ok()) {
    for (const v1::BlobInfo& b : m->header.blobs()) {
      if (b.node() == deps_.options->node_id) nodes.insert(b.peers().begin(), b.peers().end());
    }
  }
  deps_.peers->Drop(job, step, {nodes.begin(), nodes.end()});
}

absl::Status CheckpointService::RemoveCheckpoint(const std::string& job, uint64_t step,
                                                 v1::CheckpointRecord rec) {
  const std::string dir = CheckpointDir(job, step);
  ram_tier_.Drop(Key{job, step});  // its hot copy first: no load reads it once it is going
  if (rec.summary().state() != v1::DELETING) {
    rec.mutable_summary()->set_state(v1::DELETING);
    rec.mutable_summary()->mutable_tiers()->Clear();
    CKPTD_RETURN_IF_ERROR(
        Annotate(PutRecordSync(rec), "recording DELETING (the tombstone) in the index"));
    CKPTD_SYNC_POINT("delete.tombstone_written");
  }
  // The remote copy first (its manifest, then its blobs, then its upload row): a delete is of
  // every tier, and a store keeping a copy of a deleted checkpoint would resurrect it on the
  // next daemon that adopts from the store.
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(job));
  DropPeerCopies(job, step);
  CKPTD_RETURN_IF_ERROR(remote_.Remove(job, step, dir, owner));
  CKPTD_SYNC_POINT("delete.remote_removed");
  // The manifest first: should the index be lost, no directory with a manifest is left to adopt.
  CKPTD_RETURN_IF_ERROR(deps_.storage->RemoveAll(absl::StrCat(dir, "/", kManifestFileName)));
  CKPTD_SYNC_POINT("delete.manifest_removed");
  CKPTD_RETURN_IF_ERROR(deps_.storage->RemoveAll(dir));
  CKPTD_SYNC_POINT("delete.dir_removed");
  CKPTD_RETURN_IF_ERROR(deps_.meta->DeletePrefix(keys::ItemPrefix(job, step), /*sync=*/false));
  CKPTD_RETURN_IF_ERROR(deps_.meta->DeletePrefix(keys::RankPrefix(job, step), /*sync=*/false));
  CKPTD_RETURN_IF_ERROR(deps_.meta->DeletePrefix(keys::BlobPrefix(job, step), /*sync=*/false));
  // A RAM tier row recovery did not adopt (Drop removed the row of one it had).
  CKPTD_RETURN_IF_ERROR(deps_.meta->DeletePrefix(keys::Hot(job, step), /*sync=*/false));
  CKPTD_SYNC_POINT("delete.rows_removed");
  std::vector<MetaStore::Write> row{{keys::Checkpoint(job, step), std::nullopt}};
  CKPTD_RETURN_IF_ERROR(committer_.Commit(keys::Checkpoint(job, step), std::move(row)));
  CKPTD_SYNC_POINT("delete.done");
  return absl::OkStatus();
}

}  // namespace ckptd
