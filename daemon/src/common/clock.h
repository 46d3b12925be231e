// Clock: the seam through which the daemon reads the time for its housekeeping decisions — a
// checkpoint short of ranks after stage_timeout_ms, the flush gate (flush_gate_ms), a session
// never attached — and for the timestamps it records (created/committed). Tests pass a FakeClock
// and advance it to make those decisions happen exactly when they choose
// (tests/unit/service/simulation_test.cc).
//
// Deliberately not behind the seam: waits that block a client's RPC (Wait's timeout_ms, a
// reservation waiting for arena space) and the housekeeping thread's polling period. They use
// real time, so a client's timeout means what it says whatever the Clock; under a FakeClock the
// housekeeping thread still wakes on its real period and decides with the fake time.
//
// Ownership: a Clock is borrowed (ServiceDeps::clock, SessionTable) and must outlive its users.
// RealClock() is one process-wide instance, never destroyed.
// Thread safety: Now() may be called from any thread, concurrently; so may FakeClock::Advance.
#pragma once

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ckptd {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  uint64_t NowUnixMs() const { return static_cast<uint64_t>(absl::ToUnixMillis(Now())); }
};

// absl::Now().
const Clock* RealClock();

// Whole microseconds from `from` to `to`; 0 when `to` is not later (the timings the daemon
// records: service/pending_checkpoint.h).
inline uint64_t MicrosBetween(absl::Time from, absl::Time to) {
  return to > from ? static_cast<uint64_t>(absl::ToInt64Microseconds(to - from)) : 0;
}

// A clock that stands still until Advance()d (tests). Never goes backwards: the daemon computes
// elapsed times as unsigned differences.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  // Moves the time forward by `d` (a negative `d` is ignored).
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (d > absl::ZeroDuration()) now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd
