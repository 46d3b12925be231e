// Executor: the daemon's bounded pools for RPC work and flushes ("flush", "rpc", "wait",
// "reserve", "load" in main.cc): a WorkerPool (common/worker_pool.h) whose Post never blocks: a
// full queue is refused (the caller answers RESOURCE_EXHAUSTED), which is how overload turns into
// backpressure instead of unbounded growth (docs/DESIGN.md invariant 5). Its threads are named
// "<name>-<i>".
//
// Thread safety: every method may be called from any thread, Stop not from the executor's own
// threads (a CHECK).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "common/worker_pool.h"

namespace ckptd {

class Executor {
 public:
  Executor(std::string name, size_t threads, size_t queue_max)
      : pool_(std::move(name), threads, queue_max) {}
  // False when the queue already holds queue_max tasks or the executor is stopped.
  bool Post(std::function<void()> task) {
    return pool_.Post(std::move(task), WorkerPool::WhenFull::kRefuse).ok();
  }
  // Waits until no task is queued or running (tasks may still post follow-up tasks, which run
  // too), or until `timeout`; returns true if it became idle.
  bool Drain(absl::Duration timeout) { return pool_.WaitIdle(timeout); }
  // Drops queued tasks, refuses new ones, and joins the threads after their running tasks.
  void Stop() { pool_.Shutdown(WorkerPool::ShutdownMode::kCancel); }
  size_t queued() const { return pool_.queued(); }

 private:
  WorkerPool pool_;
};

}  // namespace ckptd
