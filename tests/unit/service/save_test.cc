// Save of CheckpointService in-process (service_rig.h):
//   - the shards of one item in one Save agree on what the item is and do not overlap;
//   - a rank's synced journal write does not hold the service lock; a failed one aborts the
//     checkpoint cleanly; an abort during it ends ABORTED with nothing left;
//   - open checkpoints per job are capped (RESOURCE_EXHAUSTED naming the limit);
//   - a rank of more partial-page shards than the flush's bounce pages is written in batches
//     and loads bit-exact;
//   - an abort whose ABORTED row fails is written again, and its staged extents are held until
//     then (a restart never resumes it from bytes handed to another save);
//   - a rank is flushed only once its journal row is written.
#include <catch2/catch.hpp>
#include <future>
#include <thread>

#include "common/limits.h"
#include "service_rig.h"

namespace ckptd {
namespace {

using namespace ckptd::testing;

// A Save request of `rank` of `world` for `step` of kJob, without shards.
v1::SaveRequest BareSave(const Rig& rig, uint64_t step, uint32_t rank = 0, uint32_t world = 1) {
  v1::SaveRequest req;
  req.set_session_id(rig.session);
  req.set_job(kJob);
  req.set_step(step);
  req.set_rank(rank);
  req.set_world_size(world);
  return req;
}

// A float32 tensor shard of item `item`, global [rows, cols], rows [row0, row0 + nrows), whose
// bytes are at `offset` of `extent`.
void AddRows(v1::SaveRequest* req, const std::string& item, uint64_t rows, uint64_t cols,
             uint64_t row0, uint64_t nrows, uint64_t extent, uint64_t offset,
             v1::DType dtype = v1::FLOAT32) {
  v1::ShardSpec* s = req->add_shards();
  s->set_item(item);
  s->mutable_tensor()->set_dtype(dtype);
  s->mutable_tensor()->add_global_shape(rows);
  s->mutable_tensor()->add_global_shape(cols);
  v1::Box* box = s->mutable_tensor()->mutable_region()->mutable_box();
  box->add_offsets(row0);
  box->add_offsets(0);
  box->add_lengths(nrows);
  box->add_lengths(cols);
  s->mutable_data()->set_extent_id(extent);
  s->mutable_data()->set_offset(offset);
  s->mutable_data()->set_length(nrows * cols * 4);
}

absl::StatusOr<v1::Extent> Reserve(Rig& rig, uint64_t bytes) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(rig.session);
  rr.add_sizes_bytes(bytes);
  v1::ReserveExtentsResponse ext;
  CKPTD_RETURN_IF_ERROR(rig.svc->ReserveExtents(rig.caller, rr, &ext));
  return ext.extents(0);
}

absl::Status Abort(Rig& rig, uint64_t step) {
  v1::AbortRequest req;
  req.set_job(kJob);
  req.set_step(step);
  v1::CheckpointStatus resp;
  return rig.svc->Abort(rig.caller, req, &resp);
}

// Stages rank `rank` of `world` of `step`: rows [64 * rank / world, 64 * (rank + 1) / world) of
// "w" (float32 [64, 64]), every byte `fill`.
absl::Status SaveRows(Rig& rig, uint64_t step, uint32_t rank, uint32_t world, uint8_t fill) {
  const uint64_t r0 = 64 * rank / world, r1 = 64 * (rank + 1) / world;
  CKPTD_ASSIGN_OR_RETURN(v1::Extent e, Reserve(rig, (r1 - r0) * 64 * 4));
  std::memset(rig.arena->At(rig.caller.uid, 0) + e.offset(), fill, (r1 - r0) * 64 * 4);
  v1::SaveRequest req = BareSave(rig, step, rank, world);
  AddRows(&req, "w", 64, 64, r0, r1 - r0, e.id(), 0);
  v1::SaveResponse resp;
  return rig.svc->Save(rig.caller, req, &resp);
}

// Polls until `step` of kJob is in `state` (10 s at most).
bool EventuallyIn(Rig& rig, uint64_t step, v1::CheckpointState state) {
  for (int i = 0; i < 1000; ++i) {
    if (rig.State(step) == state) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_CASE("save: the shards of one item in one Save agree on the item and do not overlap",
          "[unit]") {
  Rig rig;
  absl::StatusOr<v1::Extent> e = Reserve(rig, 64 * 64 * 4);
  REQUIRE(e.ok());

  SECTION("another dtype for the same item") {
    v1::SaveRequest req = BareSave(rig, 1);
    AddRows(&req, "w", 64, 64, 0, 32, e->id(), 0);
    AddRows(&req, "w", 64, 64, 32, 32, e->id(), 32 * 64 * 4, v1::INT32);
    v1::SaveResponse resp;
    absl::Status st = rig.svc->Save(rig.caller, req, &resp);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(st, "describes the item differently"));
  }
  SECTION("another global shape for the same item") {
    v1::SaveRequest req = BareSave(rig, 1);
    AddRows(&req, "w", 64, 64, 0, 32, e->id(), 0);
    AddRows(&req, "w", 96, 64, 32, 32, e->id(), 32 * 64 * 4);
    v1::SaveResponse resp;
    CHECK(rig.svc->Save(rig.caller, req, &resp).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("overlapping regions") {
    v1::SaveRequest req = BareSave(rig, 1);
    AddRows(&req, "w", 64, 64, 0, 32, e->id(), 0);
    AddRows(&req, "w", 64, 64, 16, 32, e->id(), 16 * 64 * 4);
    v1::SaveResponse resp;
    absl::Status st = rig.svc->Save(rig.caller, req, &resp);
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK(Contains(st, "overlap"));
  }
  // Nothing was staged: the step saves normally afterwards (the extent is still the client's).
  CHECK(rig.State(1) == v1::CHECKPOINT_STATE_UNSPECIFIED);
  v1::SaveRequest ok = BareSave(rig, 1);
  AddRows(&ok, "w", 64, 64, 0, 32, e->id(), 0);
  AddRows(&ok, "w", 64, 64, 32, 32, e->id(), 32 * 64 * 4);
  v1::SaveResponse resp;
  REQUIRE(rig.svc->Save(rig.caller, ok, &resp).ok());
  CHECK(rig.Wait(1).ok());
}

TEST_CASE("save: a rank's synced journal write does not hold the service lock", "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 5));  // the journal batch of step 5 starts with its row
  auto save = std::async(std::launch::async, [&] { return rig.Save(5, 0x55); });
  REQUIRE(rig.meta_gate.WaitReached());
  auto meanwhile = std::async(std::launch::async, [&] {
    CHECK(rig.LoadCheck(1, 0x11).ok());
    CHECK(rig.Latest().ok());
    CHECK(rig.SaveCommitted(6, 0x66).ok());  // another checkpoint journals and commits
    rig.List();
  });
  const bool answered = meanwhile.wait_for(kPatience) == std::future_status::ready;
  CHECK(answered);
  rig.meta_gate.Release();
  meanwhile.get();
  REQUIRE(save.get().ok());
  REQUIRE(rig.Wait(5).ok());
  CHECK(rig.LoadCheck(5, 0x55).ok());
  CHECK(rig.LoadCheck(6, 0x66).ok());
}

TEST_CASE("save: a failed journal write aborts the checkpoint cleanly, the next step saves",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 3), absl::ResourceExhaustedError("index full (test)"));
  absl::Status st = rig.Save(3, 0x33);
  CHECK(st.code() == absl::StatusCode::kResourceExhausted);
  CHECK(Contains(st, "journaling rank 0"));
  CHECK(EventuallyIn(rig, 3, v1::ABORTED));
  CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(3)));
  // The next step saves, commits and loads; nothing of step 3 holds arena space.
  REQUIRE(rig.SaveCommitted(4, 0x44).ok());
  CHECK(rig.LoadCheck(4, 0x44).ok());
  CHECK(rig.LoadCheck(1, 0x11).ok());
  CHECK(rig.arena->free_bytes() + rig.svc->ram_tier_stats().hot_bytes ==
        rig.arena->capacity_bytes());
}

TEST_CASE("save: an abort during a rank's journal write ends ABORTED with nothing left",
          "[unit][fault]") {
  Rig rig;
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 7));
  auto save = std::async(std::launch::async, [&] {
    v1::SaveRequest req = BareSave(rig, 7, 0, 2);  // rank 0 of 2: stays open
    absl::StatusOr<v1::Extent> e = Reserve(rig, 64 * 64 * 4);
    REQUIRE(e.ok());
    AddRows(&req, "w", 64, 64, 0, 64, e->id(), 0);
    v1::SaveResponse resp;
    return rig.svc->Save(rig.caller, req, &resp);
  });
  REQUIRE(rig.meta_gate.WaitReached());
  // The abort is durable only after the journal write: answered once it is released.
  auto abort = std::async(std::launch::async, [&] { return Abort(rig, 7); });
  CHECK(abort.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  rig.meta_gate.Release();
  CHECK(abort.get().ok());
  CHECK(save.get().code() == absl::StatusCode::kAborted);
  CHECK(EventuallyIn(rig, 7, v1::ABORTED));
  CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(7)));
  CHECK(rig.arena->free_bytes() + rig.svc->ram_tier_stats().hot_bytes ==
        rig.arena->capacity_bytes());
  // After a restart it is still ABORTED (the rows of its rank were removed with it).
  rig.Restart();
  REQUIRE(rig.recovered.ok());
  CHECK(rig.State(7) == v1::ABORTED);
}

// Found by the simulation (simulation_test.cc): an abort freed the staged extents before its
// ABORTED row was written; when that write failed, the checkpoint stayed STAGING for good (Wait
// timed out) and a restart resumed it from extents another checkpoint had reused meanwhile.
TEST_CASE(
    "save: an abort whose ABORTED row fails is written again, its staging is held until "
    "then",
    "[unit][fault]") {
  Rig rig;
  REQUIRE(SaveRows(rig, 1, 0, 2, 0x11).ok());  // rank 0 of 2: stays open
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 1), absl::UnavailableError("index down (test)"));
  // The first write fails: Abort says so (UNAVAILABLE, not durable yet)...
  CHECK(Abort(rig, 1).code() == absl::StatusCode::kUnavailable);
  // ...and housekeeping writes the row again; Wait answers once it is written and the files are
  // gone.
  CHECK(rig.Wait(1).code() == absl::StatusCode::kAborted);
  CHECK(rig.meta_gate.reached());
  CHECK(rig.State(1) == v1::ABORTED);
  CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(1)));
  CHECK(rig.arena->free_bytes() + rig.svc->ram_tier_stats().hot_bytes ==
        rig.arena->capacity_bytes());
  rig.Restart(/*keep_arena=*/true);
  REQUIRE(rig.recovered.ok());
  CHECK(rig.State(1) == v1::ABORTED);
}

// Found by the simulation: a Wait between an abort and its ABORTED row, for a checkpoint whose
// first journal write failed (so it had no row yet), answered NOT_FOUND.
TEST_CASE("save: a Wait on a checkpoint being aborted before it had a row answers ABORTED",
          "[unit][fault]") {
  Rig rig;
  // Rank 0's journal write fails, and so does every try at the ABORTED row until disarmed.
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 1), absl::UnavailableError("index down (test)"),
                    1 << 30);
  CHECK(SaveRows(rig, 1, 0, 1, 0x11).code() == absl::StatusCode::kUnavailable);
  v1::WaitRequest w;
  w.set_job(kJob);
  w.set_step(1);
  w.set_timeout_ms(300);
  v1::CheckpointStatus resp;
  absl::Status st = rig.svc->Wait(rig.caller, w, &resp);
  INFO(st.ToString());
  CHECK(st.code() == absl::StatusCode::kDeadlineExceeded);  // still being aborted
  rig.meta_gate.Disarm();
  CHECK(rig.Wait(1).code() == absl::StatusCode::kAborted);
  CHECK(rig.arena->free_bytes() + rig.svc->ram_tier_stats().hot_bytes ==
        rig.arena->capacity_bytes());
}

TEST_CASE(
    "save: a crash before an abort is recorded resumes the checkpoint from its own bytes, "
    "never from extents handed out again",
    "[unit][fault]") {
  Rig rig;
  REQUIRE(SaveRows(rig, 1, 0, 2, 0x11).ok());
  // The ABORTED row cannot be written (the index keeps failing): the journal still says rank 0
  // is staged in its extent, which must not be handed to the next save.
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 1), absl::UnavailableError("index down (test)"),
                    1 << 30);
  // Abort says the abort is not durable.
  absl::Status aborted = Abort(rig, 1);
  CHECK(aborted.code() == absl::StatusCode::kUnavailable);
  CHECK(Contains(aborted, "could not be written"));
  REQUIRE(rig.meta_gate.WaitReached());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  CHECK(rig.State(1) == v1::STAGING);  // not recorded
  rig.Restart(/*keep_arena=*/true);    // the daemon dies before the abort is recorded
  REQUIRE(rig.recovered.ok());
  rig.meta_gate.Disarm();
  // The state before the abort: rank 0 staged, from its own bytes.
  REQUIRE(rig.State(1) == v1::STAGING);
  REQUIRE(SaveRows(rig, 1, 1, 2, 0x11).ok());
  REQUIRE(rig.Wait(1).ok());
  CHECK(rig.LoadCheck(1, 0x11).ok());
  CHECK(rig.LoadCheck(2, 0x22).ok());
}

// Found by the simulation: housekeeping posted the flush of a rank whose journal write was still
// in flight (the flush gate had passed). When the flush ended first, the commit was never started
// (a journal write was in flight) and nothing started it later: the checkpoint stayed PERSISTING
// for good. And the rank's journal row, landing after the flush's "persisted" row, could erase it.
TEST_CASE("save: a rank is flushed only once its journal row is written", "[unit][fault]") {
  Rig rig;
  rig.Stop();
  rig.options.flush_gate_ms = 0;  // housekeeping posts flushes at every pass (10 ms)
  rig.Start();
  REQUIRE(SaveRows(rig, 1, 0, 2, 0x11).ok());
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 1));  // hold rank 1's journal write
  auto save = std::async(std::launch::async, [&] { return SaveRows(rig, 1, 1, 2, 0x11); });
  REQUIRE(rig.meta_gate.WaitReached());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // several housekeeping passes
  CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(1) + "/" + BlobName(1)));
  rig.meta_gate.Release();
  REQUIRE(save.get().ok());
  absl::Status st = rig.Wait(1);
  INFO(st.ToString());
  REQUIRE(st.ok());
  CHECK(rig.LoadCheck(1, 0x11).ok());
}

// Stages rank 0 of a 2-rank checkpoint `step` (one 64 x 64 float32 item): it stays open.
void StageOpenRank(Rig& rig, uint64_t step) {
  absl::StatusOr<v1::Extent> e = Reserve(rig, 64 * 64 * 4);
  REQUIRE(e.ok());
  v1::SaveRequest req = BareSave(rig, step, 0, 2);
  AddRows(&req, "w", 64, 64, 0, 64, e->id(), 0);
  v1::SaveResponse resp;
  REQUIRE(rig.svc->Save(rig.caller, req, &resp).ok());
}

TEST_CASE("save: Abort answers once the abort is durable", "[unit][fault]") {
  Rig rig;
  StageOpenRank(rig, 8);
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 8));  // hold the ABORTED row's synced write
  auto abort = std::async(std::launch::async, [&] { return Abort(rig, 8); });
  REQUIRE(rig.meta_gate.WaitReached());
  // Not answered while the row is not durable.
  CHECK(abort.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  rig.meta_gate.Release();
  CHECK(abort.get().ok());
  // Durable: a restart right after the answer finds it ABORTED, not STAGING.
  rig.Restart();
  REQUIRE(rig.recovered.ok());
  CHECK(rig.State(8) == v1::ABORTED);
}

TEST_CASE(
    "save: an abort the flush pool refuses is recorded by Shutdown, outside the lifecycle lock",
    "[unit][fault]") {
  Rig rig;
  StageOpenRank(rig, 9);
  rig.pool->Stop();  // the flush pool refuses from now on (as while the daemon stops)
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 9));  // hold the ABORTED row's synced write
  auto abort = std::async(std::launch::async, [&] { return Abort(rig, 9); });
  // Nobody can write the row: the Abort waits (its record is queued for a retry).
  CHECK(abort.wait_for(std::chrono::milliseconds(600)) == std::future_status::timeout);
  auto shutdown =
      std::async(std::launch::async, [&] { return rig.svc->Shutdown(absl::Seconds(5)); });
  REQUIRE(rig.meta_gate.WaitReached());  // Shutdown writes it
  // ... with the lifecycle lock free: a status call answers while the write is held.
  auto status = std::async(std::launch::async, [&] {
    v1::GetStatusRequest g;
    g.set_job(kJob);
    g.set_step(9);
    v1::CheckpointStatus out;
    return rig.svc->GetStatus(rig.caller, g, &out);
  });
  CHECK(status.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  rig.meta_gate.Release();
  CHECK(abort.get().ok());
  shutdown.get();
  // Durable: the next start finds it ABORTED, not STAGING to resume.
  rig.Restart();
  REQUIRE(rig.recovered.ok());
  CHECK(rig.State(9) == v1::ABORTED);
}

TEST_CASE("save: open checkpoints per job are capped", "[unit]") {
  Rig rig;
  std::vector<uint64_t> extents;
  for (uint64_t step = 1; step <= limits::kOpenCheckpointsPerJobMax + 1; ++step) {
    absl::StatusOr<v1::Extent> e = Reserve(rig, 4096);
    REQUIRE(e.ok());
    v1::SaveRequest req = BareSave(rig, step, 0, 2);  // rank 0 of 2: stays STAGING
    AddRows(&req, "w", 2, 1024, 0, 1, e->id(), 0);
    v1::SaveResponse resp;
    absl::Status st = rig.svc->Save(rig.caller, req, &resp);
    if (step <= limits::kOpenCheckpointsPerJobMax) {
      REQUIRE(st.ok());
      continue;
    }
    CHECK(st.code() == absl::StatusCode::kResourceExhausted);
    CHECK(Contains(st, "kOpenCheckpointsPerJobMax"));
  }
  // Aborting one makes room again.
  REQUIRE(Abort(rig, 1).ok());
  REQUIRE(EventuallyIn(rig, 1, v1::ABORTED));
  absl::StatusOr<v1::Extent> e = Reserve(rig, 4096);
  REQUIRE(e.ok());
  v1::SaveRequest req = BareSave(rig, 100, 0, 2);
  AddRows(&req, "w", 2, 1024, 0, 1, e->id(), 0);
  v1::SaveResponse resp;
  CHECK(rig.svc->Save(rig.caller, req, &resp).ok());
}

TEST_CASE("save: a rank of more partial pages than the flush's bounce pages loads bit-exact",
          "[unit]") {
  Rig rig;
  // Rows of 25 float32 (100 bytes) in one extent: every shard has a partial last page that goes
  // through a bounce page, more of them than kFlushBounceBytesMax holds.
  const uint64_t rows = limits::kFlushBounceBytesMax / limits::kAlignmentBytes * 2 + 3;
  const uint64_t cols = 25;
  const uint64_t bytes = rows * cols * 4;
  absl::StatusOr<v1::Extent> e = Reserve(rig, bytes);
  REQUIRE(e.ok());
  uint8_t* src = rig.arena->At(rig.caller.uid, 0) + e->offset();
  for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + i / 4096);
  v1::SaveRequest req = BareSave(rig, 9);
  for (uint64_t r = 0; r < rows; ++r) AddRows(&req, "v", rows, cols, r, 1, e->id(), r * cols * 4);
  v1::SaveResponse resp;
  REQUIRE(rig.svc->Save(rig.caller, req, &resp).ok());
  REQUIRE(rig.Wait(9).ok());

  absl::StatusOr<v1::Extent> dst = Reserve(rig, bytes);
  REQUIRE(dst.ok());
  uint8_t* out = rig.arena->At(rig.caller.uid, 0) + dst->offset();
  std::memset(out, 0, bytes);
  v1::LoadRequest load;
  load.set_session_id(rig.session);
  load.set_job(kJob);
  load.set_step(9);
  v1::LoadItemRequest* item = load.add_items();
  item->set_item("v");
  item->mutable_dest()->set_extent_id(dst->id());
  item->mutable_dest()->set_length(bytes);
  v1::LoadResponse lresp;
  REQUIRE(rig.svc->Load(rig.caller, load, &lresp).ok());
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < bytes; ++i) wrong += out[i] != static_cast<uint8_t>(i * 131 + i / 4096);
  CHECK(wrong == 0);
}

}  // namespace
}  // namespace ckptd
