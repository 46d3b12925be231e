// The save threads of Client::SaveAsync (async_saves.h).
#include "async_saves.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace ckptd::internal {

AsyncSaves::AsyncSaves(uint32_t threads, int nice, uint32_t max_in_flight)
    : threads_max_(threads), nice_(nice), max_in_flight_(max_in_flight) {}

AsyncSaves::~AsyncSaves() {
  std::vector<std::thread> pool;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    pool.swap(pool_);
  }
  for (std::thread& t : pool) t.join();  // each thread drains the queue before it exits
}

uint32_t AsyncSaves::in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(queue_.size()) + running_;
}

absl::StatusOr<std::shared_ptr<AsyncSaveState>> AsyncSaves::Submit(
    std::function<absl::StatusOr<SaveResult>()> save) {
  auto state = std::make_shared<AsyncSaveState>();
  absl::MutexLock lock(&mu_);
  const uint32_t in_flight = static_cast<uint32_t>(queue_.size()) + running_;
  if (in_flight >= max_in_flight_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(in_flight,
                     " saves of this client are already in flight (ClientOptions::"
                     "async_saves_max ",
                     max_in_flight_, "): wait for one with PendingSave::WaitStaged() first"));
  }
  queue_.push_back(Entry{std::move(save), state});
  // A new thread when every started one is busy and the pool is below its size.
  if (pool_.size() < threads_max_ && running_ + queue_.size() > pool_.size()) {
    pool_.emplace_back([this] { Run(); });
  }
  return state;
}

void AsyncSaves::Run() {
  if (nice_ > 0) {
    // Linux: PRIO_PROCESS with a thread id sets that thread's nice value alone. Lowering it needs
    // no privilege; a refusal (seccomp) leaves the normal priority, which is only slower.
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice_);
  }
  for (;;) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and nothing is left to run
      entry = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    absl::StatusOr<SaveResult> result = entry.save();
    entry.save = nullptr;  // drops what the save captured before the caller is told
    {
      absl::MutexLock state_lock(&entry.state->mu);
      entry.state->result = std::move(result);
    }
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

absl::StatusOr<SaveResult> AwaitSave(AsyncSaveState& state) {
  absl::MutexLock lock(&state.mu);
  auto done = [&state]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) { return state.result.has_value(); };
  state.mu.Await(absl::Condition(&done));
  return *state.result;
}

bool SaveDone(AsyncSaveState& state) {
  absl::MutexLock lock(&state.mu);
  return state.result.has_value();
}

}  // namespace ckptd::internal
