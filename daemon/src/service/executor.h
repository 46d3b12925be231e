// Executor: a fixed pool of threads with a bounded queue. Post() never blocks: a full queue is
// refused (the caller answers RESOURCE_EXHAUSTED), which is how overload turns into backpressure
// instead of unbounded growth (DESIGN.md invariant 5).
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ckptd {

class Executor {
 public:
  Executor(std::string name, size_t threads, size_t queue_max);
  ~Executor();  // Stop()s
  // False when the queue already holds queue_max tasks or the executor is stopped.
  bool Post(std::function<void()> task);
  // Waits until no task is queued or running (tasks may still post follow-up tasks, which run
  // too), or until `timeout`; returns true if it became idle.
  bool Drain(absl::Duration timeout);
  // Drops queued tasks, refuses new ones, and joins the threads after their running tasks.
  void Stop();
  size_t queued() const;

 private:
  void Loop();
  std::string name_;
  size_t queue_max_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptd
