// RunPieces (service/run_copy.h): every piece runs exactly once, on the caller and the pool; the
// first error is returned and later pieces are skipped; it returns only once no piece still runs;
// a refusing (shut-down) pool leaves the work to the caller.
#include "service/run_copy.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "common/worker_pool.h"

namespace ckptd {
namespace {

TEST_CASE("run pieces: each piece runs once, on the calling thread and the pool", "[run_copy]") {
  WorkerPool pool("copy-test", 3, 16);
  const bool with_pool = GENERATE(true, false);
  std::vector<std::atomic<int>> ran(200);
  std::atomic<int> off_caller{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<CopyPiece> pieces;
  pieces.reserve(ran.size());
  for (size_t i = 0; i < ran.size(); ++i) {
    pieces.push_back([&, i] {
      ran[i].fetch_add(1);
      if (std::this_thread::get_id() != caller) off_caller.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return absl::OkStatus();
    });
  }
  REQUIRE(RunPieces(with_pool ? &pool : nullptr, pieces).ok());
  for (size_t i = 0; i < ran.size(); ++i) CHECK(ran[i].load() == 1);
  if (with_pool) {
    CHECK(off_caller.load() > 0);  // the pool took some
  } else {
    CHECK(off_caller.load() == 0);
  }
}

TEST_CASE("run pieces: the first error wins and nothing runs after the call returns",
          "[run_copy]") {
  WorkerPool pool("copy-test", 3, 16);
  std::atomic<int> running{0};
  std::atomic<int> started{0};
  std::vector<CopyPiece> pieces;
  pieces.reserve(64);
  for (int i = 0; i < 64; ++i) {
    pieces.push_back([&, i] {
      running.fetch_add(1);
      started.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      running.fetch_sub(1);
      if (i == 5) return absl::DataLossError("piece 5");
      return absl::OkStatus();
    });
  }
  absl::Status st = RunPieces(&pool, pieces);
  CHECK(running.load() == 0);  // every piece that started has ended
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(st.message() == "piece 5");
  CHECK(started.load() < 64);  // pieces taken after the failure were skipped
  const int after = started.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(started.load() == after);  // helpers that start late find nothing to do
}

TEST_CASE("run pieces: a pool that refuses leaves the work to the caller", "[run_copy]") {
  WorkerPool pool("copy-test", 2, 4);
  pool.Shutdown(WorkerPool::ShutdownMode::kDrain);
  std::atomic<int> ran{0};
  std::vector<CopyPiece> pieces(10, [&] {
    ran.fetch_add(1);
    return absl::OkStatus();
  });
  REQUIRE(RunPieces(&pool, pieces).ok());
  CHECK(ran.load() == 10);
}

}  // namespace
}  // namespace ckptd
