// SingleFlight: at most one run of some work per key at a time. A caller that asks for a key
// while its run is in flight waits for that run and shares its outcome instead of doing the work
// again — docs/DESIGN.md "Load" (bytes that several local ranks load are read once) for
// prefetches of a checkpoint (service/hot.cc: the Prefetch RPC and a Load's prefetch hint).
//
// Ownership: a run's state lives while its runner or a waiter holds it; the table forgets the key
// when the run ends (a later Do runs again). The work must not call Do or Await on the same key
// (it would wait for itself).
// Threads: any thread; waiters block until the run ends (no timeout: the work bounds itself).
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace ckptd {

template <typename Key>
class SingleFlight {
 public:
  struct Outcome {
    absl::Status status;
    bool ran = false;  // this caller did the work (false: it waited for another's run)
  };

  // Runs `work` unless a run of `key` is in flight; then waits for that run and answers its
  // status.
  Outcome Do(const Key& key, absl::FunctionRef<absl::Status()> work) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Flight> flight;
    bool leader = false;
    {
      absl::MutexLock lock(&mu_);
      auto [it, inserted] = flights_.try_emplace(key);
      if (inserted) it->second = std::make_shared<Flight>();
      flight = it->second;
      leader = inserted;
      if (!leader) ++flight->waiters;
    }
    if (leader) return Outcome{.status = RunLeader(key, *flight, work), .ran = true};
    flight->done.WaitForNotification();
    return Outcome{.status = flight->status, .ran = false};
  }

  // Waits for the run of `key` in flight, if any, and answers its status; nullopt when none is
  // in flight (nothing is run).
  std::optional<absl::Status> Await(const Key& key) ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Flight> flight;
    {
      absl::MutexLock lock(&mu_);
      auto it = flights_.find(key);
      if (it == flights_.end()) return std::nullopt;
      flight = it->second;
      ++flight->waiters;
    }
    flight->done.WaitForNotification();
    return flight->status;
  }

  // Runs in flight now (for tests and metrics).
  size_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return flights_.size();
  }
  // Callers that joined the run of `key` in flight (0 when none is), for tests.
  int waiters(const Key& key) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = flights_.find(key);
    return it == flights_.end() ? 0 : it->second->waiters;
  }

 private:
  struct Flight {
    absl::Notification done;
    absl::Status status;  // written by the runner before done is notified
    int waiters = 0;      // guarded by the table's mu_
  };

  absl::Status RunLeader(const Key& key, Flight& flight, absl::FunctionRef<absl::Status()> work)
      ABSL_LOCKS_EXCLUDED(mu_) {
    // Waiters are released however the work ends; the key is forgotten first, so a Do that
    // arrives after the notification runs again rather than reading a finished run.
    absl::Cleanup finish = [&] {
      {
        absl::MutexLock lock(&mu_);
        flights_.erase(key);
      }
      flight.done.Notify();
    };
    flight.status = work();
    return flight.status;
  }

  mutable absl::Mutex mu_;
  std::map<Key, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd
