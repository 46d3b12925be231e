// The CUDA IPC data plane without a GPU: CUDA_IPC regions, Save's gpu_source (the daemon copies
// device → arena) and loads into GPU destinations, through the real service and region registry
// with FakeGpu (dataplane/fake_gpu.h) behind the Gpu seam. The same paths on a real GPU are the
// [gpu] cases of tests/integration/gpu_ipc_test.cc.
#include <catch2/catch.hpp>
#include <numeric>

#include "service_rig.h"

using namespace ckptd;
using namespace ckptd::testing;

namespace {

constexpr uint64_t kElems = 1000;  // float32; not a multiple of 4 KiB
constexpr uint64_t kBytes = kElems * 4;

absl::StatusOr<uint64_t> RegisterCuda(Rig& r, const std::string& handle, uint64_t size,
                                      std::string uuid = FakeGpu::Uuid(),
                                      const std::string& session = "") {
  v1::RegisterRegionRequest req;
  req.set_session_id(session.empty() ? r.session : session);
  req.set_kind(v1::CUDA_IPC);
  req.set_cuda_ipc_handle(handle);
  req.set_cuda_device_uuid(uuid);
  req.set_size_bytes(size);
  v1::RegisterRegionResponse resp;
  CKPTD_RETURN_IF_ERROR(r.svc->RegisterRegion(r.caller, req, &resp));
  return resp.region_id();
}

uint64_t ReserveOne(Rig& r, uint64_t bytes) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(r.session);
  rr.add_sizes_bytes(bytes);
  v1::ReserveExtentsResponse ext;
  REQUIRE(r.svc->ReserveExtents(r.caller, rr, &ext).ok());
  return ext.extents(0).id();
}

// Saves float32 [kElems] "w" of `step` from bytes [offset, +kBytes) of CUDA region `region`.
absl::Status SaveFromGpu(Rig& r, uint64_t step, uint64_t region, uint64_t offset,
                         uint64_t* extent_out = nullptr) {
  const uint64_t extent = ReserveOne(r, kBytes);
  if (extent_out != nullptr) *extent_out = extent;
  v1::SaveRequest req = r.SaveRequestOf(step, {kElems});
  v1::ShardSpec* s = req.mutable_shards(0);
  s->mutable_data()->set_extent_id(extent);
  s->mutable_data()->set_length(kBytes);
  s->mutable_gpu_source()->set_region_id(region);
  s->mutable_gpu_source()->set_offset(offset);
  s->mutable_gpu_source()->set_length(kBytes);
  v1::SaveResponse resp;
  return r.svc->Save(r.caller, req, &resp);
}

// Loads "w" (or its flat region [start, +count)) of `step` into CUDA region `region` at `offset`.
absl::Status LoadToGpu(Rig& r, uint64_t step, uint64_t region, uint64_t offset, uint64_t start = 0,
                       uint64_t count = kElems) {
  v1::LoadRequest req;
  req.set_session_id(r.session);
  req.set_job(kJob);
  req.set_step(step);
  v1::LoadItemRequest* item = req.add_items();
  item->set_item("w");
  if (count != kElems) {
    item->mutable_region()->mutable_flat()->set_start(start);
    item->mutable_region()->mutable_flat()->set_count(count);
  }
  item->mutable_dest()->set_region_id(region);
  item->mutable_dest()->set_offset(offset);
  item->mutable_dest()->set_length(count * 4);
  v1::LoadResponse resp;
  return r.svc->Load(r.caller, req, &resp);
}

}  // namespace

TEST_CASE("gpu ipc: the daemon copies a gpu_source into the arena and loads into GPU memory",
          "[unit]") {
  Rig r;
  uint8_t* src = nullptr;
  const std::string h = r.gpu.Allocate(3 * kBytes, &src);
  std::vector<float> values(kElems);
  std::iota(values.begin(), values.end(), 0.5f);
  std::memcpy(src + 100, values.data(), kBytes);  // a tensor at a non-zero offset
  absl::StatusOr<uint64_t> region = RegisterCuda(r, h, 3 * kBytes);
  REQUIRE(region.ok());
  REQUIRE(SaveFromGpu(r, 1, *region, 100).ok());
  // Staged: the source may change at once, the checkpoint keeps what was copied.
  std::memset(src, 0xEE, 3 * kBytes);
  REQUIRE(r.Wait(1).ok());
  REQUIRE(r.gpu.copied_bytes() == kBytes);

  uint8_t* dst = nullptr;
  const std::string h2 = r.gpu.Allocate(2 * kBytes, &dst);
  absl::StatusOr<uint64_t> out = RegisterCuda(r, h2, 2 * kBytes);
  REQUIRE(out.ok());
  SECTION("whole") {
    REQUIRE(LoadToGpu(r, 1, *out, 8).ok());
    REQUIRE(std::memcmp(dst + 8, values.data(), kBytes) == 0);
  }
  SECTION("a flat slice (another layout) at an offset") {
    REQUIRE(LoadToGpu(r, 1, *out, 4, 333, 200).ok());
    REQUIRE(std::memcmp(dst + 4, values.data() + 333, 200 * 4) == 0);
  }
  SECTION("a destination beyond the registered bytes is OUT_OF_RANGE, nothing copied") {
    const uint64_t before = r.gpu.copied_bytes();
    absl::Status st = LoadToGpu(r, 1, *out, 2 * kBytes - 4);
    REQUIRE(st.code() == absl::StatusCode::kOutOfRange);
    REQUIRE(r.gpu.copied_bytes() == before);
  }
}

TEST_CASE("gpu ipc: registration errors name their cause and the daemon goes on", "[unit]") {
  Rig r;
  uint8_t* mem = nullptr;
  const std::string h = r.gpu.Allocate(kBytes, &mem);
  SECTION("no usable GPU: FAILED_PRECONDITION with the cause (the clients fall back)") {
    r.gpu.SetUnavailable(absl::FailedPreconditionError("no CUDA driver: libcuda.so.1"));
    absl::StatusOr<uint64_t> id = RegisterCuda(r, h, kBytes);
    REQUIRE(id.status().code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE_THAT(std::string(id.status().message()), Catch::Contains("libcuda.so.1"));
  }
  SECTION("a GPU the daemon cannot see") {
    absl::StatusOr<uint64_t> id = RegisterCuda(r, h, kBytes, std::string(16, 'x'));
    REQUIRE(id.status().code() == absl::StatusCode::kFailedPrecondition);
  }
  SECTION("malformed handle and uuid, zero size") {
    REQUIRE(RegisterCuda(r, "short", kBytes).status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(RegisterCuda(r, h, kBytes, "short").status().code() ==
            absl::StatusCode::kInvalidArgument);
    REQUIRE(RegisterCuda(r, h, 0).status().code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a handle the driver refuses") {
    REQUIRE(RegisterCuda(r, std::string(64, 'z'), kBytes).status().code() ==
            absl::StatusCode::kInvalidArgument);
    // Whatever the driver's error (CUDA_ERROR_MAP_FAILED: the exporter exited), the client's
    // handle is what is wrong — not an internal error of the daemon.
    r.gpu.FailOpens(absl::InternalError("cuIpcOpenMemHandle: CUDA_ERROR_MAP_FAILED"));
    absl::Status st = RegisterCuda(r, h, kBytes).status();
    REQUIRE(st.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(st.message()), Catch::Contains("CUDA_ERROR_MAP_FAILED"));
    r.gpu.FailOpens(absl::ResourceExhaustedError("cuIpcOpenMemHandle: out of memory"));
    REQUIRE(RegisterCuda(r, h, kBytes).status().code() == absl::StatusCode::kResourceExhausted);
    r.gpu.FailOpens(absl::OkStatus());
  }
  SECTION("a size beyond the allocation: refused, and the handle closed again") {
    REQUIRE(RegisterCuda(r, h, kBytes + 1).status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(r.gpu.open_now() == 0);
  }
  REQUIRE(r.SaveCommitted(1, 7).ok());  // the daemon still serves
}

TEST_CASE("gpu ipc: an allocation is opened once, and closed when its last region goes", "[unit]") {
  Rig r;
  uint8_t* mem = nullptr;
  const std::string h = r.gpu.Allocate(kBytes, &mem);
  absl::StatusOr<uint64_t> a = RegisterCuda(r, h, kBytes);
  absl::StatusOr<uint64_t> b = RegisterCuda(r, h, kBytes / 2);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(r.gpu.opens() == 1);
  v1::UnregisterRegionRequest un;
  un.set_session_id(r.session);
  un.set_region_id(*a);
  REQUIRE(r.svc->UnregisterRegion(r.caller, un).ok());
  REQUIRE(r.gpu.open_now() == 1);
  SECTION("the session's end closes it") {
    r.svc->EndSession(r.session);
    REQUIRE(r.gpu.open_now() == 0);
    REQUIRE(r.gpu.closes() == 1);
  }
  SECTION("a lease keeps it open past unregistration's timeout") {
    absl::StatusOr<RegionLease> lease = r.regions.Acquire(r.session, *b, 0, 16);
    REQUIRE(lease.ok());
    REQUIRE(r.regions.Unregister(r.session, *b, absl::Milliseconds(50)).code() ==
            absl::StatusCode::kFailedPrecondition);
    r.regions.DropSession(r.session);
    REQUIRE(r.gpu.open_now() == 1);  // still leased
    lease->reset();
    REQUIRE(r.gpu.open_now() == 0);
  }
}

TEST_CASE("gpu ipc: a failed device copy fails the Save cleanly, a retry stages", "[unit]") {
  Rig r;
  uint8_t* src = nullptr;
  const std::string h = r.gpu.Allocate(kBytes, &src);
  std::memset(src, 0x5A, kBytes);
  absl::StatusOr<uint64_t> region = RegisterCuda(r, h, kBytes);
  REQUIRE(region.ok());
  r.gpu.FailCopies(absl::InternalError("cuMemcpyDtoHAsync: CUDA_ERROR_ILLEGAL_ADDRESS"));
  uint64_t extent = 0;
  absl::Status st = SaveFromGpu(r, 1, *region, 0, &extent);
  REQUIRE(st.code() == absl::StatusCode::kInternal);
  REQUIRE_THAT(std::string(st.message()), Catch::Contains("copying from GPU memory"));
  REQUIRE(r.Status(1).status().code() == absl::StatusCode::kNotFound);  // nothing staged
  r.gpu.FailCopies(absl::OkStatus());
  REQUIRE(SaveFromGpu(r, 1, *region, 0).ok());
  REQUIRE(r.Wait(1).ok());
  uint8_t* dst = nullptr;
  absl::StatusOr<uint64_t> out = RegisterCuda(r, r.gpu.Allocate(kBytes, &dst), kBytes);
  REQUIRE(out.ok());
  REQUIRE(LoadToGpu(r, 1, *out, 0).ok());
  REQUIRE(std::memcmp(dst, src, kBytes) == 0);
  SECTION("a failed copy into GPU memory fails the load, naming it") {
    r.gpu.FailCopies(absl::InternalError("cuMemcpyHtoDAsync: CUDA_ERROR_LAUNCH_FAILED"));
    absl::Status load = LoadToGpu(r, 1, *out, 0);
    REQUIRE(load.code() == absl::StatusCode::kInternal);
    REQUIRE_THAT(std::string(load.message()), Catch::Contains("copying into GPU memory"));
    r.gpu.FailCopies(absl::OkStatus());
  }
}

TEST_CASE("gpu ipc: CUDA regions are refused where host memory is meant", "[unit]") {
  Rig r;
  uint8_t* mem = nullptr;
  const std::string h = r.gpu.Allocate(kBytes, &mem);
  absl::StatusOr<uint64_t> region = RegisterCuda(r, h, kBytes);
  REQUIRE(region.ok());
  v1::SaveRequest req = r.SaveRequestOf(1, {kElems});
  v1::ShardSpec* s = req.mutable_shards(0);
  SECTION("data naming the CUDA region (the daemon would flush from it)") {
    s->mutable_data()->set_region_id(*region);
    s->mutable_data()->set_length(kBytes);
  }
  SECTION("a gpu_source into a region instead of an extent") {
    s->mutable_data()->set_region_id(*region);
    s->mutable_data()->set_length(kBytes);
    *s->mutable_gpu_source() = s->data();
  }
  v1::SaveResponse resp;
  REQUIRE(r.svc->Save(r.caller, req, &resp).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("gpu ipc: the arena is pinned once for the daemon's copies while one uid uses it",
          "[unit]") {
  Rig r;
  uint8_t* src = nullptr;
  const std::string h = r.gpu.Allocate(kBytes, &src);
  absl::StatusOr<uint64_t> region = RegisterCuda(r, h, kBytes);
  REQUIRE(region.ok());
  REQUIRE(SaveFromGpu(r, 1, *region, 0).ok());
  REQUIRE(SaveFromGpu(r, 2, *region, 0).ok());
  REQUIRE(r.gpu.pins() == 1);
  REQUIRE(r.gpu_staging->pinned(r.caller.uid));
  SECTION("a second uid's segment unpins it before the next batch, copies go on") {
    REQUIRE(r.arena->Segment(r.caller.uid + 4242).ok());
    REQUIRE(SaveFromGpu(r, 3, *region, 0).ok());
    REQUIRE(r.gpu.unpins() == 1);
    REQUIRE_FALSE(r.gpu_staging->pinned(r.caller.uid));
    REQUIRE(r.Wait(3).ok());
    REQUIRE(r.gpu.pins() == 1);  // never pinned again
  }
  SECTION("the pin ends with the daemon") {
    r.Stop();
    REQUIRE(r.gpu.unpins() == 1);
    r.Start();
  }
}
