// GpuStaging: the daemon's copies between clients' GPU memory (CUDA IPC regions) and host memory —
// device → staging arena for a Save (the trainer's whole stall, done by the daemon), host → device
// for a Load (from verified read buffers). Batches are grouped by device and run through the Gpu
// seam, many copies in flight per batch.
//
// Pinning: a device→host copy runs at link speed only into page-locked memory, so the daemon pins
// its mapping of the arena segment it copies into, once, at the first such copy — but only while
// that uid's segment is the arena's only one. With two segments the arena moves free ranges
// between them by punching pages out of one (arena.h), and a pinned range whose pages were
// punched would keep DMA-ing into the old pages: so when a second segment exists, the pin is
// dropped (under the exclusive lock, with no copy in flight) before the next batch, and copies
// continue from pageable memory (slower, still correct), logged once. Load buffers are not pinned
// (host → device copies run from pageable memory): loads are bound by the storage read today;
// pinning them belongs with the RAM tier, whose extents are the arena's.
//
// Ownership: borrows the Gpu and the arena (they outlive it); unpins in its destructor.
// Threads: any thread; copy batches run concurrently (shared lock), pin/unpin exclusively.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dataplane/arena.h"
#include "dataplane/gpu.h"

namespace ckptd {

struct DeviceCopy {
  int device = -1;
  GpuCopy copy;
};

class GpuStaging {
 public:
  GpuStaging(Gpu* gpu, StagingArena* arena) : gpu_(gpu), arena_(arena) {}
  ~GpuStaging();
  GpuStaging(const GpuStaging&) = delete;
  GpuStaging& operator=(const GpuStaging&) = delete;

  Gpu* gpu() const { return gpu_; }
  // Device → host into arena memory of `uid`'s segment (extents the caller holds leases on).
  // Returns the Gpu's first error, naming the device.
  absl::Status CopyToArena(uint32_t uid, std::span<const DeviceCopy> copies)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Host → device (from memory the caller owns for the call).
  absl::Status CopyToDevice(std::span<const DeviceCopy> copies) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the arena segment of `uid` is pinned now (tests, status).
  bool pinned(uint32_t uid) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Pins `uid`'s segment when it is the only one, unpins when there are several.
  void UpdatePin(uint32_t uid) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Run(std::span<const DeviceCopy> copies, bool to_host);

  Gpu* const gpu_;
  StagingArena* const arena_;
  mutable absl::Mutex mu_;
  bool pinned_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t pinned_uid_ ABSL_GUARDED_BY(mu_) = 0;
  uint8_t* pinned_base_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool pin_failed_ ABSL_GUARDED_BY(mu_) = false;  // tried and refused: not tried again
  bool unpinned_for_segments_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckptd
