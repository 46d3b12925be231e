// Job ownership in the service (service/owners.cc, docs/SECURITY.md "Ownership"): the first Save
// of a job claims it with a synced owner row before it opens anything; another uid's first Save
// arriving while that claim is in flight waits for it and is refused — the two never both claim
// (issue 33 §1: two uids racing the first saves of a job name both committed, and the owner was
// whichever journal write landed last). Deterministic: the claim's write is held at the index.
#include <chrono>
#include <future>

#include "service_rig.h"

namespace ckptd::testing {
namespace {

// A session of another, non-admin uid on the rig's service.
struct OtherUid {
  OtherUid(Rig& r, uint32_t uid) : rig(r), caller{uid, uid, getpid(), 2, false} {
    v1::HelloRequest h;
    h.set_pid(getpid());
    v1::HelloResponse hr;
    REQUIRE(rig.svc->Hello(caller, h, &hr).ok());
    session = hr.session_id();
    REQUIRE(rig.svc->Attach(caller, session).ok());
  }
  absl::Status Save(uint64_t step, uint8_t fill) {
    v1::ReserveExtentsRequest rr;
    rr.set_session_id(session);
    rr.add_sizes_bytes(Rig::kRows * 64 * 4);
    v1::ReserveExtentsResponse ext;
    CKPTD_RETURN_IF_ERROR(rig.svc->ReserveExtents(caller, rr, &ext));
    std::memset(rig.arena->At(caller.uid, 0) + ext.extents(0).offset(), fill, Rig::kRows * 64 * 4);
    v1::SaveRequest req = rig.SaveRequestOf(step, {Rig::kRows, 64});
    req.set_session_id(session);
    req.mutable_shards(0)->mutable_data()->set_extent_id(ext.extents(0).id());
    req.mutable_shards(0)->mutable_data()->set_length(Rig::kRows * 64 * 4);
    v1::SaveResponse resp;
    return rig.svc->Save(caller, req, &resp);
  }
  Rig& rig;
  Caller caller;
  std::string session;
};

TEST_CASE("owners: a second uid's first save during the first's claim waits for it, refused",
          "[unit]") {
  Rig rig;
  rig.meta_gate.Arm(keys::Job(kJob));  // the first Save's claim: its owner row's synced write
  auto first = std::async(std::launch::async, [&] { return rig.Save(1, 0x11); });
  REQUIRE(rig.meta_gate.WaitReached());
  OtherUid other(rig, rig.caller.uid + 1000);
  auto second = std::async(std::launch::async, [&] { return other.Save(2, 0x22); });
  // It waits for the claim in flight instead of claiming too (or reading "no owner").
  CHECK(second.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  rig.meta_gate.Release();
  REQUIRE(first.get().ok());
  const absl::Status refused = second.get();
  CHECK(absl::IsPermissionDenied(refused));
  CHECK(refused.message().find("belongs to uid " + std::to_string(rig.caller.uid)) !=
        std::string::npos);
  REQUIRE(rig.Wait(1).ok());
  CHECK(rig.LoadCheck(1, 0x11).ok());
  // The owner's later steps claim nothing; the other uid stays refused, staging nothing.
  CHECK(rig.SaveCommitted(3, 0x33).ok());
  CHECK(absl::IsPermissionDenied(other.Save(4, 0x44)));
  v1::ListCheckpointsRequest lr;
  lr.set_job(kJob);
  v1::ListCheckpointsResponse listed;
  REQUIRE(rig.svc->ListCheckpoints(rig.caller, lr, &listed).ok());
  CHECK(listed.checkpoints_size() == 2);  // steps 1 and 3
}

TEST_CASE("owners: a claim whose owner row cannot be written claims nothing", "[unit][fault]") {
  Rig rig;
  rig.meta_gate.Arm(keys::Job(kJob), absl::ResourceExhaustedError("index full (test)"));
  const absl::Status failed = rig.Save(1, 0x11);
  CHECK(absl::IsResourceExhausted(failed));
  CHECK(failed.message().find("recording the owner of job") != std::string::npos);
  // Nothing was opened or owned: another uid's first Save claims the job.
  OtherUid other(rig, rig.caller.uid + 1000);
  CHECK(other.Save(2, 0x22).ok());
  CHECK(absl::IsPermissionDenied(rig.Save(3, 0x33)));  // root may read it, never write it
}

}  // namespace
}  // namespace ckptd::testing
