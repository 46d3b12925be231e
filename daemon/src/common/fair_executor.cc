#include "common/fair_executor.h"

#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"

namespace ckptd {

FairExecutor::FairExecutor(std::string name, Shares shares)
    : name_(std::move(name)), shares_(std::move(shares)) {
  CKPTD_CHECK(shares_.threads >= 1 && shares_.threads <= limits::kWorkerPoolThreadsMax &&
              shares_.queue_max >= 1 && shares_.uid_running_max >= 1 &&
              shares_.uid_inflight_max >= shares_.uid_running_max);
  threads_.reserve(shares_.threads);
  for (size_t i = 0; i < shares_.threads; ++i) {
    threads_.emplace_back([this, i] {
      std::string suffix = absl::StrCat("-", i);
      std::string thread_name = name_.substr(0, limits::kThreadNameBytesMax - suffix.size());
      pthread_setname_np(pthread_self(), (thread_name + suffix).c_str());
      Run();
    });
  }
}

FairExecutor::~FairExecutor() { Stop(); }

absl::Status FairExecutor::Post(uint32_t uid, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError(absl::StrCat("the ", name_, " pool is shut down"));
  auto it = uids_.find(uid);
  const size_t inflight = it == uids_.end() ? 0 : it->second.queue.size() + it->second.running;
  if (inflight >= shares_.uid_inflight_max) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", uid, " has ", inflight, " calls in flight on the daemon's ", name_,
                     " pool; its share is ", shares_.uid_inflight_max, " (", shares_.inflight_name,
                     "): wait for some to finish"));
  }
  if (queued_ >= shares_.queue_max) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the daemon is overloaded: ", queued_, " calls queued on its ", name_,
                     " pool (the limit), uid ", uid, "'s refused; retry later"));
  }
  Uid& u = uids_[uid];
  if (u.queue.empty()) ring_.push_back(uid);
  u.queue.push_back(std::move(task));
  ++queued_;
  ready_.Signal();
  return absl::OkStatus();
}

bool FairExecutor::NextLocked(uint32_t* uid, std::function<void()>* task) {
  for (size_t i = 0; i < ring_.size(); ++i) {
    const uint32_t candidate = ring_.front();
    ring_.pop_front();
    Uid& u = uids_.at(candidate);
    if (u.running >= shares_.uid_running_max) {
      ring_.push_back(candidate);  // at its share: the next uid's turn
      continue;
    }
    *uid = candidate;
    *task = std::move(u.queue.front());
    u.queue.pop_front();
    --queued_;
    ++u.running;
    if (!u.queue.empty()) ring_.push_back(candidate);  // its next task after the others' turn
    return true;
  }
  return false;
}

void FairExecutor::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    uint32_t uid = 0;
    std::function<void()> task;
    while (!stopping_ && !NextLocked(&uid, &task)) ready_.Wait(&mu_);
    if (stopping_) return;
    mu_.Unlock();
    task();
    task = nullptr;  // whatever it captured goes before the lock is taken back
    mu_.Lock();
    Uid& u = uids_.at(uid);
    --u.running;
    if (u.running == 0 && u.queue.empty()) uids_.erase(uid);
    // A task of this uid held back by its running share may start now, as may any other.
    ready_.SignalAll();
  }
}

void FairExecutor::Stop() {
  std::deque<std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [uid, u] : uids_) {
      for (auto& t : u.queue) dropped.push_back(std::move(t));
      u.queue.clear();
    }
    ring_.clear();
    queued_ = 0;
    ready_.SignalAll();
  }
  dropped.clear();  // outside the lock: a task's captures may take other locks when destroyed
  for (std::thread& t : threads_) t.join();
}

size_t FairExecutor::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

}  // namespace ckptd
