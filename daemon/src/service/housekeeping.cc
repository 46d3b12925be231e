// The lifecycle's background work: the housekeeping thread (stage timeouts, the flush gate, abort
// retries, unattached sessions) and shutdown.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

void CheckpointService::Start() {
  // Uploads the index holds that are not durable yet resume (after recovery, before serving).
  absl::Status resumed = remote_.Start();
  if (!resumed.ok()) {
    spdlog::error("remote tier: the uploads to resume could not be read: {}", resumed.ToString());
  }
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
