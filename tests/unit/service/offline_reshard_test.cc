// Offline reshard of CheckpointService in-process (service_rig.h); the end-to-end cases against
// the real daemon are tests/integration/offline_reshard_test.cc.
#include <catch2/catch.hpp>
#include <cstring>

#include "service_rig.h"

namespace ckptd {
namespace {

using namespace ckptd::testing;

constexpr char kObject[] = "extra.optim";  // a REPLICATED object, 1000 bytes
constexpr uint64_t kObjectBytes = 1000;

// Rank `rank` of 2 of `step`: rows [32 * rank, 32 * rank + 32) of "w" (float32 [64, 64]) and the
// replicated object, every byte `fill`.
absl::Status SaveRank(Rig& rig, uint64_t step, uint32_t rank, uint8_t fill) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(rig.session);
  rr.add_sizes_bytes(32 * 64 * 4);
  rr.add_sizes_bytes(kObjectBytes);
  v1::ReserveExtentsResponse ext;
  CKPTD_RETURN_IF_ERROR(rig.svc->ReserveExtents(rig.caller, rr, &ext));
  std::memset(rig.arena->base() + ext.extents(0).offset(), fill, 32 * 64 * 4);
  std::memset(rig.arena->base() + ext.extents(1).offset(), fill, kObjectBytes);
  v1::SaveRequest req;
  req.set_session_id(rig.session);
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
  return rig.svc->Save(rig.caller, req, &resp);
}

// Found by the simulation (simulation_test.cc): the copy of a replicated object kept the rank
// that stored it in the source, which may be beyond the target's world size; the target's
// manifest did not validate and every such reshard was ABORTED.
TEST_CASE("offline reshard: a replicated object stored by a rank beyond the target's world",
          "[unit]") {
  Rig rig;
  REQUIRE(SaveRank(rig, 1, 1, 0x11).ok());  // rank 1 first: it stores the object
  REQUIRE(SaveRank(rig, 1, 0, 0x11).ok());
  REQUIRE(rig.Wait(1).ok());
  v1::ReshardRequest req;
  req.set_job(kJob);
  req.set_step(1);
  req.set_target_step(2);
  req.set_spec("consolidated");  // a world of 1
  v1::CheckpointStatus resp;
  REQUIRE(rig.svc->Reshard(rig.caller, req, &resp).ok());
  absl::Status done = rig.Wait(2);
  INFO(done.ToString());
  REQUIRE(done.ok());
  CHECK(rig.LoadCheck(2, 0x11).ok());

  v1::ReserveExtentsRequest rr;
  rr.set_session_id(rig.session);
  rr.add_sizes_bytes(kObjectBytes);
  v1::ReserveExtentsResponse ext;
  REQUIRE(rig.svc->ReserveExtents(rig.caller, rr, &ext).ok());
  uint8_t* dst = rig.arena->base() + ext.extents(0).offset();
  std::memset(dst, 0, kObjectBytes);
  v1::LoadRequest load;
  load.set_session_id(rig.session);
  load.set_job(kJob);
  load.set_step(2);
  v1::LoadItemRequest* item = load.add_items();
  item->set_item(kObject);
  item->mutable_dest()->set_extent_id(ext.extents(0).id());
  item->mutable_dest()->set_length(kObjectBytes);
  v1::LoadResponse lresp;
  REQUIRE(rig.svc->Load(rig.caller, load, &lresp).ok());
  CHECK(lresp.items(0).saved_by_rank() == 0);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < kObjectBytes; ++i) wrong += dst[i] != 0x11;
  CHECK(wrong == 0);
}

}  // namespace
}  // namespace ckptd
