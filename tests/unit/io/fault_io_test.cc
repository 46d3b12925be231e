// FaultIo: arming, counting and forwarding.
#include "io/fault_io.h"

#include <fcntl.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "test_dir.h"

namespace ckptd {
namespace {

TEST_CASE("FaultIo injects errors on chosen calls and counts every call", "[unit][fault]") {
  testing::TestDir dir("faultio");
  FaultIo io(NewPosixIo());
  std::string path = dir.path() + "/f";
  auto file = io.Open(path, O_RDWR | O_CREAT, 0600, false);
  REQUIRE(file.ok());
  std::string data = "abc";
  IoSlice s{data.data(), data.size(), 4096};

  io.FailWritesAfter(1, ENOSPC);
  CHECK(io.WriteAll(*file, {&s, 1}).ok());
  absl::Status failed = io.WriteAll(*file, {&s, 1});
  CHECK(absl::IsResourceExhausted(failed));
  CHECK_THAT(std::string(failed.message()), Catch::Contains(path));
  CHECK_THAT(std::string(failed.message()), Catch::Contains("offset 4096"));
  CHECK_THAT(std::string(failed.message()), Catch::Contains("injected"));
  CHECK(absl::IsResourceExhausted(io.WriteAll(*file, {&s, 1})));
  io.Clear(FaultIo::Op::kWrite);
  CHECK(io.WriteAll(*file, {&s, 1}).ok());
  CHECK(io.write_calls() == 4);

  io.FailNextSync(EIO);
  CHECK(absl::IsDataLoss(io.Fdatasync(*file)));
  CHECK(io.Fsync(*file).ok());
  CHECK(io.sync_calls() == 2);

  io.FailNextRead(EIO);
  std::string back(3, '\0');
  IoSlice r{back.data(), 3, 4096};
  CHECK(absl::IsDataLoss(io.ReadAll(*file, {&r, 1})));
  CHECK(io.ReadAll(*file, {&r, 1}).ok());
  CHECK(back == "abc");
  CHECK(io.read_calls() == 2);

  io.FailNextRename(EIO);
  CHECK(absl::IsDataLoss(io.Rename(path, path + "2")));
  CHECK(io.Rename(path, path + "2").ok());
  CHECK(io.rename_calls() == 2);
  CHECK(*io.Exists(path + "2"));

  io.FailOnceAfter(FaultIo::Op::kRead, 1, EIO);
  CHECK(io.ReadAll(*file, {&r, 1}).ok());
  CHECK(absl::IsDataLoss(io.ReadAll(*file, {&r, 1})));
  CHECK(io.ReadAll(*file, {&r, 1}).ok());

  io.FailNext(FaultIo::Op::kMkdir, EACCES);
  CHECK(absl::IsPermissionDenied(io.MkdirAll(dir.path() + "/d")));
  CHECK(io.MkdirAll(dir.path() + "/d").ok());
  REQUIRE(io.Close(*file).ok());
}

TEST_CASE("FaultIo is safe to arm while other threads call it", "[unit][fault]") {
  testing::TestDir dir("faultio_mt");
  FaultIo io(NewPosixIo());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        (void)io.Exists(dir.path());
        (void)io.FsyncDir(dir.path());
      }
    });
  }
  for (int i = 0; i < 200; ++i) io.FailNextFsyncDir(EIO);
  for (auto& th : threads) th.join();
  CHECK(io.calls(FaultIo::Op::kFsyncDir) == 800);
}

}  // namespace
}  // namespace ckptd
