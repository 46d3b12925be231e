#include "common/worker_pool.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"

namespace ckptd {
namespace {

// The pool whose thread this is (null elsewhere): kWait onto one's own pool and Shutdown from
// inside are bugs that would deadlock, so they are caught before they wait.
thread_local const WorkerPool* tls_pool = nullptr;

std::string ThreadName(const std::string& pool, size_t index) {
  std::string suffix = absl::StrCat("-", index);
  std::string name = pool.substr(0, limits::kThreadNameBytesMax - suffix.size());
  return name + suffix;
}

}  // namespace

WorkerPool::WorkerPool(std::string name, size_t threads, size_t queue_max)
    : name_(std::move(name)), queue_max_(queue_max) {
  CKPTD_CHECK(threads >= 1 && threads <= limits::kWorkerPoolThreadsMax && queue_max >= 1);
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

WorkerPool::~WorkerPool() { Shutdown(ShutdownMode::kCancel); }

absl::Status WorkerPool::RefusedLocked(size_t want) const {
  if (stopping_) return absl::UnavailableError(absl::StrCat("the ", name_, " pool is shut down"));
  return absl::ResourceExhaustedError(absl::StrCat("the ", name_, " pool has ", queue_.size(),
                                                   " tasks queued; ", want,
                                                   " more would exceed its queue of ", queue_max_));
}

absl::Status WorkerPool::Post(Task task, WhenFull when_full) {
  std::vector<Task> one;
  one.push_back(std::move(task));
  return PostBatch(std::move(one), when_full);
}

absl::Status WorkerPool::PostBatch(std::vector<Task> tasks, WhenFull when_full, size_t* posted) {
  if (posted != nullptr) *posted = 0;
  CKPTD_CHECK(when_full == WhenFull::kRefuse || tls_pool != this);
  absl::MutexLock lock(&mu_);
  if (tasks.size() > queue_max_) return RefusedLocked(tasks.size());
  if (when_full == WhenFull::kRefuse) {
    if (stopping_ || queue_.size() + tasks.size() > queue_max_) return RefusedLocked(tasks.size());
    for (Task& t : tasks) queue_.push_back(std::move(t));
    if (posted != nullptr) *posted = tasks.size();
    return absl::OkStatus();
  }
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || queue_.size() < queue_max_;
  };
  for (Task& t : tasks) {
    mu_.Await(absl::Condition(&room));
    if (stopping_) return RefusedLocked(1);
    queue_.push_back(std::move(t));
    if (posted != nullptr) ++*posted;
  }
  return absl::OkStatus();
}

size_t WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

size_t WorkerPool::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

bool WorkerPool::OnPoolThread() const { return tls_pool == this; }

bool WorkerPool::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && running_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void WorkerPool::Shutdown(ShutdownMode mode) {
  CKPTD_CHECK(tls_pool != this);
  std::deque<Task> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    draining_ = true;
    if (mode == ShutdownMode::kCancel) dropped.swap(queue_);
  }
  // Outside mu_: a cancel callback may complete a future whose waiter then posts elsewhere.
  for (Task& t : dropped) {
    if (t.on_cancel) t.on_cancel();
  }
  absl::MutexLock join(&join_mu_);
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkerPool::Loop(size_t index) {
  tls_pool = this;
  // Best effort: a name that does not fit is an inconvenience, never a failure.
  pthread_setname_np(pthread_self(), ThreadName(name_, index).c_str());
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return draining_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // draining and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task.run();
    task = Task{};  // captured state is released before the task counts as done
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace ckptd
