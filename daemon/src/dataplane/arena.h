// StagingArena: the daemon's one named shared-memory segment of staging_bytes_max, pre-faulted at
// start and carved into 4 KiB-aligned extents. Clients map it once and copy each shard straight
// into an extent they reserved (the one copy); the daemon writes blobs from it with O_DIRECT and
// never copies an extent.
//
// Layout: page 0 is a header (magic, size, generation); extents come after it. The generation is
// a random id written when the segment is created: the journal records it, so a restarted daemon
// knows whether the bytes a staged checkpoint points at are still the ones that were staged.
//
// Extent lifecycle (who owns it, what ends it):
//   Reserve → owned by a session, until Release by that session or the session's end (a
//   reservation never expires behind the client's back: client.h promises an Allocate()d buffer
//   stays valid while it exists);
//   Take (a Save) → owned by the daemon, until Free after persist or abort.
// Leases: an operation that reads or writes a reserved extent for its client (a Load into it)
// holds an ExtentLease for the whole operation. Release or session end of a leased extent only
// detaches it from the session; its bytes go back to the free list when the last lease is
// dropped, so they are never re-issued to another client while the daemon still writes them.
// Take refuses a leased extent.
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
  std::string session;  // reserving session; empty once the daemon owns it or it was released
  bool daemon_owned = false;
  uint32_t leases = 0;    // operations using it now (ExtentLease)
  bool released = false;  // released while leased: freed when the last lease goes
};

class StagingArena;

// A hold on one reserved extent for the duration of an operation. Dropping the last copy ends
// it (and frees the extent if it was released meanwhile). Must not outlive the arena.
using ExtentLease = std::shared_ptr<const ExtentInfo>;

class StagingArena {
 public:
  // Creates the segment `shm_name` of `size_bytes` (including the header page) with a new
  // random generation, exclusively (O_EXCL: ALREADY_EXISTS if the name is taken — the daemon
  // never takes over a segment it did not create), with permission bits `mode` and group `gid`
  // (-1: the daemon's). With adopt_generation set it instead adopts the segment a previous run
  // of this daemon created (adopted() == true, contents untouched), only if it is a regular file
  // owned by the daemon's euid with exactly `mode`, the size and that generation in its header;
  // FAILED_PRECONDITION otherwise, NOT_FOUND when it is gone.
  // Errors: RESOURCE_EXHAUSTED when /dev/shm cannot hold it, INTERNAL for other syscalls.
  static absl::StatusOr<std::unique_ptr<StagingArena>> Open(
      const std::string& shm_name, uint64_t size_bytes, bool prefault, bool mlock_pages,
      const std::string& adopt_generation = "", uint32_t mode = 0600, int64_t gid = -1);
  ~StagingArena();  // unmaps; does not unlink (staged data survives a restart)

  const std::string& shm_name() const { return shm_name_; }
  const std::string& generation() const { return generation_; }
  bool adopted() const { return adopted_; }
  // The segment's identity, so it can be told apart from client memory under any name.
  uint64_t dev() const { return dev_; }
  uint64_t ino() const { return ino_; }
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
  // Leases extent `id` of `session` for one operation (see the header comment). NOT_FOUND as
  // Lookup.
  absl::StatusOr<ExtentLease> Lease(const std::string& session, uint64_t id);
  // Transfers ownership of reserved extents to the daemon (a Save). All or none. NOT_FOUND for
  // an id not reserved by `session`, INVALID_ARGUMENT for an id named twice, FAILED_PRECONDITION
  // for an extent a load is writing right now.
  absl::Status Take(const std::string& session, std::span<const uint64_t> ids);
  // Frees daemon-owned extents (after persist or abort).
  void Free(std::span<const uint64_t> ids);
  // Client release of its own reserved extents, all or none. NOT_FOUND names the first unknown
  // id, INVALID_ARGUMENT an id named twice. Leased extents are freed when their lease ends.
  absl::Status Release(const std::string& session, std::span<const uint64_t> ids);
  // Releases every extent still reserved by `session` (its end), as Release does.
  void ReleaseSession(const std::string& session);
  // Extents reserved by sessions (not yet taken by a Save), and how many of those are leased.
  size_t reserved_count() const;
  // Recovery: marks [offset, offset+length) as a daemon-owned extent with id `id`.
  absl::Status Restore(uint64_t id, uint64_t offset, uint64_t length);
  // Removes the segment name (clean shutdown with nothing staged).
  void Unlink();

 private:
  StagingArena() = default;
  std::optional<uint64_t> AllocateLocked(uint64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Detaches a reserved extent from its session: freed now, or when its last lease ends.
  void ReleaseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLease(uint64_t id);
  // INVALID_ARGUMENT when an id appears twice.
  static absl::Status CheckDistinct(std::span<const uint64_t> ids, const char* what);
  void FreeRangeLocked(uint64_t offset, uint64_t len) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t LargestFreeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string shm_name_;
  std::string generation_;
  bool adopted_ = false;
  uint64_t dev_ = 0;
  uint64_t ino_ = 0;
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
