// A full index volume is an error, never a crash (issue 10): the daemon's state dir (RocksDB
// index) on a tiny tmpfs, filled up. Needs root (mount); skipped with a warning otherwise.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "harness.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

// A tmpfs of `bytes` mounted at `dir` for the test's duration.
struct TinyTmpfs {
  TinyTmpfs(const std::string& dir, uint64_t bytes) : dir(dir) {
    std::filesystem::create_directories(dir);
    std::string opts = "size=" + std::to_string(bytes) + ",mode=0700";
    mounted = mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~TinyTmpfs() {
    if (mounted) umount2(dir.c_str(), MNT_DETACH);
  }
  // Writes a file until the volume is full but for `slack_bytes`.
  void Fill(uint64_t slack_bytes = 0) {
    std::vector<char> slack(slack_bytes, 's');
    int sfd = open((dir + "/slack").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(sfd >= 0);
    REQUIRE(write(sfd, slack.data(), slack.size()) == static_cast<ssize_t>(slack.size()));
    close(sfd);
    int fd = open((dir + "/filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    std::vector<char> chunk(64 << 10, 'x');
    while (write(fd, chunk.data(), chunk.size()) > 0) {
    }
    std::vector<char> small(512, 'x');
    while (write(fd, small.data(), small.size()) > 0) {
    }
    close(fd);
    std::filesystem::remove(dir + "/slack");
  }
  void Drain() { std::filesystem::remove(dir + "/filler"); }
  std::string dir;
  bool mounted = false;
};

}  // namespace

TEST_CASE("fault: a full index volume refuses saves cleanly and recovers when space returns",
          "[integration][fault]") {
  TempDir base;
  TinyTmpfs state(base.path() + "/state", 24 << 20);
  if (!state.mounted) {
    WARN("not run: needs root to mount a tmpfs");
    return;
  }
  DaemonConfig cfg;
  cfg.state_dir = state.dir;
  cfg.data_dir = base.path() + "/data";
  cfg.extra_flags = {"--index_reserve_bytes=1048576"};
  Daemon d(cfg);
  SaveCommitted(d, "full", 1, 3);

  SECTION("below the reserve: Save is RESOURCE_EXHAUSTED naming the reserve") {
    state.Fill();
    CommandResult r =
        RunTestClient(d, "save", {"--job", "full", "--step", "2", "--rank", "0", "--world", "1"});
    INFO(r.output);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Contains("RESOURCE_EXHAUSTED") && Contains("index_reserve_bytes"));
    // Reads still work; space back: saves work again.
    CHECK(VerifyInProcess(d, "full", 1, 3).empty());
    state.Drain();
    SaveCommitted(d, "full", 2, 4);
    CHECK(VerifyInProcess(d, "full", 2, 4).empty());
  }

  SECTION("no reserve: RocksDB's own write fails, the daemon stays up and resumes") {
    // Filled while the daemon is down, so RocksDB's new WAL cannot preallocate its space; a
    // little is left for the restart itself.
    REQUIRE(d.Stop());
    state.Fill(1 << 20);
    d.Restart({"--index_reserve_bytes=0"});
    // Save until the index says it is full.
    std::string failure;
    for (int i = 0; i < 400 && failure.empty(); ++i) {
      CommandResult r = RunTestClient(
          d, "save",
          {"--job", "full", "--step", std::to_string(10 + i), "--rank", "0", "--world", "1"});
      if (r.exit_code != 0) failure = r.output;
    }
    INFO(failure);
    CHECK_THAT(failure, Contains("RESOURCE_EXHAUSTED") || Contains("UNAVAILABLE"));
    CHECK(RunCtl(d, {"ls", "full"}).exit_code == 0);  // still serving
    state.Drain();
    // RocksDB resumes by itself once space is free (its error recovery polls every few
    // seconds); until then saves answer UNAVAILABLE. Retry as a client would.
    uint64_t step = 1000;
    CommandResult r;
    for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
         std::chrono::steady_clock::now() < until; ++step) {
      r = RunTestClient(d, "save",
                        {"--job", "full", "--step", std::to_string(step), "--rank", "0", "--world",
                         "1", "--seed", "5", "--wait-committed"});
      if (r.exit_code == 0) break;
      CHECK_THAT(r.output, Contains("UNAVAILABLE") || Contains("RESOURCE_EXHAUSTED"));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    INFO(r.output);
    const std::string log = d.Log();
    INFO("daemon log (end): " << log.substr(log.size() > 6000 ? log.size() - 6000 : 0));
    REQUIRE(r.exit_code == 0);
    SaveCommitted(d, "full", step + 1, 5);
    CHECK(VerifyInProcess(d, "full", step + 1, 5).empty());
    CHECK(VerifyInProcess(d, "full", 1, 3).empty());
    CHECK(d.Stop());  // SIGTERM: a clean exit, no abort
  }
}
