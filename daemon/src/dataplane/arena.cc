#include "dataplane/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "common/limits.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

constexpr char kArenaMagic[8] = {'C', 'K', 'P', 'T', 'A', 'R', 'N', '1'};

struct ArenaHeader {
  char magic[8];
  uint64_t size_bytes;
  char generation[33];
};


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

namespace {

// The segment of a previous run of this daemon, only if it is exactly what that run created:
// a regular file owned by the daemon's euid, with the daemon's mode, the size and the journaled
// generation. Anything else is refused (never adopted, never touched).
absl::Status CheckAdoptable(int fd, const std::string& what, uint64_t size_bytes, uint32_t mode,
                            const std::string& generation) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", what));
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != mode) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not the daemon's (owner uid %d, mode 0%o; expected uid %d, mode 0%o)", what,
        st.st_uid, st.st_mode & 07777, geteuid(), mode));
  }
  ArenaHeader h{};
  if (static_cast<uint64_t>(st.st_size) != size_bytes ||
      pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
      std::memcmp(h.magic, kArenaMagic, 8) != 0 || h.size_bytes != size_bytes ||
      std::string(h.generation, 32) != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " does not match the journal (size ", st.st_size, " vs ", size_bytes,
        ", or another generation than ", generation, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingArena>> StagingArena::Open(
    const std::string& shm_name, uint64_t size_bytes, bool prefault, bool mlock_pages,
    const std::string& adopt_generation, uint32_t mode, int64_t gid) {
  std::unique_ptr<StagingArena> arena(new StagingArena());
  arena->shm_name_ = shm_name;
  arena->size_bytes_ = size_bytes;
  std::string what = absl::StrCat("staging arena shm ", shm_name);

  int fd = -1;
  if (!adopt_generation.empty()) {
    fd = shm_open(shm_name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", what));
    absl::Status ok = CheckAdoptable(fd, what, size_bytes, mode, adopt_generation);
    if (!ok.ok()) {
      close(fd);
      return ok;
    }
    arena->generation_ = adopt_generation;
    arena->adopted_ = true;
  } else {
    // O_EXCL: a segment someone else created under this name is never taken over.
    fd = shm_open(shm_name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open(O_CREAT|O_EXCL) ", what));
    absl::Status set = absl::OkStatus();
    if (fchmod(fd, mode) != 0) {
      set = ErrnoStatus(errno, absl::StrCat("fchmod ", what));
    } else if (gid >= 0 && fchown(fd, static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) {
      set = ErrnoStatus(errno, absl::StrCat("fchown ", what, " to gid ", gid));
    } else if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
      set = ErrnoStatus(errno, absl::StrCat("ftruncate ", what, " to ", size_bytes, " bytes"));
    }
    if (!set.ok()) {
      close(fd);
      shm_unlink(shm_name.c_str());
      return set;
    }
    arena->generation_ = RandomHexId();
  }
  struct stat st;
  if (fstat(fd, &st) == 0) {
    arena->dev_ = st.st_dev;
    arena->ino_ = st.st_ino;
  }
  void* p = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int mmap_err = errno;
  close(fd);
  if (p == MAP_FAILED) return ErrnoStatus(mmap_err, absl::StrCat("mmap ", what));
  arena->base_ = static_cast<uint8_t*>(p);

  if (!arena->adopted_) {
    // tmpfs allocates on first touch; fallocate-like pre-faulting makes a full /dev/shm fail here,
    // at start, instead of as SIGBUS in a client's memcpy later.
    if (prefault) {
      if (madvise(p, size_bytes, MADV_POPULATE_WRITE) != 0) {
        if (errno != EINVAL) {
          return ErrnoStatus(errno, absl::StrCat("pre-faulting ", what, " (", size_bytes,
                                                 " bytes; is /dev/shm large enough?)"));
        }
        std::memset(p, 0, size_bytes);  // kernels before 5.14
      }
    }
    ArenaHeader h{};
    std::memcpy(h.magic, kArenaMagic, 8);
    h.size_bytes = size_bytes;
    std::memcpy(h.generation, arena->generation_.data(), 32);
    std::memcpy(p, &h, sizeof h);
  } else if (prefault) {
    madvise(p, size_bytes, MADV_POPULATE_WRITE);  // best effort: pages are already there
  }
  if (mlock_pages && mlock(p, size_bytes) != 0) {
    return ErrnoStatus(errno, absl::StrCat("mlock ", what, " (raise RLIMIT_MEMLOCK)"));
  }
  absl::MutexLock lock(&arena->mu_);
  arena->next_id_ = RandomExtentIdBase();
  uint64_t cap = size_bytes - limits::kArenaHeaderBytes;
  arena->free_[limits::kArenaHeaderBytes] = cap;
  arena->free_bytes_ = cap;
  return arena;
}

StagingArena::~StagingArena() {
  if (base_ != nullptr) munmap(base_, size_bytes_);
}

uint64_t StagingArena::capacity_bytes() const {
  return size_bytes_ - limits::kArenaHeaderBytes;
}

uint64_t StagingArena::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return free_bytes_;
}

void StagingArena::Unlink() {
  if (shm_unlink(shm_name_.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("shm_unlink {}: {}", shm_name_, std::strerror(errno));
  }
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
                                                              std::span<const uint64_t> sizes,
                                                              absl::Duration timeout) {
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("extent ", i, ": size 0 (zero-byte shards "
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
  absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    std::vector<ExtentInfo> out;
    bool ok = true;
    for (uint64_t s : sizes) {
      uint64_t len = RoundUp(s, limits::kAlignmentBytes);
      std::optional<uint64_t> off = AllocateLocked(len);
      if (!off) {
        ok = false;
        break;
      }
      out.push_back(ExtentInfo{next_id_++, *off, len, session, false, 0, false});
    }
    if (ok) {
      for (const ExtentInfo& e : out) extents_[e.id] = e;
      return out;
    }
    for (const ExtentInfo& e : out) {
      FreeRangeLocked(e.offset, e.length);
      free_bytes_ += e.length;
    }
    if (freed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "staging arena full: asked %d bytes in %d extents, %d bytes free of %d (largest free "
          "range %d) after waiting %d ms",
          total, sizes.size(), free_bytes_, capacity_bytes(), LargestFreeLocked(),
          absl::ToInt64Milliseconds(timeout)));
    }
  }
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
  if (--it->second.leases == 0 && it->second.released) {
    FreeRangeLocked(it->second.offset, it->second.length);
    free_bytes_ += it->second.length;
    extents_.erase(it);
  }
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
      return absl::FailedPreconditionError(absl::StrCat(
          "extent ", id, " is the destination of a load in progress; save it once that load "
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

void StagingArena::Free(std::span<const uint64_t> ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ids) {
    auto it = extents_.find(id);
    CKPTD_CHECK(it != extents_.end() && it->second.daemon_owned && it->second.leases == 0);
    FreeRangeLocked(it->second.offset, it->second.length);
    free_bytes_ += it->second.length;
    extents_.erase(it);
  }
}

void StagingArena::ReleaseLocked(absl::flat_hash_map<uint64_t, ExtentInfo>::iterator it) {
  if (it->second.leases > 0) {
    it->second.released = true;  // EndLease frees it
    it->second.session.clear();
    return;
  }
  FreeRangeLocked(it->second.offset, it->second.length);
  free_bytes_ += it->second.length;
  extents_.erase(it);
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

absl::Status StagingArena::Restore(uint64_t id, uint64_t offset, uint64_t length) {
  absl::MutexLock lock(&mu_);
  if (offset % limits::kAlignmentBytes != 0 || length % limits::kAlignmentBytes != 0 ||
      offset < limits::kArenaHeaderBytes || offset + length > size_bytes_ || length == 0) {
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
  extents_[id] = ExtentInfo{id, offset, length, "", true, 0, false};
  next_id_ = std::max(next_id_, id + 1);
  return absl::OkStatus();
}

}  // namespace ckptd
