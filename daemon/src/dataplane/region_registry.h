// RegionRegistry: client memory the daemon may read (save) and write (load) in place — POSIX
// shared-memory objects the client created, mapped once at registration and held as leases.
// CUDA IPC regions are accepted by the API but answered UNIMPLEMENTED until the GPU data plane
// lands.
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

namespace ckptd {

struct MappedRegion {
  uint64_t id = 0;
  std::string session;
  std::string shm_name;
  uint8_t* base = nullptr;
  uint64_t size_bytes = 0;
  int fd = -1;
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
  explicit RegionRegistry(ForbiddenRegions forbidden = {}) : forbidden_(std::move(forbidden)) {}

  // Maps the client's object. INVALID_ARGUMENT for a bad name or size (the object must be at
  // least size_bytes), PERMISSION_DENIED for an object not owned by `owner_uid`, a symlink, or
  // the daemon's own memory, RESOURCE_EXHAUSTED beyond limits::kRegionsPerSessionMax,
  // UNIMPLEMENTED for CUDA_IPC.
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
  const ForbiddenRegions forbidden_;
  mutable absl::Mutex mu_;
  absl::CondVar released_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<MappedRegion>> regions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ckptd
