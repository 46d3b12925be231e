// FaultIo's power-loss model (fault_io.h): what a power loss keeps of files and directory entries
// written through it, and the crash fence.
#include <fcntl.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "io/fault_io.h"
#include "test_dir.h"

namespace ckptd {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void Write(FaultIo& io, const std::string& path, const std::string& data, bool sync) {
  auto f = io.Open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600, false);
  REQUIRE(f.ok());
  IoSlice s{const_cast<char*>(data.data()), data.size(), 0};
  REQUIRE(io.WriteAll(*f, {&s, 1}).ok());
  if (sync) REQUIRE(io.Fdatasync(*f).ok());
  REQUIRE(io.Close(*f).ok());
}

TEST_CASE("FaultIo power loss: unsynced data and unsynced entries are lost, synced ones kept",
          "[unit][fault]") {
  testing::TestDir dir("powerloss");
  const std::string root = dir.path() + "/root";
  std::filesystem::create_directories(root);
  std::ofstream(root + "/old") << "before";  // present when tracking starts: durable
  FaultIo io(NewPosixIo());
  REQUIRE(io.EnablePowerLoss(dir.path() + "/trash").ok());

  Write(io, root + "/old", "rewritten, never synced", false);
  Write(io, root + "/synced-new", "data", true);  // data synced, entry not
  Write(io, root + "/kept", "kept", true);
  REQUIRE(io.FsyncDir(root).ok());  // now both entries are durable
  Write(io, root + "/kept", "kept, then more", false);
  Write(io, root + "/lost", "never synced", false);
  REQUIRE(io.PowerLoss().ok());
  CHECK(Slurp(root + "/old") == "before");
  CHECK(Slurp(root + "/synced-new") == "data");
  CHECK(Slurp(root + "/kept") == "kept");
  CHECK_FALSE(std::filesystem::exists(root + "/lost"));
}

TEST_CASE("FaultIo power loss: a rename or removal needs its directory synced", "[unit][fault]") {
  testing::TestDir dir("powerloss_ns");
  const std::string root = dir.path() + "/root";
  FaultIo io(NewPosixIo());
  REQUIRE(io.EnablePowerLoss(dir.path() + "/trash").ok());
  REQUIRE(io.MkdirAll(root + "/sub").ok());  // durable: MkdirAll syncs the parents it changes
  Write(io, root + "/sub/a", "a", true);
  Write(io, root + "/manifest.tmp", "m", true);
  REQUIRE(io.FsyncDir(root + "/sub").ok());

  SECTION("renamed but the directory not synced: the rename and the create are undone") {
    REQUIRE(io.Rename(root + "/manifest.tmp", root + "/manifest").ok());
    REQUIRE(io.PowerLoss().ok());
    CHECK_FALSE(std::filesystem::exists(root + "/manifest"));
    CHECK_FALSE(std::filesystem::exists(root + "/manifest.tmp"));
  }
  SECTION("renamed and the directory synced: durable") {
    REQUIRE(io.Rename(root + "/manifest.tmp", root + "/manifest").ok());
    REQUIRE(io.FsyncDir(root).ok());
    REQUIRE(io.PowerLoss().ok());
    CHECK(Slurp(root + "/manifest") == "m");
    CHECK_FALSE(std::filesystem::exists(root + "/manifest.tmp"));
  }
  SECTION("removed without syncing the parent: back; with it: gone") {
    REQUIRE(io.RemoveAll(root + "/sub").ok());
    CHECK_FALSE(std::filesystem::exists(root + "/sub"));
    REQUIRE(io.Unlink(root + "/manifest.tmp").ok());
    REQUIRE(io.FsyncDir(root).ok());   // both removals are in root
    REQUIRE(io.RemoveAll(root).ok());  // root's parent is never synced
    REQUIRE(io.PowerLoss().ok());
    CHECK(std::filesystem::exists(root));
    CHECK_FALSE(std::filesystem::exists(root + "/sub"));
    CHECK_FALSE(std::filesystem::exists(root + "/manifest.tmp"));
  }
  SECTION("a removal not yet durable is put back with its synced content") {
    REQUIRE(io.RemoveAll(root + "/sub").ok());
    REQUIRE(io.PowerLoss().ok());
    CHECK(Slurp(root + "/sub/a") == "a");
  }
}

TEST_CASE("FaultIo Crash() fences every change, reads still work", "[unit][fault]") {
  testing::TestDir dir("powerloss_crash");
  const std::string root = dir.path();
  FaultIo io(NewPosixIo());
  REQUIRE(io.EnablePowerLoss(root + "/trash").ok());
  Write(io, root + "/f", "f", true);
  REQUIRE(io.FsyncDir(root).ok());
  io.Crash();
  CHECK(io.crashed());
  CHECK_FALSE(io.Open(root + "/g", O_WRONLY | O_CREAT, 0600, false).ok());
  CHECK_FALSE(io.Rename(root + "/f", root + "/h").ok());
  CHECK_FALSE(io.RemoveAll(root + "/f").ok());
  CHECK_FALSE(io.MkdirAll(root + "/d").ok());
  CHECK_FALSE(io.FsyncDir(root).ok());
  auto r = io.Open(root + "/f", O_RDONLY, 0, false);
  REQUIRE(r.ok());
  CHECK(io.Close(*r).ok());
  REQUIRE(io.PowerLoss().ok());
  CHECK_FALSE(io.crashed());
  CHECK(Slurp(root + "/f") == "f");
}

}  // namespace
}  // namespace ckptd
