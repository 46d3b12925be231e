// service/store_discovery.h: one scan of a scope at a time (callers join it), none again within
// the minimum interval unless forced, a bounded wait (the scan goes on), the scan's error to every
// waiter, refusal after Shutdown — with a scan function the test controls.
#include "service/store_discovery.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace ckptd {
namespace {

// A scan that counts its runs per scope and, while `hold` is set, waits for it to be cleared.
struct FakeScan {
  absl::Mutex mu;
  bool hold ABSL_GUARDED_BY(mu) = false;
  int runs ABSL_GUARDED_BY(mu) = 0;
  absl::Status answer ABSL_GUARDED_BY(mu);

  absl::Status Run(const std::string&) {
    absl::MutexLock lock(&mu);
    ++runs;
    mu.Await(absl::Condition(
        +[](bool* h) { return !*h; }, &hold));
    return answer;
  }
  void Hold(bool h) {
    absl::MutexLock lock(&mu);
    hold = h;
  }
  int Runs() {
    absl::MutexLock lock(&mu);
    return runs;
  }
};

TEST_CASE("store discovery: callers asking at once share one scan, none within the interval",
          "[service][discovery]") {
  FakeScan scan;
  StoreDiscovery d([&](const std::string& s) { return scan.Run(s); }, absl::Seconds(60));
  scan.Hold(true);
  std::vector<std::thread> callers;
  std::vector<absl::Status> got(8);
  for (size_t i = 0; i < got.size(); ++i) {
    callers.emplace_back([&, i] { got[i] = d.Refresh("job", absl::Seconds(30)); });
  }
  while (scan.Runs() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others join meanwhile
  scan.Hold(false);
  for (std::thread& t : callers) t.join();
  for (const absl::Status& s : got) CHECK(s.ok());
  CHECK(scan.Runs() == 1);
  // Scanned OK just now: not again, unless forced; another scope is its own.
  CHECK(d.Refresh("job", absl::Seconds(30)).ok());
  CHECK(scan.Runs() == 1);
  CHECK(d.Refresh("job", absl::Seconds(30), /*force=*/true).ok());
  CHECK(scan.Runs() == 2);
  CHECK(d.Refresh("other", absl::Seconds(30)).ok());
  CHECK(scan.Runs() == 3);
  CHECK(d.scans() == 3);
}

TEST_CASE("store discovery: a slow scan is waited for once, for a bounded time, and goes on",
          "[service][discovery]") {
  FakeScan scan;
  StoreDiscovery d([&](const std::string& s) { return scan.Run(s); }, absl::Seconds(60));
  scan.Hold(true);
  const absl::Time t0 = absl::Now();
  absl::Status st = d.Refresh("job", absl::Milliseconds(100));
  CHECK(absl::IsDeadlineExceeded(st));
  CHECK(absl::Now() - t0 < absl::Seconds(10));
  // A later caller of the same scan does not wait again: the scan's deadline has passed.
  const absl::Time t1 = absl::Now();
  CHECK(absl::IsDeadlineExceeded(d.Refresh("job", absl::Seconds(30))));
  CHECK(absl::Now() - t1 < absl::Seconds(5));
  scan.Hold(false);
  // Once it ended OK the scope is fresh: no second run.
  while (d.scans() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(d.Refresh("job", absl::Seconds(30)).ok());
  CHECK(scan.Runs() == 1);
}

TEST_CASE("store discovery: a failed scan is every waiter's error and is not remembered",
          "[service][discovery]") {
  FakeScan scan;
  {
    absl::MutexLock lock(&scan.mu);
    scan.answer = absl::UnavailableError("store down");
  }
  StoreDiscovery d([&](const std::string& s) { return scan.Run(s); }, absl::Seconds(60));
  CHECK(absl::IsUnavailable(d.Refresh("job", absl::Seconds(30))));
  // Not fresh: the next question scans again.
  {
    absl::MutexLock lock(&scan.mu);
    scan.answer = absl::OkStatus();
  }
  CHECK(d.Refresh("job", absl::Seconds(30)).ok());
  CHECK(scan.Runs() == 2);
}

TEST_CASE("store discovery: after Shutdown nothing is scanned", "[service][discovery]") {
  FakeScan scan;
  StoreDiscovery d([&](const std::string& s) { return scan.Run(s); }, absl::Seconds(60));
  d.Shutdown();
  CHECK(absl::IsUnavailable(d.Refresh("job", absl::Seconds(1))));
  CHECK(scan.Runs() == 0);
}

}  // namespace
}  // namespace ckptd
