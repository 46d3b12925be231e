#include "service/executor.h"

namespace ckptd {

Executor::Executor(std::string name, size_t threads, size_t queue_max)
    : name_(std::move(name)), queue_max_(queue_max) {
  for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Executor::~Executor() { Stop(); }

void Executor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool Executor::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || queue_.size() >= queue_max_) return false;
  queue_.push_back(std::move(task));
  return true;
}

size_t Executor::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool Executor::Drain(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && running_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void Executor::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace ckptd
