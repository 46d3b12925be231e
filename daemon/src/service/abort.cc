// Aborting a checkpoint being saved: AbortLocked decides (the staging stays held), the ABORTED
// row is written durably outside the service lock (RecordAbort, retried while the index refuses),
// and only then are its extents freed and its files removed; the Abort RPC answers once that is
// done.
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "common/log.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "service/node_parts.h"
#include "spdlog/spdlog.h"

namespace ckptd {

void CheckpointService::AbortLocked(PendingCheckpoint& p, const std::string& reason) {
  if (p.aborting()) return;
  LogScope fields;
  fields.Str("job", p.job).Num("step", p.step).Str("event", "aborted");
  fields.Num("ranks", p.ranks.size()).Num("after_ms", MsAfter(p.created_unix_ms));
  spdlog::warn("{} aborted: {}", CkptName(p.job, p.step), reason);
  p.Transition(p.phase(), CheckpointPhase::kAborting);
  p.error = reason;
  if (deps_.metrics != nullptr) {
    deps_.metrics->CheckpointEnded(p.job, "aborted", SecondsSince(p.first_staged_unix_ms));
  }
  // Client regions are released now (a restart never resumes a rank staged from one; a flush in
  // flight releases its own). Arena extents stay the checkpoint's until its ABORTED row is
  // durable (RecordAbort): until then the journal names them, and a restart must never resume a
  // rank from bytes already handed to another client.
  for (auto& [r, pr] : p.ranks) {
    if (!pr.flushing()) pr.leases.clear();
  }
  if (p.idle()) FinishAbortLocked(p);
  changed_.SignalAll();
}

void CheckpointService::FinishAbortLocked(PendingCheckpoint& p) {
  CKPTD_CHECK(p.idle());
  p.Transition(CheckpointPhase::kAborting, CheckpointPhase::kAborted);
  const Key key{p.job, p.step};
  v1::CheckpointRecord rec;
  *rec.mutable_summary() = SummaryLocked(p);
  rec.mutable_summary()->mutable_tiers()->Clear();
  rec.set_dir(CheckpointDir(p.job, p.step));
  AbortRecord a{key, {{keys::Checkpoint(p.job, p.step), rec.SerializeAsString()}}, {}, 0,
                {},  p.tier_policy == v1::TIER_REMOTE && !p.multi_node()};
  if (p.multi_node() && p.coordinator() && !p.cluster.abort_decided) {
    // The coordinator aborted before its cluster thread decided (a stage timeout while staging,
    // a failed flush): the other nodes learn it from the store. No commit decision can be there:
    // only the cluster thread writes one, in kCommitting, which nothing aborts.
    v1::ClusterDecision d;
    d.set_commit(false);
    d.set_reason(p.error.substr(0, 1024));
    d.set_node(deps_.options->node_id);
    d.set_decided_unix_ms(NowMs());
    a.cluster_decision = d.SerializeAsString();
  }
  for (const auto& [r, pr] : p.ranks) {
    a.writes.push_back({keys::Rank(p.job, p.step, r), std::nullopt});
    a.writes.push_back({keys::Blob(p.job, p.step, pr.rec.blob_name()), std::nullopt});
    a.extent_ids.insert(a.extent_ids.end(), pr.extent_ids.begin(), pr.extent_ids.end());
  }
  pending_.erase(key);  // p is gone after this line
  ram_tier_.Drop(key);  // its persisted ranks' staged bytes (no row: never committed)
  // Until the ABORTED row is written, a Save, Delete or reshard of the key is refused (ABORTED,
  // retry) rather than racing the removal of its files.
  rewriting_.emplace(key, "being aborted");
  KeyChangedLocked(key);
  changed_.SignalAll();
  if (!deps_.flush_pool->Post([this, a] { RecordAbort(a); })) {
    // The flush pool refuses (full, or shutting down): no synced write under mu_ — the record
    // waits in unrecorded_aborts_ for housekeeping's next retry, or for Shutdown, which writes
    // what is left once the pool has drained. Until then the key stays in rewriting_.
    unrecorded_aborts_.push_back(std::move(a));
  }
}

void CheckpointService::RecordAbort(AbortRecord a) {
  // The ABORTED row first, the extents and files after it (and only once it is recorded): a
  // crash between the two leaves an ABORTED row whose files recovery collects. The other order
  // let a restart resume the aborted checkpoint from its journal rows, its persisted ranks' blobs
  // gone (found by the crash-point matrix: a later commit would name blobs that no longer exist),
  // or its staged ranks' extents reused by another checkpoint (found by the simulation: it
  // committed with that checkpoint's bytes, its checksums computed over them).
  const std::string dir = CheckpointDir(a.key.first, a.key.second);
  if (!a.cluster_decision.empty() && a.attempts == 0) {
    // Best effort: the other nodes give up on their own after twice stage_timeout_ms.
    absl::Status decided = remote_.remote()->PutIfAbsent(DecisionPath(dir), a.cluster_decision);
    if (!decided.ok() && !absl::IsAlreadyExists(decided)) {
      spdlog::warn("{}: writing the abort decision for the other nodes: {}",
                   CkptName(a.key.first, a.key.second), decided.ToString());
    }
  }
  absl::Status st = committer_.Commit(keys::Checkpoint(a.key.first, a.key.second), a.writes);
  if (!st.ok()) {
    // Retried by every housekeeping pass; logged on the first failure and now and then.
    if (a.attempts++ % 100 == 0) {
      spdlog::error("recording abort of {} (attempt {}, retried): {}",
                    CkptName(a.key.first, a.key.second), a.attempts, st.ToString());
    }
    absl::MutexLock lock(&mu_);
    // This failed write is the latest try: housekeeping retries kAbortRetryMs after it (not at
    // its next pass, which raced an Abort waiting to answer the failure).
    last_abort_retry_ = absl::Now();
    abort_write_failed_[a.key] = st;
    unrecorded_aborts_.push_back(std::move(a));
    changed_.SignalAll();  // an Abort waiting for durability answers now
    return;
  }
  CKPTD_SYNC_POINT("abort.recorded");
  deps_.arena->Free(a.extent_ids);  // the journal no longer names them
  absl::Status removed = deps_.storage->RemoveAll(dir);
  if (!removed.ok()) spdlog::error("removing {}: {}", dir, removed.ToString());
  if (a.remove_remote) {
    removed = remote_.remote()->RemoveAll(dir);
    if (!removed.ok()) {
      spdlog::error("removing {} on {}: {}", dir, remote_.remote()->Describe(), removed.ToString());
    }
  }
  CKPTD_SYNC_POINT("abort.files_removed");
  absl::MutexLock lock(&mu_);
  abort_write_failed_.erase(a.key);
  rewriting_.erase(a.key);
  KeyChangedLocked(a.key);
  changed_.SignalAll();
}

absl::Status CheckpointService::Abort(const Caller& caller, const v1::AbortRequest& req,
                                      v1::CheckpointStatus* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobStep(req.job(), req.step()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kDelete));
  const std::string what = CkptName(req.job(), req.step());
  absl::MutexLock lock(&mu_);
  // The owner is checked again on what was found (the check above passes for a job that had no
  // owner yet, and one may have claimed it since).
  if (auto r = reshards_.find(Key{req.job(), req.step()}); r != reshards_.end()) {
    CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), r->second->owner_uid, Access::kDelete));
  }
  if (CancelReshardLocked(Key{req.job(), req.step()}, req.reason(), resp)) return absl::OkStatus();
  auto it = pending_.find(Key{req.job(), req.step()});
  if (it == pending_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is not being saved (committed checkpoints are deleted, not aborted)"));
  }
  PendingCheckpoint& p = *it->second;
  CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), p.owner_uid, Access::kDelete));
  if (p.committing()) {
    return absl::FailedPreconditionError(absl::StrCat(what, " is already committing"));
  }
  if (p.multi_node() && !p.aborting()) return AbortAcrossNodesLocked(p, req, resp);
  FillStatusLocked(p, resp);
  AbortLocked(p, req.reason().empty() ? "aborted by a client" : req.reason().substr(0, 1024));
  resp->mutable_summary()->set_state(v1::ABORTED);
  // Answered once the abort is durable — its ABORTED row written (after a flush in flight ends)
  // — so a daemon killed right after never resumes what a client was told is aborted.
  const Key key{req.job(), req.step()};
  const absl::Time deadline = absl::Now() + absl::Milliseconds(limits::kAbortDurableWaitMs);
  while (pending_.contains(key) || rewriting_.contains(key)) {
    if (auto failed = abort_write_failed_.find(key); failed != abort_write_failed_.end()) {
      return absl::UnavailableError(absl::StrCat(
          what,
          " is aborted but its ABORTED row could not be written (it is retried; a daemon "
          "restart before it is could still resume the checkpoint): ",
          failed->second.message()));
    }
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (pending_.contains(key) || rewriting_.contains(key)) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " is aborted but its ABORTED row is not yet durable after ",
                     limits::kAbortDurableWaitMs,
                     " ms (a flush still running, or the index refusing writes; "
                     "it is retried): a daemon restart now could still resume it"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::AbortAcrossNodesLocked(PendingCheckpoint& p,
                                                       const v1::AbortRequest& req,
                                                       v1::CheckpointStatus* resp) {
  const std::string what = CkptName(p.job, p.step);
  if (!p.coordinator()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        " spans nodes and this daemon does not hold rank 0: abort it on the coordinator "
        "(the daemon of rank 0), which decides for every node"));
  }
  const std::string reason =
      req.reason().empty() ? "aborted by a client" : req.reason().substr(0, 1024);
  if (p.phase() != CheckpointPhase::kAwaitingCluster) {
    // Not published yet: no commit decision can exist; the abort decision follows the row.
    FillStatusLocked(p, resp);
    AbortLocked(p, reason);
    resp->mutable_summary()->set_state(v1::ABORTED);
    return absl::OkStatus();
  }
  // The cluster thread decides (the store may hold a decision already).
  p.cluster.abort_requested = reason;
  cluster_wake_ = true;
  changed_.SignalAll();
  const Key key{p.job, p.step};
  const absl::Time deadline = absl::Now() + absl::Milliseconds(limits::kAbortDurableWaitMs);
  while (pending_.contains(key) || rewriting_.contains(key)) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (pending_.contains(key) || rewriting_.contains(key)) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": the abort is asked for but not decided on the shared tier after ",
                     limits::kAbortDurableWaitMs, " ms (the store unreachable?); it is retried"));
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> row,
                         ReadRowLocked(key, /*corrupt_is_error=*/false));
  if (row && row->summary().state() == v1::COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " was committed across nodes before the abort was decided"));
  }
  if (row) *resp->mutable_summary() = row->summary();
  resp->mutable_summary()->set_state(v1::ABORTED);
  return absl::OkStatus();
}

}  // namespace ckptd
