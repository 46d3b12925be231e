#include "ckptd/sync_point.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {
namespace sync_point_internal {

std::atomic<bool> armed{false};

}  // namespace sync_point_internal

namespace {

// A crash is armed when crash_nth > 0. Both are written before `armed` is set.
std::atomic<size_t> crash_point{0};
std::atomic<uint64_t> crash_nth{0};
std::atomic<uint64_t> hits[kSyncPointCount];

absl::Mutex callback_mu(absl::kConstInit);
SyncPointCallback* callback ABSL_GUARDED_BY(callback_mu) = nullptr;

// A kill -9 at this step: one line on stderr (write(2): nothing buffered is flushed), then
// SIGKILL to ourselves, so no destructor, atexit handler or stdio flush runs.
[[noreturn]] void CrashHere(size_t point, uint64_t nth) {
  char line[256];
  const int n = std::snprintf(line, sizeof line,
                              "ckptd: crash point %.*s reached (hit %llu): SIGKILL "
                              "(debug_crash_at)\n",
                              static_cast<int>(kSyncPoints[point].size()),
                              kSyncPoints[point].data(), static_cast<unsigned long long>(nth));
  if (n > 0 && write(STDERR_FILENO, line, std::min<size_t>(n, sizeof line - 1)) < 0) {
    // Nothing to do: the crash is the point.
  }
  kill(getpid(), SIGKILL);
  _exit(128 + SIGKILL);
}

void UpdateArmed() {
  bool any = crash_nth.load() > 0;
  {
    absl::MutexLock lock(&callback_mu);
    any = any || callback != nullptr;
  }
  sync_point_internal::armed.store(any);
}

}  // namespace

void sync_point_internal::Reached(size_t point) {
  const uint64_t n = hits[point].fetch_add(1) + 1;
  if (crash_nth.load() == n && crash_point.load() == point) CrashHere(point, n);
  absl::MutexLock lock(&callback_mu);
  if (callback != nullptr) (*callback)(point);
}

absl::StatusOr<SyncPointCrash> ParseSyncPointCrash(std::string_view spec) {
  SyncPointCrash out;
  std::string_view name = spec;
  if (size_t colon = spec.rfind(':'); colon != std::string_view::npos) {
    name = spec.substr(0, colon);
    const std::string nth(spec.substr(colon + 1));
    if (!absl::SimpleAtoi(nth, &out.nth) || out.nth == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("crash point \"", std::string(spec),
                       "\": the count after ':' must be a whole number from 1"));
    }
  }
  for (size_t i = 0; i < kSyncPointCount; ++i) {
    if (kSyncPoints[i] == name) {
      out.point = i;
      return out;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", std::string(name),
                   "\" is no crash point; points are <area>.<step> with area save, flush, commit, "
                   "put_atomic, upload, cluster, peer, abort, delete, reshard or recovery "
                   "(daemon/include/ckptd/sync_point.h lists them)"));
}

absl::Status ArmSyncPointCrash(const SyncPointCrash& crash) {
  if (!kTestHooks) {
    return absl::FailedPreconditionError(
        "this build has no crash points (built with CKPTD_TEST_HOOKS=OFF)");
  }
  crash_point.store(crash.point);
  crash_nth.store(crash.nth);
  UpdateArmed();
  return absl::OkStatus();
}

void SetSyncPointCallback(SyncPointCallback callback_in) {
  {
    absl::MutexLock lock(&callback_mu);
    delete callback;
    callback = callback_in ? new SyncPointCallback(std::move(callback_in)) : nullptr;
  }
  UpdateArmed();
}

void ResetSyncPoints() {
  crash_nth.store(0);
  SetSyncPointCallback(nullptr);
  for (std::atomic<uint64_t>& h : hits) h.store(0);
}

uint64_t SyncPointHits(size_t point) { return point < kSyncPointCount ? hits[point].load() : 0; }

}  // namespace ckptd
