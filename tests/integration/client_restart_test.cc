// README "Using it from C++": a client survives a daemon restart. The same ckptd::Client, kept
// across a kill -9 and a clean stop of its daemon, reconnects (a new session), maps the new
// instance's arena and re-registers its shm regions, then saves and loads again bit-exact; while
// the daemon is down a call fails UNAVAILABLE naming the socket, and buffers of the old session are
// refused.

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "harness.h"
#include "shards.h"

using Catch::Matchers::Contains;
using ckptd_it::Daemon;
using ckptd_it::Shm;
using ckptd_it::Whole;

namespace {

std::vector<float> Values(float base) {
  std::vector<float> v(16384);
  std::iota(v.begin(), v.end(), base);
  return v;
}

// Saves `values` from the region (no copy: the library finds it registered) and loads it back
// into plain memory.
void SaveAndLoadFromRegion(ckptd::Client& client, Shm& shm, const std::string& job, uint64_t step,
                           const std::vector<float>& values) {
  const uint64_t bytes = values.size() * sizeof(float);
  std::memcpy(shm.data(), values.data(), bytes);
  ckptd::Client::reset_copy_stats();
  ckptd::TensorShard t = Whole("v", values);
  t.data = shm.data();
  absl::StatusOr<ckptd::SaveResult> saved = client.Save(job, step, 0, 1, std::span(&t, 1));
  REQUIRE(saved.ok());
  CHECK(ckptd::Client::copy_stats().save_bytes == 0);  // flushed from the region itself
  REQUIRE(client.WaitCommitted(job, step, 30000).ok());
  std::vector<float> got(values.size());
  ckptd::LoadTarget l{"v", ckptd::Region::Whole(), got.data(), bytes};
  REQUIRE(client.Load(job, step, 0, std::span(&l, 1)).ok());
  CHECK(got == values);
}

}  // namespace

TEST_CASE("client restart: one client keeps working across kill -9 and a clean restart",
          "[integration][restart]") {
  Daemon d;
  ckptd::ClientOptions options;
  options.socket_path = d.socket();
  options.rpc_timeout_ms = 5000;
  options.connect_timeout_ms = 1000;  // how long a call waits for the daemon to be back
  absl::StatusOr<std::unique_ptr<ckptd::Client>> connected = ckptd::Client::Connect(options);
  REQUIRE(connected.ok());
  std::unique_ptr<ckptd::Client> client = *std::move(connected);
  Shm shm(1 << 20);
  absl::StatusOr<uint64_t> region = client->RegisterShm(shm.name(), shm.bytes(), shm.data());
  REQUIRE(region.ok());
  SaveAndLoadFromRegion(*client, shm, "restart", 1, Values(1));
  absl::StatusOr<ckptd::ArenaBuffer> old_buffer = client->Allocate(8192);
  REQUIRE(old_buffer.ok());
  const uint64_t first_instance = old_buffer->generation;

  d.Kill9();
  absl::StatusOr<std::vector<ckptd::CheckpointInfo>> down = client->ListCheckpoints("restart");
  REQUIRE(down.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(down.status().message()), Contains(d.socket()));

  d.Restart({});
  SaveAndLoadFromRegion(*client, shm, "restart", 2, Values(2));
  CHECK(client->reconnect_count() == 1);
  // The step saved before the restart loads through the new session too.
  std::vector<float> got(Values(1).size());
  ckptd::LoadTarget l{"v", ckptd::Region::Whole(), got.data(), got.size() * sizeof(float)};
  REQUIRE(client->Load("restart", 1, 0, std::span(&l, 1)).ok());
  CHECK(got == Values(1));
  // The old session's buffer is refused; a new one is in the new arena and saves in place.
  ckptd::InPlaceTensorShard stale{"b",
                                  ckptd::DType::kUInt8,
                                  {8192},
                                  ckptd::Region::Whole(),
                                  ckptd::BufferRef::InArena(*old_buffer),
                                  8192};
  absl::StatusOr<ckptd::SaveResult> refused =
      client->SaveInPlace("restart-buf", 1, 0, 1, std::span(&stale, 1));
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<ckptd::ArenaBuffer> fresh = client->Allocate(8192);
  REQUIRE(fresh.ok());
  CHECK(fresh->generation != first_instance);
  std::memset(fresh->data, 0x5a, 8192);
  ckptd::InPlaceTensorShard in_arena{
      "b", ckptd::DType::kUInt8, {8192}, ckptd::Region::Whole(), ckptd::BufferRef::InArena(*fresh),
      8192};
  REQUIRE(client->SaveInPlace("restart-buf", 1, 0, 1, std::span(&in_arena, 1)).ok());
  REQUIRE(client->WaitCommitted("restart-buf", 1, 30000).ok());

  // A clean stop (SIGTERM) and start: the same again.
  REQUIRE(d.Stop());
  d.Restart({});
  SaveAndLoadFromRegion(*client, shm, "restart", 3, Values(3));
  CHECK(client->reconnect_count() == 2);
  std::vector<uint8_t> bytes(8192);
  ckptd::LoadTarget b{"b", ckptd::Region::Whole(), bytes.data(), bytes.size()};
  REQUIRE(client->Load("restart-buf", 1, 0, std::span(&b, 1)).ok());
  CHECK(bytes == std::vector<uint8_t>(8192, 0x5a));
  REQUIRE(client->Unregister(*region).ok());
}
