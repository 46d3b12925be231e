// End to end against the real daemon: 4 rank processes save concurrently, the daemon commits by
// itself, fresh clients load everything (and a subset) bit-exact, ckptctl sees and deletes it.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

TEST_CASE("e2e: 4 ranks save, the daemon commits, a fresh client loads bit-exact",
          "[integration]") {
  Daemon d;
  const std::string job = "e2e-run";
  {
    auto ranks = SaveRanksConcurrently(d, job, 1, /*seed=*/11, /*hold=*/false);
    for (auto& r : ranks) {
      INFO(r->output());
      REQUIRE(r->Wait() == 0);
    }
  }
  auto client = d.Connect();
  // Nobody calls Commit: the daemon commits once ranks 0..3 are staged.
  absl::Status committed = client->WaitCommitted(job, 1, 30000);
  INFO(d.Log());
  REQUIRE(committed.ok());

  SECTION("every tensor whole and every rank's objects, from another process") {
    CommandResult r = RunTestClient(d, "load", {"--job", job, "--step", "1", "--seed", "11"});
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE_THAT(r.output, Contains("verified"));
    CommandResult latest =
        RunTestClient(d, "load", {"--job", job, "--step", "latest", "--seed", "11"});
    INFO(latest.output);
    REQUIRE(latest.exit_code == 0);
  }

  SECTION("every tensor whole in this process; per-rank objects by rank") {
    REQUIRE(VerifyInProcess(d, job, 1, 11) == "");
    for (uint32_t rank = 0; rank < 4; ++rank) {
      auto o = client->LoadObject(job, 1, rank, kRankObject);
      REQUIRE(o.ok());
      REQUIRE(*o == RankObjectBytes(rank, 11));
    }
    auto all = client->LoadAll(job, 1, 2);
    REQUIRE(all.ok());
    REQUIRE(all->tensors.size() == StateDict().size());
    for (const TensorItem& t : StateDict()) {
      INFO(t.name);
      REQUIRE(all->tensors.count(t.name) == 1);
      REQUIRE(all->tensors[t.name].shape == t.shape);
      REQUIRE(all->tensors[t.name].dtype == t.dtype);
      REQUIRE(all->tensors[t.name].bytes == GlobalBytes(t, 11));
    }
    REQUIRE(all->objects[kRankObject] == RankObjectBytes(2, 11));
    REQUIRE(all->objects[kReplicatedObject] == ReplicatedObjectBytes(11));
    auto latest = client->Latest(job);
    REQUIRE(latest.ok());
    REQUIRE(*latest == 1);
  }

  SECTION("only a subset of items, reading less than everything") {
    const std::vector<std::string> subset = {"model.mask", "optim.step",
                                             "model.layers.0.mlp.fc1.fp8"};
    CommandResult r = RunTestClient(d, "load",
                                    {"--job", job, "--step", "1", "--seed", "11", "--items",
                                     "model.mask,optim.step,model.layers.0.mlp.fc1.fp8"});
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    REQUIRE(VerifyInProcess(d, job, 1, 11, subset) == "");

    // A box region of one item: rows 5..8 of the bf16 tensor (spans two ranks' shards).
    const TensorItem& t = StateDict()[1];
    REQUIRE(t.name == "model.layers.0.attn.qkv");
    const uint64_t cols = t.shape[1];
    std::vector<uint8_t> got(4 * cols * 2);
    std::vector<ckptd::LoadTarget> targets = {
        {t.name, ckptd::Region::Box({30, 0}, {4, cols}), got.data(), got.size()}};
    auto res = client->Load(job, 1, 0, targets);
    REQUIRE(res.ok());
    std::vector<uint8_t> want(got.size());
    FillElements(t.name, t.dtype, 30 * cols, 4 * cols, 11, want.data());
    REQUIRE(got == want);
  }

  SECTION("ckptctl shows, inspects and removes it") {
    CommandResult jobs = RunCtl(d, {"ls"});
    INFO(jobs.output);
    REQUIRE(jobs.exit_code == 0);
    REQUIRE_THAT(jobs.output, Contains(job));

    CommandResult ls = RunCtl(d, {"ls", job});
    INFO(ls.output);
    REQUIRE(ls.exit_code == 0);
    REQUIRE_THAT(ls.output, Contains("COMMITTED"));

    CommandResult st = RunCtl(d, {"--json", "status", job, "1"});
    INFO(st.output);
    REQUIRE(st.exit_code == 0);
    REQUIRE_THAT(st.output, Contains("\"state\": \"COMMITTED\""));

    CommandResult insp = RunCtl(d, {"inspect", job, "1"});
    INFO(insp.output);
    REQUIRE(insp.exit_code == 0);
    for (const TensorItem& t : StateDict()) REQUIRE_THAT(insp.output, Contains(t.name));
    REQUIRE_THAT(insp.output, Contains(kRankObject));
    REQUIRE_THAT(insp.output, Contains("bfloat16"));
    REQUIRE_THAT(insp.output, Contains("float8_e4m3fn"));
    REQUIRE_THAT(insp.output, Contains("int64"));
    REQUIRE_THAT(insp.output, Contains("[128,96]"));
    REQUIRE_THAT(insp.output, Contains("[0,8]"));
    REQUIRE_THAT(insp.output, Contains("[]"));

    auto items = client->Inspect(job, 1);
    REQUIRE(items.ok());
    for (const TensorItem& t : StateDict()) {
      bool found = false;
      for (const ckptd::ItemInfo& i : *items) {
        if (i.name != t.name) continue;
        found = true;
        REQUIRE(i.kind == ckptd::ItemInfo::kTensor);
        REQUIRE(i.dtype == t.dtype);
        REQUIRE(i.shape == t.shape);
        // Row-sharded: one shard per rank; the replicated 0-d tensor is stored once.
        if (t.sharded) REQUIRE(i.shard_count == 4);
        if (!t.sharded) REQUIRE(i.shard_count == 1);
      }
      INFO(t.name);
      REQUIRE(found);
    }

    CommandResult rm = RunCtl(d, {"rm", job, "1"});
    INFO(rm.output);
    REQUIRE(rm.exit_code == 0);
    CommandResult gone = RunCtl(d, {"status", job, "1"});
    REQUIRE(gone.exit_code != 0);
    auto load = client->LoadObject(job, 1, 0, kRankObject);
    REQUIRE(load.status().code() == absl::StatusCode::kNotFound);
    const std::string dir = d.data_dir() + "/" + job + "/" + StepDir(1);
    for (int i = 0; i < 100 && PathExists(dir); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    REQUIRE_FALSE(PathExists(dir));
  }

  SECTION("ckptctl exits non-zero on a bad command or a missing checkpoint") {
    REQUIRE(RunCtl(d, {"frobnicate"}).exit_code == 2);
    REQUIRE(RunCtl(d, {"status", job, "not-a-step"}).exit_code == 2);
    CommandResult missing = RunCtl(d, {"status", job, "999"});
    REQUIRE(missing.exit_code == 1);
    REQUIRE_THAT(missing.output, Contains("999"));
  }
}

TEST_CASE("copy counter: exactly one copy per saved byte on the CPU path", "[integration]") {
  Daemon d;
  auto client = d.Connect();
  ckptd::Client::reset_copy_stats();
  uint64_t bytes = 0, shards = 0;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    RankPayload p = MakeRankPayload(rank, 4, 3);
    bytes += p.tensor_bytes + p.object_bytes;
    for (const auto& t : p.tensors) shards += t.bytes > 0;
    shards += p.objects.size();
    auto r = client->Save("copies", 1, rank, 4, p.tensors, p.objects);
    REQUIRE(r.ok());
  }
  ckptd::CopyStats s = ckptd::Client::copy_stats();
  CHECK(s.save_bytes == bytes);
  CHECK(s.save_calls == shards);
  CHECK(s.load_bytes == 0);
  REQUIRE(client->WaitCommitted("copies", 1, 30000).ok());

  // Load: one copy per byte loaded, out of the arena into the caller's buffer.
  ckptd::Client::reset_copy_stats();
  REQUIRE(VerifyInProcess(d, "copies", 1, 3) == "");
  s = ckptd::Client::copy_stats();
  uint64_t tensor_bytes = 0;
  for (const TensorItem& t : StateDict()) tensor_bytes += GlobalBytes(t, 3).size();
  uint64_t object_bytes = 0;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    object_bytes += RankObjectBytes(rank, 3).size() + ReplicatedObjectBytes(3).size();
  }
  CHECK(s.load_bytes == tensor_bytes + object_bytes);
  CHECK(s.save_bytes == 0);
}

// docs/DESIGN.md "Save": double buffering: with room in the arena for two checkpoints, step N+1
// stages while step N is still being written, and both commit bit-exact.
TEST_CASE("double-buffered: step 2 stages while step 1 still persists", "[integration]") {
  Daemon d;
  d.Restart({"--debug_flush_delay_ms=1500"});
  auto client = d.Connect();
  auto stage = [&](uint64_t step, uint64_t seed) {
    auto ranks = SaveRanksConcurrently(d, "dbuf", step, seed, /*hold=*/false);
    for (auto& r : ranks) {
      INFO(r->output());
      REQUIRE(r->Wait() == 0);
    }
  };
  stage(1, 31);
  stage(2, 32);
  auto s1 = client->GetStatus("dbuf", 1);
  REQUIRE(s1.ok());
  INFO(ckptd::CheckpointStateName(s1->state));
  CHECK(s1->state != ckptd::CheckpointState::kCommitted);  // step 2 did not wait for step 1
  REQUIRE(client->WaitCommitted("dbuf", 1, 30000).ok());
  REQUIRE(client->WaitCommitted("dbuf", 2, 30000).ok());
  CHECK(VerifyInProcess(d, "dbuf", 1, 31) == "");
  CHECK(VerifyInProcess(d, "dbuf", 2, 32) == "");
}

// The flush gate: a rank's flush waits for the checkpoint's other ranks (up to flush_gate_ms),
// so flushing never competes with ranks still copying; alone, it flushes once the gate passes.
TEST_CASE("flush gate: flushes wait for every rank, or for flush_gate_ms", "[integration]") {
  Daemon d;
  d.Restart({"--flush_gate_ms=2000"});
  auto client = d.Connect();
  auto persisted = [&](uint64_t step) {
    auto st = client->GetStatus("gate", step);
    REQUIRE(st.ok());
    return st->bytes_persisted;
  };
  std::vector<RankPayload> ranks;
  for (uint32_t r = 0; r < 4; ++r) ranks.push_back(MakeRankPayload(r, 4, 41));
  REQUIRE(client->Save("gate", 1, 0, 4, ranks[0].tensors, ranks[0].objects).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(persisted(1) == 0);  // ranks 1-3 are not staged yet: rank 0 waits
  for (uint32_t r = 1; r < 4; ++r) {
    REQUIRE(client->Save("gate", 1, r, 4, ranks[r].tensors, ranks[r].objects).ok());
  }
  REQUIRE(client->WaitCommitted("gate", 1, 30000).ok());  // all staged: flushed at once
  CHECK(VerifyInProcess(d, "gate", 1, 41) == "");

  // The others never come: rank 0 is flushed once the gate passes (the stage timeout still
  // aborts the checkpoint later).
  REQUIRE(client->Save("gate", 2, 0, 4, ranks[0].tensors, ranks[0].objects).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(persisted(2) == 0);
  uint64_t got = 0;
  for (int i = 0; i < 100 && got == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    got = persisted(2);
  }
  CHECK(got > 0);
}

TEST_CASE("close: a closed client's session ends at once, its buffers stay mapped",
          "[integration]") {
  Daemon d;  // a 64 MiB arena
  auto a = d.Connect();
  absl::StatusOr<ckptd::ArenaBuffer> held = a->Allocate(48ull << 20);
  REQUIRE(held.ok());
  std::memset(held->data, 7, held->size);
  a->Close();
  a->Close();  // again: nothing
  // Mapped until the client is destroyed: no fault on access.
  CHECK(static_cast<const uint8_t*>(held->data)[held->size - 1] == 7);
  absl::StatusOr<std::vector<ckptd::JobInfo>> after = a->ListJobs();
  REQUIRE(after.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(after.status().message()), Contains("closed"));
  // The daemon released the closed session's extent: 48 MiB of the 64 fit again, now, not when
  // `a` is destroyed (a reservation would otherwise wait for reserve_timeout_ms, then fail).
  auto b = d.Connect();
  absl::StatusOr<ckptd::ArenaBuffer> again = b->Allocate(48ull << 20);
  REQUIRE(again.ok());
}

TEST_CASE("close: closing after the daemon died returns at once and never reconnects",
          "[integration]") {
  Daemon d;
  auto a = d.Connect();
  REQUIRE(a->ListJobs().ok());
  d.Kill9();
  auto t0 = std::chrono::steady_clock::now();
  a->Close();  // no Goodbye to wait for: the session died with the daemon
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  d.Restart({});
  absl::StatusOr<std::vector<ckptd::JobInfo>> after = a->ListJobs();
  REQUIRE(after.status().code() == absl::StatusCode::kFailedPrecondition);  // no new Hello
  CHECK(a->reconnect_count() == 0);
}
