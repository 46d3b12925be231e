// A CheckpointService in-process for unit tests (recovery_test.cc, save_test.cc,
// simulation_test.cc): posix storage over a FaultIo, wrapped so a test can hold or fail one
// RemoveAll, an in-memory or RocksDB index wrapped so a test can hold or fail one synced write, a
// real arena and flush pool, and a Clock (the real one, or a test's FakeClock); Restart() starts
// a fresh service over the same index and data dir, with a new arena (a power loss or reboot: the
// staged bytes are gone) or the same one adopted (a daemon crash: the segment survives).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../dataplane/fake_gpu.h"
#include "../dataplane/test_arena.h"
#include "ckptd/status.h"
#include "ckptd/storage.h"
#include "dataplane/arena.h"
#include "dataplane/region_registry.h"
#include "format/names.h"
#include "index/keys.h"
#include "io/fault_io.h"
#include "service/checkpoint_service.h"
#include "storage/posix/posix_storage.h"

namespace ckptd::testing {

inline constexpr char kJob[] = "rec-job";
inline constexpr auto kPatience = std::chrono::seconds(10);

// Holds one call at a chosen point until Release(), or fails it (the next `times` calls there).
// Thread-safe.
class Gate {
 public:
  void Arm(std::string target, absl::Status fail = absl::OkStatus(), int times = 1) {
    absl::MutexLock lock(&mu_);
    target_ = std::move(target);
    fail_ = std::move(fail);
    times_ = fail_.ok() ? 1 : times;
    armed_ = true;
    reached_ = released_ = false;
  }
  // Called by the wrapped operation: true when it is the armed target (then held or failed).
  absl::Status Pass(const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (!armed_ || what != target_) return absl::OkStatus();
    armed_ = --times_ > 0;
    reached_ = true;
    if (!fail_.ok()) return fail_;
    mu_.Await(absl::Condition(&released_));
    return absl::OkStatus();
  }
  bool WaitReached() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&reached_), absl::Seconds(10));
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Whether the armed target was reached, without waiting.
  bool reached() {
    absl::MutexLock lock(&mu_);
    return reached_;
  }
  // Forgets an armed target not reached yet.
  void Disarm() {
    absl::MutexLock lock(&mu_);
    armed_ = false;
  }

 private:
  absl::Mutex mu_;
  std::string target_;
  absl::Status fail_;
  int times_ = 0;
  bool armed_ = false;
  bool reached_ = false;
  bool released_ = false;
};

// Storage whose RemoveAll(path) passes `gate` first.
class GatedStorage : public Storage {
 public:
  GatedStorage(Storage* base, Gate* gate) : base_(base), gate_(gate) {}
  std::string Describe() const override { return base_->Describe(); }
  bool ReadsThroughKernel() const override { return base_->ReadsThroughKernel(); }
  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& p) override {
    return base_->CreateBlob(p);
  }
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& p) override {
    return base_->OpenBlob(p);
  }
  absl::Status PutAtomic(const std::string& p, std::string_view d) override {
    return base_->PutAtomic(p, d);
  }
  absl::Status PutIfAbsent(const std::string& p, std::string_view d) override {
    return base_->PutIfAbsent(p, d);
  }
  absl::StatusOr<std::string> Get(const std::string& p) override { return base_->Get(p); }
  absl::StatusOr<bool> Exists(const std::string& p) override { return base_->Exists(p); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& d) override {
    return base_->List(d);
  }
  absl::Status RemoveAll(const std::string& p) override {
    CKPTD_RETURN_IF_ERROR(gate_->Pass(p));
    return base_->RemoveAll(p);
  }

 private:
  Storage* base_;
  Gate* gate_;
};

// MetaStore whose synced Commits pass `gate` first, named by the first key they write.
class GatedMeta : public MetaStore {
 public:
  GatedMeta(MetaStore* base, Gate* gate) : base_(base), gate_(gate) {}
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override {
    return base_->Get(key);
  }
  absl::Status Commit(std::span<const Write> writes, bool sync) override {
    if (sync && !writes.empty() && writes[0].value) {
      CKPTD_RETURN_IF_ERROR(gate_->Pass(writes[0].key));
    }
    return base_->Commit(writes, sync);
  }
  // A group commit's batches one by one, each through the gate by its own first key: a test holds
  // or fails the write of one batch whether or not the committer grouped it with others.
  std::vector<absl::Status> CommitGroup(std::span<const std::vector<Write>> batches,
                                        bool sync) override {
    std::vector<absl::Status> out;
    for (const std::vector<Write>& b : batches) out.push_back(Commit(b, sync));
    return out;
  }
  absl::Status DeletePrefix(std::string_view prefix, bool sync) override {
    return base_->DeletePrefix(prefix, sync);
  }
  absl::Status Scan(std::string_view prefix, std::string_view start_after, size_t limit,
                    const std::function<bool(std::string_view, std::string_view)>& fn) override {
    return base_->Scan(prefix, start_after, limit, fn);
  }

 private:
  MetaStore* base_;
  Gate* gate_;
};

struct Rig {
  std::string dir;
  std::string shm;
  DaemonOptions options;
  bool rocks = false;
  std::unique_ptr<MetaStore> meta;
  Gate meta_gate;
  std::unique_ptr<GatedMeta> gated_meta;
  std::unique_ptr<FaultIo> io;
  std::unique_ptr<Storage> posix;
  Gate storage_gate;
  std::unique_ptr<GatedStorage> storage;
  std::unique_ptr<StagingArena> arena;
  std::vector<ArenaSegmentInfo> kept;  // set by Stop(true): the next Start adopts them
  const Clock* clock = RealClock();
  FakeGpu gpu;  // CUDA IPC regions and the daemon's GPU copies, over host memory
  RegionRegistry regions{ForbiddenRegions{}, &gpu};
  std::unique_ptr<GpuStaging> gpu_staging;
  std::unique_ptr<Executor> pool;
  std::unique_ptr<CheckpointService> svc;
  absl::Status recovered;
  std::string session;
  Caller caller{static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid()), getpid(), 1,
                getuid() == 0};
  static constexpr int kRows = 64;

  static constexpr uint64_t kArenaBytes = 8 << 20;

  // `test_clock` (borrowed; nullptr: the real clock) is the service's clock. The state dir is
  // made under `tmp_root` (empty: $CKPTD_TEST_TMP, else /tmp).
  explicit Rig(bool use_rocks = false, const Clock* test_clock = nullptr, std::string tmp_root = "")
      : rocks(use_rocks) {
    if (test_clock != nullptr) clock = test_clock;
    const char* tmp = getenv("CKPTD_TEST_TMP");
    if (tmp_root.empty()) tmp_root = tmp != nullptr ? tmp : "/tmp";
    dir = tmp_root + "/svcrec-" + RandomHexId().substr(0, 8);
    std::filesystem::create_directories(dir + "/data");
    options.state_dir = dir;
    // Nothing binds it in-process; short, so a deep build dir does not fail Validate (the
    // default <state_dir>/ckptd.sock must fit a unix socket path).
    options.socket_path = "/tmp/ckptd-unit-test.sock";
    options.stage_timeout_ms = 60000;
    REQUIRE(options.Validate().ok());
    io = std::make_unique<FaultIo>(NewUringIo(8));
    posix = NewPosixStorage(dir + "/data", io.get());
    storage = std::make_unique<GatedStorage>(posix.get(), &storage_gate);
    if (!rocks) meta = NewMemoryMetaStore();
    Start();
    REQUIRE(recovered.ok());
  }
  ~Rig() {
    Stop();
    std::filesystem::remove_all(dir);
  }

  // Stops the service as a crash would, as far as a process can stop itself: queued flush and
  // commit tasks are dropped, running ones finish (the pool is stopped before the service is
  // destroyed, so none outlives it). `keep_arena`: the segment is left for the next Start to
  // adopt (a daemon crash) instead of being removed (a power loss).
  void Stop(bool keep_arena = false) {
    if (pool) pool->Stop();
    svc.reset();
    pool.reset();
    gpu_staging.reset();
    kept.clear();
    if (arena && keep_arena) kept = arena->segments();
    if (arena && !keep_arena) arena->Unlink();
    arena.reset();
    if (rocks) {
      gated_meta.reset();
      meta.reset();
    }
  }
  // Starts a service (a fresh process, as far as the service can tell: new arena, new pool,
  // empty caches) over the same index and data dir; `recovered` is what Recover() said.
  void Start() {
    if (rocks) {
      auto m = OpenRocksDbMetaStore(dir + "/index");
      REQUIRE(m.ok());
      meta = std::move(*m);
    }
    gated_meta = std::make_unique<GatedMeta>(meta.get(), &meta_gate);
    if (kept.empty()) {
      shm = "/ckptd-svcrec-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 6) + "-";
    }
    arena = OpenTestArena(shm, kArenaBytes, kept);
    kept.clear();
    pool = std::make_unique<Executor>("flush", 2, 1024);
    ServiceDeps deps{&options, gated_meta.get(), storage.get(), arena.get(), &regions, pool.get()};
    deps.clock = clock;
    gpu_staging = std::make_unique<GpuStaging>(&gpu, arena.get());
    deps.gpu = gpu_staging.get();
    svc = std::make_unique<CheckpointService>(deps);
    recovered = svc->Recover();
    if (!recovered.ok()) return;
    svc->Start();
    v1::HelloRequest h;
    h.set_pid(getpid());
    v1::HelloResponse hr;
    REQUIRE(svc->Hello(caller, h, &hr).ok());
    session = hr.session_id();
    REQUIRE(svc->Attach(caller, session).ok());  // as the client does: it never expires
  }
  void Restart(bool keep_arena = false) {
    Stop(keep_arena);
    Start();
  }

  std::string StepPath(uint64_t step) const { return CheckpointDir(kJob, step); }
  std::string StepDirOnDisk(uint64_t step) const { return dir + "/data/" + StepPath(step); }
  std::string ManifestOnDisk(uint64_t step) const {
    return StepDirOnDisk(step) + "/" + kManifestFileName;
  }

  // A 1-rank Save of `step` with one float32 tensor "w" of `shape` (its data still to be named).
  v1::SaveRequest SaveRequestOf(uint64_t step, std::vector<uint64_t> shape) const {
    v1::SaveRequest req;
    req.set_session_id(session);
    req.set_job(kJob);
    req.set_step(step);
    req.set_rank(0);
    req.set_world_size(1);
    v1::ShardSpec* s = req.add_shards();
    s->set_item("w");
    s->mutable_tensor()->set_dtype(v1::FLOAT32);
    for (uint64_t d : shape) s->mutable_tensor()->add_global_shape(d);
    return req;
  }

  // Saves a 1-rank checkpoint of one float32 [64, 64] tensor filled with `fill`.
  absl::Status Save(uint64_t step, uint8_t fill) {
    v1::ReserveExtentsRequest rr;
    rr.set_session_id(session);
    rr.add_sizes_bytes(kRows * 64 * 4);
    v1::ReserveExtentsResponse ext;
    CKPTD_RETURN_IF_ERROR(svc->ReserveExtents(caller, rr, &ext));
    std::memset(arena->At(caller.uid, 0) + ext.extents(0).offset(), fill, kRows * 64 * 4);
    v1::SaveRequest req = SaveRequestOf(step, {kRows, 64});
    v1::ShardSpec* s = req.mutable_shards(0);
    s->mutable_data()->set_extent_id(ext.extents(0).id());
    s->mutable_data()->set_length(kRows * 64 * 4);
    v1::SaveResponse resp;
    absl::Status st = svc->Save(caller, req, &resp);
    if (!st.ok()) {  // give the extent back
      v1::ReleaseExtentsRequest rel;
      rel.set_session_id(session);
      rel.add_extent_ids(ext.extents(0).id());
      svc->ReleaseExtents(caller, rel).IgnoreError();
    }
    return st;
  }
  absl::Status Wait(uint64_t step) {
    v1::WaitRequest w;
    w.set_job(kJob);
    w.set_step(step);
    w.set_timeout_ms(10000);
    v1::CheckpointStatus st;
    return svc->Wait(caller, w, &st);
  }
  absl::Status SaveCommitted(uint64_t step, uint8_t fill) {
    CKPTD_RETURN_IF_ERROR(Save(step, fill));
    return Wait(step);
  }
  // Loads "w" of `step` (nullopt: latest) and checks every byte is `fill`.
  absl::Status LoadCheck(std::optional<uint64_t> step, uint8_t fill, uint64_t* loaded = nullptr) {
    v1::ReserveExtentsRequest rr;
    rr.set_session_id(session);
    rr.add_sizes_bytes(kRows * 64 * 4);
    v1::ReserveExtentsResponse ext;
    CKPTD_RETURN_IF_ERROR(svc->ReserveExtents(caller, rr, &ext));
    uint8_t* p = arena->At(caller.uid, 0) + ext.extents(0).offset();
    std::memset(p, ~fill, kRows * 64 * 4);
    v1::LoadRequest req;
    req.set_session_id(session);
    req.set_job(kJob);
    if (step) {
      req.set_step(*step);
    } else {
      req.set_latest(true);
    }
    v1::LoadItemRequest* item = req.add_items();
    item->set_item("w");
    item->mutable_dest()->set_extent_id(ext.extents(0).id());
    item->mutable_dest()->set_length(kRows * 64 * 4);
    v1::LoadResponse resp;
    absl::Status st = svc->Load(caller, req, &resp);
    for (int i = 0; st.ok() && i < kRows * 64 * 4; ++i) {
      if (p[i] != fill) st = absl::DataLossError("byte " + std::to_string(i) + " differs");
    }
    if (st.ok() && loaded != nullptr) *loaded = resp.step();
    v1::ReleaseExtentsRequest rel;
    rel.set_session_id(session);
    rel.add_extent_ids(ext.extents(0).id());
    svc->ReleaseExtents(caller, rel).IgnoreError();
    return st;
  }
  absl::Status Delete(uint64_t step) {
    v1::DeleteRequest req;
    req.set_job(kJob);
    req.set_step(step);
    return svc->Delete(caller, req);
  }
  absl::StatusOr<v1::CheckpointSummary> Status(uint64_t step) {
    v1::GetStatusRequest req;
    req.set_job(kJob);
    req.set_step(step);
    v1::CheckpointStatus resp;
    CKPTD_RETURN_IF_ERROR(svc->GetStatus(caller, req, &resp));
    return resp.summary();
  }
  v1::CheckpointState State(uint64_t step) {
    absl::StatusOr<v1::CheckpointSummary> s = Status(step);
    return s.ok() ? s->state() : v1::CHECKPOINT_STATE_UNSPECIFIED;
  }
  absl::StatusOr<uint64_t> Latest() {
    v1::LatestRequest req;
    req.set_job(kJob);
    v1::LatestResponse resp;
    CKPTD_RETURN_IF_ERROR(svc->Latest(caller, req, &resp));
    return resp.step();
  }
  std::map<uint64_t, v1::CheckpointSummary> List() {
    v1::ListCheckpointsRequest req;
    req.set_job(kJob);
    v1::ListCheckpointsResponse resp;
    REQUIRE(svc->ListCheckpoints(caller, req, &resp).ok());
    std::map<uint64_t, v1::CheckpointSummary> out;
    for (const auto& s : resp.checkpoints()) out[s.step()] = s;
    return out;
  }
  void PutRaw(const std::string& key, const std::string& value) {
    MetaStore::Write w{key, value};
    REQUIRE(meta->Commit({&w, 1}, true).ok());
  }
};

inline bool Contains(const absl::Status& st, const std::string& part) {
  return std::string(st.message()).find(part) != std::string::npos;
}

inline void FlipByte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

// An index value that is no CheckpointRecord ('n' starts a field of wire type 6, which does not
// exist).
inline const std::string kGarbage = "not a protobuf";

}  // namespace ckptd::testing
