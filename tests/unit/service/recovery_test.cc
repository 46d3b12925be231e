// Delete and recovery of CheckpointService in-process, over posix storage (wrapped so a test can
// hold or fail one RemoveAll, or hold one synced index write) and an in-memory or RocksDB index:
//   - a Delete racing a re-save of the same step: the re-save is refused while the delete runs,
//     the service lock is not held across the directory removal or the synced tombstone write,
//     and the end state is "absent" or "COMMITTED and loads bit-exact";
//   - a delete that failed half way is finished by the next Delete or by recovery;
//   - recovery skips stray files, repairs rows that do not parse, and marks a COMMITTED
//     checkpoint whose manifest does not verify CORRUPT (latest falls back to an older one), and
//     one whose manifest is gone MISSING (its files kept);
//   - a checkpoint resumed at a restart keeps its owner.
#include <catch2/catch.hpp>
#include <cstring>
#include <future>

#include "service_rig.h"

namespace ckptd {
namespace {

using namespace ckptd::testing;

TEST_CASE("recovery: a re-save racing a delete of the same step is refused until it is done",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  rig.storage_gate.Arm(rig.StepPath(1));  // hold the delete at its directory removal
  auto del = std::async(std::launch::async, [&] { return rig.Delete(1); });
  REQUIRE(rig.storage_gate.WaitReached());

  // Meanwhile (the service lock is free: each of these takes it) the step is DELETING, a re-save
  // and a second delete are refused with ABORTED, and other steps save and load.
  auto meanwhile = std::async(std::launch::async, [&] {
    CHECK(rig.State(1) == v1::DELETING);
    absl::Status resave = rig.Save(1, 0x22);
    INFO(resave.ToString());
    CHECK(resave.code() == absl::StatusCode::kAborted);
    CHECK(Contains(resave, "being deleted"));
    if (resave.ok()) rig.Wait(1).IgnoreError();  // the old behaviour: it commits in the window
    absl::Status again = rig.Delete(1);
    INFO(again.ToString());
    CHECK(again.code() == absl::StatusCode::kAborted);
    CHECK(rig.SaveCommitted(2, 0x33).ok());
    CHECK(rig.LoadCheck(2, 0x33).ok());
  });
  const bool answered = meanwhile.wait_for(kPatience) == std::future_status::ready;
  CHECK(answered);
  rig.storage_gate.Release();
  meanwhile.get();
  absl::Status deleted = del.get();
  INFO(deleted.ToString());
  CHECK(deleted.ok());

  // Either absent, or COMMITTED and bit-exact: never a committed checkpoint without its data.
  absl::StatusOr<v1::CheckpointSummary> s = rig.Status(1);
  if (s.ok()) {
    CHECK(s->state() == v1::COMMITTED);
    CHECK(rig.LoadCheck(1, 0x22).ok());
  } else {
    CHECK(s.status().code() == absl::StatusCode::kNotFound);
    CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(1)));
  }
  CHECK(s.status().code() == absl::StatusCode::kNotFound);  // this interleaving: the delete won
  // Once the delete is done the step saves again and loads bit-exact.
  REQUIRE(rig.SaveCommitted(1, 0x44).ok());
  CHECK(rig.LoadCheck(1, 0x44).ok());
}

TEST_CASE("recovery: a delete's synced tombstone write does not hold the service lock",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  rig.meta_gate.Arm(keys::Checkpoint(kJob, 1));  // the first synced write of step 1's row
  auto del = std::async(std::launch::async, [&] { return rig.Delete(1); });
  const bool reached = rig.meta_gate.WaitReached();
  CHECK(reached);
  auto meanwhile = std::async(std::launch::async, [&] {
    CHECK(rig.LoadCheck(2, 0x22).ok());
    CHECK(rig.Save(1, 0x55).code() == absl::StatusCode::kAborted);
    auto latest = rig.Latest();
    CHECK(latest.ok());
  });
  const bool answered = meanwhile.wait_for(kPatience) == std::future_status::ready;
  CHECK(answered);
  rig.meta_gate.Release();
  meanwhile.get();
  CHECK(del.get().ok());
  CHECK(rig.Status(1).status().code() == absl::StatusCode::kNotFound);
  CHECK(rig.LoadCheck(2, 0x22).ok());
}

TEST_CASE("recovery: a delete that failed half way is finished by Delete or by a restart",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  const bool manifest_first = GENERATE(true, false);
  const bool restart = GENERATE(true, false);
  CAPTURE(manifest_first, restart);
  // Fail the removal of the manifest, or of the directory after it, as a crash there would stop
  // the delete.
  rig.storage_gate.Arm(manifest_first ? rig.StepPath(2) + "/" + kManifestFileName : rig.StepPath(2),
                       absl::DataLossError("injected EIO"));
  absl::Status failed = rig.Delete(2);
  INFO(failed.ToString());
  REQUIRE_FALSE(failed.ok());
  CHECK(Contains(failed, "DELETING"));
  CHECK(rig.State(2) == v1::DELETING);
  absl::StatusOr<uint64_t> latest = rig.Latest();  // never the half-deleted one
  CHECK((latest.ok() && *latest == 1));
  CHECK_FALSE(rig.Save(2, 0x33).ok());
  if (restart) {
    rig.Restart();
    REQUIRE(rig.recovered.ok());
  } else {
    CHECK(rig.Delete(2).ok());
  }
  CHECK(rig.Status(2).status().code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(2)));
  CHECK(rig.LoadCheck(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x33).ok());
  CHECK(rig.LoadCheck(2, 0x33).ok());
}

// A client of uid 4321 (not the test's, which may be root) on connection `connection`.
std::pair<Caller, std::string> UserSession(Rig& rig, uint64_t connection) {
  Caller user{4321, 4321, 0, connection, false};
  v1::HelloRequest h;
  v1::HelloResponse hr;
  REQUIRE(rig.svc->Hello(user, h, &hr).ok());
  REQUIRE(rig.svc->Attach(user, hr.session_id()).ok());
  return {user, hr.session_id()};
}

// Rank `rank` of 2 of `step` as `user`: rows [32 * rank, 32 * rank + 32) of "w", every byte
// `fill`.
absl::Status SaveHalf(Rig& rig, const std::pair<Caller, std::string>& user, uint64_t step,
                      uint32_t rank, uint8_t fill) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(user.second);
  rr.add_sizes_bytes(32 * 64 * 4);
  v1::ReserveExtentsResponse ext;
  CKPTD_RETURN_IF_ERROR(rig.svc->ReserveExtents(user.first, rr, &ext));
  std::memset(rig.arena->At(user.first.uid, 0) + ext.extents(0).offset(), fill, 32 * 64 * 4);
  v1::SaveRequest req;
  req.set_session_id(user.second);
  req.set_job(kJob);
  req.set_step(step);
  req.set_rank(rank);
  req.set_world_size(2);
  v1::ShardSpec* s = req.add_shards();
  s->set_item("w");
  s->mutable_tensor()->set_dtype(v1::FLOAT32);
  s->mutable_tensor()->add_global_shape(64);
  s->mutable_tensor()->add_global_shape(64);
  v1::Box* box = s->mutable_tensor()->mutable_region()->mutable_box();
  box->add_offsets(32 * rank);
  box->add_offsets(0);
  box->add_lengths(32);
  box->add_lengths(64);
  s->mutable_data()->set_extent_id(ext.extents(0).id());
  s->mutable_data()->set_length(32 * 64 * 4);
  v1::SaveResponse resp;
  return rig.svc->Save(user.first, req, &resp);
}

uint32_t JobOwnerUid(Rig& rig) {
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  REQUIRE(rig.svc->ListJobs(rig.caller, req, &resp).ok());
  for (const v1::JobSummary& j : resp.jobs()) {
    if (j.job() == kJob) return j.owner_uid();
  }
  FAIL("job not listed");
  return 0;
}

// Found by the simulation (simulation_test.cc): a checkpoint resumed at a restart had no owner
// (uid 0), so its owner could not add the missing ranks (PERMISSION_DENIED), and its next journal
// write (a partial commit) recorded uid 0 as the job's owner, locking the owner out of the job.
TEST_CASE("recovery: a checkpoint resumed at a restart keeps its owner", "[unit][fault]") {
  Rig rig;
  auto user = UserSession(rig, 77);
  REQUIRE(SaveHalf(rig, user, 1, 0, 0x11).ok());
  REQUIRE(SaveHalf(rig, user, 2, 0, 0x22).ok());
  rig.Restart(/*keep_arena=*/true);  // a crash: both resume from the arena
  REQUIRE(rig.recovered.ok());
  user = UserSession(rig, 78);
  absl::Status st = SaveHalf(rig, user, 1, 1, 0x11);
  INFO(st.ToString());
  REQUIRE(st.ok());
  REQUIRE(rig.Wait(1).ok());
  CHECK(rig.LoadCheck(1, 0x11).ok());
  v1::CommitRequest commit;
  commit.set_job(kJob);
  commit.set_step(2);
  commit.set_partial(true);
  v1::CheckpointStatus resp;
  REQUIRE(rig.svc->Commit(user.first, commit, &resp).ok());
  REQUIRE(rig.Wait(2).ok());
  CHECK(JobOwnerUid(rig) == 4321);
}

TEST_CASE("recovery: stray files and directories in the data dir are skipped, the daemon starts",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  const std::string data = rig.dir + "/data";
  std::ofstream(data + "/notes.txt") << "operator notes\n";
  std::filesystem::create_directories(data + "/.hidden");
  std::filesystem::create_directories(data + "/bad name!");
  std::ofstream(data + "/" + kJob + "/notes") << "more notes\n";
  std::filesystem::create_directories(data + "/" + kJob + "/step-12");
  std::ofstream(rig.StepDirOnDisk(9)) << "a file where a step directory would be\n";
  // A directory copied in with a manifest that does not verify: reported, never exposed.
  std::filesystem::create_directories(rig.StepDirOnDisk(5));
  std::ofstream(rig.ManifestOnDisk(5)) << "not a manifest";
  rig.Restart();
  INFO(rig.recovered.ToString());
  REQUIRE(rig.recovered.ok());
  CHECK(rig.LoadCheck(1, 0x11).ok());
  CHECK(rig.Status(5).status().code() == absl::StatusCode::kNotFound);
  absl::StatusOr<uint64_t> latest = rig.Latest();
  CHECK((latest.ok() && *latest == 1));
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  CHECK(rig.LoadCheck(2, 0x22).ok());
  // Nothing stray was removed.
  CHECK(std::filesystem::exists(data + "/notes.txt"));
  CHECK(std::filesystem::exists(data + "/" + kJob + "/notes"));
}

TEST_CASE("recovery: index rows that do not parse are repaired or skipped, the daemon starts",
          "[unit][fault]") {
  Rig rig(/*use_rocks=*/true);
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  // While running: a broken row of a step with no data neither breaks latest nor the listing,
  // and can be deleted.
  rig.PutRaw(keys::Checkpoint(kJob, 8), kGarbage);
  absl::StatusOr<uint64_t> latest = rig.Latest();
  INFO(latest.status().ToString());
  CHECK((latest.ok() && *latest == 2));
  auto listed = rig.List();
  CHECK(listed.size() == 3);
  CHECK(listed[8].state() == v1::CHECKPOINT_STATE_UNSPECIFIED);
  CHECK(listed[8].error().find("does not parse") != std::string::npos);
  CHECK(rig.Delete(8).ok());

  // Across a restart: the row of step 1 (its manifest is there) is rebuilt from the manifest; the
  // row of step 7 (nothing on storage) becomes ABORTED; a key that names no checkpoint is left.
  rig.PutRaw(keys::Checkpoint(kJob, 1), kGarbage);
  rig.PutRaw(keys::Checkpoint(kJob, 7), kGarbage);
  const std::string stray_key = keys::CheckpointPrefix(kJob) + "short";
  rig.PutRaw(stray_key, kGarbage);
  rig.Restart();
  INFO(rig.recovered.ToString());
  REQUIRE(rig.recovered.ok());
  CHECK(rig.State(1) == v1::COMMITTED);
  CHECK(rig.LoadCheck(1, 0x11).ok());
  CHECK(rig.LoadCheck(2, 0x22).ok());
  CHECK(rig.State(7) == v1::ABORTED);
  latest = rig.Latest();
  CHECK((latest.ok() && *latest == 2));
  listed = rig.List();
  CHECK(listed.size() == 3);  // 1, 2 and 7; the stray key is no checkpoint of the job
  CHECK(rig.Delete(7).ok());
}

TEST_CASE("recovery: a corrupt newest manifest is CORRUPT, latest falls back, load says DATA_LOSS",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  const std::string manifest = rig.ManifestOnDisk(2);
  const std::string saved = rig.dir + "/manifest-2.copy";
  std::filesystem::copy_file(manifest, saved);
  rig.Stop();
  FlipByte(manifest, std::filesystem::file_size(manifest) / 2);
  rig.Start();
  INFO(rig.recovered.ToString());
  REQUIRE(rig.recovered.ok());

  absl::StatusOr<v1::CheckpointSummary> s = rig.Status(2);
  REQUIRE(s.ok());
  CHECK(s->state() == v1::CORRUPT);
  CHECK(s->error().find("manifest") != std::string::npos);
  auto listed = rig.List();
  CHECK(listed[1].state() == v1::COMMITTED);
  CHECK(listed[2].state() == v1::CORRUPT);
  absl::StatusOr<uint64_t> latest = rig.Latest();
  CHECK((latest.ok() && *latest == 1));
  uint64_t loaded = 0;
  CHECK(rig.LoadCheck(std::nullopt, 0x11, &loaded).ok());  // restoring "latest" falls back
  CHECK(loaded == 1);
  absl::Status by_number = rig.LoadCheck(2, 0x22);
  INFO(by_number.ToString());
  CHECK(by_number.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(by_number, "CORRUPT"));
  // A re-save of the step is refused until the corrupt one is deleted.
  CHECK_FALSE(rig.Save(2, 0x33).ok());

  SECTION("an operator restores the manifest: the next start adopts it back") {
    rig.Stop();
    std::filesystem::copy_file(saved, manifest, std::filesystem::copy_options::overwrite_existing);
    rig.Start();
    REQUIRE(rig.recovered.ok());
    CHECK(rig.State(2) == v1::COMMITTED);
    latest = rig.Latest();
    CHECK((latest.ok() && *latest == 2));
    CHECK(rig.LoadCheck(2, 0x22).ok());
  }
  SECTION("it is deleted and the step saved again") {
    CHECK(rig.Delete(2).ok());
    REQUIRE(rig.SaveCommitted(2, 0x33).ok());
    CHECK(rig.LoadCheck(std::nullopt, 0x33, &loaded).ok());
    CHECK(loaded == 2);
  }
}

TEST_CASE(
    "recovery: only the newest manifests are verified at start, an older corrupt one "
    "fails its load with DATA_LOSS",
    "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  rig.Stop();
  FlipByte(rig.ManifestOnDisk(1), std::filesystem::file_size(rig.ManifestOnDisk(1)) / 2);
  rig.Start();
  REQUIRE(rig.recovered.ok());
  CHECK(rig.State(2) == v1::COMMITTED);
  CHECK(rig.LoadCheck(2, 0x22).ok());
  absl::Status old = rig.LoadCheck(1, 0x11);
  INFO(old.ToString());
  CHECK(old.code() == absl::StatusCode::kDataLoss);
  // Once the newest is gone, latest reaches step 1, finds it corrupt and marks it.
  REQUIRE(rig.Delete(2).ok());
  absl::StatusOr<uint64_t> latest = rig.Latest();
  CHECK(latest.status().code() == absl::StatusCode::kNotFound);
  CHECK(rig.State(1) == v1::CORRUPT);
}

// Issue 33 §3: a COMMITTED checkpoint whose manifest vanished, with no other tier holding a
// copy, was ABORTED at the next start and its blobs removed. Removing data is the operator's
// call: it is MISSING, its files and rows stay, latest skips it, a load is DATA_LOSS naming the
// state; the manifest put back makes it COMMITTED again; Delete removes it.
TEST_CASE("recovery: a committed checkpoint whose manifest vanished is MISSING, its files kept",
          "[unit][fault]") {
  Rig rig;
  REQUIRE(rig.SaveCommitted(1, 0x11).ok());
  REQUIRE(rig.SaveCommitted(2, 0x22).ok());
  const std::string manifest = rig.ManifestOnDisk(2);
  const std::string saved = rig.dir + "/manifest-2.copy";
  std::filesystem::copy_file(manifest, saved);
  rig.Stop();
  std::filesystem::remove(manifest);
  rig.Start();
  INFO(rig.recovered.ToString());
  REQUIRE(rig.recovered.ok());

  absl::StatusOr<v1::CheckpointSummary> s = rig.Status(2);
  REQUIRE(s.ok());
  CHECK(s->state() == v1::MISSING);
  CHECK(s->error().find(kManifestFileName) != std::string::npos);
  CHECK(std::filesystem::exists(rig.StepDirOnDisk(2) + "/" + BlobName(0)));  // evidence kept
  auto listed = rig.List();
  CHECK(listed[1].state() == v1::COMMITTED);
  CHECK(listed[2].state() == v1::MISSING);
  absl::StatusOr<uint64_t> latest = rig.Latest();
  CHECK((latest.ok() && *latest == 1));
  uint64_t loaded = 0;
  CHECK(rig.LoadCheck(std::nullopt, 0x11, &loaded).ok());
  CHECK(loaded == 1);
  absl::Status by_number = rig.LoadCheck(2, 0x22);
  INFO(by_number.ToString());
  CHECK(by_number.code() == absl::StatusCode::kDataLoss);
  CHECK(Contains(by_number, "MISSING"));
  CHECK(rig.Save(2, 0x33).code() == absl::StatusCode::kDataLoss);  // never saved over

  SECTION("a second start keeps it MISSING and its files") {
    rig.Restart();
    REQUIRE(rig.recovered.ok());
    CHECK(rig.State(2) == v1::MISSING);
    CHECK(std::filesystem::exists(rig.StepDirOnDisk(2) + "/" + BlobName(0)));
  }
  SECTION("an operator puts the manifest back: the next start makes it COMMITTED") {
    rig.Stop();
    std::filesystem::copy_file(saved, manifest);
    rig.Start();
    REQUIRE(rig.recovered.ok());
    CHECK(rig.State(2) == v1::COMMITTED);
    CHECK(rig.LoadCheck(2, 0x22).ok());
    latest = rig.Latest();
    CHECK((latest.ok() && *latest == 2));
  }
  SECTION("a manifest put back that does not verify makes it CORRUPT") {
    rig.Stop();
    std::filesystem::copy_file(saved, manifest);
    FlipByte(manifest, std::filesystem::file_size(manifest) / 2);
    rig.Start();
    REQUIRE(rig.recovered.ok());
    CHECK(rig.State(2) == v1::CORRUPT);
    CHECK(std::filesystem::exists(rig.StepDirOnDisk(2) + "/" + BlobName(0)));
  }
  SECTION("Delete removes it, and the step can be saved again") {
    CHECK(rig.Delete(2).ok());
    CHECK_FALSE(std::filesystem::exists(rig.StepDirOnDisk(2)));
    REQUIRE(rig.SaveCommitted(2, 0x33).ok());
    CHECK(rig.LoadCheck(2, 0x33).ok());
  }
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

// An item row that does not parse is DATA_LOSS naming the item, whether the item is asked for
// by name or found by a listing (its parse result was ignored: an empty item was answered).
TEST_CASE("inspect: an item row that does not parse is DATA_LOSS naming the item", "[unit]") {
  Rig rig;
  REQUIRE(rig.Save(1, 0x33).ok());
  REQUIRE(rig.Wait(1).ok());
  MetaStore::Write w{keys::Item(kJob, 1, "w"), std::string("\xff\xff\xff garbage", 12)};
  REQUIRE(rig.meta->Commit({&w, 1}, true).ok());
  v1::InspectRequest req;
  req.set_job(kJob);
  req.set_step(1);
  v1::InspectResponse resp;
  absl::Status listed = rig.svc->Inspect(rig.caller, req, &resp);
  CHECK(listed.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(listed.message()).find("item \"w\"") != std::string::npos);
  req.add_items("w");
  resp.Clear();
  absl::Status named = rig.svc->Inspect(rig.caller, req, &resp);
  CHECK(named.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(named.message()).find("item \"w\"") != std::string::npos);
}

}  // namespace
}  // namespace ckptd
