#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>
#include <thread>

#include "common/limits.h"
#include "dataplane/arena.h"
#include "dataplane/region_registry.h"

namespace ckptd {
namespace {

std::string TestShmName() {
  return "/ckptd-unittest-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 8);
}

struct ArenaFixture {
  std::string name = TestShmName();
  ~ArenaFixture() { shm_unlink(name.c_str()); }
};

TEST_CASE("arena extents are 4 KiB aligned, disjoint and all-or-none", "[unit]") {
  ArenaFixture f;
  auto arena = StagingArena::Open(f.name, 16 << 20, true, false);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  CHECK_FALSE(a.adopted());
  CHECK(a.capacity_bytes() == (16 << 20) - limits::kArenaHeaderBytes);
  std::vector<uint64_t> sizes = {1, 4096, 4097, 100000, 0x12345};
  auto ext = a.Reserve("s1", sizes, absl::ZeroDuration());
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
  auto arena = StagingArena::Open(f.name, 16 << 20, false, false);
  REQUIRE(arena.ok());
  StagingArena& a = **arena;
  std::vector<uint64_t> big = {12 << 20};
  auto first = a.Reserve("s", big, absl::ZeroDuration());
  REQUIRE(first.ok());
  std::vector<uint64_t> more = {8 << 20};
  auto t0 = absl::Now();
  auto second = a.Reserve("s", more, absl::Milliseconds(100));
  CHECK(absl::Now() - t0 >= absl::Milliseconds(90));
  REQUIRE(second.status().code() == absl::StatusCode::kResourceExhausted);
  std::string msg(second.status().message());
  CHECK(msg.find("asked 8388608 bytes") != std::string::npos);
  CHECK(msg.find("bytes free") != std::string::npos);
  // A request larger than the arena fails at once.
  std::vector<uint64_t> huge = {64 << 20};
  CHECK(a.Reserve("s", huge, absl::Seconds(10)).status().code() ==
        absl::StatusCode::kResourceExhausted);
  std::vector<uint64_t> zero = {0};
  CHECK(a.Reserve("s", zero, absl::ZeroDuration()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A waiter is woken when space is freed (the next step stages while the previous persists).
  std::thread freer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<uint64_t> id = {(*first)[0].id};
    REQUIRE(a.Take("s", id).ok());
    a.Free(id);
  });
  auto third = a.Reserve("s", more, absl::Seconds(5));
  freer.join();
  CHECK(third.ok());
}

TEST_CASE("arena: a restarted daemon adopts the segment and restores journaled extents",
          "[unit]") {
  ArenaFixture f;
  std::string gen;
  ExtentInfo kept;
  {
    auto arena = StagingArena::Open(f.name, 16 << 20, true, false);
    REQUIRE(arena.ok());
    gen = (*arena)->generation();
    std::vector<uint64_t> sizes = {8192};
    auto ext = (*arena)->Reserve("s", sizes, absl::ZeroDuration());
    REQUIRE(ext.ok());
    kept = (*ext)[0];
    std::memset((*arena)->base() + kept.offset, 0xab, 8192);
  }
  auto again = StagingArena::Open(f.name, 16 << 20, true, false);
  REQUIRE(again.ok());
  CHECK((*again)->adopted());
  CHECK((*again)->generation() == gen);
  CHECK((*again)->base()[kept.offset + 100] == 0xab);
  REQUIRE((*again)->Restore(kept.id, kept.offset, kept.length).ok());
  CHECK((*again)->Restore(kept.id + 1, kept.offset, kept.length).code() ==
        absl::StatusCode::kDataLoss);
  CHECK((*again)->free_bytes() == (*again)->capacity_bytes() - kept.length);
  // Another size: recreated with a new generation.
  again->reset();
  auto resized = StagingArena::Open(f.name, 32 << 20, false, false);
  REQUIRE(resized.ok());
  CHECK_FALSE((*resized)->adopted());
  CHECK((*resized)->generation() != gen);
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
  auto id = reg.Register("s", req);
  REQUIRE(id.ok());
  CHECK(reg.Acquire("s", *id, 0, 1 << 20).ok());
  CHECK(reg.Acquire("s", *id, (1 << 20) - 1, 1).ok());
  CHECK(reg.Acquire("s", *id, (1 << 20) - 1, 2).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(reg.Acquire("s", *id, ~uint64_t{0}, 2).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(reg.Acquire("other", *id, 0, 1).status().code() == absl::StatusCode::kNotFound);
  CHECK(reg.Acquire("s", *id + 7, 0, 1).status().code() == absl::StatusCode::kNotFound);
  req.set_size_bytes(2 << 20);
  CHECK(reg.Register("s", req).status().code() == absl::StatusCode::kInvalidArgument);
  req.set_shm_name("../etc/passwd");
  CHECK(reg.Register("s", req).status().code() == absl::StatusCode::kInvalidArgument);
  req.set_kind(v1::CUDA_IPC);
  CHECK(reg.Register("s", req).status().code() == absl::StatusCode::kUnimplemented);
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

}  // namespace
}  // namespace ckptd
