// RegionRegistry: client memory the daemon may read (save) and write (load) in place — POSIX
// shared-memory objects the client created, mapped once at registration, and CUDA allocations the
// client exported with cuIpcGetMemHandle (cudaIpcGetMemHandle), opened through the Gpu seam — all
// held as leases.
//
// CUDA IPC regions: one region per allocation, offsets counted from the allocation's base. Each
// allocation (device + handle) is opened once however many sessions register it (IpcMapping,
// shared), and closed when its last region and lease are gone — a client that dies has its
// session dropped, which closes its handles once no save or load still copies through them. The
// registered size must lie inside the allocation as the driver reports it, so no offset a client
// names can reach beyond its allocation. A handle is a capability the driver does not tie to a
// uid; only a session's own regions can be named in its saves and loads, but a client that
// learned another process's handle bytes could have the daemon open memory on a GPU the client
// cannot reach itself (docs/SECURITY.md "Security and failure model"). Without a
// usable GPU (no driver, no device, a GPU the daemon cannot see) registration answers
// FAILED_PRECONDITION naming the cause, and the clients fall back to copying themselves.
//
// A Lease keeps a mapping alive while an operation uses it; Unregister waits (bounded) until no
// lease is held, so a client that unregistered may reuse its memory at once. Session end drops
// the registry's reference only: a mapping leased by an operation in flight stays mapped until
// that operation finishes.
//
// Trust: only an object owned by the caller's uid, a regular file opened without following a
// symlink, is registered; never the daemon's own arena (by name prefix or by inode). The object
// stays open: every Acquire checks it still holds the registered size (FAILED_PRECONDITION naming
// the region when it shrank), and a shrink racing an access is caught by memory_guard.h.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/ckptd.pb.h"
#include "dataplane/gpu.h"

namespace ckptd {

// One opened CUDA IPC allocation; closed when the last region using it is destroyed.
struct IpcMapping {
  Gpu* gpu = nullptr;
  int device = -1;
  uint64_t device_addr = 0;
  uint64_t allocation_bytes = 0;
  std::function<void()> forget;  // drops the registry's index entry
  ~IpcMapping();
};

struct MappedRegion {
  uint64_t id = 0;
  std::string session;
  v1::RegionKind kind = v1::SHM;
  std::string shm_name;     // SHM; for CUDA_IPC a description ("cuda:<device>")
  uint8_t* base = nullptr;  // SHM: the mapping; CUDA_IPC: null (device memory)
  uint64_t size_bytes = 0;
  int fd = -1;
  std::shared_ptr<IpcMapping> ipc;  // CUDA_IPC
  bool on_device() const { return ipc != nullptr; }
  int device() const { return ipc ? ipc->device : -1; }
  // CUDA_IPC: the device address of byte `offset` of the region.
  uint64_t device_addr(uint64_t offset) const { return ipc->device_addr + offset; }
  ~MappedRegion();
};

// Memory that must never be registered as a client region: the daemon's own.
struct ForbiddenRegions {
  std::string shm_prefix;  // e.g. "/ckptd-1a2b3c4d-"
  // Whether a file (st_dev, st_ino) is one of the daemon's arena segments, under any name.
  std::function<bool(uint64_t dev, uint64_t ino)> is_arena;
};

using RegionLease = std::shared_ptr<const MappedRegion>;

class RegionRegistry {
 public:
  // `gpu` (borrowed; may be null: no CUDA regions) opens CUDA IPC handles.
  explicit RegionRegistry(ForbiddenRegions forbidden = {}, Gpu* gpu = nullptr)
      : forbidden_(std::move(forbidden)), gpu_(gpu) {}
  ~RegionRegistry();

  // Maps the client's object. INVALID_ARGUMENT for a bad name or size (the object must be at
  // least size_bytes), PERMISSION_DENIED for an object not owned by `owner_uid`, a symlink, or
  // the daemon's own memory, RESOURCE_EXHAUSTED beyond limits::kRegionsPerSessionMax.
  // CUDA_IPC: FAILED_PRECONDITION without a usable GPU or for a GPU the daemon cannot see,
  // INVALID_ARGUMENT for a handle the driver refuses or a size beyond the allocation,
  // RESOURCE_EXHAUSTED beyond limits::kCudaRegionsPerSessionMax.
  absl::StatusOr<uint64_t> Register(const std::string& session, uint32_t owner_uid,
                                    const v1::RegisterRegionRequest& req);
  // Waits up to `timeout` for in-flight users, then unmaps. NOT_FOUND for an unknown id,
  // FAILED_PRECONDITION if still busy after the timeout.
  absl::Status Unregister(const std::string& session, uint64_t id, absl::Duration timeout);
  // A lease on region `id` of `session` whose [offset, offset+length) is inside it.
  // NOT_FOUND for an unknown region, OUT_OF_RANGE for bytes outside it (naming both),
  // FAILED_PRECONDITION when the object shrank below its registered size.
  absl::StatusOr<RegionLease> Acquire(const std::string& session, uint64_t id, uint64_t offset,
                                      uint64_t length) const;
  void DropSession(const std::string& session);

 private:
  absl::StatusOr<uint64_t> RegisterCuda(const std::string& session,
                                        const v1::RegisterRegionRequest& req);
  absl::StatusOr<std::shared_ptr<IpcMapping>> OpenIpc(int device, const std::string& handle);
  absl::Status CheckCountLocked(const std::string& session, bool cuda) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t AddLocked(std::shared_ptr<MappedRegion> r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ForbiddenRegions forbidden_;
  Gpu* const gpu_;
  // Opened allocations by device and handle. Opening and closing (IpcMapping's destructor, which
  // also drops the entry) run under its lock, so one allocation is never opened twice at once.
  // Lock order: mu_ before IpcIndex::mu (a region whose last lease ends under mu_ closes its
  // mapping).
  struct IpcIndex {
    absl::Mutex mu;
    absl::CondVar closed;  // signalled when a mapping's close finished (its entry erased)
    absl::flat_hash_map<std::string, std::weak_ptr<IpcMapping>> open ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<IpcIndex> ipc_ = std::make_shared<IpcIndex>();
  mutable absl::Mutex mu_;
  absl::CondVar released_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<MappedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ckptd
