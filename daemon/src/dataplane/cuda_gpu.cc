// CudaGpu: the Gpu seam over the CUDA driver API (cuda/cuda_driver.h).
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/limits.h"
#include "cuda/cuda_driver.h"
#include "dataplane/gpu.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

using cuda::CUstream;
using cuda::DriverApi;

class CudaGpu final : public Gpu {
 public:
  absl::Status Available() override { return cuda::Driver().status(); }

  absl::StatusOr<int> DeviceOf(std::string_view uuid) override {
    absl::StatusOr<const DriverApi*> api = cuda::Driver();
    if (!api.ok()) return api.status();
    int count = 0;
    absl::Status st = cuda::Check(**api, (*api)->cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (!st.ok()) return st;
    for (int d = 0; d < count; ++d) {
      absl::StatusOr<std::string> u = cuda::DeviceUuid(**api, d);
      if (u.ok() && *u == uuid) return d;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", cuda::FormatUuid(uuid), " is not visible to the daemon (it sees ", count,
        " GPUs): run the daemon where it can see every GPU of the node (no CUDA_VISIBLE_DEVICES "
        "narrower than the trainers', the GPUs passed into its container)"));
  }

  absl::StatusOr<GpuMapping> OpenIpc(int device, std::string_view handle) override {
    absl::StatusOr<const DriverApi*> loaded = cuda::Driver();
    if (!loaded.ok()) return loaded.status();
    const DriverApi* api = *loaded;
    if (handle.size() != cuda::kIpcHandleBytes) {
      return absl::InvalidArgumentError(absl::StrCat("a CUDA IPC handle is ", cuda::kIpcHandleBytes,
                                                     " bytes, not ", handle.size()));
    }
    absl::Status st = cuda::UseDevice(*api, device);
    if (!st.ok()) return st;
    cuda::CUipcMemHandle h{};
    std::copy(handle.begin(), handle.end(), h.reserved);
    cuda::CUdeviceptr p = 0;
    st = cuda::Check(*api, api->cuIpcOpenMemHandle(&p, h, cuda::kIpcLazyEnablePeerAccess),
                     "cuIpcOpenMemHandle");
    if (!st.ok()) return st;
    cuda::CUdeviceptr base = 0;
    size_t size = 0;
    st = cuda::Check(*api, api->cuMemGetAddressRange(&base, &size, p), "cuMemGetAddressRange");
    if (!st.ok()) {
      api->cuIpcCloseMemHandle(p);
      return st;
    }
    // The mapping starts at the allocation's base; what lies beyond base+size is not ours.
    return GpuMapping{p, static_cast<uint64_t>(size - (p - base))};
  }

  void CloseIpc(int device, uint64_t device_addr) override {
    absl::StatusOr<const DriverApi*> api = cuda::Driver();
    if (!api.ok()) return;
    absl::Status st = cuda::UseDevice(**api, device);
    if (st.ok())
      st = cuda::Check(**api, (*api)->cuIpcCloseMemHandle(device_addr), "cuIpcCloseMemHandle");
    if (!st.ok())
      spdlog::warn("closing a client's CUDA IPC mapping on device {}: {}", device, st.ToString());
  }

  // Both need a current context on the calling thread (any RPC thread, which may never have
  // used CUDA): device 0's primary context — a portable registration serves every context.
  absl::Status PinHost(void* p, uint64_t bytes) override {
    absl::StatusOr<const DriverApi*> loaded = cuda::Driver();
    if (!loaded.ok()) return loaded.status();
    const DriverApi* api = *loaded;
    absl::Status st = cuda::UseDevice(*api, 0);
    if (!st.ok()) return st;
    return cuda::Check(*api, api->cuMemHostRegister(p, bytes, cuda::kHostRegisterPortable),
                       absl::StrCat("cuMemHostRegister of ", bytes, " bytes"));
  }

  void UnpinHost(void* p) override {
    absl::StatusOr<const DriverApi*> api = cuda::Driver();
    if (!api.ok()) return;
    absl::Status st = cuda::UseDevice(**api, 0);
    if (st.ok()) st = cuda::Check(**api, (*api)->cuMemHostUnregister(p), "cuMemHostUnregister");
    if (!st.ok()) spdlog::error("unpinning host memory: {}", st.ToString());
  }

  absl::Status CopyToHost(int device, std::span<const GpuCopy> copies) override {
    return Copy(device, copies, /*to_host=*/true);
  }
  absl::Status CopyToDevice(int device, std::span<const GpuCopy> copies) override {
    return Copy(device, copies, /*to_host=*/false);
  }

 private:
  absl::Status Copy(int device, std::span<const GpuCopy> copies, bool to_host) {
    if (copies.empty()) return absl::OkStatus();
    absl::StatusOr<const DriverApi*> loaded = cuda::Driver();
    if (!loaded.ok()) return loaded.status();
    const DriverApi* api = *loaded;
    absl::Status st = cuda::UseDevice(*api, device);
    if (!st.ok()) return st;
    absl::StatusOr<CUstream> stream = TakeStream(*api, device);
    if (!stream.ok()) return stream.status();
    absl::Status first;
    for (const GpuCopy& c : copies) {
      cuda::CUresult r = to_host ? api->cuMemcpyDtoHAsync(c.host, c.device_addr, c.bytes, *stream)
                                 : api->cuMemcpyHtoDAsync(c.device_addr, c.host, c.bytes, *stream);
      if (r != cuda::kSuccess) {
        first = cuda::Check(*api, r,
                            absl::StrCat(to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync",
                                         " of ", c.bytes, " bytes on device ", device));
        break;
      }
    }
    // Every copy queued must finish before the caller reuses its memory, whatever failed.
    absl::Status synced = cuda::Check(*api, api->cuStreamSynchronize(*stream),
                                      absl::StrCat("copies on device ", device));
    if (synced.ok()) {
      GiveStream(device, *stream);
    } else {
      api->cuStreamDestroy(*stream);  // a stream in an error state is not reused
    }
    return first.ok() ? synced : first;
  }

  absl::StatusOr<CUstream> TakeStream(const DriverApi& api, int device) {
    {
      absl::MutexLock lock(&mu_);
      std::vector<CUstream>& free = streams_[device];
      if (!free.empty()) {
        CUstream s = free.back();
        free.pop_back();
        return s;
      }
    }
    // The copies run at the device's lowest stream priority: they overlap the trainer's kernels
    // (a save issued right after optimizer.step(), docs/USER_GUIDE.md "Overlapping the save with
    // compute"), and the scheduler then serves the trainer's streams first.
    int least = 0;
    int greatest = 0;
    absl::Status st = cuda::Check(api, api.cuCtxGetStreamPriorityRange(&least, &greatest),
                                  "cuCtxGetStreamPriorityRange");
    if (!st.ok()) return st;
    CUstream s = nullptr;
    st = cuda::Check(api, api.cuStreamCreateWithPriority(&s, cuda::kStreamNonBlocking, least),
                     "cuStreamCreateWithPriority");
    if (!st.ok()) return st;
    return s;
  }

  void GiveStream(int device, CUstream s) {
    absl::MutexLock lock(&mu_);
    std::vector<CUstream>& free = streams_[device];
    if (free.size() < limits::kGpuStreamsPerDeviceMax) {
      free.push_back(s);
      return;
    }
    absl::StatusOr<const DriverApi*> api = cuda::Driver();
    if (api.ok()) (*api)->cuStreamDestroy(s);
  }

  absl::Mutex mu_;
  absl::flat_hash_map<int, std::vector<CUstream>> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Gpu> NewCudaGpu() { return std::make_unique<CudaGpu>(); }

}  // namespace ckptd
