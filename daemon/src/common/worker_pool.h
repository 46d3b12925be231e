// WorkerPool: a named, fixed set of long-lived threads fed from one bounded queue. It replaces
// threads made per request (std::async, std::thread): the daemon's concurrent work runs on a
// known number of threads, each named "<pool>-<i>" so it shows in top -H, gdb and perf, and the
// queue in front of them never grows past its bound (docs/DESIGN.md invariant 5).
//
// Submission, chosen per call:
//  - WhenFull::kWait blocks the submitter until the queue has room (backpressure) — for internal
//    stages of work already admitted (a flush's checksum tasks, a load's read pieces);
//  - WhenFull::kRefuse answers RESOURCE_EXHAUSTED at once — for admission of new work on behalf
//    of a client, which must never wait unboundedly (the flush executor, reshards).
// A pool thread must not submit kWait to its own pool (it could wait for itself): a CHECK.
//
// Results: Post() takes a plain task; Submit() returns a std::future of the task's
// absl::Status / absl::StatusOr<T>. A task dropped by Shutdown(kCancel) never runs: its on_cancel
// runs instead (Submit's future then holds CANCELLED).
//
// Shutdown(kDrain) runs every queued task first; Shutdown(kCancel) drops them; both refuse new
// tasks (UNAVAILABLE), wait for the running ones and join the threads. The destructor is
// Shutdown(kCancel). Neither may be called from a pool thread (a CHECK).
//
// Thread safety: every method may be called from any thread at once.
// Status codes: RESOURCE_EXHAUSTED (queue full, kRefuse; or a batch larger than the queue),
// UNAVAILABLE (the pool is shut down, or shut down while a kWait submitter waited).
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd {

class WorkerPool {
 public:
  enum class WhenFull { kWait, kRefuse };
  enum class ShutdownMode { kDrain, kCancel };

  struct Task {
    std::function<void()> run;
    // Runs instead of `run` if Shutdown(kCancel) drops the task (on the thread calling
    // Shutdown); may be empty.
    std::function<void()> on_cancel;
  };

  // 1 <= threads <= limits::kWorkerPoolThreadsMax and queue_max >= 1 (a bug otherwise). `name`
  // prefixes the thread names; it is cut so "<name>-<i>" fits limits::kThreadNameBytesMax.
  WorkerPool(std::string name, size_t threads, size_t queue_max);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  absl::Status Post(Task task, WhenFull when_full);
  absl::Status Post(std::function<void()> run, WhenFull when_full) {
    return Post(Task{std::move(run), nullptr}, when_full);
  }
  // All of `tasks` or none: with kRefuse, RESOURCE_EXHAUSTED unless the queue has room for every
  // one; with kWait, each waits for room in turn (a batch larger than the queue is
  // RESOURCE_EXHAUSTED either way, before any is queued). On UNAVAILABLE with kWait the tasks
  // queued before the shutdown run or are cancelled with the queue; *posted says how many were.
  absl::Status PostBatch(std::vector<Task> tasks, WhenFull when_full, size_t* posted = nullptr);

  // Runs `fn` (returning absl::Status or absl::StatusOr<T>) on the pool; the future holds its
  // result, or CANCELLED if Shutdown(kCancel) dropped it.
  template <typename F>
  auto Submit(F fn, WhenFull when_full) -> absl::StatusOr<std::future<std::invoke_result_t<F&>>> {
    using R = std::invoke_result_t<F&>;
    static_assert(std::is_constructible_v<R, absl::Status>,
                  "Submit's function returns absl::Status or absl::StatusOr<T>");
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> future = promise->get_future();
    auto f = std::make_shared<F>(std::move(fn));
    std::string what = name_;
    absl::Status st = Post(Task{[promise, f] { promise->set_value((*f)()); },
                                [promise, what] {
                                  promise->set_value(R(absl::CancelledError(
                                      "the " + what + " pool shut down before the task ran")));
                                }},
                           when_full);
    if (!st.ok()) return st;
    return future;
  }

  // Waits until no task is queued or running, or until `timeout`; true if it became idle.
  bool WaitIdle(absl::Duration timeout);
  void Shutdown(ShutdownMode mode);

  const std::string& name() const { return name_; }
  size_t threads() const { return threads_.size(); }
  size_t queue_max() const { return queue_max_; }
  size_t queued() const;
  size_t running() const;
  // True on one of this pool's threads.
  bool OnPoolThread() const;

 private:
  void Loop(size_t index);
  absl::Status RefusedLocked(size_t want) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const size_t queue_max_;
  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // refuses new tasks
  bool draining_ ABSL_GUARDED_BY(mu_) = false;  // threads exit once the queue is empty
  std::vector<std::thread> threads_;
  absl::Mutex join_mu_;  // one Shutdown joins at a time
};

}  // namespace ckptd
