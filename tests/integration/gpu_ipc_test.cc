// The CUDA IPC data plane against the real daemon over its socket. Without a GPU: a CUDA_IPC
// registration is refused with FAILED_PRECONDITION naming the cause and the daemon goes on. With
// one ([gpu]): the C++ client's GPU shards and load targets go through the daemon (no byte copied
// by the library), bit-exact, at offsets inside allocations and into another layout; and against
// a daemon that cannot see the GPU, the library falls back to copying itself, with the same bytes.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "harness.h"
#include "raw_session.h"

#ifdef CKPTD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace ckptd_it;
using Catch::Matchers::Contains;

TEST_CASE("gpu ipc: a CUDA_IPC registration without a usable GPU is FAILED_PRECONDITION",
          "[integration]") {
  Daemon d;
  auto c = d.Connect();
  Raw raw(d);  // as any client could send it
  ckptd::v1::RegisterRegionRequest req;
  req.set_session_id(raw.hello.session_id());
  req.set_kind(ckptd::v1::CUDA_IPC);
  req.set_cuda_ipc_handle(std::string(64, '\1'));
  req.set_cuda_device_uuid(std::string(16, '\2'));
  req.set_size_bytes(4096);
  ckptd::v1::RegisterRegionResponse resp;
  grpc::Status st =
      raw.Call([&](grpc::ClientContext* ctx) { return raw.stub->RegisterRegion(ctx, req, &resp); });
  INFO(st.error_message());
  // No GPU here: no driver or no device. (On a GPU machine this handle is garbage: refused.)
  REQUIRE((st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
           st.error_code() == grpc::StatusCode::INVALID_ARGUMENT));
  if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    REQUIRE_THAT(st.error_message(), Contains("CUDA IPC regions need a GPU"));
  }
  // The daemon goes on serving.
  std::vector<float> w(256, 1.5f), back(256, 0.0f);
  ckptd::TensorShard s;
  s.item = "w";
  s.global_shape = {256};
  s.data = w.data();
  s.bytes = w.size() * 4;
  REQUIRE(c->Save("gpu-refused", 1, 0, 1, {&s, 1}).ok());
  REQUIRE(c->WaitCommitted("gpu-refused", 1, 30000).ok());
  ckptd::LoadTarget t;
  t.item = "w";
  t.dest = back.data();
  t.bytes = back.size() * 4;
  REQUIRE(c->Load("gpu-refused", 1, 0, {&t, 1}).ok());
  REQUIRE(back == w);
}

#ifdef CKPTD_HAVE_CUDA
namespace {

// Saves two float32 tensors living inside one cudaMalloc allocation (the second at a non-zero,
// unaligned offset) and loads them back into GPU memory, whole and as a box; returns the
// library's GPU fallback bytes.
uint64_t SaveAndLoadFromGpu(ckptd::Client& c, const std::string& job) {
  const uint64_t n = 1 << 20;
  std::vector<float> a(n), b(n / 2);
  std::iota(a.begin(), a.end(), 1.0f);
  std::iota(b.begin(), b.end(), -7.0f);
  uint8_t* dev = nullptr;
  const uint64_t b_at = n * 4 + 1028;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&dev), b_at + b.size() * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev, a.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(dev + b_at, b.data(), b.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  ckptd::Client::reset_copy_stats();
  ckptd::TensorShard s[2];
  s[0].item = "a";
  s[0].global_shape = {n};
  s[0].data = dev;
  s[0].bytes = n * 4;
  s[0].device = 0;
  s[1].item = "b";
  s[1].global_shape = {b.size() / 64, 64};
  s[1].data = dev + b_at;
  s[1].bytes = b.size() * 4;
  s[1].device = 0;
  absl::StatusOr<ckptd::SaveResult> saved = c.Save(job, 1, 0, 1, s);
  INFO(saved.status().ToString());
  REQUIRE(saved.ok());
  REQUIRE(cudaMemset(dev, 0, b_at + b.size() * 4) == cudaSuccess);  // staged: ours again
  REQUIRE(c.WaitCommitted(job, 1, 60000).ok());

  uint8_t* out = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&out), (n + 4096) * 4) == cudaSuccess);
  ckptd::LoadTarget t[2];
  t[0].item = "a";
  t[0].dest = out + 4;  // an offset inside the allocation
  t[0].bytes = n * 4;
  t[0].device = 0;
  t[1].item = "b";  // rows 5..7, columns 8..39: another layout
  t[1].region = ckptd::Region::Box({5, 8}, {3, 32});
  t[1].dest = out + 4 + n * 4;
  t[1].bytes = 3 * 32 * 4;
  t[1].device = 0;
  absl::StatusOr<ckptd::LoadResult> loaded = c.Load(job, 1, 0, t);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  std::vector<float> got(n), box(3 * 32);
  REQUIRE(cudaMemcpy(got.data(), out + 4, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(box.data(), out + 4 + n * 4, box.size() * 4, cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  REQUIRE(got == a);
  for (int r = 0; r < 3; ++r) {
    for (int k = 0; k < 32; ++k) REQUIRE(box[r * 32 + k] == b[(5 + r) * 64 + 8 + k]);
  }
  REQUIRE(cudaFree(dev) == cudaSuccess);
  REQUIRE(cudaFree(out) == cudaSuccess);
  return ckptd::Client::copy_stats().gpu_fallback_bytes;
}

}  // namespace

TEST_CASE("gpu ipc: the daemon copies GPU shards itself and loads into GPU memory",
          "[integration][gpu]") {
  DaemonConfig cfg;
  cfg.staging_bytes_max = 256ull << 20;
  Daemon d(cfg);
  auto c = d.Connect();
  REQUIRE(SaveAndLoadFromGpu(*c, "gpu-ipc") == 0);  // not one byte copied by the library
}

TEST_CASE("gpu ipc: against a daemon that cannot see the GPU the library copies, same bytes",
          "[integration][gpu]") {
  DaemonConfig cfg;
  cfg.staging_bytes_max = 256ull << 20;
  // The daemon starts with no visible GPU (its environment only).
  const char* before = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string saved_env = before != nullptr ? before : "";
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  Daemon d(cfg);
  if (before != nullptr) {
    setenv("CUDA_VISIBLE_DEVICES", saved_env.c_str(), 1);
  } else {
    unsetenv("CUDA_VISIBLE_DEVICES");
  }
  auto c = d.Connect();
  REQUIRE(SaveAndLoadFromGpu(*c, "gpu-fallback") > 0);
}
#endif
