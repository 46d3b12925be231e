#include "format/checksum_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "format/crc32c.h"

namespace ckptd {
namespace {

std::vector<uint8_t> Bytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_CASE("checksum pool: equals BlockCrcs for every length and task size", "[unit]") {
  WorkerPool pool("crc", 3, 8);
  for (uint64_t len : {0ull, 1ull, 4095ull, 4096ull, 4097ull, 10 * 4096ull + 17, 300000ull}) {
    std::vector<uint8_t> data = Bytes(len, len);
    for (uint64_t task : {1ull, 4096ull, 3 * 4096ull + 5, 1ull << 20}) {
      INFO("length " << len << ", task " << task);
      auto got = ParallelBlockCrcs(pool, data.data(), len, 4096, task);
      REQUIRE(got.ok());
      CHECK(*got == BlockCrcs(data.data(), len, 4096));
    }
  }
}

TEST_CASE("checksum pool: many ranges at once, each into its own results", "[unit]") {
  WorkerPool pool("crc", 2, 4);  // fewer slots than tasks: submission waits for room
  std::vector<std::vector<uint8_t>> data;
  std::vector<std::vector<uint32_t>> out;
  std::vector<CrcRange> ranges;
  for (uint64_t i = 0; i < 12; ++i) {
    data.push_back(Bytes(i * 5000, i));
    out.emplace_back(BlockCount(i * 5000, 4096), 0);
  }
  for (size_t i = 0; i < data.size(); ++i) {
    ranges.push_back(CrcRange{data[i].data(), data[i].size(), out[i].data()});
  }
  REQUIRE(ParallelBlockCrcs(pool, ranges, 4096, nullptr, 8192).ok());
  for (size_t i = 0; i < data.size(); ++i) {
    CHECK(out[i] == BlockCrcs(data[i].data(), data[i].size(), 4096));
  }
}

TEST_CASE("checksum pool: the first error is returned after every task has finished", "[unit]") {
  WorkerPool pool("crc", 2, 8);
  std::vector<uint8_t> data = Bytes(64 * 4096, 1);
  std::vector<uint32_t> out(64);
  std::atomic<int> started{0}, finished{0};
  BlockSumFn sum = [&](const uint8_t* p, uint64_t n, uint32_t block, uint32_t* o) {
    started++;
    absl::SleepFor(absl::Milliseconds(2));
    BlockCrcsInto(p, n, block, o);
    finished++;
    if (p == data.data() + 8 * 4096) return absl::DataLossError("client memory vanished");
    return absl::OkStatus();
  };
  CrcRange r{data.data(), data.size(), out.data()};
  absl::Status st = ParallelBlockCrcs(pool, std::span(&r, 1), 4096, sum, 4 * 4096);
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(started.load() == 16);
  CHECK(finished.load() == 16);  // none still running when it returned
}

TEST_CASE("checksum pool: a started job runs while the caller works, and is waited for", "[unit]") {
  WorkerPool pool("crc", 2, 8);
  std::vector<uint8_t> data = Bytes(40 * 4096 + 3, 5);
  std::vector<uint32_t> out(41);
  CrcRange r{data.data(), data.size(), out.data()};
  absl::Notification release;
  std::atomic<int> done{0};
  BlockSumFn held = [&](const uint8_t* p, uint64_t n, uint32_t block, uint32_t* o) {
    release.WaitForNotification();
    BlockCrcsInto(p, n, block, o);
    done++;
    return absl::OkStatus();
  };
  SECTION("Wait") {
    BlockCrcJob job = StartBlockCrcs(pool, std::span(&r, 1), 4096, held, 8 * 4096);
    CHECK(done.load() == 0);  // started, none finished: the caller is free meanwhile
    release.Notify();
    CHECK(job.Wait().ok());
    CHECK(done.load() == 6);
    CHECK(out == BlockCrcs(data.data(), data.size(), 4096));
    CHECK(job.Wait().ok());  // a second Wait: nothing left
  }
  SECTION("the destructor waits") {
    std::thread releaser([&] {
      absl::SleepFor(absl::Milliseconds(50));
      release.Notify();
    });
    { BlockCrcJob job = StartBlockCrcs(pool, std::span(&r, 1), 4096, held, 8 * 4096); }
    CHECK(done.load() == 6);
    releaser.join();
  }
}

TEST_CASE("checksum pool: a pool shut down leaves the work to the caller", "[unit]") {
  WorkerPool pool("crc", 1, 2);
  pool.Shutdown(WorkerPool::ShutdownMode::kDrain);
  std::vector<uint8_t> data = Bytes(100000, 3);
  auto got = ParallelBlockCrcs(pool, data.data(), data.size(), 4096, 4096);
  REQUIRE(got.ok());
  CHECK(*got == BlockCrcs(data.data(), data.size(), 4096));
}

TEST_CASE("checksum pool: concurrent callers share one pool", "[unit]") {
  WorkerPool pool("crc", 2, 4);
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 6; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 10; ++round) {
        std::vector<uint8_t> data = Bytes(50000 + c * 1000 + round, c * 100 + round);
        auto got = ParallelBlockCrcs(pool, data.data(), data.size(), 4096, 8192);
        if (!got.ok() || *got != BlockCrcs(data.data(), data.size(), 4096)) wrong++;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(wrong.load() == 0);
}

}  // namespace
}  // namespace ckptd
