// PosixStorage over both Io implementations, and its failure paths through FaultIo.
#include "storage/posix/posix_storage.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "ckptd/io.h"
#include "ckptd/storage.h"
#include "common/limits.h"
#include "io/fault_io.h"
#include "test_buffers.h"
#include "test_dir.h"

namespace ckptd {
namespace {

using testing::TestDir;

using testing::Aligned;
using testing::AlignedBuf;
using testing::Fill;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::unique_ptr<Io> MakeIo(int kind) { return kind == 0 ? NewPosixIo() : NewUringIo(32); }

TEST_CASE("PosixStorage blob round trip with aligned and unaligned slices", "[unit]") {
  int kind = GENERATE(0, 1);
  DYNAMIC_SECTION((kind == 0 ? "posix" : "uring")) {
    TestDir dir("storage_rt");
    auto io = MakeIo(kind);
    auto storage = NewPosixStorage(dir.path(), io.get());
    CHECK(storage->Describe() == "posix:" + dir.path());

    // Layout: 8 aligned 64 KiB extents (O_DIRECT), then an unaligned tail of 1000 bytes,
    // then a slice with an unaligned buffer address at an aligned offset.
    constexpr uint64_t kExtent = 64 * 1024;
    constexpr uint64_t kTotal = 8 * kExtent + 4096 + 1000;
    AlignedBuf src = Aligned(kTotal + 4096);
    Fill(src.get(), kTotal + 4096, 42);
    std::vector<IoSlice> slices;
    for (uint64_t i = 0; i < 8; ++i) {
      slices.push_back({src.get() + i * kExtent, kExtent, i * kExtent});
    }
    slices.push_back({src.get() + 8 * kExtent + 1, 4096, 8 * kExtent});  // misaligned address
    slices.push_back({src.get() + 8 * kExtent + 4096, 1000, 8 * kExtent + 4096});  // tail
    auto writer = storage->CreateBlob("job/0000000000000042/r00000.blob");
    REQUIRE(writer.ok());
    REQUIRE((*writer)->Write(slices).ok());
    REQUIRE((*writer)->Sync().ok());
    CHECK(absl::IsFailedPrecondition((*writer)->Write(slices)));
    CHECK(absl::IsFailedPrecondition((*writer)->Sync()));

    auto reader = storage->OpenBlob("job/0000000000000042/r00000.blob");
    REQUIRE(reader.ok());
    CHECK((*reader)->size_bytes() == kTotal);
    AlignedBuf dst = Aligned(kTotal + 4096);
    std::vector<IoSlice> reads = slices;
    for (auto& s : reads) s.buf = dst.get() + (static_cast<char*>(s.buf) - src.get());
    // Plus an unaligned read across an extent boundary.
    std::string cross(5000, '\0');
    reads.push_back({cross.data(), cross.size(), kExtent - 2500});
    REQUIRE((*reader)->Read(reads).ok());
    for (const IoSlice& s : slices) {
      CHECK(std::memcmp(dst.get() + (static_cast<char*>(s.buf) - src.get()), s.buf, s.len) == 0);
    }
    CHECK(std::memcmp(cross.data(), src.get() + kExtent - 2500, 2500) == 0);

    // Past the end: DATA_LOSS naming the blob.
    std::string past(100, '\0');
    IoSlice beyond{past.data(), past.size(), kTotal - 10};
    absl::Status s = (*reader)->Read({&beyond, 1});
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(Msg(s), Catch::Contains("r00000.blob"));

    // An aligned (O_DIRECT) read running past the unaligned end of the blob.
    IoSlice direct_past{dst.get(), 8192, 8 * kExtent};
    absl::Status sd = (*reader)->Read({&direct_past, 1});
    CHECK(absl::IsDataLoss(sd));
    CHECK_THAT(Msg(sd), Catch::Contains("r00000.blob"));

    auto list = storage->List("job/0000000000000042");
    REQUIRE(list.ok());
    CHECK(*list == std::vector<std::string>{"r00000.blob"});
    CHECK(*storage->Exists("job"));
    CHECK(*storage->Exists(""));
    CHECK_FALSE(*storage->Exists("job/nope"));
    CHECK(storage->List("absent/dir")->empty());
  }
}

TEST_CASE("PosixStorage writes a 200 MiB blob in chunks with many slices in flight", "[unit]") {
  TestDir dir("storage_large");
  auto io = NewUringIo(32);
  auto storage = NewPosixStorage(dir.path(), io.get());
  constexpr uint64_t kBytes = 200 * limits::kMiB;
  constexpr uint64_t kSlice = 1 * limits::kMiB;
  AlignedBuf src = Aligned(kBytes);
  Fill(src.get(), kBytes, 9);
  auto writer = storage->CreateBlob("big/blob");
  REQUIRE(writer.ok());
  // Four Write calls of 50 slices each, plus one slice larger than kIoChunkBytesMax.
  std::vector<IoSlice> slices;
  for (uint64_t off = 0; off < 100 * limits::kMiB; off += kSlice) {
    slices.push_back({src.get() + off, kSlice, off});
  }
  slices.push_back({src.get() + 100 * limits::kMiB, 100 * limits::kMiB, 100 * limits::kMiB});
  for (size_t i = 0; i < slices.size(); i += 50) {
    size_t n = std::min<size_t>(50, slices.size() - i);
    REQUIRE((*writer)->Write(std::span<const IoSlice>(slices).subspan(i, n)).ok());
  }
  REQUIRE((*writer)->Sync().ok());
  auto reader = storage->OpenBlob("big/blob");
  REQUIRE(reader.ok());
  REQUIRE((*reader)->size_bytes() == kBytes);
  AlignedBuf dst = Aligned(kBytes);
  std::vector<IoSlice> reads;
  for (uint64_t off = 0; off < kBytes; off += 8 * kSlice) {
    reads.push_back({dst.get() + off, 8 * kSlice, off});
  }
  REQUIRE((*reader)->Read(reads).ok());
  CHECK(std::memcmp(src.get(), dst.get(), kBytes) == 0);
}

TEST_CASE("PosixStorage blobs from several threads at once", "[unit]") {
  TestDir dir("storage_threads");
  auto io = NewUringIo(8);
  auto storage = NewPosixStorage(dir.path(), io.get());
  constexpr int kThreads = 4;
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      constexpr uint64_t kBytes = 2 * limits::kMiB + 123;
      std::string data(kBytes, '\0');
      Fill(data.data(), kBytes, 50 + t);
      std::string path = "j/" + std::to_string(t) + "/b";
      auto w = storage->CreateBlob(path);
      if (!w.ok()) return;
      std::vector<IoSlice> slices;
      for (uint64_t off = 0; off < kBytes; off += 8192) {
        slices.push_back({data.data() + off, std::min<uint64_t>(8192, kBytes - off), off});
      }
      if (!(*w)->Write(slices).ok() || !(*w)->Sync().ok()) return;
      auto back = storage->Get(path);
      ok[t] = back.ok() && *back == data ? 1 : 0;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(ok[t] == 1);
  CHECK(*storage->List("j") == std::vector<std::string>{"0", "1", "2", "3"});
}

TEST_CASE("PosixStorage PutAtomic replaces atomically and leaves no temporary file", "[unit]") {
  TestDir dir("storage_put");
  auto io = NewUringIo(4);
  auto storage = NewPosixStorage(dir.path(), io.get());
  REQUIRE(storage->PutAtomic("ckpt/MANIFEST", "first").ok());
  CHECK(*storage->Get("ckpt/MANIFEST") == "first");
  std::string big(3 * limits::kMiB + 7, 'z');
  REQUIRE(storage->PutAtomic("ckpt/MANIFEST", big).ok());
  CHECK(*storage->Get("ckpt/MANIFEST") == big);
  REQUIRE(storage->PutAtomic("ckpt/empty", "").ok());
  CHECK(*storage->Get("ckpt/empty") == "");
  CHECK(*storage->List("ckpt") == std::vector<std::string>{"MANIFEST", "empty"});
  auto g = storage->Get("ckpt/none");
  CHECK(absl::IsNotFound(g.status()));
  CHECK_THAT(Msg(g.status()), Catch::Contains("ckpt/none"));
}

TEST_CASE("PosixStorage rejects paths that could leave the root", "[unit]") {
  TestDir dir("storage_paths");
  auto io = NewPosixIo();
  auto storage = NewPosixStorage(dir.path(), io.get());
  for (const char* bad : {"/etc/passwd", "..", "../x", "a/../../x", "a/..", ""}) {
    INFO(bad);
    CHECK(absl::IsInvalidArgument(storage->CreateBlob(bad).status()));
    CHECK(absl::IsInvalidArgument(storage->OpenBlob(bad).status()));
    CHECK(absl::IsInvalidArgument(storage->PutAtomic(bad, "x")));
    CHECK(absl::IsInvalidArgument(storage->Get(bad).status()));
    CHECK(absl::IsInvalidArgument(storage->RemoveAll(bad)));
  }
  CHECK(absl::IsInvalidArgument(storage->List("../up").status()));
  CHECK(absl::IsInvalidArgument(storage->Exists("/abs").status()));
  CHECK(absl::IsInvalidArgument(storage->Get(std::string("a\0b", 3)).status()));
  // Names merely containing dots are fine.
  CHECK(storage->PutAtomic("a..b/..c", "ok").ok());
  CHECK(*storage->Get("a..b/..c") == "ok");
}

TEST_CASE("PosixStorage RemoveAll removes a tree - absent is OK", "[unit]") {
  TestDir dir("storage_rm");
  auto io = NewPosixIo();
  auto storage = NewPosixStorage(dir.path(), io.get());
  REQUIRE(storage->PutAtomic("job/1/a", "a").ok());
  REQUIRE(storage->PutAtomic("job/1/sub/b", "b").ok());
  REQUIRE(storage->PutAtomic("job/2/a", "a").ok());
  REQUIRE(storage->RemoveAll("job/1").ok());
  CHECK_FALSE(*storage->Exists("job/1"));
  CHECK(*storage->Exists("job/2/a"));
  CHECK(storage->RemoveAll("job/1").ok());
  CHECK(storage->RemoveAll("never").ok());
}

TEST_CASE("PosixStorage write and sync failures propagate with the path", "[unit][fault]") {
  TestDir dir("storage_fault");
  auto base = NewUringIo(8);
  FaultIo io(base.get());
  auto storage = NewPosixStorage(dir.path(), &io);
  std::string data(10000, 'd');
  IoSlice slice{data.data(), data.size(), 0};

  SECTION("EIO on write is DATA_LOSS naming the blob") {
    auto w = storage->CreateBlob("j/1/r0.blob");
    REQUIRE(w.ok());
    io.FailNextWrite(EIO);
    absl::Status s = (*w)->Write({&slice, 1});
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(Msg(s), Catch::Contains("j/1/r0.blob"));
    CHECK_THAT(Msg(s), Catch::Contains("offset 0"));
    CHECK((*w)->Write({&slice, 1}).ok());  // one-shot fault
    CHECK((*w)->Sync().ok());
  }
  SECTION("ENOSPC after n writes is RESOURCE_EXHAUSTED") {
    auto w = storage->CreateBlob("j/1/r1.blob");
    REQUIRE(w.ok());
    io.FailWritesAfter(2, ENOSPC);
    CHECK((*w)->Write({&slice, 1}).ok());
    CHECK((*w)->Write({&slice, 1}).ok());
    absl::Status s = (*w)->Write({&slice, 1});
    CHECK(absl::IsResourceExhausted(s));
    CHECK_THAT(Msg(s), Catch::Contains("r1.blob"));
    CHECK(absl::IsResourceExhausted((*w)->Write({&slice, 1})));
    io.ClearAll();
    CHECK((*w)->Write({&slice, 1}).ok());
  }
  SECTION("EIO on fdatasync fails Sync naming the blob") {
    auto w = storage->CreateBlob("j/1/r2.blob");
    REQUIRE(w.ok());
    REQUIRE((*w)->Write({&slice, 1}).ok());
    uint64_t syncs = io.sync_calls();
    io.FailNextSync(EIO);
    absl::Status s = (*w)->Sync();
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(Msg(s), Catch::Contains("fdatasync"));
    CHECK_THAT(Msg(s), Catch::Contains("r2.blob"));
    CHECK(io.sync_calls() == syncs + 1);
  }
  SECTION("Sync of a new blob syncs its directory too, and says so when that fails") {
    auto w = storage->CreateBlob("j/1/r3.blob");
    REQUIRE(w.ok());
    REQUIRE((*w)->Write({&slice, 1}).ok());
    const uint64_t dir_syncs = io.calls(FaultIo::Op::kFsyncDir);
    io.FailNextFsyncDir(EIO);
    absl::Status s = (*w)->Sync();
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(Msg(s), Catch::Contains("fsync directory"));
    CHECK(io.calls(FaultIo::Op::kFsyncDir) == dir_syncs + 1);
  }
  SECTION("PutAtomic removes the temporary files a crashed PutAtomic of the same path left") {
    REQUIRE(storage->PutAtomic("j/9/manifest", "old").ok());
    const std::string step_dir = dir.path() + "/j/9";
    std::ofstream(step_dir + "/manifest.tmp.0123456789abcdef") << "torn";
    std::ofstream(step_dir + "/other.tmp.0123456789abcdef") << "not ours";
    REQUIRE(storage->PutAtomic("j/9/manifest", "new").ok());
    CHECK(*storage->Get("j/9/manifest") == "new");
    CHECK(*storage->List("j/9") ==
          std::vector<std::string>{"manifest", "other.tmp.0123456789abcdef"});
  }
  SECTION("a failed PutAtomic keeps the old content and leaves no temporary file") {
    REQUIRE(storage->PutAtomic("j/MANIFEST", "old").ok());
    io.FailNextRename(EIO);
    absl::Status s = storage->PutAtomic("j/MANIFEST", "new");
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(Msg(s), Catch::Contains("j/MANIFEST"));
    io.FailNextSync(EIO);
    CHECK(absl::IsDataLoss(storage->PutAtomic("j/MANIFEST", "new")));
    io.FailNextWrite(ENOSPC);
    CHECK(absl::IsResourceExhausted(storage->PutAtomic("j/MANIFEST", "new")));
    CHECK(*storage->Get("j/MANIFEST") == "old");
    CHECK(*storage->List("j") == std::vector<std::string>{"MANIFEST"});
    io.FailNextFsyncDir(EIO);
    CHECK(absl::IsDataLoss(storage->PutAtomic("j/MANIFEST", "new")));
  }
  SECTION("PutIfAbsent: once only; a failed one leaves no temporary file") {
    REQUIRE(storage->PutIfAbsent("j/commit", "first").ok());
    CHECK(absl::IsAlreadyExists(storage->PutIfAbsent("j/commit", "second")));
    io.FailNextRename(EIO);  // RenameNoReplace counts as a rename
    CHECK(absl::IsDataLoss(storage->PutIfAbsent("j/other", "x")));
    io.FailNextSync(EIO);
    CHECK(absl::IsDataLoss(storage->PutIfAbsent("j/other", "x")));
    CHECK(*storage->Get("j/commit") == "first");
    CHECK(*storage->List("j") == std::vector<std::string>{"commit"});
    REQUIRE(storage->PutIfAbsent("j/other", "x").ok());
    CHECK(*storage->Get("j/other") == "x");
  }
  SECTION("RemoveAll syncs the parent directory, and says so when that fails") {
    REQUIRE(storage->PutAtomic("j/7/manifest", "m").ok());
    io.FailNextFsyncDir(EIO);
    absl::Status s = storage->RemoveAll("j/7/manifest");
    CHECK(absl::IsDataLoss(s));
    CHECK_FALSE(*storage->Exists("j/7/manifest"));
    CHECK(storage->RemoveAll("j/7/manifest").ok());
    CHECK(storage->RemoveAll("nowhere/at/all").ok());
  }
  SECTION("EIO on read fails Read naming the blob") {
    REQUIRE(storage->PutAtomic("j/obj", data).ok());
    auto r = storage->OpenBlob("j/obj");
    REQUIRE(r.ok());
    std::string back(data.size(), '\0');
    IoSlice rs{back.data(), back.size(), 0};
    io.FailNextRead(EIO);
    absl::Status s = (*r)->Read({&rs, 1});
    CHECK(absl::IsDataLoss(s));
    CHECK_THAT(Msg(s), Catch::Contains("j/obj"));
    REQUIRE((*r)->Read({&rs, 1}).ok());
    CHECK(back == data);
  }
  SECTION("open failures name the path") {
    io.FailNextOpen(EACCES);
    auto w = storage->CreateBlob("j/denied.blob");
    CHECK(absl::IsPermissionDenied(w.status()));
    CHECK_THAT(Msg(w.status()), Catch::Contains("j/denied.blob"));
  }
}

// Records, per ReadAll, whether it went to the O_DIRECT descriptor and how many bytes it read.
class ReadProbeIo : public FaultIo {
 public:
  explicit ReadProbeIo(std::unique_ptr<Io> base) : FaultIo(std::move(base)) {}
  absl::Status ReadAll(const FileHandle& file, std::span<const IoSlice> slices) override {
    uint64_t bytes = 0;
    for (const IoSlice& s : slices) bytes += s.len;
    (file.direct ? direct_bytes : cached_bytes) += bytes;
    return FaultIo::ReadAll(file, slices);
  }
  std::atomic<uint64_t> direct_bytes{0};
  std::atomic<uint64_t> cached_bytes{0};
};

TEST_CASE("PosixStorage read_cached_through_cache reads cached slices through the cache",
          "[unit]") {
  TestDir dir("storage_cached");
  ReadProbeIo io(NewUringIo(8));
  const bool cached_mode = GENERATE(true, false);
  auto storage = NewPosixStorage(dir.path(), &io,
                                 PosixStorageOptions{.read_cached_through_cache = cached_mode});
  constexpr uint64_t kSlice = 64 * 1024;
  constexpr uint64_t kTotal = 4 * kSlice;
  AlignedBuf src = Aligned(kTotal);
  Fill(src.get(), kTotal, 7);
  std::vector<IoSlice> slices;
  for (uint64_t i = 0; i < 4; ++i) slices.push_back({src.get() + i * kSlice, kSlice, i * kSlice});
  auto writer = storage->CreateBlob("j/b.blob");
  REQUIRE(writer.ok());
  REQUIRE((*writer)->Write(slices).ok());
  REQUIRE((*writer)->Sync().ok());
  const std::string path = dir.path() + "/j/b.blob";
  {
    auto probe = io.Open(path, O_RDONLY, 0, true);
    REQUIRE(probe.ok());
    const bool direct = probe->direct;
    REQUIRE(io.Close(*probe).ok());
    if (!direct) {
      WARN("O_DIRECT is refused under " << dir.path() << ": nothing to choose between");
      return;
    }
  }
  AlignedBuf dst = Aligned(kTotal);
  auto read_all = [&] {
    std::memset(dst.get(), 0, kTotal);
    std::vector<IoSlice> in;
    for (uint64_t i = 0; i < 4; ++i) in.push_back({dst.get() + i * kSlice, kSlice, i * kSlice});
    auto reader = storage->OpenBlob("j/b.blob");
    REQUIRE(reader.ok());
    io.direct_bytes = 0;
    io.cached_bytes = 0;
    REQUIRE((*reader)->Read(in).ok());
    REQUIRE(std::memcmp(dst.get(), src.get(), kTotal) == 0);
  };
  // Written with O_DIRECT: none of it is cached, so every slice is read from the device.
  read_all();
  CHECK(io.direct_bytes == kTotal);
  CHECK(io.cached_bytes == 0);
  // Cached whole (read through the cache by someone else), then one slice dropped again.
  {
    int fd = open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    std::vector<char> buf(kTotal);
    REQUIRE(pread(fd, buf.data(), kTotal, 0) == static_cast<ssize_t>(kTotal));
    REQUIRE(posix_fadvise(fd, 2 * kSlice, kSlice, POSIX_FADV_DONTNEED) == 0);
    close(fd);
  }
  // What the cache holds now, slice by slice (the kernel drops whole folios only: where one
  // spans slices, the dropped slice may still be cached).
  uint64_t held = 0;
  {
    auto f = io.Open(path, O_RDONLY, 0, true);
    REQUIRE(f.ok());
    for (uint64_t i = 0; i < 4; ++i) {
      if (*io.CachedBytes(*f, i * kSlice, kSlice) == kSlice) held += kSlice;
    }
    REQUIRE(io.Close(*f).ok());
  }
  INFO("slices cached whole: " << held / kSlice);
  CHECK(held >= 3 * kSlice);
  read_all();
  if (cached_mode) {
    CHECK(io.cached_bytes == held);           // the slices the cache holds whole
    CHECK(io.direct_bytes == kTotal - held);  // the one it does not
  } else {
    CHECK(io.direct_bytes == kTotal);  // O_DIRECT whatever the cache holds
    CHECK(io.cached_bytes == 0);
  }
}

// A shared file system without RENAME_NOREPLACE (docs/OPERATIONS.md "Checkpoints that span nodes"):
// the link(2) fallback, forced on any file system by NewLinkNoReplaceIo, keeps PutIfAbsent's
// contract: of writers racing on one path exactly one wins, its content whole, and the losers'
// temporary files are gone.
TEST_CASE("posix storage: PutIfAbsent through the link() fallback is once only under a race",
          "[io]") {
  TestDir dir("storage_link");
  std::unique_ptr<Io> base = NewPosixIo();
  std::unique_ptr<Io> io = NewLinkNoReplaceIo(base.get());
  std::unique_ptr<Storage> storage = NewPosixStorage(dir.path(), io.get());
  constexpr int kWriters = 8;
  for (int round = 0; round < 20; ++round) {
    const std::string path = "j/step-" + std::to_string(round) + "/cluster/decision";
    std::atomic<int> go{0};
    std::vector<absl::Status> results(kWriters);
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        go.fetch_add(1);
        while (go.load() < kWriters) {
        }
        results[w] = storage->PutIfAbsent(path, std::string(5000, static_cast<char>('a' + w)));
      });
    }
    for (std::thread& t : writers) t.join();
    int won = -1;
    for (int w = 0; w < kWriters; ++w) {
      if (results[w].ok()) {
        CHECK(won == -1);
        won = w;
      } else {
        CHECK(absl::IsAlreadyExists(results[w]));
      }
    }
    REQUIRE(won >= 0);
    CHECK(*storage->Get(path) == std::string(5000, static_cast<char>('a' + won)));
    CHECK(*storage->List("j/step-" + std::to_string(round) + "/cluster") ==
          std::vector<std::string>{"decision"});
  }
  // LinkNoReplace itself: an existing name is never replaced, and the source is left in place.
  const std::string a = dir.path() + "/a", b = dir.path() + "/b";
  std::ofstream(a) << "A";
  std::ofstream(b) << "B";
  absl::Status s = LinkNoReplace(a, b);
  CHECK(absl::IsAlreadyExists(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains(b));
  CHECK(std::filesystem::exists(a));
  std::ifstream in(b);
  std::string got;
  in >> got;
  CHECK(got == "B");
}

}  // namespace
}  // namespace ckptd
