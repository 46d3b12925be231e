#include "service/hot_leases.h"

#include "absl/strings/str_cat.h"
#include "common/limits.h"

namespace ckptd {

HotLeases::Pins HotLeases::ExpireLocked(absl::Time now) {
  Pins ended;  // destroyed by the caller once mu_ is released
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    if (--per_session_[it->second.session] == 0) per_session_.erase(it->second.session);
    ended.push_back(std::move(it->second.copy));
    leases_.erase(it++);
  }
  return ended;
}

absl::StatusOr<uint64_t> HotLeases::Grant(const std::string& session, RamTier::Key key,
                                          std::shared_ptr<const HotCopy> copy) {
  Pins ended;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  ended = ExpireLocked(now);
  uint64_t& held = per_session_[session];
  if (held >= limits::kHotLeasesPerSessionMax) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", session, " holds ", held, " hot leases (limits::kHotLeasesPerSessionMax = ",
        limits::kHotLeasesPerSessionMax, "); release them (ReleaseExtents.hot_lease_ids)"));
  }
  ++held;
  const uint64_t id = next_id_++;
  leases_.emplace(id, Lease{session, std::move(key), std::move(copy), now + time_});
  return id;
}

absl::StatusOr<RamTier::Key> HotLeases::Release(const std::string& session, uint64_t id) {
  std::shared_ptr<const HotCopy> pin;
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.session != session) {
    return absl::NotFoundError(absl::StrCat("hot lease ", id, " is not held by session ", session,
                                            " (released, expired or never granted to it)"));
  }
  RamTier::Key key = it->second.key;
  pin = std::move(it->second.copy);
  if (--per_session_[session] == 0) per_session_.erase(session);
  leases_.erase(it);
  return key;
}

void HotLeases::DropSession(const std::string& session) {
  Pins ended;
  absl::MutexLock lock(&mu_);
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.session != session) {
      ++it;
      continue;
    }
    ended.push_back(std::move(it->second.copy));
    leases_.erase(it++);
  }
  per_session_.erase(session);
}

size_t HotLeases::Expire() {
  Pins ended;
  absl::MutexLock lock(&mu_);
  ended = ExpireLocked(clock_->Now());
  return ended.size();
}

size_t HotLeases::held() const {
  absl::MutexLock lock(&mu_);
  return leases_.size();
}

}  // namespace ckptd
