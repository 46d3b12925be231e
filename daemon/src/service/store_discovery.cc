#include "service/store_discovery.h"

#include "ckptd/status.h"
#include "common/limits.h"

namespace ckptd {

StoreDiscovery::StoreDiscovery(Scan scan, absl::Duration min_interval)
    : scan_(std::move(scan)),
      min_interval_(min_interval),
      pool_("discover", 1, limits::kDiscoveryQueueMax) {}

StoreDiscovery::~StoreDiscovery() { Shutdown(); }

void StoreDiscovery::Shutdown() { pool_.Shutdown(WorkerPool::ShutdownMode::kCancel); }

uint64_t StoreDiscovery::scans() const {
  absl::MutexLock lock(&mu_);
  return scans_;
}

absl::Status StoreDiscovery::Refresh(const std::string& scope, absl::Duration wait, bool force) {
  CKPTD_CHECK(!pool_.OnPoolThread());
  std::shared_ptr<Run> run;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (auto it = fresh_.find(scope);
        !force && it != fresh_.end() && now - it->second < min_interval_) {
      return absl::OkStatus();
    }
    if (auto it = running_.find(scope); it != running_.end()) {
      run = it->second;
    } else {
      run = std::make_shared<Run>();
      run->deadline = now + wait;
      // Queued under mu_ (kRefuse never blocks), so a second caller finds it in running_.
      absl::Status posted = pool_.Post(
          WorkerPool::Task{[this, scope, run] { RunScan(scope, run); },
                           [this, scope, run] {
                             run->status = absl::UnavailableError("the daemon is stopping");
                             absl::MutexLock l(&mu_);
                             running_.erase(scope);
                             run->done.Notify();
                           }},
          WorkerPool::WhenFull::kRefuse);
      if (!posted.ok()) return posted;
      running_.emplace(scope, run);
    }
  }
  // Every caller of one scan waits until the deadline its first caller set: a slow or hung
  // store holds each scan's callers for one `wait` in all, not one per caller.
  if (!run->done.WaitForNotificationWithDeadline(run->deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the store did not answer within ", absl::FormatDuration(wait)));
  }
  return run->status;
}

void StoreDiscovery::RunScan(const std::string& scope, const std::shared_ptr<Run>& run) {
  run->status = scan_(scope);
  absl::MutexLock lock(&mu_);
  running_.erase(scope);
  ++scans_;
  if (run->status.ok()) {
    const absl::Time now = absl::Now();
    for (auto it = fresh_.begin(); it != fresh_.end();) {
      it = now - it->second >= min_interval_ ? fresh_.erase(it) : std::next(it);
    }
    fresh_[scope] = now;
  }
  run->done.Notify();
}

}  // namespace ckptd
