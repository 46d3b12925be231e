// Retention policies against a real daemon (docs/OPERATIONS.md "Retention"): keep_local with
// keep_every milestones for most jobs, and a retention_rules rule for others; `ckptctl gc` and
// housekeeping keep exactly what the policy says, across a restart; a bad rule stops the start
// naming it.
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using namespace ckptd_it;  // NOLINT(google-build-using-namespace): the harness

namespace {

// The COMMITTED steps of `job`.
std::set<uint64_t> Steps(const Daemon& d, const std::string& job) {
  auto client = d.Connect();
  std::set<uint64_t> steps;
  auto list = client->ListCheckpoints(job);
  REQUIRE(list.ok());
  for (const auto& c : *list) {
    if (c.state == ckptd::CheckpointState::kCommitted) steps.insert(c.step);
  }
  return steps;
}

std::string StepPath(const std::string& root, uint64_t step, const std::string& job) {
  return root + "/" + job + "/" + StepDir(step);
}

// Polls `done` every 100 ms for up to timeout_ms.
bool Eventually(const std::function<bool()>& done, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

void SaveSteps(const Daemon& d, const std::string& job, uint64_t first, uint64_t last) {
  for (uint64_t step = first; step <= last; ++step) SaveCommitted(d, job, step, step);
}

}  // namespace

TEST_CASE("retention: keep_local with keep_every milestones and a per-job rule, across a restart",
          "[integration][retention]") {
  const std::vector<std::string> flags = {
      "--keep_local=2", "--keep_every=4",
      "--retention_rules=eval-*: keep_local=1, keep_every=0; never-*: keep_local=0",
      "--gc_interval_ms=3600000"};  // only ckptctl gc until the restart below
  Daemon d(DaemonConfig{.extra_flags = flags});
  SaveSteps(d, "train", 1, 9);
  SaveSteps(d, "eval-a", 1, 5);
  SaveSteps(d, "never-b", 1, 3);

  CommandResult gc = RunCtl(d, {"gc"});
  INFO(gc.output << "\nlog:\n" << d.Log());
  REQUIRE(gc.exit_code == 0);
  // train: the 2 newest (9, 8) and the milestones (8, 4); eval-a: the newest only; never-b: all
  // (its rule keeps every local copy).
  CHECK(Steps(d, "train") == std::set<uint64_t>{4, 8, 9});
  CHECK(Steps(d, "eval-a") == std::set<uint64_t>{5});
  CHECK(Steps(d, "never-b") == std::set<uint64_t>{1, 2, 3});
  CHECK(gc.output.find("local copy 3 of keep_local 2") != std::string::npos);  // train/7
  CHECK(!PathExists(StepPath(d.data_dir(), 7, "train")));
  CHECK(PathExists(StepPath(d.data_dir(), 4, "train")));
  CHECK(VerifyInProcess(d, "train", 4, 4) == "");  // a milestone still loads, bit-exact

  // After a restart (housekeeping now every second) the same policy holds for new steps: train
  // keeps 10, 9 and the milestones 8, 4; eval-a keeps 6.
  std::vector<std::string> again = flags;
  again.back() = "--gc_interval_ms=1000";
  d.Restart(again);
  CHECK(Steps(d, "train") == std::set<uint64_t>{4, 8, 9});
  SaveSteps(d, "train", 10, 10);
  SaveSteps(d, "eval-a", 6, 6);
  const bool settled = Eventually(
      [&] {
        return Steps(d, "train") == std::set<uint64_t>{4, 8, 9, 10} &&
               Steps(d, "eval-a") == std::set<uint64_t>{6};
      },
      20000);
  INFO(d.Log());
  CHECK(settled);
  CHECK(Steps(d, "never-b") == std::set<uint64_t>{1, 2, 3});
  CHECK(RunCtl(d, {"gc"}).output.find("nothing to collect") != std::string::npos);
}

TEST_CASE("retention: a bad retention rule stops the start naming the rule",
          "[integration][retention]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--retention_rules=eval-*: keep_latest=1", "unknown key \"keep_latest\""},
      {"--retention_rules=eval-*: keep_local=two", "is not key=N"},
      {"--retention_rules=keep_local=1", "expected \"PATTERN: key=N"},
      {"--retention_rules=x: keep_local=1; : keep_local=2", "rule 2"},
      {"--retention_rules=x: keep_remote=1", "needs a remote tier"},
  };
  for (const auto& [flag, message] : bad) {
    INFO(flag);
    TempDir dir;
    CommandResult r = RunCommand({CKPTD_BIN, "--state_dir=" + dir.path() + "/s", flag});
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("retention_rules") != std::string::npos);
    CHECK(r.output.find(message) != std::string::npos);
  }
}
