#include "gpu_regions.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client_core.h"
#include "cuda/cuda_driver.h"

namespace ckptd::internal {
namespace {

// The driver with `device`'s primary context current on this (the caller's) thread until `scope`
// ends, when the caller's own context is current again.
absl::StatusOr<const cuda::DriverApi*> DriverOn(int device, cuda::ScopedDevice* scope) {
  absl::StatusOr<const cuda::DriverApi*> api = cuda::Driver();
  if (!api.ok()) return api.status();
  absl::Status st = scope->Enter(**api, device);
  if (!st.ok()) return st;
  return *api;
}

}  // namespace

bool GpuRegions::FallBack(const absl::Status& error) {
  // A daemon that is gone or slow is not a reason to copy differently: that error is the answer.
  return !error.ok() && !absl::IsUnavailable(error) && !absl::IsDeadlineExceeded(error) &&
         !absl::IsCancelled(error);
}

absl::StatusOr<v1::MemRef> GpuRegions::Locate(ClientCore& core, const Session& session,
                                              const void* device_ptr, int device, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (generation_ != session.generation) {  // the daemon dropped the old session's regions
    regions_.clear();
    generation_ = session.generation;
    daemon_refused_ = absl::OkStatus();
  }
  if (!daemon_refused_.ok()) return daemon_refused_;
  cuda::ScopedDevice scope;
  absl::StatusOr<const cuda::DriverApi*> api = DriverOn(device, &scope);
  if (!api.ok()) return api.status();
  const auto ptr = reinterpret_cast<cuda::CUdeviceptr>(device_ptr);
  cuda::CUdeviceptr base = 0;
  size_t size = 0;
  absl::Status st =
      cuda::Check(**api, (*api)->cuMemGetAddressRange(&base, &size, ptr), "cuMemGetAddressRange");
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address ", reinterpret_cast<uintptr_t>(device_ptr),
                     " is not GPU memory of device ", device, " (", st.message(), ")"));
  }
  if (bytes > size - (ptr - base)) {
    return absl::InvalidArgumentError(absl::StrCat(bytes, " bytes at offset ", ptr - base,
                                                   " run past the end of their CUDA allocation (",
                                                   size, " bytes)"));
  }
  cuda::CUipcMemHandle h{};
  st = cuda::Check(**api, (*api)->cuIpcGetMemHandle(&h, base), "cuIpcGetMemHandle");
  if (!st.ok()) {
    if (!logged_export_) {
      logged_export_ = true;
      std::fprintf(stderr,
                   "ckptd: GPU memory on device %d cannot be shared over CUDA IPC (%s; PyTorch's "
                   "expandable_segments allocations cannot); the library copies it to host "
                   "itself instead\n",
                   device, std::string(st.message()).c_str());
    }
    return absl::FailedPreconditionError(st.message());
  }
  std::string handle(h.reserved, cuda::kIpcHandleBytes);
  const std::pair<int, uint64_t> key{device, base};
  v1::MemRef ref;
  ref.set_offset(ptr - base);
  ref.set_length(bytes);
  if (auto it = regions_.find(key); it != regions_.end()) {
    if (it->second.handle == handle) {
      it->second.last_used = ops_;
      if (it->second.region_id == 0) return it->second.refused;
      ref.set_region_id(it->second.region_id);
      return ref;
    }
    if (it->second.region_id == 0) {  // a refused allocation: nothing registered to drop
      regions_.erase(it);
    } else {
      // A new allocation at a freed one's address: the old region would keep the freed memory
      // mapped in the daemon.
      UnregisterLocked(core, session, it->second.region_id);
      regions_.erase(it);
    }
  }
  absl::StatusOr<std::string> uuid = cuda::DeviceUuid(**api, device);
  if (!uuid.ok()) return uuid.status();
  v1::RegisterRegionRequest req;
  req.set_session_id(session.session_id);
  req.set_kind(v1::CUDA_IPC);
  req.set_cuda_ipc_handle(handle);
  req.set_cuda_device(device);
  req.set_cuda_device_uuid(*uuid);
  req.set_size_bytes(size);
  v1::RegisterRegionResponse resp;
  st = core.Call("RegisterRegion", core.rpc_timeout_ms(), &internal::Connection::RegisterRegion,
                 req, &resp);
  if (!st.ok()) {
    if (absl::IsFailedPrecondition(st) || absl::IsUnimplemented(st)) {
      daemon_refused_ = st;
      if (!logged_daemon_) {
        logged_daemon_ = true;
        std::fprintf(stderr,
                     "ckptd: the daemon cannot copy GPU memory itself (%s); this client copies "
                     "GPU tensors to and from host memory itself instead\n",
                     std::string(st.message()).c_str());
      }
    } else if (FallBack(st)) {  // this allocation only: remembered for the session
      regions_[key] = Entry{std::move(handle), 0, size, st, ops_};
    }
    return st;
  }
  regions_[key] = Entry{std::move(handle), resp.region_id(), size, absl::OkStatus(), ops_};
  ref.set_region_id(resp.region_id());
  return ref;
}

namespace {

// The library's synchronous copy between host memory and `device`'s memory (the fallback).
absl::Status CopySync(void* dst, const void* src, uint64_t bytes, int device, bool to_device) {
  cuda::ScopedDevice scope;
  absl::StatusOr<const cuda::DriverApi*> api = DriverOn(device, &scope);
  if (!api.ok()) return api.status();
  cuda::CUresult r =
      to_device ? (*api)->cuMemcpyHtoD(reinterpret_cast<cuda::CUdeviceptr>(dst), src, bytes)
                : (*api)->cuMemcpyDtoH(dst, reinterpret_cast<cuda::CUdeviceptr>(src), bytes);
  return cuda::Check(**api, r,
                     absl::StrCat(to_device ? "cuMemcpyHtoD" : "cuMemcpyDtoH", " of ", bytes,
                                  " bytes ", to_device ? "to" : "from", " device ", device));
}

}  // namespace

absl::Status GpuRegions::CopyToHost(void* host, const void* device_ptr, uint64_t bytes,
                                    int device) {
  return CopySync(host, device_ptr, bytes, device, /*to_device=*/false);
}

absl::Status GpuRegions::CopyToDevice(void* device_ptr, const void* host, uint64_t bytes,
                                      int device) {
  return CopySync(device_ptr, host, bytes, device, /*to_device=*/true);
}

void GpuRegions::UnregisterLocked(ClientCore& core, const Session& session, uint64_t region_id) {
  v1::UnregisterRegionRequest req;
  req.set_session_id(session.session_id);
  req.set_region_id(region_id);
  v1::UnregisterRegionResponse resp;
  // Best effort: a region the daemon still holds (a copy in flight past the timeout) or that
  // the session's end already dropped is gone from the client either way.
  (void)core.Call("UnregisterRegion", core.rpc_timeout_ms(),
                  &internal::Connection::UnregisterRegion, req, &resp);
}

void GpuRegions::EndOperation(ClientCore& core, const Session& session) {
  absl::MutexLock lock(&mu_);
  if (generation_ != session.generation) return;  // that session's regions are gone anyway
  ++ops_;
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (ops_ - it->second.last_used <= kIdleOpsMax) {
      ++it;
      continue;
    }
    if (it->second.region_id != 0) UnregisterLocked(core, session, it->second.region_id);
    regions_.erase(it++);
  }
}

size_t GpuRegions::registered() const {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

}  // namespace ckptd::internal
