// FairExecutor: a bounded pool for RPC work shared by many uids (docs/DESIGN.md invariant 6: no uid
// can make another wait beyond a stated bound). Each uid has its own FIFO queue; a free thread
// takes the next task of the next uid in round-robin order, so a uid that queued thousands of calls
// delays another uid's call by at most one call per thread, never by its whole backlog. Two
// per-uid shares bound what one uid can hold:
//  - `uid_running_max`: threads one uid's tasks may occupy at once. A pool made with one thread
//    more than that (the usual setup, main.cc) always keeps a thread for the other uids, however
//    long one uid's calls run (a Wait of an hour, a 100,000-item Save);
//  - `uid_inflight_max`: its calls queued or running at once; more are refused at Post.
// The pool's `queue_max` bounds the queued tasks of all uids together.
//
// Post never blocks: a refusal is RESOURCE_EXHAUSTED naming the limit, the pool and the uid
// (backpressure, docs/DESIGN.md invariant 5). Threads are named "<name>-<i>"
// (common/worker_pool.h's rule). Thread safety: every method may be called from any thread; Stop
// not from the pool's own threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {

class FairExecutor {
 public:
  struct Shares {
    size_t threads = 1;           // >= 1
    size_t queue_max = 1;         // queued tasks of all uids, >= 1
    size_t uid_running_max = 1;   // >= 1
    size_t uid_inflight_max = 1;  // >= uid_running_max
    // How uid_inflight_max is named in a refusal (the options an operator tunes).
    std::string inflight_name;
  };

  FairExecutor(std::string name, Shares shares);
  ~FairExecutor();  // Stop()
  FairExecutor(const FairExecutor&) = delete;
  FairExecutor& operator=(const FairExecutor&) = delete;

  // Queues `task` for `uid`. RESOURCE_EXHAUSTED when the uid already has uid_inflight_max calls
  // in flight here, or queue_max tasks are queued; UNAVAILABLE once stopped.
  absl::Status Post(uint32_t uid, std::function<void()> task);
  // Drops queued tasks, refuses new ones, and joins the threads after their running tasks.
  void Stop();

  size_t queued() const;
  const std::string& name() const { return name_; }
  const Shares& shares() const { return shares_; }

 private:
  struct Uid {
    std::deque<std::function<void()>> queue;
    size_t running = 0;
  };
  void Run();
  // The next task a thread may start (round robin over uids with queued work under their
  // running share); false when none may start now.
  bool NextLocked(uint32_t* uid, std::function<void()>* task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const Shares shares_;
  mutable absl::Mutex mu_;
  absl::CondVar ready_;
  absl::flat_hash_map<uint32_t, Uid> uids_ ABSL_GUARDED_BY(mu_);  // only uids with work
  std::deque<uint32_t> ring_ ABSL_GUARDED_BY(mu_);  // uids with queued tasks, in turn order
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptd
