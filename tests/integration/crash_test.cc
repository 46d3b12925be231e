// Crash tests, deterministic through --debug_flush_delay_ms: a checkpoint staged but not yet
// committed survives (a) a kill -9 of the daemon (resumed from shared memory), is cleanly
// ABORTED when (b) the arena is gone too, and (c) commits by itself when every client dies.
// In every case a checkpoint committed earlier still loads bit-exact.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

const std::string kJob = "crash";
constexpr uint64_t kSeed1 = 21;
constexpr uint64_t kSeed2 = 22;

ckptd::CheckpointState StateOf(const Daemon& d, uint64_t step) {
  auto st = d.Connect()->GetStatus(kJob, step);
  return st.ok() ? st->state : ckptd::CheckpointState::kUnspecified;
}

// Step 1 committed without delay; then the daemon restarts with flushes held for a minute and
// 4 rank processes stage step 2 (and exit).
void StageStep2Held(Daemon& d) {
  SaveCommitted(d, kJob, 1, kSeed1);
  d.Restart({"--debug_flush_delay_ms=60000"});
  auto ranks = SaveRanksConcurrently(d, kJob, 2, kSeed2, /*hold=*/false);
  for (auto& r : ranks) {
    INFO(r->output());
    REQUIRE(r->Wait() == 0);
  }
  ckptd::CheckpointState s = StateOf(d, 2);
  INFO(ckptd::CheckpointStateName(s));
  REQUIRE((s == ckptd::CheckpointState::kPersisting || s == ckptd::CheckpointState::kStaging));
}

}  // namespace

TEST_CASE("crash (a): kill -9 after staged - restart commits from shared memory",
          "[integration][crash]") {
  Daemon d;
  StageStep2Held(d);
  const std::string arena = d.ArenaName();
  d.Kill9();
  REQUIRE(PathExists("/dev/shm" + arena));
  d.Restart({});
  auto client = d.Connect();
  absl::Status s = client->WaitCommitted(kJob, 2, 30000);
  INFO(s.ToString() << "\n" << d.Log());
  REQUIRE(s.ok());
  REQUIRE(VerifyInProcess(d, kJob, 2, kSeed2) == "");
  REQUIRE(VerifyInProcess(d, kJob, 1, kSeed1) == "");
  auto latest = client->Latest(kJob);
  REQUIRE(latest.ok());
  REQUIRE(*latest == 2);
}

TEST_CASE("crash (b): kill -9 after staged and the arena removed - restart aborts it",
          "[integration][crash]") {
  Daemon d;
  StageStep2Held(d);
  const std::string arena = d.ArenaName();
  d.Kill9();
  REQUIRE(shm_unlink(arena.c_str()) == 0);
  d.Restart({});
  auto client = d.Connect();
  auto st = client->GetStatus(kJob, 2);
  INFO(d.Log());
  INFO(st.status().ToString());
  REQUIRE(st.ok());
  INFO("state " << ckptd::CheckpointStateName(st->state) << " error " << st->error);
  REQUIRE(st->state == ckptd::CheckpointState::kAborted);
  REQUIRE_FALSE(st->error.empty());
  absl::Status w = client->WaitCommitted(kJob, 2, 1000);
  REQUIRE(w.code() == absl::StatusCode::kAborted);
  const std::string dir = d.data_dir() + "/" + kJob + "/" + StepDir(2);
  for (int i = 0; i < 100 && PathExists(dir); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE_FALSE(PathExists(dir));
  REQUIRE(VerifyInProcess(d, kJob, 1, kSeed1) == "");
  auto latest = client->Latest(kJob);
  REQUIRE(latest.ok());
  REQUIRE(*latest == 1);
  auto load = client->LoadObject(kJob, 2, 0, kRankObject);
  REQUIRE_FALSE(load.ok());
}

TEST_CASE("crash (c): kill -9 all four clients right after staged - the daemon commits alone",
          "[integration][crash]") {
  Daemon d;
  SaveCommitted(d, kJob, 1, kSeed1);
  d.Restart({"--debug_flush_delay_ms=2000"});
  {
    auto ranks = SaveRanksConcurrently(d, kJob, 2, kSeed2, /*hold=*/true);
    for (auto& r : ranks) r->Kill9();
  }
  ckptd::CheckpointState s = StateOf(d, 2);
  INFO(ckptd::CheckpointStateName(s));
  REQUIRE(s != ckptd::CheckpointState::kCommitted);  // the daemon was still working
  auto client = d.Connect();
  absl::Status w = client->WaitCommitted(kJob, 2, 30000);
  INFO(w.ToString() << "\n" << d.Log());
  REQUIRE(w.ok());
  REQUIRE(VerifyInProcess(d, kJob, 2, kSeed2) == "");
  REQUIRE(VerifyInProcess(d, kJob, 1, kSeed1) == "");
}

TEST_CASE("SIGTERM with a staged checkpoint journals it - the next start commits it",
          "[integration][crash]") {
  Daemon d;
  SaveCommitted(d, kJob, 1, kSeed1);
  d.Restart({"--debug_flush_delay_ms=60000", "--shutdown_grace_s=1"});
  {
    auto ranks = SaveRanksConcurrently(d, kJob, 2, kSeed2, /*hold=*/false);
    for (auto& r : ranks) REQUIRE(r->Wait() == 0);
  }
  // SIGTERM: exits after the 1 s grace period; the staged step stays journaled.
  auto t0 = std::chrono::steady_clock::now();
  const bool exited = d.Stop(10000);
  const auto took_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  CHECK(exited);
  INFO("SIGTERM to exit: " << took_ms << " ms");
  d.Restart({});
  auto client = d.Connect();
  absl::Status w = client->WaitCommitted(kJob, 2, 30000);
  INFO(w.ToString() << "\n" << d.Log());
  REQUIRE(w.ok());
  REQUIRE(VerifyInProcess(d, kJob, 2, kSeed2) == "");
  REQUIRE(VerifyInProcess(d, kJob, 1, kSeed1) == "");
}

TEST_CASE("Client::Wait on an aborted checkpoint says why - a timeout names missing ranks",
          "[integration]") {
  Daemon d;
  auto client = d.Connect();
  REQUIRE(SaveRank(*client, kJob, 3, 0, 2, 1).ok());
  REQUIRE(client->Abort(kJob, 3, "test abort").ok());
  auto st = client->Wait(kJob, 3, ckptd::WaitFor::kCommitted, 1000);
  INFO(st.status().ToString());
  REQUIRE(st.status().code() == absl::StatusCode::kAborted);
  CHECK(std::string(st.status().message()).find("test abort") != std::string::npos);
  // And on a timeout: DEADLINE_EXCEEDED naming the missing ranks.
  REQUIRE(SaveRank(*client, kJob, 4, 0, 2, 1).ok());
  auto timed_out = client->Wait(kJob, 4, ckptd::WaitFor::kCommitted, 300);
  INFO(timed_out.status().ToString());
  REQUIRE(timed_out.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(timed_out.status().message()).find("ranks missing: [1]") != std::string::npos);
}
