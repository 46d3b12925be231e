// A checkpoint larger than the staging arena, saved with the RAM tier on: the ranks that staged
// first persist and their extents pass to the RAM tier (not freed), and a reservation waiting for
// space must be woken then to evict them (StagingArena::WakeReservations), not sleep until its
// reserve_timeout_ms and fail RESOURCE_EXHAUSTED.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "harness.h"

using namespace ckptd_it;  // NOLINT(google-build-using-namespace): the harness

TEST_CASE("arena pressure: a save larger than the arena completes once staged ranks go hot",
          "[integration][ram]") {
  // 64 MiB arena, 4 ranks of 24 MiB: the third and fourth reservations find no space until the
  // first ranks' flushes (after flush_gate_ms) hand their extents to the RAM tier.
  Daemon d(DaemonConfig{.staging_bytes_max = 64ull << 20,
                        .extra_flags = {"--reserve_timeout_ms=15000", "--flush_gate_ms=500"}});
  constexpr uint32_t kWorld = 4;
  constexpr uint64_t kRows = 6144, kCols = 1024;  // 24 MiB of float32 per rank
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kRows * kCols));
  for (uint32_t r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < data[r].size(); ++i) data[r][i] = static_cast<float>(r * 7 + i % 101);
  }
  const auto started = std::chrono::steady_clock::now();
  std::vector<absl::Status> saved(kWorld);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      // Staggered so the first two hold the arena when the others reserve.
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * r));
      auto client = d.Connect();
      ckptd::TensorShard t;
      t.item = "w";
      t.global_shape = {kWorld * kRows, kCols};
      t.region = ckptd::Region::Box({r * kRows, 0}, {kRows, kCols});
      t.data = data[r].data();
      t.bytes = kRows * kCols * sizeof(float);
      saved[r] = client->Save("big", 1, r, kWorld, std::span(&t, 1), {}).status();
    });
  }
  for (std::thread& t : ranks) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO(d.Log());
  for (uint32_t r = 0; r < kWorld; ++r) CHECK(saved[r].ok());
  auto client = d.Connect();
  REQUIRE(client->WaitCommitted("big", 1, 30000).ok());
  // Woken when the first ranks went hot (about flush_gate_ms), far inside reserve_timeout_ms.
  CHECK(seconds < 10);
  for (uint32_t r = 0; r < kWorld; ++r) {
    std::vector<float> back(kRows * kCols);
    ckptd::LoadTarget target;
    target.item = "w";
    target.region = ckptd::Region::Box({r * kRows, 0}, {kRows, kCols});
    target.dest = back.data();
    target.bytes = back.size() * sizeof(float);
    REQUIRE(client->Load("big", 1, r, std::span(&target, 1)).ok());
    CHECK(back == data[r]);
  }
}
