// The control-plane simulation's calls into CheckpointService (simulation_test.cc), made as a
// client would make them: each client is its own connection (Caller) with a session from Hello
// bound by Attach; a rank reserves arena extents, copies its shards in and names them in Save; a
// load reserves destination extents, loads into them and releases them. Every function returns
// the service's answer unchanged, so the simulation judges the code; byte checks are reported
// apart (*mismatch), never as a service error.
//
// Threads: a Client is used by one thread at a time; distinct clients may call concurrently.
#pragma once

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service_rig.h"
#include "simulation_model.h"

namespace ckptd::sim {

// One client process: its connection and session, and the extents it reserved and still holds
// (written, not yet named in a Save).
struct Client {
  Caller caller;
  std::string session;
  std::vector<uint64_t> held;
};

class Calls {
 public:
  explicit Calls(testing::Rig* rig) : rig_(rig) {}
  CheckpointService& svc() { return *rig_->svc; }

  // Hello on `connection` as `uid`; Attach unless `attach` is false (a client that dies before it
  // attaches).
  absl::Status Connect(Client& c, uint32_t uid, uint64_t connection, bool attach = true) {
    c.caller = Caller{uid, uid, 0, connection, false};
    c.held.clear();
    v1::HelloRequest h;
    h.set_client_name("simulation");
    v1::HelloResponse hr;
    CKPTD_RETURN_IF_ERROR(svc().Hello(c.caller, h, &hr));
    c.session = hr.session_id();
    return attach ? svc().Attach(c.caller, c.session) : absl::OkStatus();
  }

  // Reserves one extent per size, without waiting for space.
  absl::StatusOr<std::vector<v1::Extent>> Reserve(Client& c, const std::vector<uint64_t>& sizes) {
    v1::ReserveExtentsRequest rr;
    rr.set_session_id(c.session);
    rr.set_timeout_ms(1);
    for (uint64_t s : sizes) rr.add_sizes_bytes(s);
    v1::ReserveExtentsResponse resp;
    CKPTD_RETURN_IF_ERROR(svc().ReserveExtents(c.caller, rr, &resp));
    return std::vector<v1::Extent>(resp.extents().begin(), resp.extents().end());
  }
  absl::Status Release(Client& c, const std::vector<uint64_t>& ids) {
    v1::ReleaseExtentsRequest rel;
    rel.set_session_id(c.session);
    for (uint64_t id : ids) rel.add_extent_ids(id);
    return svc().ReleaseExtents(c.caller, rel);
  }

  // A Save of `rank`'s shards: reserved (one extent per shard, or all in one extent when
  // `one_extent`, packed at unaligned offsets), copied in, then Save — with `before_save` run
  // just before it (a race's other half). A refused Save gives its extents back (they may be
  // gone already: the checkpoint's abort or the session's end freed them).
  absl::Status SaveRank(Client& c, const std::string& job, uint64_t step, uint32_t world,
                        uint32_t rank, const std::vector<Shard>& shards, bool one_extent,
                        const std::function<void()>& before_save = nullptr) {
    std::vector<uint64_t> sizes, at;  // at: offset of each shard in its extent
    uint64_t total = 0;
    for (const Shard& s : shards) {
      at.push_back(one_extent ? total : 0);
      total += s.bytes.size() + (one_extent ? 8 : 0);  // a gap: shards start unaligned
      if (!one_extent) sizes.push_back(s.bytes.size());
    }
    if (one_extent) sizes = {total};
    CKPTD_ASSIGN_OR_RETURN(std::vector<v1::Extent> ext, Reserve(c, sizes));
    v1::SaveRequest req;
    req.set_session_id(c.session);
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_world_size(world);
    std::vector<uint64_t> ids;
    for (const v1::Extent& e : ext) ids.push_back(e.id());
    for (size_t i = 0; i < shards.size(); ++i) {
      const v1::Extent& e = ext[one_extent ? 0 : i];
      std::memcpy(rig_->arena->At(c.caller.uid, 0) + e.offset() + at[i], shards[i].bytes.data(),
                  shards[i].bytes.size());
      v1::ShardSpec* s = req.add_shards();
      *s = shards[i].spec;
      s->mutable_data()->set_extent_id(e.id());
      s->mutable_data()->set_offset(at[i]);
      s->mutable_data()->set_length(shards[i].bytes.size());
    }
    if (before_save) before_save();
    v1::SaveResponse resp;
    absl::Status st = svc().Save(c.caller, req, &resp);
    if (!st.ok()) Release(c, ids).IgnoreError();
    return st;
  }

  // Loads `asks` of (job, step) (nullopt: latest) and compares every byte; *loaded is the step
  // the daemon chose. A byte that differs sets *mismatch, naming the item and the offset.
  absl::Status Load(Client& c, const std::string& job, std::optional<uint64_t> step,
                    const std::vector<Ask>& asks, std::string* mismatch,
                    uint64_t* loaded = nullptr) {
    std::vector<uint64_t> sizes;
    for (const Ask& a : asks) sizes.push_back(std::max<uint64_t>(a.expect.size(), 1));
    CKPTD_ASSIGN_OR_RETURN(std::vector<v1::Extent> ext, Reserve(c, sizes));
    v1::LoadRequest req;
    req.set_session_id(c.session);
    req.set_job(job);
    if (step) req.set_step(*step);
    if (!step) req.set_latest(true);
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < asks.size(); ++i) {
      std::memset(rig_->arena->At(c.caller.uid, 0) + ext[i].offset(), 0xee, sizes[i]);
      v1::LoadItemRequest* it = req.add_items();
      *it = asks[i].req;
      it->mutable_dest()->set_extent_id(ext[i].id());
      it->mutable_dest()->set_length(asks[i].expect.size());
      ids.push_back(ext[i].id());
    }
    v1::LoadResponse resp;
    absl::Status st = svc().Load(c.caller, req, &resp);
    for (size_t i = 0; st.ok() && i < asks.size() && mismatch->empty(); ++i) {
      const uint8_t* got = rig_->arena->At(c.caller.uid, 0) + ext[i].offset();
      const std::string& want = asks[i].expect;
      for (size_t b = 0; b < want.size(); ++b) {
        if (got[b] != static_cast<uint8_t>(want[b])) {
          *mismatch = absl::StrCat("item \"", asks[i].req.item(), "\" byte ", b, " of ",
                                   want.size(), " is ", static_cast<int>(got[b]), ", saved ",
                                   static_cast<int>(static_cast<uint8_t>(want[b])));
          break;
        }
      }
    }
    if (st.ok() && loaded != nullptr) *loaded = resp.step();
    absl::Status released = Release(c, ids);
    if (!released.ok() && mismatch->empty()) {
      *mismatch = absl::StrCat("releasing load extents: ", released.ToString());
    }
    return st;
  }

  absl::Status Wait(const Caller& c, const std::string& job, uint64_t step, uint32_t timeout_ms,
                    v1::CheckpointStatus* out) {
    v1::WaitRequest w;
    w.set_job(job);
    w.set_step(step);
    w.set_timeout_ms(timeout_ms);
    return svc().Wait(c, w, out);
  }
  absl::StatusOr<v1::CheckpointStatus> Status(const Caller& c, const std::string& job,
                                              uint64_t step) {
    v1::GetStatusRequest req;
    req.set_job(job);
    req.set_step(step);
    v1::CheckpointStatus resp;
    CKPTD_RETURN_IF_ERROR(svc().GetStatus(c, req, &resp));
    return resp;
  }
  absl::Status Delete(const Caller& c, const std::string& job, uint64_t step) {
    v1::DeleteRequest req;
    req.set_job(job);
    req.set_step(step);
    return svc().Delete(c, req);
  }
  absl::Status Abort(const Caller& c, const std::string& job, uint64_t step) {
    v1::AbortRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_reason("simulation");
    v1::CheckpointStatus resp;
    return svc().Abort(c, req, &resp);
  }
  absl::Status CommitPartial(const Caller& c, const std::string& job, uint64_t step,
                             bool partial = true) {
    v1::CommitRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_partial(partial);
    v1::CheckpointStatus resp;
    return svc().Commit(c, req, &resp);
  }
  absl::Status Reshard(const Caller& c, const std::string& job, uint64_t step,
                       const std::string& target_job, uint64_t target_step,
                       const std::string& spec) {
    v1::ReshardRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_target_job(target_job);
    req.set_target_step(target_step);
    req.set_spec(spec);
    v1::CheckpointStatus resp;
    return svc().Reshard(c, req, &resp);
  }
  absl::StatusOr<uint64_t> Latest(const Caller& c, const std::string& job) {
    v1::LatestRequest req;
    req.set_job(job);
    v1::LatestResponse resp;
    CKPTD_RETURN_IF_ERROR(svc().Latest(c, req, &resp));
    return resp.step();
  }
  absl::StatusOr<std::vector<v1::CheckpointSummary>> List(const Caller& c, const std::string& job) {
    v1::ListCheckpointsRequest req;
    req.set_job(job);
    req.set_page_size(1000);
    v1::ListCheckpointsResponse resp;
    CKPTD_RETURN_IF_ERROR(svc().ListCheckpoints(c, req, &resp));
    return std::vector<v1::CheckpointSummary>(resp.checkpoints().begin(), resp.checkpoints().end());
  }

 private:
  testing::Rig* rig_;
};

}  // namespace ckptd::sim
