// InFlight: the calls a server is answering now, so that its stop can wait for them (and only for
// them) before it closes the connections left (daemon/main.cc, peer/peer_server.cc). gRPC's own
// Shutdown(deadline) waits for every connection to close, idle ones included, until the deadline.
// Threads: every method from any thread.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd {

class InFlight {
 public:
  void Begin() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ++calls_;
  }
  void End() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --calls_;
  }
  // True once no call is in flight, within `timeout`.
  bool WaitIdle(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
  }

  // One call, for the life of a handler.
  class Scope {
   public:
    explicit Scope(InFlight* f) : f_(f) { f_->Begin(); }
    ~Scope() { f_->End(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    InFlight* const f_;
  };

 private:
  absl::Mutex mu_;
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd
