// Pinning the staging arena for CUDA (ClientOptions::pin_arena_for_cuda) against the real daemon.
// Without a GPU the connect must fail cleanly and leave the daemon serving; with one ([gpu]) a
// tensor copied from device memory straight into the pinned arena saves and loads bit-exact.
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

#include "harness.h"

#ifdef CKPTD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

std::unique_ptr<ckptd::Client> PinnedClient(const Daemon& d, absl::Status* status) {
  ckptd::ClientOptions o;
  o.socket_path = d.socket();
  o.pin_arena_for_cuda = true;
  absl::StatusOr<std::unique_ptr<ckptd::Client>> c = ckptd::Client::Connect(o);
  *status = c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Saves `host` (float32 [n]) from the arena buffer `buf` as job/1 and loads it back.
std::vector<float> SaveFromArenaAndLoad(ckptd::Client& c, const ckptd::ArenaBuffer& buf,
                                        uint64_t n) {
  ckptd::InPlaceTensorShard s;
  s.item = "w";
  s.global_shape = {n};
  s.data = ckptd::BufferRef::InArena(buf);
  s.bytes = n * sizeof(float);
  REQUIRE(c.SaveFromArena("pin-job", 1, 0, 1, {&s, 1}).ok());
  REQUIRE(c.WaitCommitted("pin-job", 1, 30000).ok());
  std::vector<float> back(n, -1.0f);
  ckptd::LoadTarget t;
  t.item = "w";
  t.dest = back.data();
  t.bytes = n * sizeof(float);
  REQUIRE(c.Load("pin-job", 1, 0, {&t, 1}).ok());
  return back;
}

}  // namespace

TEST_CASE("cuda pin: pinning needs CUDA, without it Connect fails cleanly and nothing leaks",
          "[integration]") {
  Daemon d;
  absl::Status st;
  std::unique_ptr<ckptd::Client> pinned = PinnedClient(d, &st);
  if (st.ok()) {
    // A machine with a GPU: the mapping is pinned, and saving through it works.
    REQUIRE(pinned->arena_pinned_for_cuda());
  } else {
    INFO(st.ToString());
    REQUIRE(st.code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(st.message()), Contains("pinning arena"));
    REQUIRE_THAT(std::string(st.message()), Contains(d.ArenaName()));
    const std::string m(st.message());
    REQUIRE((m.find("cudaHostRegister") != std::string::npos ||
             m.find("no CUDA runtime") != std::string::npos));
  }
  // The daemon keeps serving; an unpinned client saves and loads as always.
  auto plain = d.Connect();
  REQUIRE_FALSE(plain->arena_pinned_for_cuda());
  ckptd::Client& c = pinned ? *pinned : *plain;
  const uint64_t n = 1 << 18;  // 1 MiB
  absl::StatusOr<ckptd::ArenaBuffer> buf = c.Allocate(n * sizeof(float));
  REQUIRE(buf.ok());
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.0f);
  std::memcpy(buf->data, host.data(), n * sizeof(float));
  REQUIRE(SaveFromArenaAndLoad(c, *buf, n) == host);
}

#ifdef CKPTD_HAVE_CUDA
TEST_CASE("cuda pin: a device buffer copied into the pinned arena saves and loads bit-exact",
          "[integration][gpu]") {
  DaemonConfig cfg;
  cfg.staging_bytes_max = 512ull << 20;
  Daemon d(cfg);
  absl::Status st;
  std::unique_ptr<ckptd::Client> c = PinnedClient(d, &st);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(c->arena_pinned_for_cuda());
  const uint64_t n = 64 << 20;  // 256 MiB of float32
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 1.0f);
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  absl::StatusOr<ckptd::ArenaBuffer> buf = c->Allocate(n * sizeof(float));
  REQUIRE(buf.ok());
  // The registration is visible to the CUDA runtime: the copy is DMA into the arena.
  cudaPointerAttributes attr;
  REQUIRE(cudaPointerGetAttributes(&attr, buf->data) == cudaSuccess);
  REQUIRE(attr.type == cudaMemoryTypeHost);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(buf->data, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream) ==
          cudaSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  REQUIRE(cudaFree(dev) == cudaSuccess);
  REQUIRE(SaveFromArenaAndLoad(*c, *buf, n) == host);
}
#endif
