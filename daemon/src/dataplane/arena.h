// StagingArena: the daemon's one named shared-memory segment of staging_bytes_max, pre-faulted at
// start and carved into 4 KiB-aligned extents. Clients map it once and copy each shard straight
// into an extent they reserved (the one copy); the daemon writes blobs from it with O_DIRECT and
// never copies an extent.
//
// Layout: page 0 is a header (magic, size, generation); extents come after it. The generation is
// a random id written when the segment is created: the journal records it, so a restarted daemon
// knows whether the bytes a staged checkpoint points at are still the ones that were staged.
//
// Extent lifecycle: Reserve (owned by a session) → Take by a Save (owned by the daemon) → Free
// after persist; or Release by the client / its session ending / the reservation TTL.
//
// Thread safety: all methods may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ckptd {

struct ExtentInfo {
  uint64_t id = 0;
  uint64_t offset = 0;  // into the segment, 4 KiB aligned
  uint64_t length = 0;  // multiple of 4 KiB
  std::string session;  // reserving session; empty once the daemon owns it
  bool daemon_owned = false;
  absl::Time reserved_at;
};

class StagingArena {
 public:
  // Opens the segment `shm_name` of `size_bytes` (including the header page). When a segment of
  // that name already holds a valid header of the same size it is adopted (adopted() == true,
  // generation kept, contents untouched); otherwise it is (re)created with a new generation.
  // Errors: RESOURCE_EXHAUSTED when /dev/shm cannot hold it, INTERNAL for other syscalls.
  static absl::StatusOr<std::unique_ptr<StagingArena>> Open(const std::string& shm_name,
                                                            uint64_t size_bytes, bool prefault,
                                                            bool mlock_pages);
  ~StagingArena();  // unmaps; does not unlink (staged data survives a restart)

  const std::string& shm_name() const { return shm_name_; }
  const std::string& generation() const { return generation_; }
  bool adopted() const { return adopted_; }
  uint8_t* base() const { return base_; }
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t capacity_bytes() const;  // bytes extents can use
  uint64_t free_bytes() const;

  // Reserves one extent per size (rounded up to 4 KiB), all or none, for `session`. Waits up to
  // `timeout` for space; then RESOURCE_EXHAUSTED stating the bytes asked and free. A request that
  // could never fit fails at once. INVALID_ARGUMENT for a zero size.
  absl::StatusOr<std::vector<ExtentInfo>> Reserve(const std::string& session,
                                                  std::span<const uint64_t> sizes,
                                                  absl::Duration timeout);
  // The extent `id` if `session` reserved it (and it is not yet taken). NOT_FOUND otherwise,
  // naming the id.
  absl::StatusOr<ExtentInfo> Lookup(const std::string& session, uint64_t id) const;
  // Transfers ownership of reserved extents to the daemon (a Save). All or none.
  absl::Status Take(const std::string& session, std::span<const uint64_t> ids);
  // Frees daemon-owned extents (after persist or abort).
  void Free(std::span<const uint64_t> ids);
  // Client release of its own reserved extents. NOT_FOUND names the first unknown id.
  absl::Status Release(const std::string& session, std::span<const uint64_t> ids);
  // Frees every extent still reserved by `session`.
  void ReleaseSession(const std::string& session);
  // Frees reservations older than `ttl` that no Save took. Returns how many.
  size_t ExpireReservations(absl::Duration ttl);
  // Recovery: marks [offset, offset+length) as a daemon-owned extent with id `id`.
  absl::Status Restore(uint64_t id, uint64_t offset, uint64_t length);
  // Removes the segment name (clean shutdown with nothing staged).
  void Unlink();

 private:
  StagingArena() = default;
  std::optional<uint64_t> AllocateLocked(uint64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeRangeLocked(uint64_t offset, uint64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t LargestFreeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string shm_name_;
  std::string generation_;
  bool adopted_ = false;
  uint8_t* base_ = nullptr;
  uint64_t size_bytes_ = 0;

  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // offset → length, coalesced
  uint64_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, ExtentInfo> extents_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// Extent ids of different daemon instances never collide: each instance starts at a random base.
uint64_t RandomExtentIdBase();
// 16 random bytes as 32 hex characters.
std::string RandomHexId();

}  // namespace ckptd
