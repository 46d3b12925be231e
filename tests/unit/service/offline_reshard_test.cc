// Offline reshard of CheckpointService in-process (service_rig.h): a replicated object stored by
// a rank beyond the target's world, a new target job's owner, a service destroyed right after a
// reshard commits, and Wait answering a target only once its reshard is over. The end-to-end
// cases against the real daemon are tests/integration/offline_reshard_test.cc.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>

#include "format/blob_layout.h"
#include "format/manifest.h"
#include "format/names.h"
#include "service_rig.h"

namespace ckptd {
namespace {

using namespace ckptd::testing;

constexpr char kObject[] = "extra.optim";  // a REPLICATED object, 1000 bytes
constexpr uint64_t kObjectBytes = 1000;

// A client: its caller and session.
struct User {
  Caller caller;
  std::string session;
};

User RigUser(const Rig& rig) { return User{rig.caller, rig.session}; }

// A client of uid 4321 (not the test's, which may be root, the daemon's own uid).
User OtherUser(Rig& rig) {
  User u{Caller{4321, 4321, 0, 99, false}, ""};
  v1::HelloRequest h;
  v1::HelloResponse hr;
  REQUIRE(rig.svc->Hello(u.caller, h, &hr).ok());
  REQUIRE(rig.svc->Attach(u.caller, hr.session_id()).ok());
  u.session = hr.session_id();
  return u;
}

// Rank `rank` of 2 of `step` by `u`: rows [32 * rank, 32 * rank + 32) of "w" (float32 [64, 64])
// and the replicated object, every byte `fill`.
absl::Status SaveRank(Rig& rig, const User& u, uint64_t step, uint32_t rank, uint8_t fill) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(u.session);
  rr.add_sizes_bytes(32 * 64 * 4);
  rr.add_sizes_bytes(kObjectBytes);
  v1::ReserveExtentsResponse ext;
  CKPTD_RETURN_IF_ERROR(rig.svc->ReserveExtents(u.caller, rr, &ext));
  std::memset(rig.arena->At(u.caller.uid, 0) + ext.extents(0).offset(), fill, 32 * 64 * 4);
  std::memset(rig.arena->At(u.caller.uid, 0) + ext.extents(1).offset(), fill, kObjectBytes);
  v1::SaveRequest req;
  req.set_session_id(u.session);
  req.set_job(kJob);
  req.set_step(step);
  req.set_rank(rank);
  req.set_world_size(2);
  v1::ShardSpec* t = req.add_shards();
  t->set_item("w");
  t->mutable_tensor()->set_dtype(v1::FLOAT32);
  t->mutable_tensor()->add_global_shape(64);
  t->mutable_tensor()->add_global_shape(64);
  v1::Box* box = t->mutable_tensor()->mutable_region()->mutable_box();
  box->add_offsets(32 * rank);
  box->add_offsets(0);
  box->add_lengths(32);
  box->add_lengths(64);
  t->mutable_data()->set_extent_id(ext.extents(0).id());
  t->mutable_data()->set_length(32 * 64 * 4);
  v1::ShardSpec* o = req.add_shards();
  o->set_item(kObject);
  o->mutable_object()->set_scope(v1::REPLICATED);
  o->mutable_data()->set_extent_id(ext.extents(1).id());
  o->mutable_data()->set_length(kObjectBytes);
  v1::SaveResponse resp;
  return rig.svc->Save(u.caller, req, &resp);
}

// Loads the object of (job, step) as `u` and checks every byte is `fill`.
absl::Status LoadObject(Rig& rig, const User& u, const std::string& job, uint64_t step,
                        uint8_t fill) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(u.session);
  rr.add_sizes_bytes(kObjectBytes);
  v1::ReserveExtentsResponse ext;
  CKPTD_RETURN_IF_ERROR(rig.svc->ReserveExtents(u.caller, rr, &ext));
  uint8_t* dst = rig.arena->At(u.caller.uid, 0) + ext.extents(0).offset();
  std::memset(dst, ~fill, kObjectBytes);
  v1::LoadRequest load;
  load.set_session_id(u.session);
  load.set_job(job);
  load.set_step(step);
  v1::LoadItemRequest* item = load.add_items();
  item->set_item(kObject);
  item->mutable_dest()->set_extent_id(ext.extents(0).id());
  item->mutable_dest()->set_length(kObjectBytes);
  v1::LoadResponse resp;
  CKPTD_RETURN_IF_ERROR(rig.svc->Load(u.caller, load, &resp));
  if (resp.items(0).saved_by_rank() != 0) return absl::InternalError("not saved by rank 0");
  for (uint64_t i = 0; i < kObjectBytes; ++i) {
    if (dst[i] != fill) return absl::DataLossError(absl::StrCat("byte ", i, " differs"));
  }
  return absl::OkStatus();
}

absl::Status Reshard(Rig& rig, const User& u, uint64_t step, const std::string& target_job,
                     uint64_t target_step, const std::string& spec) {
  v1::ReshardRequest req;
  req.set_job(kJob);
  req.set_step(step);
  req.set_target_job(target_job);
  req.set_target_step(target_step);
  req.set_spec(spec);
  v1::CheckpointStatus resp;
  return rig.svc->Reshard(u.caller, req, &resp);
}

// Found by the simulation (simulation_test.cc): the copy of a replicated object kept the rank
// that stored it in the source, which may be beyond the target's world size; the target's
// manifest did not validate and every such reshard was ABORTED.
TEST_CASE("offline reshard: a replicated object stored by a rank beyond the target's world",
          "[unit]") {
  Rig rig;
  const User u = RigUser(rig);
  REQUIRE(SaveRank(rig, u, 1, 1, 0x11).ok());  // rank 1 first: it stores the object
  REQUIRE(SaveRank(rig, u, 1, 0, 0x11).ok());
  REQUIRE(rig.Wait(1).ok());
  REQUIRE(Reshard(rig, u, 1, kJob, 2, "consolidated").ok());  // a world of 1
  absl::Status done = rig.Wait(2);
  INFO(done.ToString());
  REQUIRE(done.ok());
  CHECK(rig.LoadCheck(2, 0x11).ok());
  absl::Status loaded = LoadObject(rig, u, kJob, 2, 0x11);
  INFO(loaded.ToString());
  CHECK(loaded.ok());
}

// Found by the simulation: a reshard into a job that did not exist left the job's owner to the
// commit, which records the daemon's own uid; the caller could not read its own reshard.
TEST_CASE("offline reshard: a new target job belongs to the caller", "[unit]") {
  Rig rig;
  const User u = OtherUser(rig);
  REQUIRE(SaveRank(rig, u, 1, 0, 0x22).ok());
  REQUIRE(SaveRank(rig, u, 1, 1, 0x22).ok());
  REQUIRE(rig.Wait(1).ok());
  REQUIRE(Reshard(rig, u, 1, "new-job", 5, "rows:4").ok());
  v1::WaitRequest w;
  w.set_job("new-job");
  w.set_step(5);
  w.set_timeout_ms(10000);
  v1::CheckpointStatus st;
  REQUIRE(rig.svc->Wait(u.caller, w, &st).ok());
  absl::Status loaded = LoadObject(rig, u, "new-job", 5, 0x22);
  INFO(loaded.ToString());
  CHECK(loaded.ok());
  v1::ListJobsResponse jobs;
  REQUIRE(rig.svc->ListJobs(u.caller, v1::ListJobsRequest(), &jobs).ok());
  for (const v1::JobSummary& j : jobs.jobs()) {
    if (j.job() == "new-job") CHECK(j.owner_uid() == 4321);
  }
}

// Found by the simulation: the reshard's thread cached the target's manifest after it had left
// the running reshards, so Shutdown did not wait for it and a service destroyed right after a
// reshard committed could be written to (heap corruption; ASan names it).
TEST_CASE("offline reshard: the service may be destroyed as soon as a reshard commits", "[unit]") {
  Rig rig;
  const User u = RigUser(rig);
  REQUIRE(SaveRank(rig, u, 1, 0, 0x33).ok());
  REQUIRE(SaveRank(rig, u, 1, 1, 0x33).ok());
  REQUIRE(rig.Wait(1).ok());
  for (uint64_t target = 2; target < 22; ++target) {
    REQUIRE(Reshard(rig, RigUser(rig), 1, kJob, target, "rows:2").ok());
    REQUIRE(rig.Wait(target).ok());
    rig.Restart();  // at once
    REQUIRE(rig.recovered.ok());
  }
  CHECK(LoadObject(rig, RigUser(rig), kJob, 21, 0x33).ok());
}

// Found by the simulation: Wait answered a reshard's target (COMMITTED, or ABORTED) while the
// reshard was still registered as running, so a Delete right after was refused as "being
// written (a reshard)" and an Abort "cancelled" a committed checkpoint.
TEST_CASE("offline reshard: once Wait answers the target, the reshard is over", "[unit]") {
  Rig rig(false, nullptr, "/dev/shm");  // fast storage: the reshard ends right as Wait starts
  const User u = RigUser(rig);
  REQUIRE(SaveRank(rig, u, 1, 0, 0x44).ok());
  REQUIRE(SaveRank(rig, u, 1, 1, 0x44).ok());
  REQUIRE(rig.Wait(1).ok());
  // Other checkpoints commit meanwhile: each wakes every Wait, also between a reshard's last row
  // and its end.
  std::atomic<bool> stop{false};
  std::thread others([&] {
    for (uint64_t step = 1000; !stop.load(); ++step) {
      if (!rig.SaveCommitted(step, 0x55).ok()) break;
    }
  });
  for (uint64_t target = 2; target < 102; ++target) {
    REQUIRE(Reshard(rig, u, 1, kJob, target, "consolidated").ok());
    if (target % 2 == 0) {  // cancelled: it ends ABORTED (or COMMITTED, when it was done)
      v1::AbortRequest req;
      req.set_job(kJob);
      req.set_step(target);
      v1::CheckpointStatus resp;
      absl::Status aborted = rig.svc->Abort(rig.caller, req, &resp);
      CHECK((aborted.ok() || absl::IsFailedPrecondition(aborted)));  // or it was over already
    }
    absl::Status waited = rig.Wait(target);
    CHECK((waited.ok() || absl::IsAborted(waited)));
    absl::Status deleted = rig.Delete(target);
    INFO("target " << target << ": " << deleted.ToString());
    CHECK(deleted.ok());
    if (!deleted.ok()) break;
  }
  stop = true;
  others.join();
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

std::vector<uint8_t> ReadWholeFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// Every blob of the checkpoint on disk is what format/blob_layout.h says, byte for byte: its
// shards at the offsets the layout gives them in blob order, zero padding, the file exactly the
// manifest's size, every block crc right.
void CheckBlobsFollowTheLayout(Rig& rig, const std::string& job, uint64_t step) {
  const std::string dir = rig.options.data_dir + "/" + CheckpointDir(job, step);
  std::vector<uint8_t> bytes = ReadWholeFile(dir + "/" + kManifestFileName);
  auto m = DecodeManifest(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), dir);
  REQUIRE(m.ok());
  std::map<uint32_t, std::vector<const v1::ShardEntry*>> by_blob;
  for (const v1::ItemEntry& item : m->items) {
    for (const v1::ShardEntry& s : item.shards()) by_blob[s.blob_id()].push_back(&s);
  }
  for (const v1::BlobInfo& info : m->header.blobs()) {
    INFO(dir << "/" << info.name());
    CHECK(info.SerializeAsString() ==
          MakeBlobInfo(info.id(), info.size_bytes()).SerializeAsString());
    std::vector<const v1::ShardEntry*> shards = by_blob[info.id()];
    std::stable_sort(shards.begin(), shards.end(), [](auto* a, auto* b) {
      return std::make_pair(a->length() > 0, a->offset()) <
             std::make_pair(b->length() > 0, b->offset());
    });
    BlobLayout layout;
    std::vector<ShardPlacement> placed;
    for (const v1::ShardEntry* s : shards) {
      placed.push_back(*layout.Append(s->length()));
      CHECK(placed.back().offset == s->offset());
    }
    CHECK(layout.size_bytes() == info.size_bytes());
    std::vector<uint8_t> blob = ReadWholeFile(dir + "/" + info.name());
    CHECK(VerifyBlobPadding(blob, info.size_bytes(), placed, info.name()).ok());
    for (const v1::ShardEntry* s : shards) {
      CHECK(VerifyShardBytes(blob, 0, *s, m->header.checksum_block_bytes(), info.name()).ok());
    }
  }
}

// The flush and the reshard both write blobs through format/blob_layout.h: the blobs of a saved
// checkpoint and of its reshards into other layouts are exactly what the layout defines.
TEST_CASE("offline reshard: saved and resharded blobs follow the blob layout", "[unit]") {
  Rig rig;
  const User u = RigUser(rig);
  REQUIRE(SaveRank(rig, u, 1, 0, 0x61).ok());
  REQUIRE(SaveRank(rig, u, 1, 1, 0x61).ok());
  REQUIRE(rig.Wait(1).ok());
  CheckBlobsFollowTheLayout(rig, kJob, 1);
  uint64_t target = 2;
  for (const char* spec : {"consolidated", "rows:4", "rows:3"}) {
    INFO(spec);
    REQUIRE(Reshard(rig, u, 1, kJob, target, spec).ok());
    REQUIRE(rig.Wait(target).ok());
    CheckBlobsFollowTheLayout(rig, kJob, target);
    CHECK(LoadObject(rig, u, kJob, target, 0x61).ok());
    ++target;
  }
}

}  // namespace
}  // namespace ckptd
