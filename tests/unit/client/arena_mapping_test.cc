// The arena mapping's populating thread (client/cpp/src/arena_mapping.h): a mapping made before the
// daemon faulted its arena in maps, in the background, the pages that come to exist in the segment
// (and allocates none itself); MAP_POPULATE'd mappings start none; destroying a mapping stops and
// joins it at once.
#include "arena_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <thread>

namespace ckptd::internal {
namespace {

constexpr uint64_t kArenaBytes = 8 << 20;

int Segment() {
  int fd = memfd_create("arena-mapping-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, kArenaBytes) == 0);
  return fd;
}

// Whether `pred` holds within 5 s.
template <typename Pred>
bool Within5s(Pred pred) {
  for (int i = 0; i < 500 && !pred(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Pages of the file behind `fd`: written (made to exist) through a mapping of the test's own, as
// the daemon's pre-faulting does in its mapping.
void Fault(int fd, uint64_t off, uint64_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(off));
  REQUIRE(p != MAP_FAILED);
  REQUIRE(madvise(p, len, MADV_POPULATE_WRITE) == 0);
  REQUIRE(munmap(p, len) == 0);
}

TEST_CASE("arena mapping: the pages that come to exist are mapped in the background, none else",
          "[unit]") {
  unsetenv("CKPTD_ARENA_POPULATE");
  int fd = Segment();
  int keep = dup(fd);  // MapFd takes fd
  auto m = ArenaMapping::MapFd(fd, "arena-mapping-test", kArenaBytes, false, false);
  REQUIRE(m.ok());
  // Nothing exists yet: nothing is populated (and the thread allocates nothing).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK((*m)->populated_bytes() == 0);
  struct stat st;
  REQUIRE(fstat(keep, &st) == 0);
  CHECK(st.st_blocks == 0);
  // The daemon faults the first half in: exactly that half gets mapped.
  Fault(keep, 0, kArenaBytes / 2);
  CHECK(Within5s([&] { return (*m)->populated_bytes() == kArenaBytes / 2; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK((*m)->populated_bytes() == kArenaBytes / 2);
  Fault(keep, kArenaBytes / 2, kArenaBytes / 2);
  CHECK(Within5s([&] { return (*m)->populated_bytes() == kArenaBytes; }));
  close(keep);
}

TEST_CASE("arena mapping: a populated mapping starts no thread, destroying one stops it at once",
          "[unit]") {
  unsetenv("CKPTD_ARENA_POPULATE");
  auto full = ArenaMapping::MapFd(Segment(), "arena-mapping-test", kArenaBytes, true, false);
  REQUIRE(full.ok());
  CHECK((*full)->populated_bytes() == kArenaBytes);
  // A mapping whose pages never come to exist: its thread waits; destroying it is prompt.
  auto idle = ArenaMapping::MapFd(Segment(), "arena-mapping-test", kArenaBytes, false, false);
  REQUIRE(idle.ok());
  const auto started = std::chrono::steady_clock::now();
  idle->reset();
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(1));
  // CKPTD_ARENA_POPULATE=0: no thread, nothing populated even when the pages exist.
  setenv("CKPTD_ARENA_POPULATE", "0", 1);
  int fd = Segment();
  int keep = dup(fd);
  Fault(keep, 0, kArenaBytes);
  auto off = ArenaMapping::MapFd(fd, "arena-mapping-test", kArenaBytes, false, false);
  unsetenv("CKPTD_ARENA_POPULATE");
  REQUIRE(off.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK((*off)->populated_bytes() == 0);
  close(keep);
}

}  // namespace
}  // namespace ckptd::internal
