// SingleFlight (common/single_flight.h): one run per key at a time, shared by whoever asks while
// it runs; a later ask runs again; Await never runs anything.
#include "common/single_flight.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace ckptd {
namespace {

TEST_CASE("SingleFlight: callers of a key in flight share its one run and its status", "[unit]") {
  SingleFlight<std::string> flights;
  absl::Notification entered;
  absl::Notification release;
  std::atomic<int> runs{0};
  auto work = [&]() -> absl::Status {
    ++runs;
    entered.Notify();
    release.WaitForNotification();
    return absl::ResourceExhaustedError("too big");
  };
  SingleFlight<std::string>::Outcome leader;
  std::thread first([&] { leader = flights.Do("a", work); });
  entered.WaitForNotification();
  CHECK(flights.in_flight() == 1);
  constexpr int kWaiters = 4;
  std::vector<SingleFlight<std::string>::Outcome> got(kWaiters);
  std::vector<std::optional<absl::Status>> awaited(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      got[i] = flights.Do("a", work);
      awaited[i] = flights.Await("a");  // after the run: nothing in flight
    });
  }
  while (flights.waiters("a") < kWaiters) std::this_thread::yield();  // all joined the run
  // Another key runs at once, beside the first.
  CHECK(flights.Do("b", [] { return absl::OkStatus(); }).ran);
  release.Notify();
  first.join();
  for (std::thread& t : waiters) t.join();
  CHECK(runs == 1);
  CHECK(leader.ran);
  CHECK(absl::IsResourceExhausted(leader.status));
  for (int i = 0; i < kWaiters; ++i) {
    CHECK_FALSE(got[i].ran);
    CHECK(absl::IsResourceExhausted(got[i].status));
    CHECK_FALSE(awaited[i].has_value());
  }
  CHECK(flights.in_flight() == 0);
}

TEST_CASE("SingleFlight: Await waits for the run in flight and runs nothing itself", "[unit]") {
  SingleFlight<int> flights;
  CHECK_FALSE(flights.Await(1).has_value());
  absl::Notification entered;
  absl::Notification release;
  std::thread runner([&] {
    (void)flights.Do(1, [&] {
      entered.Notify();
      release.WaitForNotification();
      return absl::OkStatus();
    });
  });
  entered.WaitForNotification();
  std::optional<absl::Status> awaited;
  std::thread waiter([&] { awaited = flights.Await(1); });
  while (flights.waiters(1) < 1) std::this_thread::yield();
  release.Notify();
  runner.join();
  waiter.join();
  REQUIRE(awaited.has_value());
  CHECK(awaited->ok());
  // Once a run ended, the next Do runs again.
  int runs = 0;
  CHECK(flights
            .Do(1,
                [&] {
                  ++runs;
                  return absl::OkStatus();
                })
            .ran);
  CHECK(runs == 1);
}

}  // namespace
}  // namespace ckptd
