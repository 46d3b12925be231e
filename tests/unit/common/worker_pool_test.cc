#include "common/worker_pool.h"

#include <pthread.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace ckptd {
namespace {

using WhenFull = WorkerPool::WhenFull;
using Mode = WorkerPool::ShutdownMode;

std::string CurrentThreadName() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// Occupies every thread of `pool` until Open().
class Gate {
 public:
  Gate(WorkerPool& pool, size_t threads) {
    for (size_t i = 0; i < threads; ++i) {
      REQUIRE(pool.Post(
                      [this] {
                        entered_++;
                        open_.WaitForNotification();
                      },
                      WhenFull::kRefuse)
                  .ok());
    }
    while (entered_.load() < static_cast<int>(threads)) std::this_thread::yield();
  }
  void Open() { open_.Notify(); }

 private:
  std::atomic<int> entered_{0};
  absl::Notification open_;
};

TEST_CASE("worker pool: runs tasks on named threads and returns their results", "[unit]") {
  WorkerPool pool("crc", 3, 8);
  CHECK(pool.threads() == 3);
  auto name =
      pool.Submit([] { return absl::StatusOr<std::string>(CurrentThreadName()); }, WhenFull::kWait);
  REQUIRE(name.ok());
  absl::StatusOr<std::string> got = name->get();
  REQUIRE(got.ok());
  CHECK((*got == "crc-0" || *got == "crc-1" || *got == "crc-2"));
  auto value = pool.Submit([] { return absl::StatusOr<int>(42); }, WhenFull::kRefuse);
  REQUIRE(value.ok());
  CHECK(*value->get() == 42);
  CHECK(pool.WaitIdle(absl::Seconds(10)));
  CHECK(pool.queued() == 0);
  CHECK(pool.running() == 0);
}

TEST_CASE("worker pool: long names are cut to fit the thread name limit", "[unit]") {
  WorkerPool pool("a-very-long-pool-name", 1, 1);
  auto name =
      pool.Submit([] { return absl::StatusOr<std::string>(CurrentThreadName()); }, WhenFull::kWait);
  REQUIRE(name.ok());
  CHECK(*name->get() == "a-very-long-p-0");
}

TEST_CASE("worker pool: errors of tasks reach their futures", "[unit]") {
  WorkerPool pool("err", 2, 4);
  auto st =
      pool.Submit([] { return absl::DataLossError("block 3 crc32c mismatch"); }, WhenFull::kWait);
  REQUIRE(st.ok());
  absl::Status got = st->get();
  CHECK(got.code() == absl::StatusCode::kDataLoss);
  CHECK(got.message() == "block 3 crc32c mismatch");
  auto so =
      pool.Submit([] { return absl::StatusOr<int>(absl::NotFoundError("x")); }, WhenFull::kWait);
  REQUIRE(so.ok());
  CHECK(so->get().status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("worker pool: a full queue refuses with RESOURCE_EXHAUSTED (kRefuse)", "[unit]") {
  WorkerPool pool("full", 1, 2);
  Gate gate(pool, 1);
  std::atomic<int> ran{0};
  CHECK(pool.Post([&] { ran++; }, WhenFull::kRefuse).ok());
  CHECK(pool.Post([&] { ran++; }, WhenFull::kRefuse).ok());
  absl::Status refused = pool.Post([&] { ran++; }, WhenFull::kRefuse);
  CHECK(refused.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(refused.message()).find("full pool has 2 tasks queued") != std::string::npos);
  auto future = pool.Submit([] { return absl::OkStatus(); }, WhenFull::kRefuse);
  CHECK(future.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(pool.queued() == 2);
  gate.Open();
  CHECK(pool.WaitIdle(absl::Seconds(10)));
  CHECK(ran.load() == 2);
}

TEST_CASE("worker pool: a batch is queued whole or not at all", "[unit]") {
  WorkerPool pool("batch", 1, 3);
  Gate gate(pool, 1);
  std::atomic<int> ran{0};
  auto tasks = [&](int n) {
    std::vector<WorkerPool::Task> v;
    for (int i = 0; i < n; ++i) v.push_back({[&] { ran++; }, nullptr});
    return v;
  };
  REQUIRE(pool.Post([&] { ran++; }, WhenFull::kRefuse).ok());
  size_t posted = 99;
  CHECK(pool.PostBatch(tasks(3), WhenFull::kRefuse, &posted).code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(posted == 0);
  CHECK(pool.queued() == 1);
  // Larger than the whole queue: refused even when waiting is allowed (it could never fit).
  CHECK(pool.PostBatch(tasks(4), WhenFull::kWait, &posted).code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(pool.PostBatch(tasks(2), WhenFull::kRefuse, &posted).ok());
  CHECK(posted == 2);
  gate.Open();
  CHECK(pool.WaitIdle(absl::Seconds(10)));
  CHECK(ran.load() == 3);
}

TEST_CASE("worker pool: kWait blocks at the bound until there is room (backpressure)", "[unit]") {
  WorkerPool pool("wait", 1, 2);
  Gate gate(pool, 1);
  std::atomic<int> ran{0};
  REQUIRE(pool.Post([&] { ran++; }, WhenFull::kWait).ok());
  REQUIRE(pool.Post([&] { ran++; }, WhenFull::kWait).ok());
  std::atomic<bool> returned{false};
  absl::Status st;
  std::thread submitter([&] {
    st = pool.Post([&] { ran++; }, WhenFull::kWait);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  CHECK_FALSE(returned.load());  // the queue is full and its only thread is held
  CHECK(pool.queued() == 2);
  gate.Open();
  submitter.join();
  CHECK(st.ok());
  CHECK(pool.WaitIdle(absl::Seconds(10)));
  CHECK(ran.load() == 3);
}

TEST_CASE("worker pool: shutdown with queued work drains or cancels it", "[unit]") {
  std::atomic<int> ran{0}, cancelled{0};
  auto task = [&] { return WorkerPool::Task{[&] { ran++; }, [&] { cancelled++; }}; };
  SECTION("kDrain runs everything queued, then refuses") {
    WorkerPool pool("drain", 2, 16);
    Gate gate(pool, 2);
    for (int i = 0; i < 10; ++i) REQUIRE(pool.Post(task(), WhenFull::kRefuse).ok());
    std::thread stopper([&] { pool.Shutdown(Mode::kDrain); });
    gate.Open();
    stopper.join();
    CHECK(ran.load() == 10);
    CHECK(cancelled.load() == 0);
    CHECK(pool.Post(task(), WhenFull::kRefuse).code() == absl::StatusCode::kUnavailable);
    CHECK(pool.Post(task(), WhenFull::kWait).code() == absl::StatusCode::kUnavailable);
  }
  SECTION("kCancel drops the queued tasks: their futures hold CANCELLED") {
    WorkerPool pool("cancel", 1, 16);
    Gate gate(pool, 1);
    for (int i = 0; i < 5; ++i) REQUIRE(pool.Post(task(), WhenFull::kRefuse).ok());
    auto future = pool.Submit([] { return absl::StatusOr<int>(1); }, WhenFull::kRefuse);
    REQUIRE(future.ok());
    std::thread stopper([&] { pool.Shutdown(Mode::kCancel); });
    // The running task finishes; the queued ones never run.
    CHECK(future->get().status().code() == absl::StatusCode::kCancelled);
    gate.Open();
    stopper.join();
    CHECK(ran.load() == 0);
    CHECK(cancelled.load() == 5);
    CHECK(pool.Submit([] { return absl::OkStatus(); }, WhenFull::kRefuse).status().code() ==
          absl::StatusCode::kUnavailable);
  }
  SECTION("a submitter waiting for room is answered UNAVAILABLE") {
    WorkerPool pool("stopwait", 1, 1);
    Gate gate(pool, 1);
    REQUIRE(pool.Post(task(), WhenFull::kRefuse).ok());
    absl::Status st;
    std::thread submitter([&] { st = pool.Post(task(), WhenFull::kWait); });
    absl::SleepFor(absl::Milliseconds(50));
    std::thread stopper([&] { pool.Shutdown(Mode::kCancel); });
    submitter.join();
    CHECK(st.code() == absl::StatusCode::kUnavailable);
    gate.Open();
    stopper.join();
    CHECK(cancelled.load() == 1);
  }
  SECTION("the destructor cancels") {
    auto pool = std::make_unique<WorkerPool>("dtor", 1, 4);
    auto gate = std::make_unique<Gate>(*pool, 1);
    REQUIRE(pool->Post(task(), WhenFull::kRefuse).ok());
    std::thread stopper([&] { pool.reset(); });
    while (cancelled.load() == 0) std::this_thread::yield();
    gate->Open();
    stopper.join();
    CHECK(ran.load() == 0);
  }
}

TEST_CASE("worker pool: many submitters, every task runs exactly once", "[unit]") {
  WorkerPool pool("many", 3, 4);
  constexpr int kSubmitters = 8, kTasks = 500;
  std::atomic<int64_t> sum{0};
  std::atomic<int> refused{0}, unexpected{0};
  std::vector<std::thread> submitters;
  for (int s = 0; s < kSubmitters; ++s) {
    submitters.emplace_back([&, s] {
      for (int i = 1; i <= kTasks; ++i) {
        WhenFull how = (s % 2 == 0) ? WhenFull::kWait : WhenFull::kRefuse;
        while (true) {
          absl::Status st = pool.Post([&sum, i] { sum += i; }, how);
          if (st.ok()) break;
          // No Catch assertion off the test's thread: Catch2 v2 is not thread-safe.
          if (st.code() != absl::StatusCode::kResourceExhausted) unexpected++;
          refused++;
          std::this_thread::yield();
        }
      }
    });
  }
  for (std::thread& t : submitters) t.join();
  REQUIRE(pool.WaitIdle(absl::Seconds(60)));
  CHECK(sum.load() == int64_t{kSubmitters} * kTasks * (kTasks + 1) / 2);
  CHECK(unexpected.load() == 0);
  CHECK(pool.queued() == 0);
}

}  // namespace
}  // namespace ckptd
