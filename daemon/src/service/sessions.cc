#include "service/sessions.h"

#include "absl/strings/str_cat.h"
#include "ckptd/error_reason.h"
#include "ckptd/v1/ckptd.pb.h"
#include "common/limits.h"
#include "dataplane/arena.h"
#include "spdlog/spdlog.h"

namespace ckptd {

namespace {
// Clients decide on the reason (proto: ErrorReason), never on this text.
absl::Status UnknownSession(absl::string_view message) {
  return WithReason(absl::FailedPreconditionError(message), v1::UNKNOWN_SESSION);
}
}  // namespace

std::string DescribeCaller(const Caller& c) {
  return absl::StrCat("uid ", c.uid, c.pid > 0 ? absl::StrCat(" (pid ", c.pid, ")") : "");
}

absl::StatusOr<std::string> SessionTable::Open(const Caller& caller, std::string client_name) {
  std::string id = RandomHexId();
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= limits::kSessionsMax) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many client sessions (", sessions_.size(),
                     ", limit kSessionsMax = ", limits::kSessionsMax, ")"));
  }
  uint32_t& n = per_uid_[caller.uid];
  if (n >= limits::kSessionsPerUidMax) {
    return absl::ResourceExhaustedError(absl::StrCat(
        DescribeCaller(caller), " has ", n, " sessions open (limit kSessionsPerUidMax = ",
        limits::kSessionsPerUidMax, "); close clients or let them end"));
  }
  ++n;
  client_name.resize(std::min<size_t>(client_name.size(), 256));
  sessions_[id] =
      Session{caller.uid, caller.connection, std::move(client_name), clock_->Now(), false};
  return id;
}

absl::Status SessionTable::Attach(const Caller& caller, const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.uid != caller.uid ||
      it->second.connection != caller.connection) {
    return UnknownSession(
        absl::StrCat("unknown session \"", id, "\" on this connection (call Hello first)"));
  }
  if (it->second.attached) {
    return absl::FailedPreconditionError(absl::StrCat("session \"", id, "\" is already attached"));
  }
  it->second.attached = true;
  return absl::OkStatus();
}

absl::Status SessionTable::Check(const Caller& caller, const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.uid != caller.uid ||
      it->second.connection != caller.connection) {
    return UnknownSession(absl::StrCat(
        "unknown session \"", id,
        "\" (call Hello first; sessions belong to one connection and end with it, and the daemon "
        "may have restarted)"));
  }
  return absl::OkStatus();
}

absl::Status SessionTable::CheckUid(uint32_t uid, const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.uid != uid) {
    return UnknownSession(absl::StrCat("unknown session \"", id, "\" for uid ", uid,
                                       " (a session's arena goes only to the uid that opened it)"));
  }
  return absl::OkStatus();
}

void SessionTable::SetArenaGeneration(const std::string& id, const std::string& generation) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end()) it->second.arena_generation = generation;
}

std::string SessionTable::ArenaGeneration(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  return it == sessions_.end() ? "" : it->second.arena_generation;
}

void SessionTable::End(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return;
    auto uid = per_uid_.find(it->second.uid);
    if (--uid->second == 0) per_uid_.erase(uid);
    sessions_.erase(it);
  }
  spdlog::debug("session {} ended", id);
  on_end_(id);
}

size_t SessionTable::ExpireUnattached(absl::Duration timeout) {
  const absl::Time now = clock_->Now();
  std::vector<std::string> expired;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) {
      if (!s.attached && now - s.opened > timeout) expired.push_back(id);
    }
  }
  for (const std::string& id : expired) End(id);
  return expired.size();
}

void SessionTable::EndAll() {
  std::vector<std::string> all;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) all.push_back(id);
  }
  for (const std::string& id : all) End(id);
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace ckptd
