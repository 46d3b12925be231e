#include "dataplane/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <thread>

#include "common/limits.h"
#include "dataplane/memory_guard.h"
#include "dataplane/region_registry.h"

namespace ckptd {
namespace {

std::string TestShmName() {
  return "/ckptd-unittest-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 8);
}

// Any uid: segments are the daemon's files, whoever they serve.
constexpr uint32_t kU = 1000;
constexpr uint32_t kV = 1001;

// An arena whose segments are named "<prefix>arena-u<uid>-..." and journaled into `journaled`;
// every segment with the prefix is removed at the end.
struct ArenaFixture {
  std::string prefix = TestShmName() + "-";
  std::vector<ArenaSegmentInfo> journaled;
  absl::StatusOr<std::unique_ptr<StagingArena>> Open(uint64_t bytes, bool prefault) {
    return StagingArena::Create(ArenaOptions{prefix, bytes, prefault, false},
                                [this](const ArenaSegmentInfo& s) {
                                  journaled.push_back(s);
                                  return absl::OkStatus();
                                });
  }
  ~ArenaFixture() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      std::string n = e.path().filename().string();
      if (("/" + n).rfind(prefix, 0) == 0) shm_unlink(("/" + n).c_str());
    }
  }
};

TEST_CASE("arena extents are 4 KiB aligned, disjoint and all-or-none", "[unit]") {
  ArenaFixture f;
  auto arena = f.Open(16 << 20, true);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  CHECK(a.segments().empty());  // made at the first reservation of a uid
  CHECK(a.capacity_bytes() == (16 << 20) - limits::kArenaHeaderBytes);
  std::vector<uint64_t> sizes = {1, 4096, 4097, 100000, 0x12345};
  auto ext = a.Reserve("s1", kU, sizes, absl::ZeroDuration());
  REQUIRE(ext.ok());
  REQUIRE(ext->size() == sizes.size());
  std::set<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t i = 0; i < ext->size(); ++i) {
    const ExtentInfo& e = (*ext)[i];
    CHECK(e.offset % limits::kAlignmentBytes == 0);
    CHECK(e.length % limits::kAlignmentBytes == 0);
    CHECK(e.length >= sizes[i]);
    CHECK(e.offset >= limits::kArenaHeaderBytes);
    CHECK(e.offset + e.length <= a.size_bytes());
    ranges.insert({e.offset, e.offset + e.length});
  }
  uint64_t prev_end = 0;
  for (auto [b, e] : ranges) {
    CHECK(b >= prev_end);
    prev_end = e;
  }
  // Another session cannot see or take them; the owner can look them up and release them.
  CHECK(a.Lookup("s2", (*ext)[0].id).status().code() == absl::StatusCode::kNotFound);
  CHECK(a.Lookup("s1", (*ext)[0].id).ok());
  uint64_t before = a.free_bytes();
  std::vector<uint64_t> ids = {(*ext)[0].id, (*ext)[1].id};
  REQUIRE(a.Release("s1", ids).ok());
  CHECK(a.free_bytes() == before + (*ext)[0].length + (*ext)[1].length);
  CHECK(a.Release("s1", ids).code() == absl::StatusCode::kNotFound);
  a.ReleaseSession("s1");
  CHECK(a.free_bytes() == a.capacity_bytes());
}

TEST_CASE("arena: full arena waits, then fails stating bytes asked and free", "[unit]") {
  ArenaFixture f;
  auto arena = f.Open(16 << 20, false);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  std::vector<uint64_t> big = {12 << 20};
  auto first = a.Reserve("s", kU, big, absl::ZeroDuration());
  REQUIRE(first.ok());
  std::vector<uint64_t> more = {8 << 20};
  auto t0 = absl::Now();
  auto second = a.Reserve("s", kU, more, absl::Milliseconds(100));
  CHECK(absl::Now() - t0 >= absl::Milliseconds(90));
  REQUIRE(second.status().code() == absl::StatusCode::kResourceExhausted);
  std::string msg(second.status().message());
  CHECK(msg.find("asked 8388608 bytes") != std::string::npos);
  CHECK(msg.find("bytes free") != std::string::npos);
  // A request larger than the arena fails at once.
  std::vector<uint64_t> huge = {64 << 20};
  CHECK(a.Reserve("s", kU, huge, absl::Seconds(10)).status().code() ==
        absl::StatusCode::kResourceExhausted);
  std::vector<uint64_t> zero = {0};
  CHECK(a.Reserve("s", kU, zero, absl::ZeroDuration()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A waiter is woken when space is freed (the next step stages while the previous persists).
  std::thread freer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<uint64_t> id = {(*first)[0].id};
    REQUIRE(a.Take("s", id).ok());
    a.Free(id);
  });
  auto third = a.Reserve("s", kU, more, absl::Seconds(5));
  freer.join();
  CHECK(third.ok());
}

TEST_CASE("arena: a restarted daemon adopts the segment and restores journaled extents", "[unit]") {
  ArenaFixture f;
  ExtentInfo kept;
  {
    auto arena = f.Open(16 << 20, true);
    REQUIRE(arena.ok());
    std::vector<uint64_t> sizes = {8192};
    auto ext = (*arena)->Reserve("s", kU, sizes, absl::ZeroDuration());
    REQUIRE(ext.ok());
    kept = (*ext)[0];
    CHECK(kept.uid == kU);
    std::memset((*arena)->Data(kept), 0xab, 8192);
  }
  REQUIRE(f.journaled.size() == 1);
  const ArenaSegmentInfo seg = f.journaled[0];
  CHECK(seg.uid == kU);
  CHECK(seg.name.rfind(f.prefix + "arena-u1000-", 0) == 0);
  auto again = f.Open(16 << 20, true);
  REQUIRE(again.ok());
  REQUIRE((*again)->Adopt(kU, seg.name, seg.generation).ok());
  CHECK((*again)->SegmentOfGeneration(seg.generation)->adopted);
  CHECK((*again)->Generation(kU) == seg.generation);
  CHECK((*again)->At(kU, kept.offset)[100] == 0xab);
  REQUIRE((*again)->Restore(kept.id, kU, kept.offset, kept.length).ok());
  CHECK((*again)->Restore(kept.id + 1, kU, kept.offset, kept.length).code() ==
        absl::StatusCode::kDataLoss);
  CHECK((*again)->Restore(kept.id + 2, kV, kept.offset + 65536, 4096).code() ==
        absl::StatusCode::kDataLoss);  // no segment of that uid
  CHECK((*again)->free_bytes() == (*again)->capacity_bytes() - kept.length);
  CHECK((*again)->Adopt(kU, seg.name, seg.generation).code() == absl::StatusCode::kAlreadyExists);
  again->reset();
  // Another size, generation or uid: never adopted, never touched.
  auto other = f.Open(32 << 20, false);
  CHECK((*other)->Adopt(kU, seg.name, seg.generation).code() ==
        absl::StatusCode::kFailedPrecondition);
  other = f.Open(16 << 20, false);
  CHECK((*other)->Adopt(kU, seg.name, std::string(32, '0')).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK((*other)->Adopt(kV, seg.name, seg.generation).code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK((*other)->Adopt(kU, f.prefix + "arena-gone", seg.generation).code() ==
        absl::StatusCode::kNotFound);
  CHECK((*other)->segments().empty());
}

TEST_CASE("arena: a segment someone else could have written is never adopted", "[unit]") {
  ArenaFixture f;
  {
    auto arena = f.Open(16 << 20, false);
    REQUIRE(arena.ok());
    REQUIRE((*arena)->Segment(kU).ok());
  }
  const ArenaSegmentInfo seg = f.journaled.at(0);
  const std::string path = "/dev/shm" + seg.name;
  struct stat st;
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);  // no client opens it by name
  // Same bytes, same generation, but group/other may write it: not the daemon's segment.
  REQUIRE(chmod(path.c_str(), 0666) == 0);
  auto arena = f.Open(16 << 20, false);
  absl::Status adopted = (*arena)->Adopt(kU, seg.name, seg.generation);
  REQUIRE(adopted.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(adopted.message()).find("is not the daemon's") != std::string::npos);
  if (geteuid() == 0) {
    // Owned by another uid: refused too.
    REQUIRE(chmod(path.c_str(), 0600) == 0);
    REQUIRE(chown(path.c_str(), 65534, 65534) == 0);
    CHECK((*arena)->Adopt(kU, seg.name, seg.generation).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("arena: each uid's extents live in its own segment, memory stays within the arena",
          "[unit]") {
  ArenaFixture f;
  const uint64_t size = 16 << 20;
  auto arena = f.Open(size, true);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  std::vector<uint64_t> all = {a.capacity_bytes()};
  auto mine = a.Reserve("s1", kU, all, absl::ZeroDuration());
  REQUIRE(mine.ok());
  CHECK(a.FullyResident(kU));  // the first uid's segment holds the whole arena
  std::memset(a.Data((*mine)[0]), 0x5a, (*mine)[0].length);
  std::vector<uint64_t> ids = {(*mine)[0].id};
  REQUIRE(a.Release("s1", ids).ok());
  // Another uid gets the same offsets, in another segment: none of kU's bytes, and kU's pages
  // there are punched out (each offset is backed in one segment).
  auto theirs = a.Reserve("s2", kV, all, absl::ZeroDuration());
  REQUIRE(theirs.ok());
  REQUIRE(f.journaled.size() == 2);
  const ExtentInfo& t = (*theirs)[0];
  CHECK(t.uid == kV);
  CHECK(a.Data(t) != a.At(kU, t.offset));
  CHECK_FALSE(a.FullyResident(kU));
  CHECK(a.FullyResident(kV));
  bool any = false;
  for (uint64_t i = 0; i < t.length; i += 4096) any |= a.Data(t)[i] != 0;
  CHECK_FALSE(any);
  auto blocks = [](const std::string& name) {
    struct stat st;
    REQUIRE(stat(("/dev/shm" + name).c_str(), &st) == 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  CHECK(blocks(f.journaled[0].name) <= limits::kArenaHeaderBytes);
  CHECK(blocks(f.journaled[1].name) >= a.capacity_bytes());
  // Descriptors are the segments; anything else is not.
  struct stat st;
  REQUIRE(fstat(*a.SegmentFd(kU), &st) == 0);
  CHECK(a.IsSegment(st.st_dev, st.st_ino));
  CHECK(a.SegmentFd(4242).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(stat("/dev/shm", &st) == 0);
  CHECK_FALSE(a.IsSegment(st.st_dev, st.st_ino));
}

TEST_CASE("arena: segments are capped per uid count", "[unit]") {
  ArenaFixture f;
  auto arena = f.Open(16 << 20, false);
  REQUIRE(arena.ok());
  for (uint32_t u = 0; u < limits::kArenaSegmentsMax; ++u) {
    REQUIRE((*arena)->Segment(20000 + u).ok());
  }
  absl::StatusOr<ArenaSegmentInfo> over = (*arena)->Segment(30000);
  CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(over.status().message()).find("kArenaSegmentsMax") != std::string::npos);
  CHECK((*arena)->Segment(20000).ok());  // an existing one is still served
}

TEST_CASE("arena: a leased extent is never re-issued while the lease lasts", "[unit]") {
  ArenaFixture f;
  auto arena = f.Open(16 << 20, false);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  std::vector<uint64_t> all = {a.capacity_bytes()};
  auto ext = a.Reserve("s1", kU, all, absl::ZeroDuration());
  REQUIRE(ext.ok());
  const uint64_t id = (*ext)[0].id;
  {
    auto lease = a.Lease("s1", id);
    REQUIRE(lease.ok());
    CHECK(a.Lease("s2", id).status().code() == absl::StatusCode::kNotFound);
    // A save cannot take what a load is writing.
    std::vector<uint64_t> ids = {id};
    CHECK(a.Take("s1", ids).code() == absl::StatusCode::kFailedPrecondition);
    // The client releases it (or its session ends) mid-load: the bytes stay out of reach.
    REQUIRE(a.Release("s1", ids).ok());
    CHECK(a.Lookup("s1", id).status().code() == absl::StatusCode::kNotFound);
    CHECK(a.free_bytes() == 0);
    std::vector<uint64_t> one = {4096};
    CHECK(a.Reserve("s2", kU, one, absl::Milliseconds(20)).status().code() ==
          absl::StatusCode::kResourceExhausted);
  }
  // The load finished: now the bytes are free.
  CHECK(a.free_bytes() == a.capacity_bytes());
  // Session end while leased behaves the same.
  auto again = a.Reserve("s3", kU, all, absl::ZeroDuration());
  REQUIRE(again.ok());
  {
    auto lease = a.Lease("s3", (*again)[0].id);
    REQUIRE(lease.ok());
    a.ReleaseSession("s3");
    CHECK(a.free_bytes() == 0);
  }
  CHECK(a.free_bytes() == a.capacity_bytes());
}

TEST_CASE("arena: an id named twice is a clear error, never a crash", "[unit]") {
  ArenaFixture f;
  auto arena = f.Open(16 << 20, false);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  std::vector<uint64_t> sizes = {4096, 4096};
  auto ext = a.Reserve("s", kU, sizes, absl::ZeroDuration());
  REQUIRE(ext.ok());
  std::vector<uint64_t> twice = {(*ext)[0].id, (*ext)[0].id};
  absl::Status st = a.Release("s", twice);
  CHECK(st.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(st.message()).find("named twice") != std::string::npos);
  CHECK(a.Take("s", twice).code() == absl::StatusCode::kInvalidArgument);
  // Nothing was released by the refused call.
  CHECK(a.Lookup("s", (*ext)[0].id).ok());
  std::vector<uint64_t> once = {(*ext)[0].id};
  CHECK(a.Release("s", once).ok());
  CHECK(a.Release("s", once).code() == absl::StatusCode::kNotFound);
}

TEST_CASE("region registry bounds-checks every access", "[unit]") {
  std::string name = TestShmName();
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 1 << 20) == 0);
  close(fd);
  RegionRegistry reg;
  v1::RegisterRegionRequest req;
  req.set_kind(v1::SHM);
  req.set_shm_name(name);
  req.set_size_bytes(1 << 20);
  auto id = reg.Register("s", getuid(), req);
  REQUIRE(id.ok());
  CHECK(reg.Acquire("s", *id, 0, 1 << 20).ok());
  CHECK(reg.Acquire("s", *id, (1 << 20) - 1, 1).ok());
  CHECK(reg.Acquire("s", *id, (1 << 20) - 1, 2).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(reg.Acquire("s", *id, ~uint64_t{0}, 2).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(reg.Acquire("other", *id, 0, 1).status().code() == absl::StatusCode::kNotFound);
  CHECK(reg.Acquire("s", *id + 7, 0, 1).status().code() == absl::StatusCode::kNotFound);
  req.set_size_bytes(2 << 20);
  CHECK(reg.Register("s", getuid(), req).status().code() == absl::StatusCode::kInvalidArgument);
  req.set_shm_name("../etc/passwd");
  CHECK(reg.Register("s", getuid(), req).status().code() == absl::StatusCode::kInvalidArgument);
  req.set_kind(v1::CUDA_IPC);  // a registry without a GPU: refused, naming why
  absl::Status no_gpu = reg.Register("s", getuid(), req).status();
  CHECK(no_gpu.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(no_gpu.message()), Catch::Contains("without GPU support"));
  {
    auto lease = reg.Acquire("s", *id, 0, 16);
    REQUIRE(lease.ok());
    // Busy: unregister waits, then fails clearly.
    CHECK(reg.Unregister("s", *id, absl::Milliseconds(50)).code() ==
          absl::StatusCode::kFailedPrecondition);
  }
  CHECK(reg.Unregister("s", *id, absl::Seconds(1)).ok());
  CHECK(reg.Unregister("s", *id, absl::Seconds(1)).code() == absl::StatusCode::kNotFound);
  shm_unlink(name.c_str());
}

// An shm object of `bytes` named `name`; unlinked by the caller.
void MakeShm(const std::string& name, uint64_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  close(fd);
}

TEST_CASE("region registry refuses memory that is not the caller's", "[unit]") {
  ArenaFixture f;
  auto arena = f.Open(16 << 20, false);
  REQUIRE(arena.ok());
  REQUIRE((*arena)->Segment(getuid()).ok());
  StagingArena* a = arena->get();
  RegionRegistry reg(ForbiddenRegions{"/ckptd-unittest-daemon-", [a](uint64_t dev, uint64_t ino) {
                                        return a->IsSegment(dev, ino);
                                      }});
  v1::RegisterRegionRequest req;
  req.set_kind(v1::SHM);
  req.set_size_bytes(4096);
  // The daemon's own arena, by inode under any name, and anything under its prefix.
  req.set_shm_name(f.journaled.at(0).name);
  CHECK(reg.Register("s", getuid(), req).status().code() == absl::StatusCode::kPermissionDenied);
  req.set_shm_name("/ckptd-unittest-daemon-arena");
  CHECK(reg.Register("s", getuid(), req).status().code() == absl::StatusCode::kPermissionDenied);
  // An object of another uid.
  std::string name = TestShmName();
  MakeShm(name, 4096);
  req.set_shm_name(name);
  absl::StatusOr<uint64_t> other = reg.Register("s", getuid() + 1, req);
  CHECK(other.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(other.status().message()).find("owned by uid") != std::string::npos);
  // A symlink in /dev/shm is not followed.
  std::string link = TestShmName();
  REQUIRE(symlink(("/dev/shm" + name).c_str(), ("/dev/shm" + link).c_str()) == 0);
  req.set_shm_name(link);
  CHECK(reg.Register("s", getuid(), req).status().code() == absl::StatusCode::kPermissionDenied);
  unlink(("/dev/shm" + link).c_str());
  shm_unlink(name.c_str());
}

TEST_CASE("a region shrunk after registration is a clear error, never a signal", "[unit]") {
  InstallMemoryGuard();
  std::string name = TestShmName();
  MakeShm(name, 1 << 20);
  RegionRegistry reg;
  v1::RegisterRegionRequest req;
  req.set_kind(v1::SHM);
  req.set_shm_name(name);
  req.set_size_bytes(1 << 20);
  auto id = reg.Register("s", getuid(), req);
  REQUIRE(id.ok());
  auto lease = reg.Acquire("s", *id, 0, 1 << 20);
  REQUIRE(lease.ok());
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 4096) == 0);  // the owner shrinks it under a lease
  // A new lease sees it at once.
  absl::StatusOr<RegionLease> late = reg.Acquire("s", *id, 0, 1 << 20);
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(late.status().message()).find("shrank") != std::string::npos);
  // The access racing the shrink faults (SIGBUS) and is caught.
  std::vector<uint8_t> out(1 << 20);
  absl::Status read = GuardedCopy(out.data(), (*lease)->base, 1 << 20, "region 1");
  CHECK(read.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(read.message()).find("vanished") != std::string::npos);
  CHECK(GuardedZero((*lease)->base + 8192, 4096, "region 1").code() ==
        absl::StatusCode::kFailedPrecondition);
  // Bytes still backed work as before, and the guard is reusable on this thread.
  CHECK(GuardedZero((*lease)->base, 4096, "region 1").ok());
  close(fd);
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace ckptd
