// Two README promises about memory and tiers, against a real daemon:
// - "staging_mlock ... to pin it": with the option the arena's pages are locked in the daemon
//   (VmLck in /proc/<pid>/status covers the bytes staged), without it nothing is.
// - "Loads racing a drop of the local copy fall back to the remote copy": a load whose tiers were
//   chosen while the local copy existed, and whose reads start after retention dropped it (held
//   between the two by debug_load_delay_ms), reads the store instead, bit-exact.
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "shards.h"

using namespace ckptd_it;  // NOLINT(google-build-using-namespace): the harness

namespace {

// VmLck of `pid` in KiB (-1 when the line is missing).
int64_t LockedKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Saves one 32 MiB tensor as (job, step) through `d` and waits until it is COMMITTED.
void SaveBig(const Daemon& d, const std::string& job, uint64_t step,
             const std::vector<float>& values) {
  auto client = d.Connect();
  ckptd::TensorShard t = Whole("w", values);
  REQUIRE(client->Save(job, step, 0, 1, std::span(&t, 1)).ok());
  REQUIRE(client->WaitCommitted(job, step, 30000).ok());
}

}  // namespace

TEST_CASE("staging_mlock: the arena's pages are locked in the daemon, and only with the option",
          "[integration][mlock]") {
  const std::vector<float> values = Pattern(8 << 20, 3);  // 32 MiB
  for (bool mlock : {false, true}) {
    INFO("staging_mlock=" << mlock);
    Daemon d(DaemonConfig{
        .staging_bytes_max = 64ull << 20,
        .extra_flags = {std::string("--staging_mlock=") + (mlock ? "true" : "false")}});
    SaveBig(d, "mlock", 1, values);
    const int64_t locked = LockedKiB(d.pid());
    INFO("VmLck " << locked << " kB\n" << d.Log());
    if (mlock) {
      CHECK(locked >= 32 << 10);           // at least the 32 MiB staged
      CHECK(locked <= (64 << 10) + 1024);  // the arena, not more
    } else {
      CHECK(locked == 0);
    }
  }
}

TEST_CASE("remote tier: a load racing a drop of the local copy reads the remote copy",
          "[integration][remote]") {
  TempDir remote;
  const std::vector<std::string> flags = {
      "--remote_dir=" + remote.path(), "--tier_policy=local+remote", "--keep_local=1",
      "--gc_interval_ms=3600000",      "--ram_tier_keep_per_job=0",  "--debug_load_delay_ms=1500"};
  Daemon d(DaemonConfig{.extra_flags = flags});
  const std::vector<float> v1 = Pattern(1 << 20, 1), v2 = Pattern(1 << 20, 2);
  SaveBig(d, "race", 1, v1);
  SaveBig(d, "race", 2, v2);
  auto client = d.Connect();
  for (uint64_t step : {1, 2}) {
    REQUIRE(client->Wait("race", step, ckptd::WaitFor::kRemote, 30000).ok());
  }
  const std::string local = d.data_dir() + "/race/" + StepDir(1);
  REQUIRE(PathExists(local));

  // The load chooses its tiers (local first) now and reads 1.5 s later; gc drops the local copy
  // of step 1 (keep_local 1) meanwhile.
  std::vector<float> got(v1.size());
  auto load = std::async(std::launch::async, [&] {
    ckptd::LoadTarget l{"w", ckptd::Region::Whole(), got.data(), got.size() * sizeof(float)};
    return d.Connect()->Load("race", 1, 0, std::span(&l, 1));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CommandResult gc = RunCtl(d, {"gc"});
  INFO(gc.output << "\nlog:\n" << d.Log());
  REQUIRE(gc.exit_code == 0);
  REQUIRE(!PathExists(local));  // dropped while the load waits
  REQUIRE(load.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  absl::StatusOr<ckptd::LoadResult> r = load.get();
  REQUIRE(r.ok());
  CHECK(got == v1);
  CHECK(r->bytes_read_remote > 0);
  CHECK(r->bytes_read_remote == r->bytes_read);
  auto st = client->GetStatus("race", 1);
  REQUIRE(st.ok());
  CHECK_FALSE(st->tiers.local);
  CHECK(st->tiers.remote);
}
