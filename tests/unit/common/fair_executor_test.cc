// FairExecutor (common/fair_executor.h): uids served in turn, a thread kept for other uids, and
// per-uid shares of calls in flight refused naming the limit and the uid.
#include "common/fair_executor.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace ckptd {
namespace {

using namespace std::chrono_literals;

TEST_CASE("fair executor: one uid's long calls leave a thread to another uid", "[unit]") {
  FairExecutor pool("t", {.threads = 3,
                          .queue_max = 1000,
                          .uid_running_max = 2,
                          .uid_inflight_max = 500,
                          .inflight_name = "test share"});
  absl::Notification release;
  std::atomic<int> hog_started{0};
  // 100 long calls of uid 1: two run, 98 queue.
  for (int i = 0; i < 100; ++i) {
    REQUIRE(pool.Post(1,
                      [&] {
                        ++hog_started;
                        release.WaitForNotification();
                      })
                .ok());
  }
  for (int i = 0; i < 500 && hog_started.load() < 2; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(hog_started.load() == 2);  // two threads busy with uid 1, 98 of its calls queued
  absl::Notification victim_ran;
  REQUIRE(pool.Post(2, [&] { victim_ran.Notify(); }).ok());
  // The third thread is kept for uid 2: its call runs at once, ahead of uid 1's backlog.
  CHECK(victim_ran.WaitForNotificationWithTimeout(absl::Seconds(5)));
  CHECK(hog_started.load() == 2);
  release.Notify();
  pool.Stop();
}

TEST_CASE("fair executor: a uid past its calls in flight is refused naming the limit and uid",
          "[unit]") {
  FairExecutor pool("t", {.threads = 2,
                          .queue_max = 1000,
                          .uid_running_max = 1,
                          .uid_inflight_max = 3,
                          .inflight_name = "uid_share_percent of test"});
  absl::Notification release;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(pool.Post(7, [&] { release.WaitForNotification(); }).ok());
  }
  absl::Status refused = pool.Post(7, [] {});
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(refused.message().find("uid 7") != absl::string_view::npos);
  CHECK(refused.message().find("uid_share_percent of test") != absl::string_view::npos);
  // Another uid is not affected.
  absl::Notification other;
  REQUIRE(pool.Post(8, [&] { other.Notify(); }).ok());
  CHECK(other.WaitForNotificationWithTimeout(absl::Seconds(5)));
  release.Notify();
  pool.Stop();
}

TEST_CASE("fair executor: queued calls of several uids are served in turn", "[unit]") {
  FairExecutor pool("t", {.threads = 1,
                          .queue_max = 1000,
                          .uid_running_max = 1,
                          .uid_inflight_max = 1000,
                          .inflight_name = "test"});
  absl::Notification gate, started;
  REQUIRE(pool.Post(1,
                    [&] {
                      started.Notify();
                      gate.WaitForNotification();
                    })
              .ok());
  REQUIRE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::Mutex mu;
  std::vector<uint32_t> order;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(pool.Post(1,
                      [&] {
                        absl::MutexLock l(&mu);
                        order.push_back(1);
                      })
                .ok());
  }
  REQUIRE(pool.Post(2,
                    [&] {
                      absl::MutexLock l(&mu);
                      order.push_back(2);
                    })
              .ok());
  gate.Notify();
  for (int i = 0; i < 500; ++i) {
    {
      absl::MutexLock l(&mu);
      if (order.size() == 4) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  pool.Stop();
  absl::MutexLock l(&mu);
  // uid 1 was queued first, then uid 2: turns alternate, so uid 2's one call does not wait for
  // uid 1's whole backlog.
  CHECK(order == std::vector<uint32_t>{1, 2, 1, 1});
}

}  // namespace
}  // namespace ckptd
