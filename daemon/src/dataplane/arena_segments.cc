// StagingArena's segments: one named shared-memory object per uid, and which of them holds the
// pages of each offset range (arena.h: "one segment per uid", "physical memory").
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "dataplane/arena.h"
#include "spdlog/spdlog.h"

namespace ckptd {

struct StagingArena::Seg {
  ArenaSegmentInfo info;
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t size_bytes = 0;
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool retired = false;  // damaged and replaced (Segment()); guarded by seg_mu_

  ~Seg() {
    if (base != nullptr) munmap(base, size_bytes);
    if (fd >= 0) close(fd);
  }
};

namespace {

constexpr char kArenaMagic[8] = {'C', 'K', 'P', 'T', 'A', 'R', 'N', '2'};
constexpr uint32_t kSegmentMode = 0600;

// Page 0 of every segment.
struct SegmentHeader {
  char magic[8];
  uint64_t size_bytes;
  uint32_t uid;
  char generation[33];
  char state_dir[3584];  // NUL-terminated; empty in segments of older versions (never swept)
};
static_assert(sizeof(SegmentHeader) <= limits::kArenaHeaderBytes);

// A segment of a previous run of this daemon, only if it is exactly what that run created.
absl::Status CheckAdoptable(int fd, const std::string& what, uint64_t size_bytes, uint32_t uid,
                            const std::string& generation) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", what));
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 07777) != kSegmentMode) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not the daemon's (owner uid %d, mode 0%o; expected uid %d, mode 0%o)", what,
        st.st_uid, st.st_mode & 07777, geteuid(), kSegmentMode));
  }
  SegmentHeader h{};
  if (static_cast<uint64_t>(st.st_size) != size_bytes ||
      pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
      std::memcmp(h.magic, kArenaMagic, 8) != 0 || h.size_bytes != size_bytes || h.uid != uid ||
      std::string(h.generation, 32) != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " does not match the journal (size ", st.st_size, " vs ", size_bytes,
                     ", or another uid than ", uid, " or generation than ", generation, ")"));
  }
  return absl::OkStatus();
}

// Faults [p, p+n) in; a full /dev/shm is RESOURCE_EXHAUSTED here rather than a SIGBUS later.
absl::Status Populate(uint8_t* p, uint64_t n, const std::string& what) {
  if (madvise(p, n, MADV_POPULATE_WRITE) == 0) return absl::OkStatus();
  if (errno == EINVAL) {  // kernels before 5.14
    for (uint64_t i = 0; i < n; i += limits::kAlignmentBytes) {
      reinterpret_cast<volatile uint8_t*>(p)[i] = p[i];
    }
    return absl::OkStatus();
  }
  int err = errno;
  if (err == ENOMEM || err == EFAULT || err == ENOSPC) {
    return absl::ResourceExhaustedError(
        absl::StrCat("faulting in ", n, " bytes of ", what, ": ", std::strerror(err),
                     " (is /dev/shm large enough for staging_bytes_max?)"));
  }
  return ErrnoStatus(err, absl::StrCat("faulting in ", n, " bytes of ", what));
}

}  // namespace

StagingArena::StagingArena(ArenaOptions options, SegmentJournalFn journal)
    : options_(std::move(options)), journal_(std::move(journal)) {}

StagingArena::~StagingArena() {
  stop_prefault_.store(true);
  if (prefault_thread_.joinable()) prefault_thread_.join();
}

absl::StatusOr<std::unique_ptr<StagingArena>> StagingArena::Create(ArenaOptions options,
                                                                   SegmentJournalFn journal) {
  if (options.size_bytes % limits::kAlignmentBytes != 0 ||
      options.size_bytes <= limits::kArenaHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("staging arena of ", options.size_bytes,
                                                   " bytes: must be a multiple of ",
                                                   limits::kAlignmentBytes, " and larger than its ",
                                                   limits::kArenaHeaderBytes, "-byte header"));
  }
  std::unique_ptr<StagingArena> arena(new StagingArena(std::move(options), std::move(journal)));
  absl::MutexLock lock(&arena->mu_);
  arena->next_id_ = RandomExtentIdBase();
  uint64_t cap = arena->capacity_bytes();
  arena->free_[limits::kArenaHeaderBytes] = cap;
  arena->free_bytes_ = cap;
  arena->resident_[limits::kArenaHeaderBytes] = {cap, kNobody};
  return arena;
}

absl::StatusOr<std::unique_ptr<StagingArena::Seg>> StagingArena::NewSegment(uint32_t uid) {
  auto seg = std::make_unique<Seg>();
  seg->info.uid = uid;
  seg->info.name =
      absl::StrCat(options_.name_prefix, "arena-u", uid, "-", RandomHexId().substr(0, 16));
  seg->info.generation = RandomHexId();
  seg->size_bytes = options_.size_bytes;
  const std::string what = absl::StrCat("staging arena segment ", seg->info.name);
  // O_EXCL under a random name: a segment someone else created is never taken over.
  seg->fd = shm_open(seg->info.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     kSegmentMode);
  if (seg->fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open(O_CREAT|O_EXCL) ", what));
  absl::Status st = absl::OkStatus();
  struct stat sb;
  if (fchmod(seg->fd, kSegmentMode) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("fchmod ", what));
  } else if (ftruncate(seg->fd, static_cast<off_t>(seg->size_bytes)) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("ftruncate ", what, " to ", seg->size_bytes, " bytes"));
  } else if (fstat(seg->fd, &sb) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("fstat ", what));
  } else {
    void* p = mmap(nullptr, seg->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
    if (p == MAP_FAILED) {
      st = ErrnoStatus(errno, absl::StrCat("mmap ", what));
    } else {
      seg->base = static_cast<uint8_t*>(p);
      seg->dev = sb.st_dev;
      seg->ino = sb.st_ino;
      st = Populate(seg->base, limits::kArenaHeaderBytes, what);
    }
  }
  if (st.ok() && options_.mlock_pages && mlock2(seg->base, seg->size_bytes, MLOCK_ONFAULT) != 0) {
    st = ErrnoStatus(errno, absl::StrCat("mlock ", what, " (raise RLIMIT_MEMLOCK)"));
  }
  if (!st.ok()) {
    shm_unlink(seg->info.name.c_str());
    return st;
  }
  SegmentHeader h{};
  std::memcpy(h.magic, kArenaMagic, 8);
  h.size_bytes = seg->size_bytes;
  h.uid = uid;
  std::memcpy(h.generation, seg->info.generation.data(), 32);
  if (options_.state_dir.size() < sizeof h.state_dir) {
    std::memcpy(h.state_dir, options_.state_dir.data(), options_.state_dir.size());
  }
  std::memcpy(seg->base, &h, sizeof h);
  return seg;
}

size_t RemoveAbandonedSegments() {
  size_t removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = "/" + entry.path().filename().string();
    if (name.rfind("/ckptd-", 0) != 0) continue;
    const int fd = shm_open(name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) continue;
    struct stat st;
    SegmentHeader h{};
    const bool ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                      (st.st_mode & 07777) == kSegmentMode &&
                      pread(fd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) &&
                      std::memcmp(h.magic, kArenaMagic, 8) == 0;
    close(fd);
    h.state_dir[sizeof h.state_dir - 1] = '\0';
    const std::string dir(h.state_dir);
    if (!ours || dir.empty() || std::filesystem::exists(dir, ec) || ec) continue;
    if (shm_unlink(name.c_str()) == 0) {
      spdlog::info("removed arena segment {}: its state dir {} is gone", name, dir);
      ++removed;
    }
  }
  return removed;
}

absl::Status StagingArena::Adopt(uint32_t uid, const std::string& name,
                                 const std::string& generation) {
  absl::MutexLock create(&create_mu_);
  if (Find(uid) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("uid ", uid, " already has an arena segment"));
  }
  auto seg = std::make_unique<Seg>();
  seg->info = ArenaSegmentInfo{uid, name, generation, /*adopted=*/true};
  seg->size_bytes = options_.size_bytes;
  const std::string what = absl::StrCat("staging arena segment ", name);
  seg->fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (seg->fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open ", what));
  CKPTD_RETURN_IF_ERROR(CheckAdoptable(seg->fd, what, seg->size_bytes, uid, generation));
  struct stat sb;
  if (fstat(seg->fd, &sb) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", what));
  seg->dev = sb.st_dev;
  seg->ino = sb.st_ino;
  void* p = mmap(nullptr, seg->size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", what));
  seg->base = static_cast<uint8_t*>(p);
  if (options_.mlock_pages && mlock2(seg->base, seg->size_bytes, MLOCK_ONFAULT) != 0) {
    return ErrnoStatus(errno, absl::StrCat("mlock ", what, " (raise RLIMIT_MEMLOCK)"));
  }
  {
    // What the previous run left resident is not known: the next claim of a free range
    // punches it out of every other segment.
    absl::MutexLock lock(&mu_);
    for (auto& [off, run] : resident_) {
      if (run.second == kNobody) run.second = kAnyone;
    }
  }
  spdlog::info("staging arena {} for uid {} adopted", name, uid);
  absl::WriterMutexLock lock(&seg_mu_);
  segs_.push_back(std::move(seg));
  return absl::OkStatus();
}

absl::Status StagingArena::CheckIntact(const Seg& s) const {
  struct stat st;
  if (fstat(s.fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", s.info.name));
  if (static_cast<uint64_t>(st.st_size) != s.size_bytes) {
    return absl::DataLossError(
        absl::StrCat("staging arena segment ", s.info.name, " of uid ", s.info.uid, " is ",
                     st.st_size, " bytes, not ", s.size_bytes, ": a process of uid ", s.info.uid,
                     " truncated or resized it (its staged bytes are gone)"));
  }
  return absl::OkStatus();
}

void StagingArena::RetireLocked(Seg* s, const absl::Status& why) {
  {
    absl::WriterMutexLock lock(&seg_mu_);
    s->retired = true;
  }
  ++retired_[s->info.uid];
  if (shm_unlink(s->info.name.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("shm_unlink {}: {}", s->info.name, std::strerror(errno));
  }
  {
    // The pages its uid held are gone with it: the new segment faults them in when claimed.
    absl::MutexLock lock(&mu_);
    for (auto& [off, run] : resident_) {
      if (run.second == s->info.uid) run.second = kAnyone;
    }
  }
  spdlog::error(
      "staging arena: {}; segment retired (sessions that mapped it are refused; checkpoints "
      "staged in it abort when flushed); new sessions of uid {} get a new segment",
      std::string(why.message()), s->info.uid);
}

absl::StatusOr<ArenaSegmentInfo> StagingArena::Segment(uint32_t uid) {
  if (Seg* s = Find(uid); s != nullptr && CheckIntact(*s).ok()) return s->info;
  absl::MutexLock create(&create_mu_);
  if (Seg* s = Find(uid)) {
    absl::Status intact = CheckIntact(*s);
    if (intact.ok()) return s->info;
    if (retired_[uid] >= limits::kArenaSegmentRetiresMax) {
      return absl::ResourceExhaustedError(absl::StrCat(
          intact.message(), "; uid ", uid, " already had ", retired_[uid],
          " damaged segments replaced (kArenaSegmentRetiresMax): its staging is refused until "
          "the daemon restarts"));
    }
    RetireLocked(s, intact);
  }
  size_t count = 0;
  {
    absl::ReaderMutexLock lock(&seg_mu_);
    for (const auto& s : segs_) count += s->retired ? 0 : 1;
  }
  if (count >= limits::kArenaSegmentsMax) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "staging arena: ", count, " uids already have a segment (kArenaSegmentsMax); uid ", uid,
        " cannot get one until the daemon restarts"));
  }
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<Seg> seg, NewSegment(uid));
  if (absl::Status st = journal_(seg->info); !st.ok()) {
    shm_unlink(seg->info.name.c_str());
    return Annotate(st, absl::StrCat("journaling staging arena segment ", seg->info.name));
  }
  spdlog::info("staging arena {} for uid {} ({} bytes)", seg->info.name, uid, seg->size_bytes);
  ArenaSegmentInfo info = seg->info;
  {
    absl::WriterMutexLock lock(&seg_mu_);
    segs_.push_back(std::move(seg));
  }
  if (count == 0 && options_.prefault && !prefault_thread_.joinable()) {
    // The first uid (the node's training uid, usually) gets the whole free arena resident, as
    // pre-faulting at start did — in the background, so this Hello answers at once.
    {
      absl::MutexLock lock(&mu_);
      prefault_uid_ = uid;
    }
    prefault_thread_ = std::thread([this, uid] { PrefaultLoop(uid); });
  }
  return info;
}

void StagingArena::PrefaultLoop(uint32_t uid) {
  constexpr uint64_t kChunkBytes = 64 * limits::kMiB;
  Seg* seg = Find(uid);
  CKPTD_CHECK(seg != nullptr);
  uint64_t faulted = 0;
  while (!stop_prefault_.load()) {
    uint64_t off = 0, len = 0;
    {
      absl::MutexLock lock(&mu_);
      // A range nobody holds was never reserved, so it is free; claiming it for `uid` keeps
      // other uids' claims away until inflight_ is cleared.
      for (const auto& [o, run] : resident_) {
        if (run.second == kNobody) {
          off = o;
          len = std::min(run.first, kChunkBytes);
          break;
        }
      }
      if (len == 0) break;
      // A reservation faulting its own range in goes first: faulting beside it only slows it
      // (the first save issued at once after a start: 5.3 s with it, 3.0 s alone, for 2 GiB on
      // the 2-core bench machine; bench/RESULTS.md "The first save after a start").
      if (reservations_faulting_ > 0) {
        inflight_done_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
        continue;
      }
      ClaimLocked(off, len, uid);
      inflight_offset_ = off;
      inflight_length_ = len;
    }
    absl::Status st =
        Populate(seg->base + off, len, absl::StrCat("staging arena segment ", seg->info.name));
    absl::MutexLock lock(&mu_);
    inflight_length_ = 0;
    inflight_done_.SignalAll();
    if (!st.ok()) {
      // Left for reservations to fault (and fail cleanly then).
      ClaimLocked(off, len, kAnyone);
      spdlog::warn("pre-faulting the staging arena: {}", st.ToString());
      break;
    }
    faulted += len;
  }
  absl::MutexLock lock(&mu_);
  prefault_uid_ = kNobody;
  spdlog::info("staging arena {}: {} bytes faulted in for uid {}", seg->info.name, faulted, uid);
}

uint64_t StagingArena::prefault_left_bytes() const {
  absl::MutexLock lock(&mu_);
  if (prefault_uid_ == kNobody) return 0;
  uint64_t left = inflight_length_;
  for (const auto& [o, run] : resident_) left += run.second == kNobody ? run.first : 0;
  return left;
}

StagingArena::Seg* StagingArena::Find(uint32_t uid) const {
  absl::ReaderMutexLock lock(&seg_mu_);
  for (const auto& s : segs_) {
    if (s->info.uid == uid && !s->retired) return s.get();
  }
  return nullptr;
}

uint8_t* StagingArena::AtGeneration(const std::string& generation, uint64_t offset) const {
  absl::ReaderMutexLock lock(&seg_mu_);
  for (const auto& s : segs_) {
    if (s->info.generation == generation) {
      CKPTD_CHECK(offset <= s->size_bytes);
      return s->base + offset;
    }
  }
  return nullptr;
}

bool StagingArena::Retired(const std::string& generation) const {
  absl::ReaderMutexLock lock(&seg_mu_);
  for (const auto& s : segs_) {
    if (s->info.generation == generation) return s->retired;
  }
  return false;
}

std::optional<ArenaSegmentInfo> StagingArena::ExistingSegment(uint32_t uid) const {
  Seg* s = Find(uid);
  if (s == nullptr) return std::nullopt;
  return s->info;
}

absl::StatusOr<int> StagingArena::SegmentFd(uint32_t uid) const {
  Seg* s = Find(uid);
  if (s == nullptr) return absl::NotFoundError(absl::StrCat("uid ", uid, " has no arena segment"));
  return s->fd;
}

std::vector<ArenaSegmentInfo> StagingArena::segments() const {
  absl::ReaderMutexLock lock(&seg_mu_);
  std::vector<ArenaSegmentInfo> out;
  out.reserve(segs_.size());
  for (const auto& s : segs_) {
    if (!s->retired) out.push_back(s->info);  // a retired one is unlinked already
  }
  return out;
}

bool StagingArena::IsSegment(uint64_t dev, uint64_t ino) const {
  absl::ReaderMutexLock lock(&seg_mu_);
  for (const auto& s : segs_) {
    if (s->dev == dev && s->ino == ino) return true;
  }
  return false;
}

std::optional<ArenaSegmentInfo> StagingArena::SegmentOfGeneration(
    const std::string& generation) const {
  absl::ReaderMutexLock lock(&seg_mu_);
  for (const auto& s : segs_) {
    if (s->info.generation == generation) return s->info;
  }
  return std::nullopt;
}

bool StagingArena::FullyResident(uint32_t uid) const {
  absl::MutexLock lock(&mu_);
  return resident_.size() == 1 && resident_.begin()->second.second == uid;
}

std::string StagingArena::Generation(uint32_t uid) const {
  Seg* s = Find(uid);
  return s == nullptr ? "" : s->info.generation;
}

uint8_t* StagingArena::At(uint32_t uid, uint64_t offset) const {
  Seg* s = Find(uid);
  CKPTD_CHECK(s != nullptr && offset <= s->size_bytes);
  return s->base + offset;
}

void StagingArena::Unlink() {
  for (const ArenaSegmentInfo& s : segments()) {
    if (shm_unlink(s.name.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("shm_unlink {}: {}", s.name, std::strerror(errno));
    }
  }
}

std::vector<StagingArena::Span> StagingArena::ClaimLocked(uint64_t offset, uint64_t length,
                                                          uint32_t uid) {
  // Split the runs at both ends, then walk the runs inside.
  // The lambdas run under the caller's mu_ (clang's analysis does not carry it into a lambda).
  auto split = [this](uint64_t at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = resident_.upper_bound(at);
    if (it == resident_.begin()) return;
    --it;
    auto [len, holder] = it->second;
    if (it->first == at || it->first + len <= at) return;
    it->second.first = at - it->first;
    resident_[at] = {it->first + len - at, holder};
  };
  split(offset);
  split(offset + length);
  std::vector<Span> taken;
  for (auto it = resident_.find(offset); it != resident_.end() && it->first < offset + length;) {
    CKPTD_CHECK(it->first + it->second.first <= offset + length);
    if (it->second.second != uid) {
      taken.push_back(Span{it->first, it->second.first, it->second.second});
    }
    it = resident_.erase(it);
  }
  // One run for the claimed range, merged with equal neighbours.
  uint64_t off = offset, len = length;
  auto next = resident_.lower_bound(off);
  if (next != resident_.end() && next->first == off + len && next->second.second == uid) {
    len += next->second.first;
    next = resident_.erase(next);
  }
  if (next != resident_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.first == off && prev->second.second == uid) {
      off = prev->first;
      len += prev->second.first;
      resident_.erase(prev);
    }
  }
  resident_[off] = {len, uid};
  return taken;
}

absl::Status StagingArena::MakeResident(uint32_t uid, const std::vector<Span>& spans) {
  Seg* mine = Find(uid);
  CKPTD_CHECK(mine != nullptr);
  std::vector<Seg*> others;
  {
    absl::ReaderMutexLock lock(&seg_mu_);
    for (const auto& s : segs_) {
      if (s.get() != mine && !s->retired) others.push_back(s.get());
    }
  }
  if (!spans.empty()) {
    // The first segment's background faulting must not be racing a punch of what it faults.
    absl::MutexLock lock(&mu_);
    auto busy = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (inflight_length_ == 0 || prefault_uid_ == uid) return false;
      for (const Span& sp : spans) {
        if (sp.offset < inflight_offset_ + inflight_length_ &&
            inflight_offset_ < sp.offset + sp.length) {
          return true;
        }
      }
      return false;
    };
    while (busy()) inflight_done_.Wait(&mu_);
    ++reservations_faulting_;
  }
  absl::Status st = FaultSpans(mine, others, spans);
  if (!spans.empty()) {
    absl::MutexLock lock(&mu_);
    --reservations_faulting_;
    inflight_done_.SignalAll();
  }
  return st;
}

absl::Status StagingArena::FaultSpans(Seg* mine, const std::vector<Seg*>& others,
                                      const std::vector<Span>& spans) {
  for (const Span& sp : spans) {
    // The range is free in the allocator and now ours: nobody else's extent is there, so the
    // pages another segment holds are only what its uid staged there before (or wrote there
    // since, into free space). They go, so physical memory stays within the arena's size.
    for (Seg* o : others) {
      if (sp.holder != kAnyone && sp.holder != o->info.uid) continue;
      if (fallocate(o->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    static_cast<off_t>(sp.offset), static_cast<off_t>(sp.length)) != 0) {
        spdlog::warn("punching [{}, +{}) out of {}: {}", sp.offset, sp.length, o->info.name,
                     std::strerror(errno));
      }
    }
    if (options_.prefault) {
      CKPTD_RETURN_IF_ERROR(Populate(mine->base + sp.offset, sp.length,
                                     absl::StrCat("staging arena segment ", mine->info.name)));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd
