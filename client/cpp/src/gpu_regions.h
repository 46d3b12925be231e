// Internal to libckptd-client: GPU memory for saves and loads. The daemon copies itself, over CUDA
// IPC: each CUDA allocation holding a tensor is exported once (cuIpcGetMemHandle of its base) and
// registered as a CUDA_IPC region of the session, cached by (allocation base, handle) — a new
// allocation at a freed one's address has another handle and replaces it (the stale region is
// unregistered, so the daemon closes its mapping). A shard then names its bytes as an offset into
// that region.
//
// Fallback: where IPC cannot be used — the daemon has no usable GPU or cannot see this one
// (FAILED_PRECONDITION / UNIMPLEMENTED: IPC is off for this client from then on), or the
// allocation cannot be exported (expandable segments, VMM memory: that allocation only) — the
// library copies itself (cuMemcpyDtoH into the staging extent, cuMemcpyHtoD from load scratch),
// with the same results, and says so once on stderr.
//
// Ownership: regions live until replaced, until the session ends (a new daemon instance or
// connection: the cache is dropped with its generation), or until the client is destroyed.
// Threads: thread-safe; registration RPCs run under mu_ (one per new allocation).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd::internal {

class ClientCore;
struct Session;

class GpuRegions {
 public:
  // The daemon-side region holding [device_ptr, device_ptr + bytes) of `device` (this process's
  // ordinal), as a MemRef; registers the allocation when new. An error means "fall back": the
  // caller copies itself (CopyToHost / CopyToDevice). Errors other than the fallback ones
  // (INVALID_ARGUMENT for a pointer that is not device memory, bytes beyond the allocation) are
  // returned as is for the caller to report.
  absl::StatusOr<v1::MemRef> Locate(ClientCore& core, const Session& session,
                                    const void* device_ptr, int device, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an error of Locate means "copy in the library instead" (every error but a daemon
  // that is gone or slow: that error is the answer).
  static bool FallBack(const absl::Status& locate_error);

  // The library's own copies (synchronous), for the fallback.
  static absl::Status CopyToHost(void* host, const void* device_ptr, uint64_t bytes, int device);
  static absl::Status CopyToDevice(void* device_ptr, const void* host, uint64_t bytes, int device);

  // Called after each save or load that named GPU memory: regions no such operation used in the
  // last kIdleOpsMax are unregistered, so an allocation PyTorch freed (empty_cache, its
  // out-of-memory retry) is not kept mapped by the daemon — whose mapping would keep the memory
  // from returning to the driver — for longer than a few checkpoints.
  void EndOperation(ClientCore& core, const Session& session) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr uint64_t kIdleOpsMax = 4;

  // Regions registered (tests).
  size_t registered() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::string handle;
    uint64_t region_id = 0;  // 0: the daemon refused this allocation (`refused` says why)
    uint64_t size_bytes = 0;
    absl::Status refused;
    uint64_t last_used = 0;  // ops_ when a save or load last named it
  };
  void UnregisterLocked(ClientCore& core, const Session& session, uint64_t region_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ops_ ABSL_GUARDED_BY(mu_) = 0;  // EndOperation calls
  // By (device, allocation base); allocations the daemon refused are kept too, so a save does not
  // ask again for each of them (a daemon that cannot open any handle costs one RPC per
  // allocation per session, not per save).
  std::map<std::pair<int, uint64_t>, Entry> regions_ ABSL_GUARDED_BY(mu_);
  // Set once the daemon refused CUDA regions for good: every later shard falls back at once.
  absl::Status daemon_refused_ ABSL_GUARDED_BY(mu_);
  bool logged_daemon_ ABSL_GUARDED_BY(mu_) = false;
  bool logged_export_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckptd::internal
