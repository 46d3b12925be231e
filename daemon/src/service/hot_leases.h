// HotLeases: the hot copies clients are copying out of themselves (issue 37 §1;
// docs/ARCHITECTURE.md "The load path"). A Load whose items ask for it
// (LoadItemRequest.hot_direct) answers where their bytes lie in a hot copy in the caller's own
// arena segment instead of copying them; the client then copies from its mapping of the segment.
// The lease keeps those bytes where they are meanwhile.
//
// Resource: a lease holds one pin (a shared_ptr) of a RamTier HotCopy. Owner: the session that
// loaded. What ends it, whichever comes first:
//   - the client releases it (ReleaseExtentsRequest.hot_lease_ids; or hot_mismatch_lease_ids,
//     and the service then drops the hot copy);
//   - its session ends (Goodbye, the client's process dying, the daemon stopping: DropSession);
//   - lease_time passes (Expire: the housekeeping and every Grant call it), so a client that
//     never releases holds the bytes for a bounded time.
// While a lease lives, eviction, Drop and delete only drop the tier's reference: the extents are
// freed when the last pin goes (ram_tier.h), so bytes a client copies are never reused under it.
// A lease ended (by expiry or the session's end) while a client still copies, or a daemon
// restart, may let the bytes be reused: the client checksums every block as it copies it and
// compares with the manifest's crc32c from the Load answer, so it never keeps bytes that changed
// (it loads those items again, through the daemon's own verified copy).
// A client that lies: releasing an id it does not hold (never granted, released twice, expired,
// another session's) is NOT_FOUND and touches nothing; a session holding
// limits::kHotLeasesPerSessionMax is refused another (RESOURCE_EXHAUSTED naming the limit).
// Threads: every method may be called from any thread at once; one lock (mu_), never held while a
// copy is destroyed (its extents are freed with the lock released).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "tier/ram_tier.h"

namespace ckptd {

class HotLeases {
 public:
  // `clock` is borrowed (outlives the table).
  HotLeases(const Clock* clock, absl::Duration lease_time) : clock_(clock), time_(lease_time) {}
  ~HotLeases() = default;  // pins dropped: extents freed if nothing else pins them

  // A new lease of `session` on `copy` (the hot copy of `key`); its id (never 0, never reused).
  // RESOURCE_EXHAUSTED naming limits::kHotLeasesPerSessionMax when the session holds that many
  // after expired ones went.
  absl::StatusOr<uint64_t> Grant(const std::string& session, RamTier::Key key,
                                 std::shared_ptr<const HotCopy> copy) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends lease `id` of `session`; the key it pinned. NOT_FOUND when the session holds no such
  // lease (the message names the id).
  absl::StatusOr<RamTier::Key> Release(const std::string& session, uint64_t id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every lease of `session` (its end).
  void DropSession(const std::string& session) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the leases past lease_time; how many.
  size_t Expire() ABSL_LOCKS_EXCLUDED(mu_);
  // Leases held, all sessions.
  size_t held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Lease {
    std::string session;
    RamTier::Key key;
    std::shared_ptr<const HotCopy> copy;
    absl::Time expires;
  };
  using Pins = std::vector<std::shared_ptr<const HotCopy>>;
  Pins ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const absl::Duration time_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> per_session_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd
