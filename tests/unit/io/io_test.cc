// Io: both implementations (io_uring and pread/pwrite) must behave identically.
#include "ckptd/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/limits.h"
#include "io/posix_io.h"
#include "test_buffers.h"
#include "test_dir.h"

namespace ckptd {
namespace {

using testing::TestDir;

using testing::Aligned;
using testing::AlignedBuf;
using testing::Fill;

std::unique_ptr<Io> MakeIo(int kind, uint32_t depth = 8) {
  return kind == 0 ? NewPosixIo() : NewUringIo(depth);
}

const char* KindName(int kind) { return kind == 0 ? "posix" : "uring"; }

TEST_CASE("io_uring availability is reported", "[unit]") {
  INFO("io_uring supported here: " << io_internal::UringSupported());
  REQUIRE(NewUringIo(4) != nullptr);
}

TEST_CASE("Io writes and reads back aligned O_DIRECT slices", "[unit]") {
  int kind = GENERATE(0, 1);
  DYNAMIC_SECTION(KindName(kind)) {
    TestDir dir("io_direct");
    auto io = MakeIo(kind);
    std::string path = dir.path() + "/f";
    auto file = io->Open(path, O_RDWR | O_CREAT | O_TRUNC, 0600, true);
    REQUIRE(file.ok());
    CHECK(file->direct);  // ext4/xfs test dirs support O_DIRECT
    constexpr uint64_t kSlices = 64;
    constexpr uint64_t kSliceBytes = 16 * 4096;
    AlignedBuf out = Aligned(kSlices * kSliceBytes);
    AlignedBuf in = Aligned(kSlices * kSliceBytes);
    Fill(out.get(), kSlices * kSliceBytes, 1);
    // Written in reverse order of offset, many in flight.
    std::vector<IoSlice> slices;
    for (uint64_t i = 0; i < kSlices; ++i) {
      uint64_t j = kSlices - 1 - i;
      slices.push_back({out.get() + j * kSliceBytes, kSliceBytes, j * kSliceBytes});
    }
    REQUIRE(io->WriteAll(*file, slices).ok());
    REQUIRE(io->Fdatasync(*file).ok());
    CHECK(*io->FileSize(*file) == kSlices * kSliceBytes);
    for (auto& s : slices) s.buf = in.get() + (static_cast<char*>(s.buf) - out.get());
    REQUIRE(io->ReadAll(*file, slices).ok());
    CHECK(std::memcmp(in.get(), out.get(), kSlices * kSliceBytes) == 0);
    REQUIRE(io->Close(*file).ok());
    CHECK(file->fd == -1);
  }
}

TEST_CASE("Io splits slices larger than kIoChunkBytesMax", "[unit]") {
  int kind = GENERATE(0, 1);
  DYNAMIC_SECTION(KindName(kind)) {
    TestDir dir("io_chunk");
    auto io = MakeIo(kind, 2);
    const uint64_t bytes = limits::kIoChunkBytesMax + 3 * 4096 + 17;  // unaligned tail
    std::string data(bytes, '\0');
    Fill(data.data(), bytes, 7);
    auto file = io->Open(dir.path() + "/big", O_RDWR | O_CREAT, 0600, false);
    REQUIRE(file.ok());
    IoSlice w{data.data(), bytes, 5};
    REQUIRE(io->WriteAll(*file, {&w, 1}).ok());
    std::string back(bytes, 'x');
    IoSlice r{back.data(), bytes, 5};
    REQUIRE(io->ReadAll(*file, {&r, 1}).ok());
    CHECK(back == data);
    CHECK(*io->FileSize(*file) == bytes + 5);
    REQUIRE(io->Close(*file).ok());
  }
}

TEST_CASE("uring and posix Io produce identical files", "[unit]") {
  TestDir dir("io_identical");
  std::vector<std::unique_ptr<Io>> ios;
  ios.push_back(NewPosixIo());
  ios.push_back(NewUringIo(16));
  std::string data(1 << 20, '\0');
  Fill(data.data(), data.size(), 3);
  // Many unaligned slices of random sizes and positions, some overlapping (later wins in both
  // implementations only if they do not overlap, so keep them disjoint).
  std::vector<IoSlice> slices;
  std::mt19937_64 rng(11);
  uint64_t pos = 0;
  while (pos < data.size()) {
    uint64_t len = std::min<uint64_t>(1 + rng() % 20000, data.size() - pos);
    slices.push_back({data.data() + pos, len, pos});
    pos += len + rng() % 3;  // leave small holes
  }
  std::shuffle(slices.begin(), slices.end(), rng);
  std::vector<std::string> contents;
  for (size_t i = 0; i < ios.size(); ++i) {
    std::string path = dir.path() + "/f" + std::to_string(i);
    auto file = ios[i]->Open(path, O_RDWR | O_CREAT, 0600, false);
    REQUIRE(file.ok());
    REQUIRE(ios[i]->WriteAll(*file, slices).ok());
    REQUIRE(ios[i]->Fsync(*file).ok());
    uint64_t size = *ios[i]->FileSize(*file);
    std::string back(size, 'x');
    IoSlice r{back.data(), size, 0};
    // Read through the other implementation.
    REQUIRE(ios[1 - i]->ReadAll(*file, {&r, 1}).ok());
    contents.push_back(back);
    REQUIRE(ios[i]->Close(*file).ok());
  }
  CHECK(contents[0] == contents[1]);
  for (const IoSlice& s : slices) {
    CHECK(std::memcmp(contents[0].data() + s.offset, s.buf, s.len) == 0);
  }
}

TEST_CASE("Io ReadAll past the end of the file is DATA_LOSS naming the path", "[unit]") {
  int kind = GENERATE(0, 1);
  DYNAMIC_SECTION(KindName(kind)) {
    TestDir dir("io_eof");
    auto io = MakeIo(kind);
    std::string path = dir.path() + "/short";
    auto file = io->Open(path, O_RDWR | O_CREAT, 0600, false);
    REQUIRE(file.ok());
    std::string data(1000, 'a');
    IoSlice w{data.data(), data.size(), 0};
    REQUIRE(io->WriteAll(*file, {&w, 1}).ok());
    std::string back(2000, '\0');
    IoSlice r{back.data(), back.size(), 0};
    absl::Status s = io->ReadAll(*file, {&r, 1});
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(std::string(s.message()), Catch::Contains(path));
    CHECK_THAT(std::string(s.message()), Catch::Contains("offset 1000"));
    REQUIRE(io->Close(*file).ok());
  }
}

TEST_CASE("Io transfer errors name the path and the offset", "[unit]") {
  int kind = GENERATE(0, 1);
  DYNAMIC_SECTION(KindName(kind)) {
    TestDir dir("io_err");
    auto io = MakeIo(kind);
    std::string path = dir.path() + "/ro";
    {
      auto f = io->Open(path, O_WRONLY | O_CREAT, 0600, false);
      REQUIRE(f.ok());
      REQUIRE(io->Close(*f).ok());
    }
    auto file = io->Open(path, O_RDONLY, 0, false);
    REQUIRE(file.ok());
    std::string data(100, 'a');
    IoSlice w{data.data(), data.size(), 8192};
    absl::Status s = io->WriteAll(*file, {&w, 1});  // EBADF: not open for writing
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()), Catch::Contains(path));
    CHECK_THAT(std::string(s.message()), Catch::Contains("offset 8192"));
    REQUIRE(io->Close(*file).ok());

    auto missing = io->Open(dir.path() + "/nope", O_RDONLY, 0, true);
    CHECK(absl::IsNotFound(missing.status()));
    CHECK_THAT(std::string(missing.status().message()), Catch::Contains("/nope"));
  }
}

// tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since: either way Open must succeed
// and say which it got.
TEST_CASE("Io Open with want_direct on tmpfs", "[unit]") {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) return;  // no tmpfs to try on
  auto io = NewPosixIo();
  std::string path = "/dev/shm/ckptd_io_test_" + std::to_string(getpid());
  auto file = io->Open(path, O_RDWR | O_CREAT | O_TRUNC, 0600, true);
  REQUIRE(file.ok());
  if (!file->direct) {
    std::string data = "hello";
    IoSlice w{data.data(), data.size(), 0};
    CHECK(io->WriteAll(*file, {&w, 1}).ok());
  }
  REQUIRE(io->Close(*file).ok());
  REQUIRE(io->Unlink(path).ok());
}

TEST_CASE("Io namespace operations", "[unit]") {
  TestDir dir("io_ns");
  auto io = NewUringIo(4);
  const std::string root = dir.path();

  SECTION("MkdirAll creates parents, is idempotent, and refuses a file in the way") {
    std::string deep = root + "/a/b/c/d";
    REQUIRE(io->MkdirAll(deep).ok());
    REQUIRE(io->MkdirAll(deep).ok());
    REQUIRE(io->MkdirAll(root + "/a/b/c/d/").ok());
    struct stat st;
    REQUIRE(stat(deep.c_str(), &st) == 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK((st.st_mode & 0777) == 0700);
    auto f = io->Open(root + "/a/file", O_WRONLY | O_CREAT, 0600, false);
    REQUIRE(f.ok());
    REQUIRE(io->Close(*f).ok());
    absl::Status s = io->MkdirAll(root + "/a/file/x");
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(std::string(s.message()), Catch::Contains("/a/file"));
  }
  SECTION("ListDir is sorted; RemoveAll removes trees and accepts missing paths") {
    REQUIRE(io->MkdirAll(root + "/t/sub/deeper").ok());
    for (const char* name : {"zeta", "alpha", "mid", "sub/x", "sub/deeper/y"}) {
      auto f = io->Open(root + "/t/" + name, O_WRONLY | O_CREAT, 0600, false);
      REQUIRE(f.ok());
      REQUIRE(io->Close(*f).ok());
    }
    auto names = io->ListDir(root + "/t");
    REQUIRE(names.ok());
    CHECK(*names == std::vector<std::string>{"alpha", "mid", "sub", "zeta"});
    CHECK(absl::IsNotFound(io->ListDir(root + "/none").status()));
    REQUIRE(io->RemoveAll(root + "/t").ok());
    CHECK_FALSE(*io->Exists(root + "/t"));
    CHECK(io->RemoveAll(root + "/t").ok());
    CHECK(io->RemoveAll(root + "/never/was").ok());
  }
  SECTION("Rename, Unlink, Exists, FsyncDir") {
    auto f = io->Open(root + "/from", O_WRONLY | O_CREAT, 0600, false);
    REQUIRE(f.ok());
    REQUIRE(io->Close(*f).ok());
    REQUIRE(io->Rename(root + "/from", root + "/to").ok());
    CHECK_FALSE(*io->Exists(root + "/from"));
    CHECK(*io->Exists(root + "/to"));
    CHECK(io->FsyncDir(root).ok());
    CHECK(absl::IsNotFound(io->FsyncDir(root + "/nodir")));
    absl::Status s = io->Rename(root + "/from", root + "/x");
    CHECK(absl::IsNotFound(s));
    CHECK_THAT(std::string(s.message()), Catch::Contains(root + "/from"));
    REQUIRE(io->Unlink(root + "/to").ok());
    CHECK(absl::IsNotFound(io->Unlink(root + "/to")));
    CHECK_FALSE(*io->Exists(root + "/to/below"));
  }
}

TEST_CASE("uring Io from several threads at once (one ring per thread)", "[unit]") {
  TestDir dir("io_threads");
  auto io = NewUringIo(4);
  constexpr int kThreads = 4;
  constexpr uint64_t kBytes = 4 << 20;
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::string path = dir.path() + "/t" + std::to_string(t);
      AlignedBuf out = Aligned(kBytes);
      AlignedBuf in = Aligned(kBytes);
      Fill(out.get(), kBytes, 100 + t);
      auto file = io->Open(path, O_RDWR | O_CREAT, 0600, true);
      if (!file.ok()) return;
      std::vector<IoSlice> w, r;
      for (uint64_t off = 0; off < kBytes; off += 64 * 1024) {
        w.push_back({out.get() + off, 64 * 1024, off});
        r.push_back({in.get() + off, 64 * 1024, off});
      }
      bool good = io->WriteAll(*file, w).ok() && io->ReadAll(*file, r).ok() &&
                  std::memcmp(in.get(), out.get(), kBytes) == 0;
      good = io->Close(*file).ok() && good;
      ok[t] = good ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(ok[t] == 1);
}

// Reads `path` whole through the page cache (so every page of it is cached).
void ReadThroughCache(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<char> buf(1 << 16);
  while (read(fd, buf.data(), buf.size()) > 0) {
  }
  close(fd);
}

TEST_CASE("Io CachedBytes counts the bytes of a range the page cache holds", "[unit]") {
  const int kind = GENERATE(0, 1);
  auto io = kind == 0 ? NewPosixIo() : NewUringIo(8);
  testing::TestDir dir("io_cached");
  const std::string path = dir.path() + "/f";
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t size = 4 * page + 100;
  {
    std::vector<char> data(size, 'x');
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, data.data(), data.size()) == static_cast<ssize_t>(size));
    REQUIRE(fsync(fd) == 0);
    close(fd);
  }
  ReadThroughCache(path);
  auto file = io->Open(path, O_RDONLY, 0, true);
  REQUIRE(file.ok());
  CHECK(*io->CachedBytes(*file, 0, size) == size);
  CHECK(*io->CachedBytes(*file, 10, 2 * page) == 2 * page);         // unaligned start, exact count
  CHECK(*io->CachedBytes(*file, 3 * page, 1 << 20) == page + 100);  // clamped to the file's end
  CHECK(*io->CachedBytes(*file, size, 4096) == 0);                  // at or past the end
  CHECK(*io->CachedBytes(*file, 0, 0) == 0);
  // Clean pages dropped from the cache (FADV_DONTNEED, the whole file: the kernel drops only
  // whole folios, and a small file's pages may share one) are counted out.
  int fd = open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  close(fd);
  CHECK(*io->CachedBytes(*file, 0, size) == 0);
  CHECK(*io->CachedBytes(*file, 10, 2 * page) == 0);
  REQUIRE(io->Close(*file).ok());
}

TEST_CASE("Io with no slices is a no-op", "[unit]") {
  int kind = GENERATE(0, 1);
  TestDir dir("io_empty");
  auto io = MakeIo(kind);
  auto file = io->Open(dir.path() + "/e", O_RDWR | O_CREAT, 0600, false);
  REQUIRE(file.ok());
  CHECK(io->WriteAll(*file, {}).ok());
  CHECK(io->ReadAll(*file, {}).ok());
  IoSlice zero{nullptr, 0, 0};
  CHECK(io->WriteAll(*file, {&zero, 1}).ok());
  REQUIRE(io->Close(*file).ok());
}

}  // namespace
}  // namespace ckptd
