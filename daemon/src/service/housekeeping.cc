// The lifecycle's background work: the housekeeping thread (stage timeouts, the flush gate, abort
// retries, unattached sessions) and shutdown.
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "common/log.h"
#include "format/names.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

void CheckpointService::Start() {
  // Uploads the index holds that are not durable yet resume (after recovery, before serving).
  absl::Status resumed = remote_.Start();
  if (!resumed.ok()) {
    spdlog::error("remote tier: the uploads to resume could not be read: {}", resumed.ToString());
  }
  WatchOwnParts();  // repair keeps each job's newest part at the peer tier copied
  housekeeper_ = std::thread([this] { Housekeeping(); });
  if (remote_.enabled()) cluster_thread_ = std::thread([this] { ClusterLoop(); });
}

void CheckpointService::Housekeeping() {
  while (HousekeepingPass()) {
    // Outside the lifecycle lock: the session table's lock, and the arena's and region
    // registry's (ending a session releases what it held).
    size_t n = sessions_.ExpireUnattached(absl::Milliseconds(limits::kSessionAttachTimeoutMs));
    if (n > 0)
      spdlog::info("{} sessions ended: not attached within {} ms", n,
                   limits::kSessionAttachTimeoutMs);
    n = hot_leases_.Expire();
    if (n > 0) spdlog::info("{} hot leases ended: not released within hot_lease_ms", n);
    MaybeCollectGarbage();
  }
}

void CheckpointService::MaybeCollectGarbage() {
  const DaemonOptions& o = *deps_.options;
  if (!o.RetentionOn()) return;
  const absl::Time now = absl::Now();
  if (now - last_gc_ < absl::Milliseconds(o.gc_interval_ms)) return;
  last_gc_ = now;
  // As the daemon itself: every job (an admin caller).
  const Caller daemon{.uid = 0, .gid = 0, .pid = 0, .connection = 0, .admin = true};
  v1::GcResponse done;
  absl::Status st = CollectGarbage(daemon, v1::GcRequest(), &done);
  if (!st.ok()) spdlog::warn("retention: {}", st.ToString());
}

bool CheckpointService::HousekeepingPass() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  // The wait releases mu_; a pass holds it only for its scan (no I/O: posts only).
  changed_.WaitWithTimeout(&mu_, flush_.GateTick());
  if (stopping_) return false;
  const uint64_t now = NowMs();
  std::vector<PendingCheckpoint*> expired;
  for (auto& [key, p] : pending_) {
    if (p->staging() && !p->partial && now - p->created_unix_ms > deps_.options->stage_timeout_ms) {
      expired.push_back(p.get());
    }
  }
  for (auto& [key, p] : pending_) {
    if (flush_.GateElapsed(p->first_staged_unix_ms, now)) {
      PostGatedFlushesLocked(*p);
    }
  }
  for (PendingCheckpoint* p : expired) {
    if (p->multi_node()) {
      AbortLocked(*p,
                  absl::StrCat("stage timeout: ", p->ranks.size(), " of the ", p->local_world_size,
                               " ranks saving through this daemon (local_world_size) were "
                               "staged within ",
                               deps_.options->stage_timeout_ms, " ms"));
      continue;
    }
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < p->world_size && missing.size() < 33; ++r) {
      if (!p->ranks.contains(r)) missing.push_back(r);
    }
    AbortLocked(*p,
                absl::StrCat("stage timeout: ranks [", absl::StrJoin(missing, ", "),
                             missing.size() > 32 ? ", ..." : "", "] of ", p->world_size,
                             " were not staged within ", deps_.options->stage_timeout_ms, " ms"));
  }
  // Aborts whose ABORTED row failed: written again (RecordAbort), at most every kAbortRetryMs
  // (changed_ wakes this loop at every failure; retrying at once would spin against an index
  // that is recovering).
  std::vector<AbortRecord> retry;
  if (absl::Now() - last_abort_retry_ >= absl::Milliseconds(limits::kAbortRetryMs)) {
    last_abort_retry_ = absl::Now();
    retry.swap(unrecorded_aborts_);
  }
  for (AbortRecord& a : retry) {
    if (!deps_.flush_pool->Post([this, a] { RecordAbort(a); })) {
      unrecorded_aborts_.push_back(std::move(a));
    }
  }
  return true;
}

namespace {

// The tiers a checkpoint's row says it reached, for the shutdown log.
std::string TiersReached(const std::optional<v1::CheckpointRecord>& rec) {
  if (!rec) return "gone (deleted, or never journaled)";
  const v1::CheckpointSummary& s = rec->summary();
  if (s.state() != v1::COMMITTED) {
    return absl::StrCat(v1::CheckpointState_Name(s.state()),
                        s.state() == v1::STAGING || s.state() == v1::PERSISTING
                            ? " (journaled: it resumes from the staging arena at the next start)"
                            : "");
  }
  const v1::Tiers& t = s.tiers();
  std::string where = t.local() && t.remote() ? "local and remote"
                      : t.remote()            ? "remote"
                                              : "local";
  if (t.has_upload() && t.upload().state() != v1::UPLOAD_DURABLE) {
    absl::StrAppend(&where, "; its upload to ", t.upload().store(), " is ",
                    v1::UploadState_Name(t.upload().state()), " (", t.upload().bytes_done(), " of ",
                    t.upload().bytes_total(), " bytes) and starts again at the next start");
  }
  return absl::StrCat("COMMITTED, durable on ", where);
}

}  // namespace

absl::Duration CheckpointService::Drain(absl::Duration grace) {
  const absl::Time deadline = absl::Now() + grace;
  std::set<Key> in_flight;  // what the log reports at the end
  // Work this node can finish alone: every rank staged (flushes, the commit, an abort being
  // recorded), or its own part of a checkpoint spanning nodes not yet on the shared tier. A
  // checkpoint short of ranks, or whose part is published and waits for other nodes, is not.
  auto busy = [](const PendingCheckpoint& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (p.staging()) return !p.idle();
    if (p.multi_node() && p.cluster.part_durable && !p.committing()) return !p.idle();
    return true;
  };
  if (remote_.enabled()) {
    for (const auto& key : remote_.Tracked()) in_flight.insert(key);
  }
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    for (const auto& [key, p] : pending_) in_flight.insert(key);
    spdlog::info("shutdown: draining {} checkpoint(s) in flight{} (at most {})", pending_.size(),
                 remote_.enabled() ? " and the uploads to the remote tier" : "",
                 absl::FormatDuration(grace));
    while (absl::Now() < deadline) {
      bool any = false;
      for (const auto& [key, p] : pending_) any = any || busy(*p);
      if (!any) break;
      cluster_wake_ = true;
      changed_.SignalAll();
      changed_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(50)));
    }
  }
  std::vector<std::pair<std::pair<std::string, uint64_t>, v1::Upload>> uploads;
  if (remote_.enabled()) uploads = remote_.Drain(deadline);
  for (const auto& [key, state] : uploads) in_flight.insert(key);
  std::set<Key> still_pending;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, p] : pending_) {
      if (busy(*p)) still_pending.insert(key);
    }
  }
  for (const Key& key : in_flight) {
    absl::StatusOr<std::optional<v1::CheckpointRecord>> rec = ReadRecord(key.first, key.second);
    std::string reached = rec.ok() ? "" : absl::StrCat("unknown (", rec.status().ToString(), ")");
    if (rec.ok()) {
      std::optional<v1::CheckpointRecord> r = *rec;
      if (r && r->summary().state() == v1::COMMITTED) FillRemoteTier(r->mutable_summary());
      reached = TiersReached(r);
    }
    LogScope fields;
    fields.Str("job", key.first).Num("step", key.second).Str("event", "shutdown_reached");
    spdlog::info("shutdown: {} reached: {}{}", CkptName(key.first, key.second), reached,
                 still_pending.contains(key) ? " (its flushes were still running at the end of "
                                               "the grace period)"
                                             : "");
  }
  const absl::Duration left = deadline - absl::Now();
  spdlog::info("shutdown: drained{} with {} of the grace period left",
               still_pending.empty() && uploads.empty() ? "" : " partly",
               absl::FormatDuration(std::max(left, absl::ZeroDuration())));
  return std::max(left, absl::ZeroDuration());
}

bool CheckpointService::Shutdown(absl::Duration grace, bool* drained_out) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !housekeeper_.joinable()) return pending_.empty();
    stopping_ = true;
    changed_.SignalAll();
  }
  if (housekeeper_.joinable()) housekeeper_.join();
  StopReshards();
  discovery_.Shutdown();  // a scan in flight ends first: it adopts through the index
  remote_.Stop();         // first: a node part being copied stops between chunks
  if (cluster_thread_.joinable()) cluster_thread_.join();
  bool drained = deps_.flush_pool->Drain(grace);
  if (drained_out != nullptr) *drained_out = drained;
  if (drained) deps_.flush_pool->Stop();
  // Aborts the pool could not take (or whose write failed): recorded now, on this thread, with
  // no lock held; one that fails again is left to the next start's recovery (the journal rows
  // of an unfinished checkpoint).
  std::vector<AbortRecord> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(unrecorded_aborts_);
  }
  for (AbortRecord& a : left) RecordAbort(std::move(a));
  absl::MutexLock lock(&mu_);
  if (!drained) spdlog::warn("shutdown: flushes still running after the grace period");
  // Hot checkpoints keep the segments too: the next start adopts them (verified).
  return drained && pending_.empty() && ram_tier_.stats().hot_checkpoints == 0;
}

}  // namespace ckptd
