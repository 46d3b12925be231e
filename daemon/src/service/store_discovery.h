// StoreDiscovery: how a running daemon learns of checkpoints that other daemons committed to the
// shared store after it started (docs/DESIGN.md "Tiers"; docs/OPERATIONS.md "Checkpoints that span
// nodes"). The scan itself (list the store, adopt what this node has no row of) is the caller's
// function; this class runs it on its own thread ("discover-0") so that the caller waits a bounded
// time for an answer from a store that may be slow or down, and so that many callers asking about
// one scope at once (every rank of a node loading "latest") cost one scan:
//  - at most one scan of a scope runs at a time; a caller arriving meanwhile joins it;
//  - a scope scanned OK less than `min_interval` ago is not scanned again (the caller goes on),
//    unless the caller forces it;
//  - the first caller of a scan waits at most `wait` for it, and every caller that joins it waits
//    until that same deadline: a hung store holds each scan's callers for one `wait` in all
//    (then they answer at once until the scan ends); the scan itself goes on.
// A scope is the caller's string: a job name, or "" for every job.
//
// Ownership: owns its thread and the scans in flight (each shared by its waiters). Lifetimes: a
// scan lives until its function returns; Shutdown (or the destructor) refuses new scans, lets the
// running one finish and joins the thread, so the function's captures must outlive Shutdown.
// Threads: Refresh from any thread, except from within the scan function (a CHECK: it would wait
// for itself). Nothing is held across the scan.
// Errors (Refresh): the scan's own; DEADLINE_EXCEEDED when it did not finish within `wait`;
// RESOURCE_EXHAUSTED when limits::kDiscoveryQueueMax scopes are queued already; UNAVAILABLE after
// Shutdown.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/worker_pool.h"

namespace ckptd {

class StoreDiscovery {
 public:
  using Scan = std::function<absl::Status(const std::string& scope)>;

  StoreDiscovery(Scan scan, absl::Duration min_interval);
  ~StoreDiscovery();
  StoreDiscovery(const StoreDiscovery&) = delete;
  StoreDiscovery& operator=(const StoreDiscovery&) = delete;

  // Scans `scope` (or joins its scan in flight) unless it was scanned OK within min_interval
  // (`force`: even then — the caller looks for something it knows the last scan did not find),
  // and waits up to `wait` for the outcome.
  absl::Status Refresh(const std::string& scope, absl::Duration wait, bool force = false)
      ABSL_LOCKS_EXCLUDED(mu_);

  void Shutdown();

  // Scans run to the end since construction (for tests).
  uint64_t scans() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Run {
    absl::Time deadline;  // set by its first caller: now + wait
    absl::Notification done;
    absl::Status status;  // set before `done`
  };

  void RunScan(const std::string& scope, const std::shared_ptr<Run>& run) ABSL_LOCKS_EXCLUDED(mu_);

  const Scan scan_;
  const absl::Duration min_interval_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Run>> running_ ABSL_GUARDED_BY(mu_);
  // When each scope last scanned OK; entries older than min_interval are dropped as new ones
  // come, so it holds at most the scopes scanned within one interval.
  std::map<std::string, absl::Time> fresh_ ABSL_GUARDED_BY(mu_);
  uint64_t scans_ ABSL_GUARDED_BY(mu_) = 0;
  WorkerPool pool_;
};

}  // namespace ckptd
