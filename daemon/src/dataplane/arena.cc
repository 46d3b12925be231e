#include "dataplane/arena.h"

#include <sys/random.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "common/limits.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::Status CheckInExtent(const ExtentInfo& e, uint64_t offset, uint64_t length,
                           const std::string& what) {
  if (offset <= e.length && length <= e.length - offset) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", offset, ", ", offset, "+", length,
                                            ") are outside extent ", e.id, " (", e.length,
                                            " bytes)"));
}
namespace {

void RandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      CKPTD_CHECK(errno == EINTR);
      continue;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

}  // namespace

std::string RandomHexId() {
  uint8_t bytes[16];
  RandomBytes(bytes, sizeof bytes);
  std::string out;
  for (uint8_t b : bytes) absl::StrAppend(&out, absl::Hex(b, absl::kZeroPad2));
  return out;
}

uint64_t RandomExtentIdBase() {
  uint64_t v = 0;
  RandomBytes(&v, sizeof v);
  return (v & 0xffffffull) << 32 | 1;  // ids stay well below 2^63
}

uint64_t StagingArena::capacity_bytes() const {
  return options_.size_bytes - limits::kArenaHeaderBytes;
}

uint64_t StagingArena::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

std::optional<uint64_t> StagingArena::AllocateLocked(uint64_t len) {
  // First fit over an address-ordered free list keeps big free ranges at the end together.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < len) continue;
    uint64_t off = it->first;
    uint64_t rest = it->second - len;
    free_.erase(it);
    if (rest > 0) free_[off + len] = rest;
    free_bytes_ -= len;
    return off;
  }
  return std::nullopt;
}

void StagingArena::FreeRangeLocked(uint64_t offset, uint64_t len) {
  auto next = free_.lower_bound(offset);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    CKPTD_CHECK(prev->first + prev->second <= offset);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end()) {
    CKPTD_CHECK(offset + len <= next->first);
    if (offset + len == next->first) {
      len += next->second;
      free_.erase(next);
    }
  }
  free_[offset] = len;
  freed_.SignalAll();
}

uint64_t StagingArena::LargestFreeLocked() const {
  uint64_t m = 0;
  for (const auto& [off, len] : free_) m = std::max(m, len);
  return m;
}

absl::StatusOr<std::vector<ExtentInfo>> StagingArena::Reserve(const std::string& session,
                                                              uint32_t uid,
                                                              std::span<const uint64_t> sizes,
                                                              absl::Duration timeout) {
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("extent ", i,
                                                     ": size 0 (zero-byte shards "
                                                     "need no extent)"));
    }
    if (sizes[i] > capacity_bytes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "extent ", i, " of ", sizes[i], " bytes can never fit: the staging arena holds ",
          capacity_bytes(), " bytes (raise staging_bytes_max)"));
    }
    total += RoundUp(sizes[i], limits::kAlignmentBytes);
  }
  if (total > capacity_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("reservation of ", total, " bytes in ", sizes.size(),
                     " extents can never fit: the staging arena holds ", capacity_bytes(),
                     " bytes (reserve in smaller batches or raise staging_bytes_max)"));
  }
  if (total > uid_share_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "reservation of ", total, " bytes can never fit uid ", uid,
        "'s share of the staging arena: ", uid_share_bytes(), " of its ", capacity_bytes(),
        " bytes (uid_arena_share_percent = ", options_.uid_share_percent,
        "; reserve in smaller batches or raise staging_bytes_max)"));
  }
  CKPTD_RETURN_IF_ERROR(Segment(uid).status());
  std::vector<ExtentInfo> out;
  std::vector<Span> spans;
  {
    absl::MutexLock lock(&mu_);
    CKPTD_ASSIGN_OR_RETURN(out, AllocateAllLocked(session, uid, sizes, total, timeout));
    for (const ExtentInfo& e : out) {
      for (const Span& s : ClaimLocked(e.offset, e.length, uid)) spans.push_back(s);
    }
  }
  absl::Status resident = MakeResident(uid, spans);
  if (resident.ok()) return out;
  // Not handed out: give the extents back (unless the session ended meanwhile and released
  // them) and forget what is resident where for them.
  absl::MutexLock lock(&mu_);
  for (const Span& s : spans) ClaimLocked(s.offset, s.length, kAnyone);
  for (const ExtentInfo& e : out) {
    auto it = extents_.find(e.id);
    if (it != extents_.end() && !it->second.daemon_owned && !it->second.released &&
        it->second.session == session) {
      ReleaseLocked(it);
    }
  }
  return resident;
}

absl::StatusOr<std::vector<ExtentInfo>> StagingArena::AllocateAllLocked(
    const std::string& session, uint32_t uid, std::span<const uint64_t> sizes, uint64_t total,
    absl::Duration timeout) {
  const absl::Time started = absl::Now();
  absl::Time deadline = started + timeout;
  Budget waiting = Budget::kNone;  // the budget it waits for now (counted in waiting_*)
  bool waited = false;             // counted in the reservation stats when it ends
  auto count_wait = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WaitForSpaceLocked(Budget::kNone, &waiting, uid, total, deadline);  // no longer waiting
    if (!waited) return;
    ++reserve_waits_;
    reserve_wait_seconds_ += absl::ToDoubleSeconds(absl::Now() - started);
  };
  while (true) {
    // The uid's share first: past it the reservation waits for the uid's own bytes to go (a
    // flush, a release), never for another uid's, and evicts nobody's hot copies.
    if (options_.uid_share_percent < 100 && charged_[uid] + total > uid_share_bytes()) {
      waited = true;
      if (WaitForSpaceLocked(Budget::kUidShare, &waiting, uid, total, deadline)) {
        count_wait();
        return absl::ResourceExhaustedError(absl::StrFormat(
            "uid %d's share of the staging arena is full: it holds %d bytes reserved or staged, "
            "asked %d more, its share is %d (uid_arena_share_percent = %d of %d bytes) after "
            "waiting %d ms (reserve_timeout_ms)",
            uid, charged_[uid], total, uid_share_bytes(), options_.uid_share_percent,
            capacity_bytes(), absl::ToInt64Milliseconds(timeout)));
      }
      continue;
    }
    std::vector<ExtentInfo> out;
    bool ok = true;
    for (uint64_t s : sizes) {
      uint64_t len = RoundUp(s, limits::kAlignmentBytes);
      std::optional<uint64_t> off = AllocateLocked(len);
      if (!off) {
        ok = false;
        break;
      }
      out.push_back(ExtentInfo{next_id_++, *off, len, uid, session, false, 0, false, true});
    }
    if (ok) {
      for (const ExtentInfo& e : out) {
        extents_[e.id] = e;
        charged_[uid] += e.length;
      }
      count_wait();
      return out;
    }
    for (const ExtentInfo& e : out) {
      FreeRangeLocked(e.offset, e.length);
      free_bytes_ += e.length;
    }
    if (reclaimer_) {
      ReclaimFn reclaim = reclaimer_;
      mu_.Unlock();
      const bool freed_some = reclaim(total);
      mu_.Lock();
      if (freed_some) continue;
    }
    waited = true;
    if (WaitForSpaceLocked(Budget::kArenaBytes, &waiting, uid, total, deadline)) {
      count_wait();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "staging arena full: asked %d bytes in %d extents, %d bytes free of %d (largest free "
          "range %d) after waiting %d ms (reserve_timeout_ms); the arena holds %s",
          total, sizes.size(), free_bytes_, capacity_bytes(), LargestFreeLocked(),
          absl::ToInt64Milliseconds(timeout), HoldersTextLocked()));
    }
  }
}

bool StagingArena::WaitForSpaceLocked(Budget budget, Budget* waiting, uint32_t uid, uint64_t total,
                                      absl::Time deadline) {
  if (*waiting != budget) {
    auto count = [&](Budget b, int delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (b == Budget::kArenaBytes) waiting_arena_ += delta;
      if (b == Budget::kUidShare) waiting_share_ += delta;
      if (b != Budget::kNone) waiting_bytes_ += delta > 0 ? total : -total;
    };
    count(*waiting, -1);
    count(budget, +1);
    *waiting = budget;
    if (budget == Budget::kArenaBytes) {
      spdlog::info(
          "a reservation of {} bytes for uid {} waits for the staging arena's bytes: {} "
          "free of {}; the arena holds {}",
          total, uid, free_bytes_, capacity_bytes(), HoldersTextLocked());
    } else if (budget == Budget::kUidShare) {
      spdlog::info(
          "a reservation of {} bytes for uid {} waits for its share of the staging "
          "arena: it holds {} of its {} bytes (uid_arena_share_percent)",
          total, uid, charged_[uid], uid_share_bytes());
    }
  }
  if (budget == Budget::kNone) return false;
  return freed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline;
}

std::string StagingArena::HoldersText() const {
  absl::MutexLock lock(&mu_);
  return HoldersTextLocked();
}

std::string StagingArena::HoldersTextLocked() const {
  uint64_t reserved = 0, staged = 0, hot = 0;
  for (const auto& [id, e] : extents_) {
    if (!e.daemon_owned) {
      reserved += e.length;
    } else if (e.charged) {
      staged += e.length;
    } else {
      hot += e.length;
    }
  }
  return absl::StrCat(reserved, " bytes reserved by clients, ", staged,
                      " staged and not yet persisted (the flush queue), ", hot,
                      " kept by the RAM tier");
}

StagingArena::ReserveWaits StagingArena::reserve_waits() const {
  absl::MutexLock lock(&mu_);
  return ReserveWaits{.count = reserve_waits_,
                      .seconds = reserve_wait_seconds_,
                      .waiting_arena_bytes = waiting_arena_,
                      .waiting_uid_share = waiting_share_,
                      .waiting_bytes = waiting_bytes_};
}

absl::StatusOr<ExtentInfo> StagingArena::Lookup(const std::string& session, uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = extents_.find(id);
  if (it == extents_.end() || it->second.daemon_owned || it->second.released ||
      it->second.session != session) {
    return absl::NotFoundError(
        absl::StrCat("unknown extent ", id, " (not reserved by this session, or already saved)"));
  }
  return it->second;
}

absl::StatusOr<ExtentLease> StagingArena::Lease(const std::string& session, uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = extents_.find(id);
  if (it == extents_.end() || it->second.daemon_owned || it->second.released ||
      it->second.session != session) {
    return absl::NotFoundError(
        absl::StrCat("unknown extent ", id, " (not reserved by this session, or already saved)"));
  }
  ++it->second.leases;
  // The copy handed out is a snapshot for reading offset/length; the deleter ends the lease.
  return ExtentLease(new ExtentInfo(it->second), [this](const ExtentInfo* e) {
    EndLease(e->id);
    delete e;
  });
}

void StagingArena::EndLease(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = extents_.find(id);
  CKPTD_CHECK(it != extents_.end() && it->second.leases > 0);
  if (--it->second.leases == 0 && it->second.released) EraseLocked(it);
}

absl::Status StagingArena::CheckDistinct(std::span<const uint64_t> ids, const char* what) {
  absl::flat_hash_map<uint64_t, size_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!seen.emplace(ids[i], i).second) {
      return absl::InvalidArgumentError(absl::StrCat("extent ", ids[i], " is named twice (",
                                                     seen[ids[i]], " and ", i, ") in one ", what));
    }
  }
  return absl::OkStatus();
}

absl::Status StagingArena::Take(const std::string& session, std::span<const uint64_t> ids) {
  CKPTD_RETURN_IF_ERROR(CheckDistinct(ids, "save"));
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = extents_.find(id);
    if (it == extents_.end() || it->second.daemon_owned || it->second.released ||
        it->second.session != session) {
      return absl::NotFoundError(absl::StrCat("unknown extent ", id));
    }
    if (it->second.leases > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("extent ", id,
                       " is the destination of a load in progress; save it once that load "
                       "returned"));
    }
  }
  for (uint64_t id : ids) {
    ExtentInfo& e = extents_[id];
    e.daemon_owned = true;
    e.session.clear();
  }
  return absl::OkStatus();
}

void StagingArena::WakeReservations() {
  absl::MutexLock lock(&mu_);
  freed_.SignalAll();
}

void StagingArena::SetReclaimer(ReclaimFn fn) {
  absl::MutexLock lock(&mu_);
  reclaimer_ = std::move(fn);
}

void StagingArena::Free(std::span<const uint64_t> ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = extents_.find(id);
    CKPTD_CHECK(it != extents_.end() && it->second.daemon_owned && it->second.leases == 0);
    EraseLocked(it);
  }
}

void StagingArena::UnchargeLocked(ExtentInfo& e) {
  if (!e.charged) return;
  e.charged = false;
  auto c = charged_.find(e.uid);
  CKPTD_CHECK(c != charged_.end() && c->second >= e.length);
  c->second -= e.length;
  if (c->second == 0) charged_.erase(c);
  freed_.SignalAll();  // a reservation waiting for its uid's share
}

void StagingArena::EraseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::iterator it) {
  UnchargeLocked(it->second);
  FreeRangeLocked(it->second.offset, it->second.length);
  free_bytes_ += it->second.length;
  extents_.erase(it);
}

void StagingArena::Uncharge(std::span<const uint64_t> ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    if (auto it = extents_.find(id); it != extents_.end()) UnchargeLocked(it->second);
  }
}

uint64_t StagingArena::charged_bytes(uint32_t uid) const {
  absl::MutexLock lock(&mu_);
  auto it = charged_.find(uid);
  return it == charged_.end() ? 0 : it->second;
}

uint64_t StagingArena::uid_share_bytes() const {
  if (options_.uid_share_percent >= 100) return capacity_bytes();
  // Whole pages, so a share is something a reservation can fill.
  const uint64_t share = capacity_bytes() / 100 * options_.uid_share_percent;
  return std::max(share / limits::kAlignmentBytes * limits::kAlignmentBytes,
                  limits::kAlignmentBytes);
}

void StagingArena::ReleaseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::iterator it) {
  if (it->second.leases > 0) {
    it->second.released = true;  // EndLease frees it
    it->second.session.clear();
    return;
  }
  EraseLocked(it);
}

absl::Status StagingArena::Release(const std::string& session, std::span<const uint64_t> ids) {
  CKPTD_RETURN_IF_ERROR(CheckDistinct(ids, "release"));
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = extents_.find(id);
    if (it == extents_.end() || it->second.daemon_owned || it->second.released ||
        it->second.session != session) {
      return absl::NotFoundError(absl::StrCat("unknown extent ", id, " (cannot release it)"));
    }
  }
  for (uint64_t id : ids) ReleaseLocked(extents_.find(id));
  return absl::OkStatus();
}

void StagingArena::ReleaseSession(const std::string& session) {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, e] : extents_) {
    if (!e.daemon_owned && !e.released && e.session == session) ids.push_back(id);
  }
  for (uint64_t id : ids) ReleaseLocked(extents_.find(id));
}

size_t StagingArena::reserved_count() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, e] : extents_) n += !e.daemon_owned;
  return n;
}

absl::Status StagingArena::Restore(uint64_t id, uint32_t uid, uint64_t offset, uint64_t length) {
  if (Find(uid) == nullptr) {
    return absl::DataLossError(
        absl::StrCat("journal extent ", id, ": uid ", uid, " has no arena segment"));
  }
  absl::MutexLock lock(&mu_);
  if (offset % limits::kAlignmentBytes != 0 || length % limits::kAlignmentBytes != 0 ||
      offset < limits::kArenaHeaderBytes || offset > options_.size_bytes ||
      length > options_.size_bytes - offset || length == 0) {
    return absl::DataLossError(absl::StrCat("journal extent ", id, " [", offset, ", +", length,
                                            ") does not fit the arena"));
  }
  auto it = free_.upper_bound(offset);
  if (it == free_.begin()) {
    return absl::DataLossError(absl::StrCat("journal extent ", id, " overlaps another"));
  }
  --it;
  uint64_t f_off = it->first, f_len = it->second;
  if (offset + length > f_off + f_len) {
    return absl::DataLossError(absl::StrCat("journal extent ", id, " overlaps another"));
  }
  free_.erase(it);
  if (offset > f_off) free_[f_off] = offset - f_off;
  if (f_off + f_len > offset + length) free_[offset + length] = f_off + f_len - offset - length;
  free_bytes_ -= length;
  // Residency stays unknown (Adopt): other segments may hold stale pages there too, which the
  // next claim of this range, once freed, punches out.
  extents_[id] = ExtentInfo{id, offset, length, uid, "", true, 0, false};
  next_id_ = std::max(next_id_, id + 1);
  return absl::OkStatus();
}

}  // namespace ckptd
