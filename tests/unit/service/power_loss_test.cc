// The crash-point matrix's power-loss variant, in-process (the kill -9 variant against the real
// daemon is tests/integration/crash_matrix_test.cc). CheckpointService runs over posix storage
// on a FaultIo with its power-loss model on and over a MemoryMetaStore (both model what a power
// loss keeps: fault_io.h, memory_meta_store.h). For every named crash point in turn, a sync-point
// callback fences the disk and the index the moment the point is reached (every later write
// fails, as if the machine died there); then the service is stopped, everything not synced is
// dropped — file data since its last fsync/fdatasync, entries created, renamed or removed in a
// directory not fsync'd since, index writes since the last synced one — the arena is lost (a
// power loss clears /dev/shm), and a fresh service recovers over what is left. Checks, as in the
// kill -9 matrix: recovery succeeds; every checkpoint committed before loads bit-exact (the one
// being deleted may be absent instead); the one in flight is COMMITTED and bit-exact (always,
// once its manifest was durable — its directory fsync'd — at the power loss), or before that
// ABORTED / absent with its directory gone; the listing shows only COMMITTED and ABORTED (never
// MISSING or CORRUPT: a row the index recorded COMMITTED had its manifest durable). Every
// point of kSyncPoints must be reached. Prints "power-loss matrix: N crash points x M
// checkpoints checked".
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "../dataplane/test_arena.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "dataplane/arena.h"
#include "dataplane/region_registry.h"
#include "format/names.h"
#include "index/memory_meta_store.h"
#include "io/fault_io.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"
#include "storage/memory/memory_storage.h"
#include "storage/posix/posix_storage.h"
#include "tier/peer_tier.h"

// The whole file needs the sync points (a build without test hooks compiles none of it).
#if CKPTD_TEST_HOOKS

namespace ckptd {
namespace {

constexpr char kJob[] = "power";
constexpr uint32_t kWorld = 2;  // rank r saves item "w<r>", float32 [64, 64], one fill byte
constexpr uint64_t kItemBytes = 64 * 64 * 4;
constexpr uint64_t kNewStep = 3;
constexpr uint64_t kReshardStep = 9;  // a copy of step 1
constexpr uint8_t kFill1 = 0x11;
constexpr uint8_t kFill2 = 0x22;
constexpr uint8_t kFill3 = 0x33;

// kUpload: step 3 saved with local+remote, the remote tier a directory on the same modelled disk
// (its unsynced writes are lost too: stricter than a store that keeps power).
// kCluster: step 3 spans two nodes over that tier: this rig is node-a (the coordinator, rank 0);
// node-b (rank 1) is a second service on a disk of its own that publishes its part and stops
// before the case's point is armed; the power loss hits node-a alone. Node-a has a peer tier
// (FakePeers: every copy acknowledged by "node-c", nothing served), so its part is replicated
// before it is published (cluster.part_replicated) and names its peer.
// Not in this matrix: the points of the peer module (peer.*), reached in a daemon receiving
// another node's copy, which the service does not link; its peer store is memory only, so a
// power loss and a kill -9 lose it alike: tests/integration/crash_matrix_test.cc covers them.
enum class Workload {
  kSave,
  kAbort,
  kDelete,
  kReshard,
  kReshardAbort,
  kRecovery,
  kUpload,
  kCluster
};

struct Case {
  const char* point;
  uint64_t nth;
  Workload workload;
};

// As in the kill -9 matrix; nth 2 is the last rank here.
const Case kCases[] = {
    {"save.before_journal", 1, Workload::kSave},
    {"save.before_journal", 2, Workload::kSave},
    {"save.journaled", 1, Workload::kSave},
    {"save.journaled", 2, Workload::kSave},
    {"flush.blob_written", 1, Workload::kSave},
    {"flush.blob_synced", 1, Workload::kSave},
    {"flush.rank_persisted", 1, Workload::kSave},
    {"flush.rank_persisted", 2, Workload::kSave},
    {"flush.extents_freed", 2, Workload::kSave},
    {"commit.manifest_built", 1, Workload::kSave},
    {"put_atomic.tmp_synced", 1, Workload::kSave},
    {"put_atomic.renamed", 1, Workload::kSave},
    {"put_atomic.dir_synced", 1, Workload::kSave},
    {"commit.manifest_durable", 1, Workload::kSave},
    {"commit.indexed", 1, Workload::kSave},
    {"abort.recorded", 1, Workload::kAbort},
    {"abort.files_removed", 1, Workload::kAbort},
    {"delete.tombstone_written", 1, Workload::kDelete},
    {"delete.remote_removed", 1, Workload::kDelete},
    {"delete.manifest_removed", 1, Workload::kDelete},
    {"delete.dir_removed", 1, Workload::kDelete},
    {"delete.rows_removed", 1, Workload::kDelete},
    {"delete.done", 1, Workload::kDelete},
    {"reshard.target_recorded", 1, Workload::kReshard},
    {"reshard.blob_written", 1, Workload::kReshard},
    {"put_atomic.renamed", 1, Workload::kReshard},
    {"commit.manifest_durable", 1, Workload::kReshard},
    {"commit.indexed", 1, Workload::kReshard},
    {"reshard.committed", 1, Workload::kReshard},
    {"reshard.abort_files_removed", 1, Workload::kReshardAbort},
    {"upload.blobs_copied", 1, Workload::kUpload},
    {"upload.manifest_put", 1, Workload::kUpload},
    {"upload.durable", 1, Workload::kUpload},
    {"cluster.part_replicated", 1, Workload::kCluster},
    {"cluster.part_published", 1, Workload::kCluster},
    {"cluster.decision_written", 1, Workload::kCluster},
    {"cluster.manifest_written", 1, Workload::kCluster},
    {"cluster.committed", 1, Workload::kCluster},
    {"recovery.rows_repaired", 1, Workload::kRecovery},
    {"recovery.deletes_finished", 1, Workload::kRecovery},
    {"recovery.manifests_adopted", 1, Workload::kRecovery},
    {"recovery.aborted_files_removed", 1, Workload::kRecovery},
    {"recovery.pending_resumed", 1, Workload::kRecovery},
    {"recovery.committed_rows_checked", 1, Workload::kRecovery},
    {"recovery.newest_verified", 1, Workload::kRecovery},
};

// The peer tier of node-a in kCluster: every copy is acknowledged by node-c (the part then names
// it), none is served (loads read the other tiers), nothing is watched.
class FakePeers : public PeerTier {
 public:
  absl::StatusOr<std::vector<std::string>> Replicate(
      const std::string&, uint64_t, const std::string&,
      const std::vector<std::pair<std::string, uint64_t>>&, uint32_t replicas) override {
    return std::vector<std::string>(std::min<uint32_t>(replicas, 1), "node-c");
  }
  Storage* reader() override { return &none_; }
  void Drop(const std::string&, uint64_t, const std::vector<std::string>&) override {}
  void Watch(Part) override {}
  std::optional<Copies> CopiesOf(const std::string&, uint64_t) override { return std::nullopt; }

 private:
  MemoryStorage none_;
};

size_t PointId(std::string_view name) {
  absl::StatusOr<SyncPointCrash> c = ParseSyncPointCrash(name);
  REQUIRE(c.ok());
  return c->point;
}

// Fences `io` and `meta` the nth time `point` is reached; disarmed when destroyed.
class CrashArm {
 public:
  CrashArm(std::string_view point, uint64_t nth, FaultIo* io, MemoryMetaStore* meta) {
    const size_t id = PointId(point);
    SetSyncPointCallback([this, id, nth, io, meta](size_t p) {
      if (p != id || ++hits_ != nth) return;
      io->Crash();
      meta->Crash();
      reached_ = true;
    });
  }
  ~CrashArm() { ResetSyncPoints(); }
  bool WaitReached(std::chrono::milliseconds patience) const {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (!reached_.load() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return reached_.load();
  }

 private:
  std::atomic<uint64_t> hits_{0};
  std::atomic<bool> reached_{false};
};

// A service over a power-loss-modelled disk and index; PowerCycle() is a power loss.
struct PowerRig {
  std::string dir;
  DaemonOptions options;
  MemoryMetaStore meta;
  std::unique_ptr<FaultIo> io;
  std::unique_ptr<Storage> storage;
  std::unique_ptr<Storage> remote;  // EnableRemote()
  std::unique_ptr<PeerTier> peers;  // BeNode("node-a")
  std::string shm;
  std::unique_ptr<StagingArena> arena;
  std::unique_ptr<RegionRegistry> regions;
  std::unique_ptr<Executor> pool;
  std::unique_ptr<CheckpointService> svc;
  absl::Status recovered;
  std::string session;
  Caller caller{static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid()), getpid(), 1,
                getuid() == 0};

  PowerRig() {
    const char* tmp = getenv("CKPTD_TEST_TMP");
    dir = std::string(tmp ? tmp : "/tmp") + "/svcpower-" + RandomHexId().substr(0, 8);
    std::filesystem::create_directories(dir + "/data");
    options.state_dir = dir;
    // Nothing binds it in-process; short, so a deep build dir does not fail Validate (the
    // default <state_dir>/ckptd.sock must fit a unix socket path).
    options.socket_path = "/tmp/ckptd-unit-test.sock";
    options.stage_timeout_ms = 60000;
    REQUIRE(options.Validate().ok());
    io = std::make_unique<FaultIo>(NewUringIo(8));
    REQUIRE(io->EnablePowerLoss(dir + "/trash").ok());
    storage = NewPosixStorage(dir + "/data", io.get());
  }
  // The remote tier, before Start: every checkpoint saved local+remote. `shared`: a directory
  // another rig's remote tier already is (default: this rig's own).
  void EnableRemote(const std::string& shared = "") {
    const std::string at = shared.empty() ? dir + "/remote" : shared;
    std::filesystem::create_directories(at);
    options.remote_dir = at;
    options.tier_policy = "local+remote";
    remote = NewPosixStorage(at, io.get());
  }
  // One node of a checkpoint spanning nodes (before Start).
  void BeNode(const std::string& node_id) {
    options.node_id = node_id;
    options.cluster_poll_ms = 20;
    if (node_id == "node-a") peers = std::make_unique<FakePeers>();
  }
  ~PowerRig() {
    Stop();
    std::filesystem::remove_all(dir);
  }

  // A fresh process as far as the service can tell: a new arena, pool and caches.
  void Start() {
    shm = "/ckptd-svcpower-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 6) + "-";
    arena = OpenTestArena(shm, 16 << 20);
    regions = std::make_unique<RegionRegistry>();
    pool = std::make_unique<Executor>("flush", 2, 1024);
    ServiceDeps deps{&options, &meta, storage.get(), arena.get(), regions.get(), pool.get()};
    deps.remote = remote.get();
    deps.peers = peers.get();
    svc = std::make_unique<CheckpointService>(deps);
    recovered = svc->Recover();
    if (!recovered.ok()) return;
    svc->Start();
    v1::HelloRequest h;
    v1::HelloResponse hr;
    REQUIRE(svc->Hello(caller, h, &hr).ok());
    session = hr.session_id();
  }
  // Lets what the (possibly fenced) service still does finish, then drops it.
  void Stop() {
    if (svc) svc->Shutdown(absl::Seconds(30));
    svc.reset();
    pool.reset();
    regions.reset();
    if (arena) arena->Unlink();
    arena.reset();
    shm.clear();
  }
  // The power goes: the service stops, unsynced data and index writes are lost, and so is the
  // arena; a fresh service recovers.
  void PowerCycle() {
    Stop();
    absl::Status lost = io->PowerLoss();
    INFO(lost.ToString());
    REQUIRE(lost.ok());
    meta.DropUnsynced();
    Start();
  }

  std::string StepDirOnDisk(uint64_t step) const {
    return dir + "/data/" + CheckpointDir(kJob, step);
  }

  // Saves rank `rank` of (kJob, step): item "w<rank>" filled with `fill`.
  absl::Status Save(uint64_t step, uint32_t rank, uint8_t fill, uint32_t local_world_size = 0) {
    v1::ReserveExtentsRequest rr;
    rr.set_session_id(session);
    rr.add_sizes_bytes(kItemBytes);
    v1::ReserveExtentsResponse ext;
    CKPTD_RETURN_IF_ERROR(svc->ReserveExtents(caller, rr, &ext));
    std::memset(arena->At(caller.uid, 0) + ext.extents(0).offset(), fill, kItemBytes);
    v1::SaveRequest req;
    req.set_session_id(session);
    req.set_job(kJob);
    req.set_step(step);
    req.set_rank(rank);
    req.set_world_size(kWorld);
    req.set_local_world_size(local_world_size);
    v1::ShardSpec* s = req.add_shards();
    s->set_item("w" + std::to_string(rank));
    s->mutable_tensor()->set_dtype(v1::FLOAT32);
    s->mutable_tensor()->add_global_shape(64);
    s->mutable_tensor()->add_global_shape(64);
    s->mutable_data()->set_extent_id(ext.extents(0).id());
    s->mutable_data()->set_length(kItemBytes);
    v1::SaveResponse resp;
    return svc->Save(caller, req, &resp);
  }
  void SaveAll(uint64_t step, uint8_t fill) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      if (!Save(step, r, fill).ok()) return;
    }
  }
  absl::Status Wait(uint64_t step, v1::WaitFor until = v1::WAIT_FOR_COMMITTED) {
    v1::WaitRequest w;
    w.set_job(kJob);
    w.set_step(step);
    w.set_until(until);
    w.set_timeout_ms(10000);
    v1::CheckpointStatus st;
    return svc->Wait(caller, w, &st);
  }
  absl::StatusOr<v1::CheckpointStatus> Status(uint64_t step) {
    v1::GetStatusRequest req;
    req.set_job(kJob);
    req.set_step(step);
    v1::CheckpointStatus resp;
    CKPTD_RETURN_IF_ERROR(svc->GetStatus(caller, req, &resp));
    return resp;
  }
  absl::Status Abort(uint64_t step) {
    v1::AbortRequest req;
    req.set_job(kJob);
    req.set_step(step);
    v1::CheckpointStatus resp;
    return svc->Abort(caller, req, &resp);
  }
  absl::Status Delete(uint64_t step) {
    v1::DeleteRequest req;
    req.set_job(kJob);
    req.set_step(step);
    return svc->Delete(caller, req);
  }
  absl::Status Reshard() {
    v1::ReshardRequest req;
    req.set_job(kJob);
    req.set_step(1);
    req.set_target_step(kReshardStep);
    req.set_spec("rows:2");
    v1::CheckpointStatus resp;
    return svc->Reshard(caller, req, &resp);
  }
  // Loads every item of `step` and checks each byte is `fill`.
  absl::Status LoadCheck(uint64_t step, uint8_t fill) {
    v1::ReserveExtentsRequest rr;
    rr.set_session_id(session);
    for (uint32_t r = 0; r < kWorld; ++r) rr.add_sizes_bytes(kItemBytes);
    v1::ReserveExtentsResponse ext;
    CKPTD_RETURN_IF_ERROR(svc->ReserveExtents(caller, rr, &ext));
    v1::LoadRequest req;
    req.set_session_id(session);
    req.set_job(kJob);
    req.set_step(step);
    for (uint32_t r = 0; r < kWorld; ++r) {
      std::memset(arena->At(caller.uid, 0) + ext.extents(r).offset(), ~fill, kItemBytes);
      v1::LoadItemRequest* item = req.add_items();
      item->set_item("w" + std::to_string(r));
      item->mutable_dest()->set_extent_id(ext.extents(r).id());
      item->mutable_dest()->set_length(kItemBytes);
    }
    v1::LoadResponse resp;
    absl::Status st = svc->Load(caller, req, &resp);
    for (uint32_t r = 0; st.ok() && r < kWorld; ++r) {
      const uint8_t* p = arena->At(caller.uid, 0) + ext.extents(r).offset();
      for (uint64_t i = 0; st.ok() && i < kItemBytes; ++i) {
        if (p[i] != fill) st = absl::DataLossError(absl::StrCat("w", r, " byte ", i, " differs"));
      }
    }
    v1::ReleaseExtentsRequest rel;
    rel.set_session_id(session);
    for (const v1::Extent& e : ext.extents()) rel.add_extent_ids(e.id());
    svc->ReleaseExtents(caller, rel).IgnoreError();
    return st;
  }
  std::vector<v1::CheckpointSummary> List() {
    v1::ListCheckpointsRequest req;
    req.set_job(kJob);
    v1::ListCheckpointsResponse resp;
    if (!svc->ListCheckpoints(caller, req, &resp).ok()) return {};
    return {resp.checkpoints().begin(), resp.checkpoints().end()};
  }
};

// Runs the workload that reaches the case's point; returns once it was reached (or not).
bool RunWorkload(PowerRig& rig, const Case& c) {
  constexpr auto kPatience = std::chrono::milliseconds(10000);
  if (c.workload == Workload::kRecovery) {
    // A delete crashes with a reshard running and step 3 half staged; the power comes back and
    // the restart crashes at the case's point with every kind of work to recover.
    REQUIRE(rig.Reshard().ok());
    REQUIRE(rig.Save(kNewStep, 0, kFill3).ok());
    {
      CrashArm first("delete.tombstone_written", 1, rig.io.get(), &rig.meta);
      rig.Delete(2).IgnoreError();
      REQUIRE(first.WaitReached(kPatience));
    }
    CrashArm arm(c.point, c.nth, rig.io.get(), &rig.meta);
    rig.PowerCycle();
    return arm.WaitReached(kPatience);
  }
  // Each workload starts what reaches the point; flushes, commits and reshards reach it later, on
  // their own threads (WaitReached below).
  CrashArm arm(c.point, c.nth, rig.io.get(), &rig.meta);
  switch (c.workload) {
    case Workload::kSave:
    case Workload::kUpload:
      rig.SaveAll(kNewStep, kFill3);
      break;
    case Workload::kAbort:
      if (rig.Save(kNewStep, 0, kFill3).ok()) {
        for (int i = 0; i < 400; ++i) {
          auto st = rig.Status(kNewStep);
          if (!st.ok() || st->bytes_persisted() == st->bytes_staged()) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        rig.Abort(kNewStep).IgnoreError();
      }
      break;
    case Workload::kDelete:
      rig.Delete(2).IgnoreError();
      break;
    case Workload::kReshard:
      rig.Reshard().IgnoreError();
      break;
    case Workload::kReshardAbort:
      if (rig.Reshard().ok()) rig.Abort(kReshardStep).IgnoreError();
      break;
    case Workload::kRecovery:
      break;
    case Workload::kCluster:
      rig.Save(kNewStep, 0, kFill3, /*local_world_size=*/1).IgnoreError();
      break;
  }
  return arm.WaitReached(kPatience);
}

// kBeDurable: in flight, its manifest durable at the power loss: it must be COMMITTED.
enum class May { kStayCommitted, kBeDeleted, kBeInFlight, kBeDurable };
struct Expect {
  uint64_t step;
  uint8_t fill;
  May may;
};

// Whether the case loses power with the manifest of its checkpoint in flight durable (its
// directory fsync'd after the rename: put_atomic.renamed alone is not): from then on it must be
// COMMITTED after recovery.
bool ManifestDurable(const Case& c) {
  const std::string_view p = c.point;
  switch (c.workload) {
    case Workload::kSave:
    case Workload::kReshard:
      return p == "put_atomic.dir_synced" || p == "commit.manifest_durable" ||
             p == "commit.indexed" || p == "reshard.committed";
    // kUpload: not here — steps 1 and 2 upload too (the rig's remote tier is on from the start),
    // so the point may be reached by their upload while step 3 is still being saved.
    case Workload::kCluster:
      return p == "cluster.manifest_written" || p == "cluster.committed";
    default:
      return false;
  }
}

std::vector<Expect> Expectations(const Case& c) {
  const Workload w = c.workload;
  const May in_flight = ManifestDurable(c) ? May::kBeDurable : May::kBeInFlight;
  std::vector<Expect> out = {{1, kFill1, May::kStayCommitted}, {2, kFill2, May::kStayCommitted}};
  if (w == Workload::kDelete || w == Workload::kRecovery) out[1].may = May::kBeDeleted;
  if (w == Workload::kSave || w == Workload::kAbort || w == Workload::kRecovery ||
      w == Workload::kUpload || w == Workload::kCluster) {
    out.push_back({kNewStep, kFill3, in_flight});
  }
  if (w == Workload::kReshard || w == Workload::kReshardAbort || w == Workload::kRecovery) {
    out.push_back({kReshardStep, kFill1, in_flight});
  }
  return out;
}

// "" when `e` holds after recovery (waiting for what recovery resumed to settle), else why not.
// A save recovery resumed still short of ranks gets them again, as a trainer retrying its step
// would: it must then commit bit-exact (or abort).
std::string Check(PowerRig& rig, const Expect& e, std::map<std::string, int>* outcomes) {
  const std::string name = CkptName(kJob, e.step);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string seen;
  bool completed = false;
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<v1::CheckpointStatus> st = rig.Status(e.step);
    const v1::CheckpointState state =
        st.ok() ? st->summary().state() : v1::CHECKPOINT_STATE_UNSPECIFIED;
    if (state == v1::STAGING && e.step == kNewStep && !completed) {
      for (uint32_t r = 0; r < kWorld; ++r) rig.Save(e.step, r, e.fill).IgnoreError();
      completed = true;
      continue;
    }
    if (state == v1::COMMITTED) {
      if (e.may != May::kStayCommitted) ++(*outcomes)["COMMITTED"];
      absl::Status loaded = rig.LoadCheck(e.step, e.fill);
      if (!loaded.ok()) return absl::StrCat(name, " is COMMITTED but: ", loaded.ToString());
      std::string stray;  // files an interrupted write left beside the manifest
      std::error_code ec;
      for (const auto& f : std::filesystem::directory_iterator(rig.StepDirOnDisk(e.step), ec)) {
        const std::string file = f.path().filename().string();
        if (file.find(".tmp.") != std::string::npos) stray += " " + file;
      }
      return stray.empty() ? "" : absl::StrCat(name, " holds leftovers:", stray);
    }
    const bool gone = absl::IsNotFound(st.status());
    seen = st.ok() ? v1::CheckpointState_Name(state) : st.status().ToString();
    if ((gone || state == v1::ABORTED) && !std::filesystem::exists(rig.StepDirOnDisk(e.step))) {
      ++(*outcomes)[gone ? "absent" : "ABORTED"];
      if (e.may == May::kBeInFlight || (gone && e.may == May::kBeDeleted)) return "";
      if (e.may == May::kBeDurable) {
        return absl::StrCat(name, "'s manifest was durable at the power loss, and it is now ",
                            seen);
      }
      return absl::StrCat(name, " was committed before the power loss and is now ", seen);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::StrCat(
      name, " did not settle: ", seen,
      std::filesystem::exists(rig.StepDirOnDisk(e.step)) ? " (its directory is still there)" : "");
}

// One case on a fresh rig; appends problems, returns the checkpoints checked.
int RunCase(const Case& c, std::vector<std::string>* problems,
            std::map<std::string, int>* outcomes) {
  const std::string label = absl::StrCat(c.point, ":", c.nth);
  PowerRig rig;
  if (c.workload == Workload::kAbort) rig.options.flush_gate_ms = 0;
  if (c.workload == Workload::kReshardAbort) rig.options.debug_reshard_delay_ms = 20;
  if (c.workload == Workload::kRecovery) {
    rig.options.debug_reshard_delay_ms = 50;  // still running when the delete crashes
    rig.options.flush_gate_ms = 600000;       // step 3 stays staged, unflushed
  }
  if (c.workload == Workload::kUpload || c.workload == Workload::kCluster) rig.EnableRemote();
  if (c.workload == Workload::kCluster) rig.BeNode("node-a");
  rig.Start();
  REQUIRE(rig.recovered.ok());
  rig.SaveAll(1, kFill1);
  REQUIRE(rig.Wait(1).ok());
  rig.SaveAll(2, kFill2);
  REQUIRE(rig.Wait(2).ok());
  if (c.workload == Workload::kCluster) {
    // node-b: rank 1 of step 3, its part durable on the shared tier before node-a's rank comes.
    PowerRig b;
    b.EnableRemote(rig.dir + "/remote");
    b.BeNode("node-b");
    b.Start();
    REQUIRE(b.recovered.ok());
    REQUIRE(b.Save(kNewStep, 1, kFill3, /*local_world_size=*/1).ok());
    const std::string part =
        rig.dir + "/remote/" + CheckpointDir(kJob, kNewStep) + "/cluster/node-b.part";
    for (int i = 0; i < 500 && !std::filesystem::exists(part); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    REQUIRE(std::filesystem::exists(part));
    b.Stop();
  }
  if (!RunWorkload(rig, c)) {
    problems->push_back(absl::StrCat(label, ": never reached"));
    return 0;
  }
  rig.PowerCycle();
  if (!rig.recovered.ok()) {
    problems->push_back(absl::StrCat(label, ": recovery failed: ", rig.recovered.ToString()));
    return 0;
  }
  int checked = 0;
  for (const Expect& e : Expectations(c)) {
    ++checked;
    if (std::string wrong = Check(rig, e, outcomes); !wrong.empty()) {
      problems->push_back(absl::StrCat(label, ": ", wrong));
    }
  }
  // An upload the power loss interrupted is resumed by the restart and completes.
  absl::StatusOr<v1::CheckpointStatus> now = rig.Status(kNewStep);
  // Spanning nodes: once COMMITTED (read from the shared tier) no local blob of node-a is left.
  if (c.workload == Workload::kCluster && now.ok() && now->summary().state() == v1::COMMITTED &&
      std::filesystem::exists(rig.StepDirOnDisk(kNewStep))) {
    problems->push_back(
        absl::StrCat(label, ": ", rig.StepDirOnDisk(kNewStep), " is left after the commit"));
  }
  if (c.workload == Workload::kUpload && now.ok() && now->summary().state() == v1::COMMITTED) {
    if (absl::Status up = rig.Wait(kNewStep, v1::WAIT_FOR_REMOTE); !up.ok()) {
      problems->push_back(absl::StrCat(label, ": the upload did not complete: ", up.ToString()));
    }
  }
  for (const v1::CheckpointSummary& s : rig.List()) {
    if (s.state() != v1::COMMITTED && s.state() != v1::ABORTED) {
      problems->push_back(absl::StrCat(label, ": ", CkptName(kJob, s.step()), " is listed ",
                                       v1::CheckpointState_Name(s.state())));
    }
  }
  return checked;
}

}  // namespace

TEST_CASE(
    "power-loss matrix: unsynced writes dropped at every named crash point, recovery "
    "leaves nothing torn or lost",
    "[unit][fault][crash-matrix]") {
  std::set<std::string> covered;
  for (const Case& c : kCases) covered.insert(c.point);
  for (std::string_view p : kSyncPoints) {
    INFO("crash point " << p << " is in kSyncPoints but not in the power-loss matrix");
    CHECK((covered.contains(std::string(p)) || p.starts_with("peer.")));  // see the top
  }
  const spdlog::level::level_enum level = spdlog::get_level();
  spdlog::set_level(spdlog::level::off);  // every fenced write logs an error
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> problems;
  int checked = 0;
  std::map<std::string, int> outcomes;  // of the checkpoints in flight or being deleted
  for (const Case& c : kCases) checked += RunCase(c, &problems, &outcomes);
  spdlog::set_level(level);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::cout << "power-loss matrix: " << std::size(kCases) << " crash points (" << covered.size()
            << " named points) x 3-4 checkpoints: " << checked << " checkpoints checked in " << ms
            << " ms, " << problems.size()
            << " problems; in flight or being deleted at the crash, afterwards:";
  for (const auto& [outcome, n] : outcomes) std::cout << " " << outcome << " " << n;
  std::cout << "\n";
  for (const std::string& p : problems) FAIL_CHECK(p);
}

}  // namespace ckptd

#endif  // CKPTD_TEST_HOOKS
