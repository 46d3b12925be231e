// Gpu: the daemon's seam to CUDA (docs/DESIGN.md "Seams": Gpu) — opening clients' CUDA IPC handles,
// page-locking host memory, and batches of device<->host copies on the daemon's own streams.
// CudaGpu is the real one (the driver API through cuda/cuda_driver.h, loaded on first use, so a
// CPU-only daemon never touches CUDA); tests put a fake behind it to drive the region registry,
// save and load without a GPU.
//
// Ownership: an OpenIpc mapping stays until CloseIpc (the region registry opens each allocation
// once and closes it when its last region and lease are gone). PinHost'd memory stays pinned until
// UnpinHost, which the caller must call before unmapping it.
// Threads: every method may be called from any thread, concurrently. Copy batches run on a
// per-device pool of streams: concurrent batches overlap.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd {

// One copy between device memory (an address in the daemon's CUDA address space, from OpenIpc)
// and host memory.
struct GpuCopy {
  uint64_t device_addr = 0;
  uint8_t* host = nullptr;
  uint64_t bytes = 0;
};

struct GpuMapping {
  uint64_t device_addr = 0;       // where the allocation is mapped in the daemon
  uint64_t allocation_bytes = 0;  // its size, as the driver reports it
};

class Gpu {
 public:
  virtual ~Gpu() = default;
  // OK when CUDA can be used; FAILED_PRECONDITION naming the cause (no driver, no GPU). The first
  // call loads the driver; the answer is kept.
  virtual absl::Status Available() = 0;
  // The daemon's ordinal of the GPU with this 16-byte UUID. FAILED_PRECONDITION when the daemon
  // cannot see it (another node's GPU, or hidden by CUDA_VISIBLE_DEVICES / the container).
  virtual absl::StatusOr<int> DeviceOf(std::string_view uuid) = 0;
  // Maps the allocation a 64-byte CUDA IPC handle names (cuIpcOpenMemHandle). INVALID_ARGUMENT for
  // a handle the driver refuses (not a cudaIpcGetMemHandle handle, freed, or from memory that
  // legacy IPC cannot share — expandable segments).
  virtual absl::StatusOr<GpuMapping> OpenIpc(int device, std::string_view handle) = 0;
  virtual void CloseIpc(int device, uint64_t device_addr) = 0;
  // Page-locks [p, p+bytes) for DMA from every device; UnpinHost undoes it.
  virtual absl::Status PinHost(void* p, uint64_t bytes) = 0;
  virtual void UnpinHost(void* p) = 0;
  // Runs every copy of the batch (many in flight) and returns once all are complete; the first
  // error is returned (the others still finish or fail before it returns).
  virtual absl::Status CopyToHost(int device, std::span<const GpuCopy> copies) = 0;
  virtual absl::Status CopyToDevice(int device, std::span<const GpuCopy> copies) = 0;
};

// The real one, over the CUDA driver API.
std::unique_ptr<Gpu> NewCudaGpu();

}  // namespace ckptd
