// Offline reshard through ckptctl and the real daemon: a committed checkpoint is rewritten in
// another layout as a new checkpoint that loads bit-exact, the source stays byte-for-byte the
// same, progress shows in `ckptctl status`, a cancel or a crash leaves no target behind, and bad
// specs or targets are clear errors.
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kSeed = 31;

// `ckptctl --json inspect` of job/step (items carry "shard_count": N).
std::string InspectJson(const Daemon& d, const std::string& job, uint64_t step) {
  CommandResult r = RunCtl(d, {"--json", "inspect", job, std::to_string(step)});
  if (r.exit_code != 0) throw std::runtime_error("inspect: " + r.output);
  return r.output;
}

absl::Status WaitDone(const Daemon& d, const std::string& job, uint64_t step) {
  return d.Connect()->WaitCommitted(job, step, 60000);
}

}  // namespace

TEST_CASE("offline reshard: rows:2 and consolidated copies load bit-exact, source untouched",
          "[integration]") {
  Daemon d;
  SaveCommitted(d, "src", 1, kSeed);
  const std::string manifest = d.data_dir() + "/src/" + StepDir(1) + "/manifest.ckm";
  const std::string before = ReadFile(manifest);

  CommandResult r = RunCtl(d, {"reshard", "src", "1", "2", "rows:2"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(r.output, Contains("reshard of checkpoint src/1 (rows:2)"));
  REQUIRE(WaitDone(d, "src", 2).ok());
  CHECK(VerifyInProcess(d, "src", 2, kSeed) == "");
  // Every tensor with at least 2 rows is now in 2 shards.
  CHECK_THAT(InspectJson(d, "src", 2), Contains("\"shard_count\": 2"));

  r = RunCtl(d, {"reshard", "src", "1", "7", "consolidated", "--target_job", "export-me"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(WaitDone(d, "export-me", 7).ok());
  CHECK(VerifyInProcess(d, "export-me", 7, kSeed) == "");
  CHECK_THAT(InspectJson(d, "export-me", 7), !Contains("\"shard_count\": 2"));
  CommandResult st = RunCtl(d, {"status", "export-me", "7"});
  CHECK_THAT(st.output, Contains("COMMITTED") && Contains("origin: reshard of checkpoint src/1"));

  // A mixed spec with per-item rules: flat ranges for biases, a grid for the rest.
  r = RunCtl(d, {"reshard", "src", "2", "3", "*bias*=flat:3; *=grid:2x2"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(WaitDone(d, "src", 3).ok());
  CHECK(VerifyInProcess(d, "src", 3, kSeed) == "");

  CHECK(ReadFile(manifest) == before);
  CHECK(VerifyInProcess(d, "src", 1, kSeed) == "");
}

TEST_CASE("offline reshard: bad specs, missing sources and existing targets are clear errors",
          "[integration]") {
  Daemon d;
  SaveCommitted(d, "src", 1, kSeed);
  CommandResult r = RunCtl(d, {"reshard", "src", "1", "2", "rows:0"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("INVALID_ARGUMENT") && Contains("rule 1 \"rows:0\""));
  r = RunCtl(d, {"reshard", "src", "1", "2", "*=slices:2"});
  CHECK_THAT(r.output, Contains("unknown layout \"slices\""));
  r = RunCtl(d, {"reshard", "src", "9", "2", "rows:2"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("NOT_FOUND") && Contains("src/9"));
  r = RunCtl(d, {"reshard", "src", "1", "1", "rows:2"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("ALREADY_EXISTS") && Contains("src/1 already exists"));
  r = RunCtl(d, {"reshard", "src", "1", "2"});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("reshard takes JOB STEP TARGET_STEP SPEC"));
  CHECK(VerifyInProcess(d, "src", 1, kSeed) == "");
}

TEST_CASE("offline reshard: progress in status, cancel with abort, crash leaves no target",
          "[integration]") {
  Daemon d({.extra_flags = {"--debug_reshard_delay_ms=300"}});
  SaveCommitted(d, "src", 1, kSeed);

  SECTION("cancel") {
    REQUIRE(RunCtl(d, {"reshard", "src", "1", "2", "rows:3"}).exit_code == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    CommandResult st = RunCtl(d, {"status", "src", "2"});
    INFO(st.output);
    CHECK_THAT(st.output, Contains("PERSISTING") && Contains("progress:") &&
                              Contains("origin: reshard of checkpoint src/1 (rows:3)"));
    CommandResult ab = RunCtl(d, {"abort", "src", "2", "operator changed their mind"});
    INFO(ab.output);
    CHECK(ab.exit_code == 0);
    absl::Status done = WaitDone(d, "src", 2);
    CHECK(done.code() == absl::StatusCode::kAborted);
    CHECK_THAT(std::string(done.message()), Contains("cancelled: operator changed their mind"));
    CHECK_FALSE(PathExists(d.data_dir() + "/src/" + StepDir(2)));
  }
  SECTION("kill -9 during the reshard") {
    REQUIRE(RunCtl(d, {"reshard", "src", "1", "2", "rows:3"}).exit_code == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    d.Kill9();
    d.Restart({});
    absl::Status done = WaitDone(d, "src", 2);
    CHECK(done.code() == absl::StatusCode::kAborted);
    CHECK_THAT(std::string(done.message()), Contains("interrupted by a daemon restart"));
    CHECK_FALSE(PathExists(d.data_dir() + "/src/" + StepDir(2)));
    // It can simply run again.
    REQUIRE(RunCtl(d, {"rm", "src", "2"}).exit_code == 0);
    REQUIRE(RunCtl(d, {"reshard", "src", "1", "2", "rows:3"}).exit_code == 0);
    REQUIRE(WaitDone(d, "src", 2).ok());
    CHECK(VerifyInProcess(d, "src", 2, kSeed) == "");
  }
  CHECK(VerifyInProcess(d, "src", 1, kSeed) == "");
}

TEST_CASE("objects: a load with another world size gets every rank's copy keyed by saving rank",
          "[integration]") {
  Daemon d;
  SaveCommitted(d, "obj", 1, kSeed);  // 4 ranks, each with its own extra.rng
  auto client = d.Connect();
  auto all = client->LoadObjects("obj", 1, kRankObject);
  INFO(all.status().ToString());
  REQUIRE(all.ok());
  REQUIRE(all->size() == 4);
  for (uint32_t rank = 0; rank < 4; ++rank) CHECK(all->at(rank) == RankObjectBytes(rank, kSeed));
  auto rep = client->LoadObjects("obj", std::nullopt, kReplicatedObject);
  REQUIRE(rep.ok());
  REQUIRE(rep->size() == 1);
  CHECK(rep->begin()->second == ReplicatedObjectBytes(kSeed));
  // One saving rank's copy from a rank of a smaller world, and a rank that saved none.
  std::string buf(4096, '\0');
  ckptd::LoadTarget t{kRankObject, ckptd::Region::Whole(), buf.data(), buf.size(), 3u};
  auto one = client->Load("obj", 1, 0, std::span(&t, 1));
  REQUIRE(one.ok());
  CHECK(buf.substr(0, one->item_bytes[0]) == RankObjectBytes(3, kSeed));
  t.object_rank = 9;
  auto none = client->Load("obj", 1, 0, std::span(&t, 1));
  CHECK(none.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(none.status().message()),
             Contains("saved by rank 9") && Contains("saved by ranks 0, 1, 2, 3"));
}
