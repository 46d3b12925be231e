// Seeded control-plane simulation (STYLE.md "failure is tested"): one seed drives a
// std::mt19937_64 through a few hundred random operations against CheckpointService in-process
// (service_rig.h: posix storage over FaultIo, a gated index, a real arena and flush pool) with a
// FakeClock: multi-rank saves of random layouts by several clients (each its own connection and
// session), waits, bit-exact loads in random layouts, deletes, offline reshards, aborts, partial
// commits, client deaths mid-save, sessions never attached, the clock advanced past the flush
// gate and stage_timeout_ms, injected faults (EIO/ENOSPC on writes, syncs, renames and directory
// syncs; failed synced index writes of a checkpoint's row), restarts with the arena kept (a
// daemon crash) or lost (a power loss), and a few concurrent pairs (delete vs re-save, abort vs
// the last rank, load vs delete, reshard vs deleting its source, save vs the client's death).
//
// A model (Ckpt) tracks what must be true, and every answer is judged against it:
//   - a COMMITTED checkpoint is never lost or changed (until the simulation deletes it), and
//     loads back bit-exact in any layout; none ends COMMITTED with other bytes than were saved;
//   - each answer's code is one the operation may give in the model's state (a race accepts
//     the set of outcomes its interleavings allow, never INTERNAL);
//   - after quiescing (nothing in flight, every open checkpoint committed or aborted) the arena
//     is all free, the listing holds exactly the model's COMMITTED and ABORTED checkpoints (none
//     STAGING, PERSISTING or DELETING), latest is the newest committed step, and aborted
//     checkpoints have no files left.
// Operations run one after another from the seed, so a seed replays the same run
// (CKPTD_SIM_SEED=<n>); only the races and a restart cutting flushes short have outcomes that
// depend on timing, and the model accepts each of them. A failure prints
// "simulation seed <n> failed at op <k>: <what>" and the last operations.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numeric>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "format/names.h"
#include "index/keys.h"
#include "service_rig.h"
#include "simulation_calls.h"
#include "simulation_model.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

using sim::Chance;
using sim::Uniform;
using Code = absl::StatusCode;
using Codes = std::initializer_list<Code>;

constexpr uint32_t kSimUid = 5000;       // the clients: neither the test's uid nor root
constexpr uint32_t kStrangerUid = 5001;  // owns no job
constexpr uint32_t kWaitMs = 5000;       // real time; a Wait or poll that takes longer hangs
constexpr uint64_t kStageTimeoutMs = 60000;  // fake time, as every other time below
constexpr size_t kClients = 3;
constexpr size_t kOpenPerJobMax = 8;        // below limits::kOpenCheckpointsPerJobMax
constexpr size_t kCommittedPerJobMax = 10;  // more are deleted, oldest first
const char* const kJobs[] = {"sim-a", "sim-b"};
const char* const kSpecs[] = {"consolidated", "rows:2",   "rows:3",
                              "cols:2",       "flat:2",   "flat:5",
                              "grid:2x2",     "*.w=rows:2; *=consolidated", "model.*=flat:3"};

struct SimStats {
  uint64_t seeds = 0, ops = 0, committed = 0, aborted = 0, deleted = 0, resharded = 0;
  uint64_t faults_armed = 0, faults_fired = 0, restarts = 0, races = 0, deaths = 0;
  uint64_t stage_timeouts = 0, loads = 0, tmpfs_seeds = 0, rocksdb_seeds = 0;
};

// The model of one checkpoint.
struct Ckpt {
  enum class St { kOpen, kCommitted, kAborted, kDeleting };
  std::string job;
  uint64_t step = 0;
  std::shared_ptr<const sim::Plan> plan;
  St st = St::kOpen;
  std::set<uint32_t> staged;  // ranks whose Save answered OK
  bool partial = false;       // Commit(partial) answered OK
  bool bad_replica = false;   // its last rank saves other bytes for a replicated tensor
  bool reshard = false;       // the target of an offline reshard
  // Staged ranks whose flush is posted, or is posted by the next housekeeping pass without the
  // clock moving (the gate is 0 or passed, every rank is staged, or a restart resumed them).
  std::set<uint32_t> due;
  uint64_t created_ms = 0;       // fake time of the Save that opened it
  uint64_t first_staged_ms = 0;  // of its first rank staged since the (re)start: the flush gate

  bool ready() const { return partial || staged.size() == plan->world; }
  // The ranks a load may ask for once committed.
  std::set<uint32_t> have() const {
    if (partial) return staged;
    std::set<uint32_t> all;
    for (uint32_t r = 0; r < plan->world; ++r) all.insert(r);
    return all;
  }
  std::string name() const { return absl::StrCat(job, "/", step); }
};

class Sim {
 public:
  Sim(uint64_t seed, int ops, SimStats* stats)
      : seed_(seed), ops_(ops), stats_(stats), rng_(seed),
        clock_(absl::FromUnixSeconds(1767225600)) {}
  ~Sim() {
    calls_.reset();
    rig_.reset();
  }
  // "" when every check held; else "simulation seed N failed at op K: what" and the last ops.
  std::string Run();

 private:
  using Key = std::pair<std::string, uint64_t>;
  enum class Expect { kCommit, kAbort, kEither };
  using Op = bool (Sim::*)();

  // --- plumbing
  bool Fail(std::string what) {
    if (failure_.empty()) failure_ = std::move(what);
    return false;
  }
  void Log(std::string what) {
    log_.push_back(absl::StrCat("op ", op_, ": ", what));
    if (log_.size() > 24) log_.pop_front();
  }
  bool Allowed(const absl::Status& st, Codes codes, const std::string& what);
  uint64_t Now() const { return clock_.NowUnixMs(); }
  sim::Client& AnyClient() { return clients_[Uniform(rng_, 0, clients_.size() - 1)]; }
  const Caller& Me() const { return clients_[0].caller; }
  bool Connect(sim::Client& c, uint32_t uid = kSimUid, bool attach = true);
  bool Setup();
  // --- the model
  std::vector<Ckpt*> Select(const std::function<bool(const Ckpt&)>& pred);
  Ckpt* Pick(const std::function<bool(const Ckpt&)>& pred);
  Ckpt* PickOpen(bool ready);
  Ckpt* PickCommitted(bool complete_only = false);
  // A new checkpoint of `job` (a fresh step, or one deleted before) of a random plan.
  Ckpt& NewCkpt(const std::string& job, uint32_t world);
  // The target of a reshard of `src` (*spec: the layout drawn).
  Ckpt& NewReshardTarget(const Ckpt& src, std::string* spec);
  std::string PickJob();
  void Forget(const Ckpt& c, bool deleted);
  bool GateOpen(const Ckpt& c) const {
    return c.first_staged_ms != 0 && Now() - c.first_staged_ms >= gate_ms_;
  }
  // --- actions, each judging the answers it gets
  bool StageRank(Ckpt& c, uint32_t rank, sim::Client& cl, Codes allowed = {Code::kOk},
                 absl::Status* answer = nullptr);
  bool StageAll(Ckpt& c, uint32_t from = 0);
  bool Resolve(Ckpt& c, Expect e, std::string* why = nullptr);
  bool Verify(const Ckpt& c);
  bool ExpectState(const Ckpt& c, v1::CheckpointState want);
  bool ExpectAbsent(const std::string& job, uint64_t step);
  bool AwaitPersisted(const Ckpt& c);
  bool Settle();
  bool AfterAdvance();
  bool Restart(bool keep_arena, bool settled);
  bool CheckResumed(Ckpt& c, bool keep_arena, bool settled);
  bool Quiesce();
  bool CheckQuiesced(bool verify_all);
  bool CheckListing(const std::string& job);
  bool DeleteChecked(Ckpt& c);
  // --- operations (one per step of the run)
  bool OpSave();
  bool OpStage();
  bool OpWait();
  bool OpLoad();
  bool OpDelete();
  bool OpReshard();
  bool OpAbort();
  bool OpPartialCommit();
  bool OpClientDeath();
  bool OpUnattached();
  bool OpAdvanceClock();
  bool OpFault();
  bool OpRestart();
  bool OpRace();
  bool OpQuiesce() { return Quiesce() && CheckQuiesced(false); }
  bool OpStranger();
  bool OpRefusal();
  // faults (OpFault)
  bool FaultSave();
  bool FaultDelete();
  bool FaultReshard();
  bool FaultIndexJournal();
  bool FaultIndexCommitted();
  bool FaultIndexTombstone();
  bool FaultIndexAbort();
  // races (OpRace)
  bool RaceDeleteResave();
  bool RaceAbortLastRank();
  bool RaceLoadDelete();
  bool RaceReshardDelete();
  bool RaceSaveDeath();

  const uint64_t seed_;
  const int ops_;
  SimStats* stats_;
  std::mt19937_64 rng_;
  FakeClock clock_;
  uint64_t gate_ms_ = 0;
  std::unique_ptr<testing::Rig> rig_;
  std::unique_ptr<sim::Calls> calls_;
  std::vector<sim::Client> clients_;
  uint64_t next_connection_ = 1000;
  std::map<Key, Ckpt> ckpts_;
  std::map<std::string, uint64_t> next_step_;
  std::map<std::string, std::set<uint64_t>> deleted_steps_;
  int op_ = 0;
  std::string failure_;
  std::deque<std::string> log_;
};

#define SIM_TRY(expr)         \
  do {                        \
    if (!(expr)) return false; \
  } while (0)

bool Sim::Allowed(const absl::Status& st, Codes codes, const std::string& what) {
  std::vector<std::string> names;
  for (Code c : codes) {
    if (st.code() == c) return true;
    names.push_back(absl::StatusCodeToString(c));
  }
  return Fail(absl::StrCat(what, " answered ", st.ToString(), "; allowed: ",
                           absl::StrJoin(names, ", ")));
}

bool Sim::Connect(sim::Client& c, uint32_t uid, bool attach) {
  absl::Status st = calls_->Connect(c, uid, next_connection_++, attach);
  return st.ok() || Fail(absl::StrCat("Hello/Attach: ", st.ToString()));
}

// Where the seed's data and index live: every third seed on the test's disk ($CKPTD_TEST_TMP),
// with O_DIRECT and real syncs; the others on /dev/shm, much faster (syncs cost nothing), which
// makes the daemon's own threads race the simulation's calls harder. Every fourth seed indexes
// in RocksDB instead of the in-memory store.
std::string SimTmpRoot(uint64_t seed) {
  std::error_code ec;
  const std::filesystem::space_info shm = std::filesystem::space("/dev/shm", ec);
  if (seed % 3 == 0 || ec || shm.available < (uint64_t{512} << 20)) return "";
  return "/dev/shm";
}

bool Sim::Setup() {
  gate_ms_ = Chance(rng_, 0.5) ? 0 : 40;
  const std::string root = SimTmpRoot(seed_);
  const bool rocks = seed_ % 4 == 2;
  stats_->tmpfs_seeds += !root.empty();
  stats_->rocksdb_seeds += rocks;
  Log(absl::StrCat("seed ", seed_, ": flush gate ", gate_ms_, " ms, data on ",
                   root.empty() ? "the test's disk" : root, ", index in ",
                   rocks ? "RocksDB" : "memory"));
  rig_ = std::make_unique<testing::Rig>(rocks, &clock_, root);
  rig_->Stop();
  rig_->options.flush_gate_ms = gate_ms_;  // the housekeeping pass runs every 10 ms (real)
  rig_->options.stage_timeout_ms = kStageTimeoutMs;
  rig_->options.load_buffer_bytes = 1 << 20;
  REQUIRE(rig_->options.Validate().ok());
  rig_->Start();
  REQUIRE(rig_->recovered.ok());
  calls_ = std::make_unique<sim::Calls>(rig_.get());
  clients_.resize(kClients);
  for (sim::Client& c : clients_) SIM_TRY(Connect(c));
  return true;
}

std::string Sim::Run() {
  static const std::pair<int, Op> kOps[] = {
      {18, &Sim::OpSave},    {10, &Sim::OpStage},         {10, &Sim::OpWait},
      {12, &Sim::OpLoad},    {6, &Sim::OpDelete},         {4, &Sim::OpReshard},
      {4, &Sim::OpAbort},    {3, &Sim::OpPartialCommit},  {4, &Sim::OpClientDeath},
      {2, &Sim::OpUnattached}, {5, &Sim::OpAdvanceClock}, {7, &Sim::OpFault},
      {3, &Sim::OpRestart},  {4, &Sim::OpRace},           {2, &Sim::OpQuiesce},
      {1, &Sim::OpStranger}, {3, &Sim::OpRefusal}};
  int total = 0;
  for (const auto& [w, fn] : kOps) total += w;
  bool ok = Setup();
  for (op_ = 1; ok && op_ <= ops_; ++op_) {
    int pick = static_cast<int>(Uniform(rng_, 0, total - 1));
    for (const auto& [w, fn] : kOps) {
      if ((pick -= w) < 0) {
        ok = (this->*fn)();
        break;
      }
    }
    ++stats_->ops;
  }
  if (ok) {  // the final check: quiesce, verify everything, restart, verify again
    Log("final check");
    ok = Quiesce() && CheckQuiesced(true) && Restart(Chance(rng_, 0.5), true) &&
         Quiesce() && CheckQuiesced(true);
  }
  ++stats_->seeds;
  if (ok) return "";
  return absl::StrCat("simulation seed ", seed_, " failed at op ", op_, ": ", failure_,
                      "\nlast operations:\n  ", absl::StrJoin(log_, "\n  "));
}

// ---------------------------------------------------------------------------------------------
// The model

std::vector<Ckpt*> Sim::Select(const std::function<bool(const Ckpt&)>& pred) {
  std::vector<Ckpt*> out;
  for (auto& [key, c] : ckpts_) {
    if (pred(c)) out.push_back(&c);
  }
  return out;
}

Ckpt* Sim::Pick(const std::function<bool(const Ckpt&)>& pred) {
  std::vector<Ckpt*> all = Select(pred);
  return all.empty() ? nullptr : all[Uniform(rng_, 0, all.size() - 1)];
}

Ckpt* Sim::PickOpen(bool ready) {
  return Pick([&](const Ckpt& c) {
    return c.st == Ckpt::St::kOpen && !c.reshard && c.ready() == ready;
  });
}

Ckpt* Sim::PickCommitted(bool complete_only) {
  return Pick([&](const Ckpt& c) {
    return c.st == Ckpt::St::kCommitted && (!complete_only || !c.partial);
  });
}

std::string Sim::PickJob() {
  std::vector<std::string> jobs;
  for (const char* job : kJobs) {
    size_t open = Select([&](const Ckpt& c) {
                    return c.job == job && c.st == Ckpt::St::kOpen;
                  }).size();
    if (open < kOpenPerJobMax) jobs.push_back(job);
  }
  return jobs.empty() ? "" : jobs[Uniform(rng_, 0, jobs.size() - 1)];
}

Ckpt& Sim::NewCkpt(const std::string& job, uint32_t world) {
  std::set<uint64_t>& reuse = deleted_steps_[job];
  uint64_t step = 0;
  if (!reuse.empty() && Chance(rng_, 0.3)) {
    auto it = std::next(reuse.begin(), static_cast<long>(Uniform(rng_, 0, reuse.size() - 1)));
    step = *it;
    reuse.erase(it);
  } else {
    step = ++next_step_[job];
  }
  Ckpt& c = ckpts_[Key{job, step}];
  c = Ckpt{};
  c.job = job;
  c.step = step;
  c.plan = std::make_shared<const sim::Plan>(sim::RandomPlan(rng_, world));
  return c;
}

Ckpt& Sim::NewReshardTarget(const Ckpt& src, std::string* spec) {
  const std::string job = Chance(rng_, 0.3) ? kJobs[Uniform(rng_, 0, 1)] : src.job;
  *spec = kSpecs[Uniform(rng_, 0, std::size(kSpecs) - 1)];
  const uint64_t step = ++next_step_[job];
  Ckpt& t = ckpts_[Key{job, step}];
  t = Ckpt{};
  t.job = job;
  t.step = step;
  t.plan = src.plan;  // the same logical bytes, in another layout
  t.reshard = true;
  return t;
}

void Sim::Forget(const Ckpt& c, bool deleted) {
  if (deleted) {
    deleted_steps_[c.job].insert(c.step);
    ++stats_->deleted;
  }
  ckpts_.erase(Key{c.job, c.step});
}

// ---------------------------------------------------------------------------------------------
// Actions

bool Sim::StageRank(Ckpt& c, uint32_t rank, sim::Client& cl, Codes allowed,
                    absl::Status* answer) {
  const bool one_extent = Chance(rng_, 0.3);
  const bool bad = c.bad_replica && rank + 1 == c.plan->world;
  if (c.created_ms == 0) c.created_ms = Now();
  absl::Status st = calls_->SaveRank(cl, c.job, c.step, c.plan->world, rank,
                                     sim::RankShards(*c.plan, rank, bad), one_extent);
  if (answer != nullptr) *answer = st;
  SIM_TRY(Allowed(st, allowed, absl::StrCat("Save of ", c.name(), " rank ", rank)));
  if (st.ok()) {
    c.staged.insert(rank);
    if (c.first_staged_ms == 0) c.first_staged_ms = Now();
    if (GateOpen(c) || c.ready()) c.due = c.staged;
  }
  return true;
}

bool Sim::StageAll(Ckpt& c, uint32_t from) {
  for (uint32_t r = from; r < c.plan->world; ++r) SIM_TRY(StageRank(c, r, AnyClient()));
  return true;
}

bool Sim::Resolve(Ckpt& c, Expect e, std::string* why) {
  if (c.bad_replica && e == Expect::kCommit) e = Expect::kAbort;
  v1::CheckpointStatus s;
  absl::Status st = calls_->Wait(Me(), c.job, c.step, kWaitMs, &s);
  Log(absl::StrCat("  wait ", c.name(), ": ", st.ok() ? "COMMITTED" : st.ToString()));
  if (st.ok()) {
    if (e == Expect::kAbort) return Fail(absl::StrCat(c.name(), " COMMITTED; it must abort"));
    if (s.summary().state() != v1::COMMITTED) {
      return Fail(absl::StrCat("Wait for ", c.name(), " answered OK in state ",
                               v1::CheckpointState_Name(s.summary().state())));
    }
    c.st = Ckpt::St::kCommitted;
    ++stats_->committed;
    if (c.reshard) ++stats_->resharded;
    return Verify(c);
  }
  if (absl::IsAborted(st)) {
    if (e == Expect::kCommit) {
      return Fail(absl::StrCat(c.name(), " was aborted; nothing may abort it: ", st.message()));
    }
    c.st = Ckpt::St::kAborted;
    ++stats_->aborted;
    if (why != nullptr) *why = std::string(st.message());
    return true;
  }
  std::vector<std::string> ranks;  // what the daemon says of each rank, for the report
  for (const v1::RankStatus& r : s.ranks()) {
    ranks.push_back(absl::StrCat(r.rank(), r.persisted() ? " persisted" : " staged"));
  }
  return Fail(absl::StrCat("Wait for ", c.name(), " (", c.staged.size(), " of ",
                           c.plan->world, " ranks staged", c.partial ? ", partial" : "",
                           ") answered ", st.ToString(), "; ranks: [", absl::StrJoin(ranks, ", "),
                           "]; flush tasks queued: ", rig_->pool->queued()));
}

bool Sim::Verify(const Ckpt& c) {
  std::vector<sim::Ask> asks = sim::RandomLoad(rng_, *c.plan, c.have());
  std::string mismatch;
  absl::Status st = calls_->Load(AnyClient(), c.job, c.step, asks, &mismatch);
  if (!st.ok()) return Fail(absl::StrCat("load of COMMITTED ", c.name(), ": ", st.ToString()));
  if (!mismatch.empty()) {
    return Fail(absl::StrCat("load of COMMITTED ", c.name(), " gave other bytes: ", mismatch));
  }
  ++stats_->loads;
  return true;
}

bool Sim::ExpectState(const Ckpt& c, v1::CheckpointState want) {
  absl::StatusOr<v1::CheckpointStatus> s = calls_->Status(Me(), c.job, c.step);
  if (!s.ok()) {
    return Fail(absl::StrCat("status of ", c.name(), ": ", s.status().ToString(), "; want ",
                             v1::CheckpointState_Name(want)));
  }
  if (s->summary().state() != want) {
    return Fail(absl::StrCat(c.name(), " is ", v1::CheckpointState_Name(s->summary().state()),
                             "; want ", v1::CheckpointState_Name(want), " (",
                             s->summary().error(), ")"));
  }
  return true;
}

bool Sim::ExpectAbsent(const std::string& job, uint64_t step) {
  absl::StatusOr<v1::CheckpointStatus> s = calls_->Status(Me(), job, step);
  if (!absl::IsNotFound(s.status())) {
    return Fail(absl::StrCat(job, "/", step, " should not exist; status says ",
                             s.ok() ? v1::CheckpointState_Name(s->summary().state())
                                    : s.status().ToString()));
  }
  const std::string dir = rig_->dir + "/data/" + CheckpointDir(job, step);
  if (std::filesystem::exists(dir)) return Fail(absl::StrCat(dir, " is left behind"));
  return true;
}

// Polls until every rank of `c` (open, not ready) whose flush is due is persisted.
bool Sim::AwaitPersisted(const Ckpt& c) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (true) {
    absl::StatusOr<v1::CheckpointStatus> s = calls_->Status(Me(), c.job, c.step);
    if (!s.ok()) return Fail(absl::StrCat("status of ", c.name(), ": ", s.status().ToString()));
    const v1::CheckpointState state = s->summary().state();
    if (state != v1::STAGING && state != v1::PERSISTING) return true;  // judged by Resolve
    size_t persisted = 0;
    for (const v1::RankStatus& r : s->ranks()) persisted += r.persisted() && c.due.contains(r.rank());
    if (persisted == c.due.size()) return true;
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail(absl::StrCat(c.name(), ": ", persisted, " of the ", c.due.size(),
                               " ranks whose flush is due persisted after ", kWaitMs, " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Nothing in flight: the flushes that are due are done, the flush pool is idle.
bool Sim::Settle() {
  for (Ckpt* c : Select([](const Ckpt& c) { return c.st == Ckpt::St::kOpen && !c.ready(); })) {
    if (!c->due.empty()) SIM_TRY(AwaitPersisted(*c));
  }
  if (!rig_->pool->Drain(absl::Seconds(10))) return Fail("the flush pool does not drain");
  return true;
}

// After the clock moved: checkpoints short of ranks for longer than stage_timeout_ms are
// ABORTED (and say why); the others' staged ranks flush once the gate passed.
bool Sim::AfterAdvance() {
  for (Ckpt* c : Select([](const Ckpt& c) { return c.st == Ckpt::St::kOpen && !c.ready(); })) {
    if (Now() - c->created_ms > kStageTimeoutMs) {
      std::string why;
      SIM_TRY(Resolve(*c, Expect::kAbort, &why));
      if (why.find("stage timeout") == std::string::npos) {
        return Fail(absl::StrCat(c->name(), " aborted, but not for its stage timeout: ", why));
      }
      ++stats_->stage_timeouts;
    } else if (GateOpen(*c)) {
      c->due = c->staged;
      SIM_TRY(AwaitPersisted(*c));
    }
  }
  return true;
}

// A daemon crash (`keep_arena`: the segment survives) or a power loss (it does not). `settled`:
// nothing was in flight; otherwise flushes were cut short.
bool Sim::Restart(bool keep_arena, bool settled) {
  if (settled) SIM_TRY(Settle());
  Log(absl::StrCat("restart (arena ", keep_arena ? "kept" : "lost",
                   settled ? "" : ", flushes in flight", ")"));
  rig_->Restart(keep_arena);
  ++stats_->restarts;
  if (!rig_->recovered.ok()) return Fail("recovery: " + rig_->recovered.ToString());
  for (sim::Client& c : clients_) SIM_TRY(Connect(c));
  for (Ckpt* c : Select([](const Ckpt&) { return true; })) {
    switch (c->st) {
      case Ckpt::St::kCommitted:
        SIM_TRY(ExpectState(*c, v1::COMMITTED));
        break;
      case Ckpt::St::kAborted:
        SIM_TRY(ExpectState(*c, v1::ABORTED));
        break;
      case Ckpt::St::kDeleting:  // recovery finishes the delete
        SIM_TRY(ExpectAbsent(c->job, c->step));
        Forget(*c, true);
        break;
      case Ckpt::St::kOpen:
        SIM_TRY(CheckResumed(*c, keep_arena, settled));
        break;
    }
  }
  return true;
}

// An open checkpoint after a restart: one with every rank staged commits when the arena was
// kept or nothing was in flight; one short of ranks resumes with the same ranks when the arena
// was kept or all its ranks were persisted, and is ABORTED otherwise. (Settled, its ranks due
// were persisted and the others were not.)
bool Sim::CheckResumed(Ckpt& c, bool keep_arena, bool settled) {
  if (c.ready()) return Resolve(c, keep_arena || settled ? Expect::kCommit : Expect::kEither);
  absl::StatusOr<v1::CheckpointStatus> s = calls_->Status(Me(), c.job, c.step);
  if (!s.ok()) return Fail(absl::StrCat("status of ", c.name(), ": ", s.status().ToString()));
  const bool all_persisted = settled && c.due == c.staged;
  const v1::CheckpointState state = s->summary().state();
  if (state == v1::ABORTED) {
    if (keep_arena || all_persisted) {
      return Fail(absl::StrCat(c.name(), " was ABORTED at a restart although ",
                               keep_arena ? "the arena survived" : "its ranks were persisted",
                               ": ", s->summary().error()));
    }
    return Resolve(c, Expect::kAbort);
  }
  if (state != v1::STAGING) {
    return Fail(absl::StrCat(c.name(), " is ", v1::CheckpointState_Name(state),
                             " after a restart; want STAGING or ABORTED"));
  }
  if (!keep_arena && settled && !all_persisted) {
    return Fail(absl::StrCat(c.name(), " resumed after the arena was lost, but its ranks were "
                             "never persisted"));
  }
  std::set<uint32_t> missing(s->missing_ranks().begin(), s->missing_ranks().end());
  for (uint32_t r = 0; r < c.plan->world; ++r) {
    if (missing.contains(r) == c.staged.contains(r)) {
      return Fail(absl::StrCat(c.name(), " resumed with rank ", r,
                               c.staged.contains(r) ? " missing" : " staged",
                               "; the model says otherwise"));
    }
  }
  c.first_staged_ms = 0;  // as the resumed checkpoint's: the gate starts again at its next rank
  c.due = c.staged;       // flushed by the resume (arena kept), or persisted already
  return true;
}

bool Sim::DeleteChecked(Ckpt& c) {
  absl::Status st = calls_->Delete(Me(), c.job, c.step);
  Log(absl::StrCat("  delete ", c.name(), ": ", st.ToString()));
  SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Delete of ", c.name())));
  SIM_TRY(ExpectAbsent(c.job, c.step));
  Forget(c, true);
  return true;
}

// Ends everything in flight: ready checkpoints commit, the others are aborted, interrupted
// deletes are finished, clients give back what they hold.
bool Sim::Quiesce() {
  for (Ckpt* c : Select([](const Ckpt& c) { return c.st == Ckpt::St::kOpen; })) {
    if (c->ready()) {
      SIM_TRY(Resolve(*c, Expect::kCommit));
      continue;
    }
    absl::Status st = calls_->Abort(Me(), c->job, c->step);
    SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Abort of ", c->name())));
    SIM_TRY(Resolve(*c, Expect::kAbort));
  }
  for (Ckpt* c : Select([](const Ckpt& c) { return c.st == Ckpt::St::kDeleting; })) {
    SIM_TRY(DeleteChecked(*c));
  }
  for (sim::Client& c : clients_) {
    if (c.held.empty()) continue;
    absl::Status st = calls_->Release(c, c.held);
    SIM_TRY(Allowed(st, {Code::kOk}, "ReleaseExtents of held extents"));
    c.held.clear();
  }
  if (!rig_->pool->Drain(absl::Seconds(10))) return Fail("the flush pool does not drain");
  return true;
}

bool Sim::CheckListing(const std::string& job) {
  absl::StatusOr<std::vector<v1::CheckpointSummary>> rows = calls_->List(Me(), job);
  if (!rows.ok()) return Fail(absl::StrCat("listing ", job, ": ", rows.status().ToString()));
  std::set<uint64_t> listed;
  for (const v1::CheckpointSummary& s : *rows) {
    listed.insert(s.step());
    auto it = ckpts_.find(Key{job, s.step()});
    const v1::CheckpointState want =
        it == ckpts_.end() ? v1::CHECKPOINT_STATE_UNSPECIFIED
        : it->second.st == Ckpt::St::kCommitted ? v1::COMMITTED
                                                : v1::ABORTED;
    if (s.state() != want) {
      return Fail(absl::StrCat("after quiescing, ", job, "/", s.step(), " is listed ",
                               v1::CheckpointState_Name(s.state()), "; the model says ",
                               it == ckpts_.end() ? "it does not exist"
                                                  : v1::CheckpointState_Name(want)));
    }
  }
  uint64_t newest = 0;
  for (Ckpt* c : Select([&](const Ckpt& c) { return c.job == job; })) {
    if (!listed.contains(c->step)) return Fail(absl::StrCat(c->name(), " is not listed"));
    const std::string dir = rig_->dir + "/data/" + CheckpointDir(c->job, c->step);
    if (c->st == Ckpt::St::kAborted && std::filesystem::exists(dir)) {
      return Fail(absl::StrCat("aborted ", c->name(), " left ", dir));
    }
    if (c->st == Ckpt::St::kCommitted) newest = std::max(newest, c->step);
  }
  absl::StatusOr<uint64_t> latest = calls_->Latest(Me(), job);
  if (newest == 0 ? !absl::IsNotFound(latest.status()) : !latest.ok() || *latest != newest) {
    return Fail(absl::StrCat("latest of ", job, " is ",
                             latest.ok() ? absl::StrCat(*latest) : latest.status().ToString(),
                             "; the newest committed step is ", newest));
  }
  return true;
}

bool Sim::CheckQuiesced(bool verify_all) {
  const uint64_t free_bytes = rig_->arena->free_bytes(), cap = rig_->arena->capacity_bytes();
  if (free_bytes != cap) {
    return Fail(absl::StrCat("after quiescing the arena has ", free_bytes, " of ", cap,
                             " bytes free: ", cap - free_bytes, " bytes leaked"));
  }
  for (const char* job : kJobs) SIM_TRY(CheckListing(job));
  for (Ckpt* c : Select([](const Ckpt& c) { return c.st == Ckpt::St::kCommitted; })) {
    if (verify_all || Chance(rng_, 0.2)) SIM_TRY(Verify(*c));
  }
  return true;
}


// ---------------------------------------------------------------------------------------------
// Operations

bool Sim::OpSave() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  std::vector<Ckpt*> committed =
      Select([&](const Ckpt& c) { return c.job == job && c.st == Ckpt::St::kCommitted; });
  if (committed.size() >= kCommittedPerJobMax) SIM_TRY(DeleteChecked(*committed.front()));
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 1, 4)));
  const uint32_t world = c.plan->world;
  const bool all = world == 1 || Chance(rng_, 0.7);
  const bool replicated = std::any_of(c.plan->items.begin(), c.plan->items.end(),
                                      [](const sim::Item& it) { return it.kind == sim::Item::kReplicated; });
  c.bad_replica = all && world > 1 && replicated && Chance(rng_, 0.15);
  std::vector<uint32_t> ranks(world);
  std::iota(ranks.begin(), ranks.end(), 0);
  std::shuffle(ranks.begin(), ranks.end(), rng_);
  if (!all) ranks.resize(Uniform(rng_, 1, world - 1));
  Log(absl::StrCat("save ", c.name(), " (world ", world, ", ", c.plan->items.size(),
                   " items) ranks [", absl::StrJoin(ranks, ","), "]",
                   c.bad_replica ? ", its last rank's replica differs" : ""));
  for (uint32_t r : ranks) SIM_TRY(StageRank(c, r, AnyClient()));
  if (c.ready() && Chance(rng_, 0.6)) return Resolve(c, Expect::kCommit);
  return true;
}

bool Sim::OpStage() {
  Ckpt* c = PickOpen(false);
  if (c == nullptr) return OpSave();
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < c->plan->world; ++r) {
    if (!c->staged.contains(r)) missing.push_back(r);
  }
  std::shuffle(missing.begin(), missing.end(), rng_);
  missing.resize(Uniform(rng_, 1, missing.size()));
  Log(absl::StrCat("stage ", c->name(), " ranks [", absl::StrJoin(missing, ","), "]"));
  for (uint32_t r : missing) SIM_TRY(StageRank(*c, r, AnyClient()));
  if (c->ready() && Chance(rng_, 0.5)) return Resolve(*c, Expect::kCommit);
  return true;
}

bool Sim::OpWait() {
  if (Ckpt* c = PickOpen(true)) {
    Log(absl::StrCat("wait for ", c->name()));
    return Resolve(*c, Expect::kCommit);
  }
  Ckpt* c = PickOpen(false);
  if (c == nullptr) return OpSave();
  // Short of ranks: a Wait that answers at once names the missing ones.
  v1::CheckpointStatus s;
  absl::Status st = calls_->Wait(Me(), c->job, c->step, 0, &s);
  Log(absl::StrCat("wait(0) for ", c->name(), ": ", st.ToString()));
  SIM_TRY(Allowed(st, {Code::kDeadlineExceeded}, absl::StrCat("Wait(0) for ", c->name())));
  std::set<uint32_t> missing(s.missing_ranks().begin(), s.missing_ranks().end());
  for (uint32_t r = 0; r < c->plan->world; ++r) {
    if (missing.contains(r) == c->staged.contains(r)) {
      return Fail(absl::StrCat("Wait for ", c->name(), " reports rank ", r,
                               missing.contains(r) ? " missing" : " staged", "; it is not"));
    }
  }
  return true;
}

bool Sim::OpLoad() {
  Ckpt* c = PickCommitted();
  if (c == nullptr) return OpSave();
  std::string mismatch;
  if (c->partial && Chance(rng_, 0.3)) {
    if (std::optional<sim::Ask> lacking = sim::MissingAsk(*c->plan, c->staged)) {
      absl::Status st = calls_->Load(AnyClient(), c->job, c->step, {*lacking}, &mismatch);
      Log(absl::StrCat("load of what partial ", c->name(), " lacks: ", st.ToString()));
      return Allowed(st, {Code::kFailedPrecondition}, "load of a region a partial lacks");
    }
  }
  if (!Chance(rng_, 0.25)) {
    Log(absl::StrCat("load ", c->name()));
    return Verify(*c);
  }
  // Latest: once every ready checkpoint of the job has its outcome, the newest COMMITTED.
  const std::string job = c->job;
  for (Ckpt* r : Select([&](const Ckpt& r) {
         return r.job == job && r.st == Ckpt::St::kOpen && !r.reshard && r.ready();
       })) {
    SIM_TRY(Resolve(*r, Expect::kCommit));
  }
  Ckpt* newest = Select([&](const Ckpt& r) {
                   return r.job == job && r.st == Ckpt::St::kCommitted;
                 }).back();
  uint64_t loaded = 0;
  absl::Status st = calls_->Load(AnyClient(), job, std::nullopt,
                                 sim::RandomLoad(rng_, *newest->plan, newest->have()), &mismatch,
                                 &loaded);
  Log(absl::StrCat("load latest of ", job, ": ", st.ToString(), ", step ", loaded));
  if (!st.ok()) return Fail(absl::StrCat("load of latest of ", job, ": ", st.ToString()));
  if (loaded != newest->step) {
    return Fail(absl::StrCat("latest of ", job, " loaded step ", loaded, "; the newest "
                             "committed is ", newest->step));
  }
  if (!mismatch.empty()) return Fail(absl::StrCat("load of latest of ", job, ": ", mismatch));
  ++stats_->loads;
  return true;
}

bool Sim::OpDelete() {
  Ckpt* c = Pick([](const Ckpt& c) { return c.st != Ckpt::St::kOpen; });
  if (c == nullptr) return OpSave();
  Log(absl::StrCat("delete ", c->name()));
  return DeleteChecked(*c);
}

bool Sim::OpReshard() {
  Ckpt* src = PickCommitted(true);
  if (src == nullptr) return OpSave();
  std::string spec;
  Ckpt& t = NewReshardTarget(*src, &spec);
  const bool cancel = Chance(rng_, 0.15);
  absl::Status st = calls_->Reshard(Me(), src->job, src->step, t.job, t.step, spec);
  Log(absl::StrCat("reshard ", src->name(), " to ", t.name(), " as \"", spec, "\"",
                   cancel ? ", then abort it" : "", ": ", st.ToString()));
  SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Reshard of ", src->name())));
  Expect e = Expect::kCommit;
  if (cancel) {
    absl::Status ab = calls_->Abort(Me(), t.job, t.step);
    SIM_TRY(Allowed(ab, {Code::kOk, Code::kFailedPrecondition}, "Abort of a running reshard"));
    if (ab.ok()) e = Expect::kEither;  // the cancel may come after its last write
  }
  return Resolve(t, e);
}

bool Sim::OpAbort() {
  Ckpt* c = Pick([](const Ckpt& c) { return c.st == Ckpt::St::kOpen && !c.reshard; });
  if (c == nullptr) return OpSave();
  absl::Status st = calls_->Abort(Me(), c->job, c->step);
  Log(absl::StrCat("abort ", c->name(), c->ready() ? " (every rank staged)" : "", ": ",
                   st.ToString()));
  if (!c->ready()) {
    SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Abort of ", c->name())));
    return Resolve(*c, Expect::kAbort);
  }
  // It may be committing, or committed, already.
  SIM_TRY(Allowed(st, {Code::kOk, Code::kFailedPrecondition},
                  absl::StrCat("Abort of ", c->name())));
  return Resolve(*c, st.ok() ? Expect::kAbort : Expect::kCommit);
}

bool Sim::OpPartialCommit() {
  Ckpt* c = PickOpen(false);
  if (c == nullptr) return OpSave();
  absl::Status st = calls_->CommitPartial(Me(), c->job, c->step);
  Log(absl::StrCat("commit ", c->name(), " partial with ranks [",
                   absl::StrJoin(c->staged, ","), "]: ", st.ToString()));
  SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Commit(partial) of ", c->name())));
  c->partial = true;
  return Resolve(*c, Expect::kCommit);
}

// A client dies: maybe half way through a save (some of its ranks staged), holding extents it
// wrote and never saved. Its session ends as the Attach stream's end ends it; what it staged
// survives, what it held is freed (the quiesced arena must be all free).
bool Sim::OpClientDeath() {
  sim::Client& x = AnyClient();
  const std::string job = PickJob();
  std::string what = "client death";
  if (!job.empty() && Chance(rng_, 0.6)) {
    Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 2, 4)));
    const uint32_t k = static_cast<uint32_t>(Uniform(rng_, 1, c.plan->world - 1));
    for (uint32_t r = 0; r < k; ++r) SIM_TRY(StageRank(c, r, x));
    absl::StrAppend(&what, " after staging ", k, " of ", c.plan->world, " ranks of ", c.name());
  }
  absl::StatusOr<std::vector<v1::Extent>> ext =
      calls_->Reserve(x, {Uniform(rng_, 1, 20000), Uniform(rng_, 1, 5000)});
  if (!ext.ok()) return Fail("ReserveExtents: " + ext.status().ToString());
  for (const v1::Extent& e : *ext) {
    std::memset(rig_->arena->base() + e.offset(), 0x77, e.length());
    x.held.push_back(e.id());
  }
  Log(absl::StrCat(what, ", holding ", x.held.size(), " extents"));
  rig_->svc->EndSession(x.session);
  ++stats_->deaths;
  absl::Status st = calls_->Release(x, x.held);
  SIM_TRY(Allowed(st, {Code::kFailedPrecondition}, "ReleaseExtents on a session that ended"));
  return Connect(x);
}

// A client that dies between Hello and Attach: its session ends kSessionAttachTimeoutMs later.
bool Sim::OpUnattached() {
  sim::Client u;
  SIM_TRY(Connect(u, kSimUid, /*attach=*/false));
  absl::StatusOr<std::vector<v1::Extent>> ext = calls_->Reserve(u, {Uniform(rng_, 1, 30000)});
  if (!ext.ok()) return Fail("ReserveExtents: " + ext.status().ToString());
  const std::string job = PickJob();
  if (!job.empty() && Chance(rng_, 0.5)) {
    Ckpt& c = NewCkpt(job, 2);
    SIM_TRY(StageRank(c, 0, u));
  }
  const uint64_t d = limits::kSessionAttachTimeoutMs + Uniform(rng_, 1, 2000);
  clock_.Advance(absl::Milliseconds(d));
  Log(absl::StrCat("a session never attached; the clock advances ", d, " ms"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kWaitMs);
  while (true) {  // the next housekeeping pass ends it
    absl::Status st = calls_->Release(u, {});
    if (absl::IsFailedPrecondition(st)) break;
    SIM_TRY(Allowed(st, {Code::kOk}, "ReleaseExtents (nothing) on a live session"));
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail(absl::StrCat("a session never attached is still alive ", d,
                               " ms (fake) after its Hello"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ++stats_->deaths;
  return AfterAdvance();
}

bool Sim::OpAdvanceClock() {
  uint64_t d = 0;
  switch (Uniform(rng_, 0, 2)) {
    case 0:  // within the flush gate
      d = Uniform(rng_, 1, std::max<uint64_t>(gate_ms_, 1));
      break;
    case 1:  // past the gate, within the stage timeout
      d = Uniform(rng_, gate_ms_ + 1, kStageTimeoutMs / 2);
      break;
    default:  // past the stage timeout
      d = Uniform(rng_, kStageTimeoutMs + 1, kStageTimeoutMs + 5000);
  }
  clock_.Advance(absl::Milliseconds(d));
  Log(absl::StrCat("advance the clock ", d, " ms"));
  return AfterAdvance();
}

bool Sim::OpRestart() {
  const bool keep_arena = Chance(rng_, 0.5);
  const bool settled = Chance(rng_, 0.75);
  return Restart(keep_arena, settled);
}

// Faults are injected with nothing else in flight, so the one operation that meets them must
// fail as a whole, and one that does not meet them must succeed.
bool Sim::OpFault() {
  static const Op kFaults[] = {&Sim::FaultSave,           &Sim::FaultSave,
                               &Sim::FaultDelete,         &Sim::FaultReshard,
                               &Sim::FaultIndexJournal,   &Sim::FaultIndexCommitted,
                               &Sim::FaultIndexTombstone, &Sim::FaultIndexAbort};
  SIM_TRY(Settle());
  ++stats_->faults_armed;
  return (this->*kFaults[Uniform(rng_, 0, std::size(kFaults) - 1)])();
}

bool Sim::OpRace() {
  static const Op kRaces[] = {&Sim::RaceDeleteResave, &Sim::RaceAbortLastRank,
                              &Sim::RaceLoadDelete, &Sim::RaceReshardDelete,
                              &Sim::RaceSaveDeath};
  ++stats_->races;
  return (this->*kRaces[Uniform(rng_, 0, std::size(kRaces) - 1)])();
}

// Another uid may not read, write, delete or reshard the clients' jobs.
bool Sim::OpStranger() {
  Ckpt* c = Pick([](const Ckpt& c) { return c.st == Ckpt::St::kCommitted; });
  if (c == nullptr) return OpSave();
  sim::Client s;
  SIM_TRY(Connect(s, kStrangerUid));
  Log(absl::StrCat("uid ", kStrangerUid, " tries ", c->name()));
  std::string mismatch;
  absl::Status st = calls_->Load(s, c->job, c->step,
                                 sim::RandomLoad(rng_, *c->plan, c->have()), &mismatch);
  SIM_TRY(Allowed(st, {Code::kPermissionDenied}, "a stranger's Load"));
  st = calls_->SaveRank(s, c->job, next_step_[c->job] + 1, c->plan->world, 0,
                        sim::RankShards(*c->plan, 0), false);
  SIM_TRY(Allowed(st, {Code::kPermissionDenied}, "a stranger's Save"));
  SIM_TRY(Allowed(calls_->Delete(s.caller, c->job, c->step), {Code::kPermissionDenied},
                  "a stranger's Delete"));
  SIM_TRY(Allowed(calls_->Reshard(s.caller, c->job, c->step, "sim-stranger", 1, "rows:2"),
                  {Code::kPermissionDenied}, "a stranger's Reshard"));
  SIM_TRY(Allowed(calls_->Status(s.caller, c->job, c->step).status(),
                  {Code::kPermissionDenied}, "a stranger's GetStatus"));
  rig_->svc->EndSession(s.session);
  return true;
}

// Calls that must be refused, with the code that says why.
bool Sim::OpRefusal() {
  std::string mismatch;
  const std::string job = kJobs[Uniform(rng_, 0, 1)];
  switch (Uniform(rng_, 0, 5)) {
    case 0:
      if (Ckpt* c = Pick([](const Ckpt& c) { return c.st != Ckpt::St::kOpen; })) {
        Log(absl::StrCat("save onto existing ", c->name()));
        return StageRank(*c, 0, AnyClient(), {Code::kAlreadyExists});
      }
      break;
    case 1:
      if (Ckpt* c = PickOpen(false); c != nullptr && !c->staged.empty()) {
        if (Chance(rng_, 0.5)) {
          Log(absl::StrCat("save a staged rank of ", c->name(), " again"));
          return StageRank(*c, *c->staged.begin(), AnyClient(), {Code::kAlreadyExists});
        }
        uint32_t r = 0;
        while (c->staged.contains(r)) ++r;
        Log(absl::StrCat("save rank ", r, " of ", c->name(), " with another world size"));
        absl::Status st = calls_->SaveRank(AnyClient(), c->job, c->step, c->plan->world + 1, r,
                                           sim::RankShards(*c->plan, r), false);
        return Allowed(st, {Code::kInvalidArgument}, "a Save with another world size");
      }
      break;
    case 2:
      if (Ckpt* c = PickOpen(false)) {
        Log(absl::StrCat("delete ", c->name(), " while it is saved"));
        SIM_TRY(Allowed(calls_->Delete(Me(), c->job, c->step), {Code::kFailedPrecondition},
                        "Delete of a checkpoint being saved"));
      }
      if (Ckpt* c = PickCommitted()) {
        Log(absl::StrCat("abort committed ", c->name()));
        SIM_TRY(Allowed(calls_->Abort(Me(), c->job, c->step), {Code::kFailedPrecondition},
                        "Abort of a committed checkpoint"));
      }
      return true;
    case 3:
      if (Ckpt* c = Pick([](const Ckpt& c) {
            return (c.st == Ckpt::St::kOpen && !c.reshard && !c.ready()) ||
                   c.st == Ckpt::St::kAborted || c.st == Ckpt::St::kDeleting;
          })) {
        Log(absl::StrCat("load ", c->name(), " (not COMMITTED)"));
        SIM_TRY(Allowed(calls_->Load(AnyClient(), c->job, c->step,
                                     sim::RandomLoad(rng_, *c->plan, c->have()), &mismatch),
                        {Code::kFailedPrecondition}, "load of a checkpoint not COMMITTED"));
      }
      Log(absl::StrCat("load ", job, "/", next_step_[job] + 1000, " (never saved)"));
      return Allowed(calls_->Load(AnyClient(), job, next_step_[job] + 1000,
                                  {sim::Ask{v1::LoadItemRequest(), "x"}}, &mismatch),
                     {Code::kNotFound}, "load of a step never saved");
    case 4:
      if (Ckpt* p = Pick([](const Ckpt& c) { return c.st == Ckpt::St::kCommitted && c.partial; })) {
        Log(absl::StrCat("reshard partial ", p->name()));
        SIM_TRY(Allowed(calls_->Reshard(Me(), p->job, p->step, p->job, next_step_[p->job] + 1000,
                                        "rows:2"),
                        {Code::kFailedPrecondition}, "Reshard of a partial checkpoint"));
      }
      if (Ckpt* s = PickCommitted(true)) {
        Ckpt* t = Pick([](const Ckpt& c) { return !c.reshard || c.st != Ckpt::St::kOpen; });
        Log(absl::StrCat("reshard ", s->name(), " onto existing ", t->name()));
        return Allowed(calls_->Reshard(Me(), s->job, s->step, t->job, t->step, "rows:2"),
                       {Code::kAlreadyExists}, "Reshard onto an existing step");
      }
      break;
    default:
      if (Ckpt* c = PickOpen(false)) {
        Log(absl::StrCat("commit ", c->name(), " with partial=false"));
        SIM_TRY(Allowed(calls_->CommitPartial(Me(), c->job, c->step, false),
                        {Code::kInvalidArgument}, "Commit with partial=false"));
      }
      v1::CheckpointStatus s;
      Log(absl::StrCat("wait for ", job, "/", next_step_[job] + 1000, " (never saved)"));
      return Allowed(calls_->Wait(Me(), job, next_step_[job] + 1000, 10, &s), {Code::kNotFound},
                     "Wait for a step never saved");
  }
  return OpSave();
}

// ---------------------------------------------------------------------------------------------
// Faults (OpFault)

const char* OpName(FaultIo::Op op) {
  switch (op) {
    case FaultIo::Op::kWrite: return "write";
    case FaultIo::Op::kSync: return "fdatasync/fsync";
    case FaultIo::Op::kRename: return "rename";
    case FaultIo::Op::kFsyncDir: return "directory fsync";
    default: return "I/O call";
  }
}

// What a failing synced index write answers (MetaStore's codes).
absl::Status InjectedIndexError(std::mt19937_64& rng) {
  switch (Uniform(rng, 0, 2)) {
    case 0: return absl::UnavailableError("injected: the index is unavailable");
    case 1: return absl::ResourceExhaustedError("injected: the index volume is full");
    default: return absl::InternalError("injected: an index I/O error");
  }
}

// The next write, sync, rename or directory sync fails while a new checkpoint is saved: met, it
// aborts the checkpoint; not met, the checkpoint commits.
bool Sim::FaultSave() {
  static const FaultIo::Op kOps[] = {FaultIo::Op::kWrite, FaultIo::Op::kSync,
                                     FaultIo::Op::kRename, FaultIo::Op::kFsyncDir};
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  const FaultIo::Op op = kOps[Uniform(rng_, 0, 3)];
  const int err = Chance(rng_, 0.5) ? EIO : ENOSPC;
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 1, 3)));
  FaultIo& io = *rig_->io;
  const uint64_t before = io.calls(op);
  io.FailNext(op, err);
  Log(absl::StrCat("fault: the next ", OpName(op), " fails (", std::strerror(err), "); save ",
                   c.name(), " (world ", c.plan->world, ")"));
  // A flush may start before the last rank is staged (the gate is 0 or passed): once the fault
  // has aborted the checkpoint, its later ranks are refused.
  bool ok = true;
  for (uint32_t r = 0; ok && r < c.plan->world; ++r) {
    absl::Status st;
    ok = StageRank(c, r, AnyClient(),
                   {Code::kOk, Code::kFailedPrecondition, Code::kAborted, Code::kAlreadyExists},
                   &st);
    if (ok && !st.ok() && io.calls(op) == before) {
      ok = Fail(absl::StrCat("Save of ", c.name(), " rank ", r, " refused before any fault: ",
                             st.ToString()));
    }
    if (!st.ok()) break;
  }
  ok = ok && Resolve(c, Expect::kEither);
  const bool met = io.calls(op) > before;
  io.ClearAll();
  SIM_TRY(ok);
  stats_->faults_fired += met;
  if (met && c.st == Ckpt::St::kCommitted) {
    return Fail(absl::StrCat(c.name(), " COMMITTED although a ", OpName(op), " failed"));
  }
  if (!met && c.st != Ckpt::St::kCommitted) {
    return Fail(absl::StrCat(c.name(), " aborted, but the armed fault never fired"));
  }
  return true;
}

// The directory sync after the manifest's removal fails: Delete says so, the checkpoint stays
// DELETING (never loadable), and Delete again (or a restart) finishes it.
bool Sim::FaultDelete() {
  Ckpt* c = PickCommitted();
  if (c == nullptr) return FaultSave();
  FaultIo& io = *rig_->io;
  const uint64_t before = io.calls(FaultIo::Op::kFsyncDir);
  io.FailNext(FaultIo::Op::kFsyncDir, EIO);
  absl::Status st = calls_->Delete(Me(), c->job, c->step);
  const bool met = io.calls(FaultIo::Op::kFsyncDir) > before;
  io.ClearAll();
  Log(absl::StrCat("fault: the next directory fsync fails; delete ", c->name(), ": ",
                   st.ToString()));
  if (!met) return Fail("Delete made no directory fsync");
  ++stats_->faults_fired;
  SIM_TRY(Allowed(st, {Code::kDataLoss}, "Delete meeting EIO"));
  SIM_TRY(ExpectState(*c, v1::DELETING));
  std::string mismatch;
  SIM_TRY(Allowed(calls_->Load(AnyClient(), c->job, c->step,
                               sim::RandomLoad(rng_, *c->plan, c->have()), &mismatch),
                  {Code::kFailedPrecondition}, "load of a checkpoint left DELETING"));
  c->st = Ckpt::St::kDeleting;
  if (Chance(rng_, 0.5)) return DeleteChecked(*c);
  return true;  // a later Delete, quiesce or restart finishes it
}

bool Sim::FaultReshard() {
  Ckpt* src = PickCommitted(true);
  if (src == nullptr) return FaultSave();
  std::string spec;
  Ckpt& t = NewReshardTarget(*src, &spec);
  const FaultIo::Op op = Chance(rng_, 0.5) ? FaultIo::Op::kWrite : FaultIo::Op::kSync;
  const int err = Chance(rng_, 0.5) ? EIO : ENOSPC;
  FaultIo& io = *rig_->io;
  const uint64_t before = io.calls(op);
  io.FailNext(op, err);
  absl::Status st = calls_->Reshard(Me(), src->job, src->step, t.job, t.step, spec);
  Log(absl::StrCat("fault: the next ", OpName(op), " fails (", std::strerror(err),
                   "); reshard ", src->name(), " to ", t.name(), " as \"", spec, "\": ",
                   st.ToString()));
  const bool ok = Allowed(st, {Code::kOk}, "Reshard") && Resolve(t, Expect::kEither);
  const bool met = io.calls(op) > before;
  io.ClearAll();
  SIM_TRY(ok);
  stats_->faults_fired += met;
  if (met == (t.st == Ckpt::St::kCommitted)) {
    return Fail(absl::StrCat("reshard target ", t.name(), met ? " COMMITTED although a " :
                             " aborted although no ", OpName(op), " failed"));
  }
  return true;
}

// The synced journal write of a rank fails: that Save answers the index's code and the whole
// checkpoint is aborted (ranks staged before it included).
bool Sim::FaultIndexJournal() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 1, 3)));
  const uint32_t k = static_cast<uint32_t>(Uniform(rng_, 0, c.plan->world - 1));
  for (uint32_t r = 0; r < k; ++r) SIM_TRY(StageRank(c, r, AnyClient()));
  const absl::Status injected = InjectedIndexError(rng_);
  rig_->meta_gate.Arm(keys::Checkpoint(c.job, c.step), injected);
  Log(absl::StrCat("fault: the journal write of ", c.name(), " rank ", k, " fails (",
                   injected.ToString(), ")"));
  const bool ok = StageRank(c, k, AnyClient(), {injected.code()});
  const bool met = rig_->meta_gate.reached();
  rig_->meta_gate.Disarm();
  SIM_TRY(ok);
  if (!met) return Fail("the rank's journal write never reached the index");
  ++stats_->faults_fired;
  return Resolve(c, Expect::kAbort);
}

// The synced COMMITTED row fails (after the manifest is durable): the checkpoint is aborted
// and its files collected. Armed once every rank is staged, so the commit may win the race.
bool Sim::FaultIndexCommitted() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 1, 3)));
  SIM_TRY(StageAll(c));
  rig_->meta_gate.Arm(keys::Checkpoint(c.job, c.step), InjectedIndexError(rng_));
  Log(absl::StrCat("fault: the COMMITTED row of ", c.name(), " fails"));
  const bool ok = Resolve(c, Expect::kEither);
  const bool met = rig_->meta_gate.reached();
  rig_->meta_gate.Disarm();
  SIM_TRY(ok);
  stats_->faults_fired += met;
  if (met == (c.st == Ckpt::St::kCommitted)) {
    return Fail(absl::StrCat(c.name(), met ? " COMMITTED although its COMMITTED row failed"
                                           : " aborted although no index write failed"));
  }
  return true;
}

// The DELETING tombstone fails: Delete answers the index's code, the checkpoint stays intact.
bool Sim::FaultIndexTombstone() {
  Ckpt* c = PickCommitted();
  if (c == nullptr) return FaultIndexCommitted();
  const absl::Status injected = InjectedIndexError(rng_);
  rig_->meta_gate.Arm(keys::Checkpoint(c->job, c->step), injected);
  absl::Status st = calls_->Delete(Me(), c->job, c->step);
  const bool met = rig_->meta_gate.reached();
  rig_->meta_gate.Disarm();
  Log(absl::StrCat("fault: the DELETING row of ", c->name(), " fails; delete: ", st.ToString()));
  if (!met) return Fail("Delete wrote no DELETING row");
  ++stats_->faults_fired;
  SIM_TRY(Allowed(st, {injected.code()}, "Delete whose tombstone fails"));
  SIM_TRY(ExpectState(*c, v1::COMMITTED));
  return Verify(*c);
}

// The ABORTED row of an Abort fails: the checkpoint must still end ABORTED, never resumed.
bool Sim::FaultIndexAbort() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 2, 4)));
  const uint32_t k = static_cast<uint32_t>(Uniform(rng_, 1, c.plan->world - 1));
  for (uint32_t r = 0; r < k; ++r) SIM_TRY(StageRank(c, r, AnyClient()));
  rig_->meta_gate.Arm(keys::Checkpoint(c.job, c.step), InjectedIndexError(rng_));
  absl::Status st = calls_->Abort(Me(), c.job, c.step);
  Log(absl::StrCat("fault: the ABORTED row of ", c.name(), " fails; abort: ", st.ToString()));
  const bool ok = Allowed(st, {Code::kOk}, "Abort") && Resolve(c, Expect::kAbort);
  const bool met = rig_->meta_gate.reached();
  rig_->meta_gate.Disarm();
  SIM_TRY(ok);
  stats_->faults_fired += met;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Races (OpRace): two calls at once; the model accepts every outcome an interleaving allows.

bool Sim::RaceDeleteResave() {
  Ckpt* old = PickCommitted();
  if (old == nullptr) return OpSave();
  const std::string job = old->job;
  const uint64_t step = old->step;
  auto plan = std::make_shared<const sim::Plan>(
      sim::RandomPlan(rng_, static_cast<uint32_t>(Uniform(rng_, 1, 3))));
  std::vector<bool> one(plan->world);
  for (uint32_t r = 0; r < plan->world; ++r) one[r] = Chance(rng_, 0.3);
  sim::Client& saver = AnyClient();
  const Caller deleter = Me();
  Log(absl::StrCat("race: delete ", old->name(), " while it is saved again (world ",
                   plan->world, ")"));
  absl::Status deleted;
  std::thread t([&] { deleted = calls_->Delete(deleter, job, step); });
  std::vector<absl::Status> saved;
  for (uint32_t r = 0; r < plan->world; ++r) {
    saved.push_back(calls_->SaveRank(saver, job, step, plan->world, r, sim::RankShards(*plan, r),
                                     one[r]));
    if (!saved.back().ok()) break;
  }
  t.join();
  Log(absl::StrCat("  delete: ", deleted.ToString(), "; save of rank 0: ", saved[0].ToString()));
  SIM_TRY(Allowed(deleted, {Code::kOk}, "Delete racing a re-save"));
  SIM_TRY(Allowed(saved[0], {Code::kOk, Code::kAlreadyExists, Code::kAborted},
                  "a re-save racing its Delete"));
  Forget(*old, true);
  if (!saved[0].ok()) return ExpectAbsent(job, step);
  for (const absl::Status& st : saved) SIM_TRY(Allowed(st, {Code::kOk}, "a re-save's rank"));
  deleted_steps_[job].erase(step);
  Ckpt& c = ckpts_[Key{job, step}];
  c = Ckpt{};
  c.job = job;
  c.step = step;
  c.plan = plan;
  for (uint32_t r = 0; r < plan->world; ++r) c.staged.insert(r);
  c.created_ms = c.first_staged_ms = Now();
  return Resolve(c, Expect::kCommit);
}

bool Sim::RaceAbortLastRank() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 2, 4)));
  const uint32_t last = c.plan->world - 1;
  for (uint32_t r = 0; r < last; ++r) SIM_TRY(StageRank(c, r, AnyClient()));
  const bool one = Chance(rng_, 0.3);
  const std::vector<sim::Shard> shards = sim::RankShards(*c.plan, last);
  sim::Client& saver = AnyClient();
  const Caller aborter = Me();
  const std::string cjob = c.job;
  const uint64_t cstep = c.step;
  absl::Status aborted;
  std::thread t([&] { aborted = calls_->Abort(aborter, cjob, cstep); });
  absl::Status saved = calls_->SaveRank(saver, cjob, cstep, c.plan->world, last, shards, one);
  t.join();
  Log(absl::StrCat("race: abort ", c.name(), " while its last rank is saved: abort ",
                   aborted.ToString(), ", save ", saved.ToString()));
  SIM_TRY(Allowed(aborted, {Code::kOk, Code::kFailedPrecondition},
                  "Abort racing the last rank's Save"));
  SIM_TRY(Allowed(saved,
                  {Code::kOk, Code::kFailedPrecondition, Code::kAborted, Code::kAlreadyExists},
                  "the last rank's Save racing an Abort"));
  if (!aborted.ok() && !saved.ok()) return Fail("both the Abort and the last Save were refused");
  if (saved.ok()) c.staged.insert(last);
  return Resolve(c, aborted.ok() ? Expect::kAbort : Expect::kCommit);
}

bool Sim::RaceLoadDelete() {
  Ckpt* c = PickCommitted();
  if (c == nullptr) return OpSave();
  const std::vector<sim::Ask> asks = sim::RandomLoad(rng_, *c->plan, c->have());
  const std::string job = c->job;
  const uint64_t step = c->step;
  sim::Client& loader = AnyClient();
  const Caller deleter = Me();
  absl::Status deleted;
  std::thread t([&] { deleted = calls_->Delete(deleter, job, step); });
  std::string mismatch;
  absl::Status loaded = calls_->Load(loader, job, step, asks, &mismatch);
  t.join();
  Log(absl::StrCat("race: load ", c->name(), " while it is deleted: load ", loaded.ToString(),
                   ", delete ", deleted.ToString()));
  SIM_TRY(Allowed(deleted, {Code::kOk}, "Delete racing a load"));
  SIM_TRY(Allowed(loaded, {Code::kOk, Code::kNotFound, Code::kFailedPrecondition},
                  "a load racing a Delete"));
  if (!mismatch.empty()) return Fail("a load racing a Delete gave other bytes: " + mismatch);
  Forget(*c, true);
  return ExpectAbsent(job, step);
}

bool Sim::RaceReshardDelete() {
  Ckpt* src = PickCommitted(true);
  if (src == nullptr) return OpSave();
  std::string spec;
  Ckpt& t = NewReshardTarget(*src, &spec);
  const std::string sjob = src->job;
  const uint64_t sstep = src->step;
  const Caller deleter = Me();
  absl::Status deleted;
  std::thread th([&] { deleted = calls_->Delete(deleter, sjob, sstep); });
  absl::Status started = calls_->Reshard(Me(), sjob, sstep, t.job, t.step, spec);
  th.join();
  Log(absl::StrCat("race: reshard ", src->name(), " to ", t.name(), " while the source is "
                   "deleted: reshard ", started.ToString(), ", delete ", deleted.ToString()));
  SIM_TRY(Allowed(deleted, {Code::kOk, Code::kFailedPrecondition}, "Delete of a reshard source"));
  SIM_TRY(Allowed(started,
                  {Code::kOk, Code::kAborted, Code::kNotFound, Code::kFailedPrecondition},
                  "a Reshard racing the Delete of its source"));
  if (!deleted.ok() && !started.ok()) return Fail("both the Reshard and the Delete were refused");
  if (deleted.ok()) {
    Forget(*src, true);
    SIM_TRY(ExpectAbsent(sjob, sstep));
  }
  if (!started.ok()) {
    const std::string tjob = t.job;
    const uint64_t tstep = t.step;
    Forget(t, false);
    return ExpectAbsent(tjob, tstep);
  }
  return Resolve(t, deleted.ok() ? Expect::kEither : Expect::kCommit);
}

bool Sim::RaceSaveDeath() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 2, 4)));
  const uint32_t last = c.plan->world - 1;
  for (uint32_t r = 0; r < last; ++r) SIM_TRY(StageRank(c, r, AnyClient()));
  sim::Client& x = AnyClient();
  const std::string session = x.session;
  const bool one = Chance(rng_, 0.3);
  std::thread killer;
  absl::Status saved =
      calls_->SaveRank(x, c.job, c.step, c.plan->world, last, sim::RankShards(*c.plan, last), one,
                       [&] { killer = std::thread([&] { rig_->svc->EndSession(session); }); });
  if (killer.joinable()) killer.join();
  rig_->svc->EndSession(session);
  Log(absl::StrCat("race: the client saving ", c.name(), " rank ", last, " dies: save ",
                   saved.ToString()));
  ++stats_->deaths;
  SIM_TRY(Allowed(saved, {Code::kOk, Code::kFailedPrecondition, Code::kNotFound},
                  "a Save racing its client's death"));
  SIM_TRY(Connect(x));
  if (saved.ok()) {
    c.staged.insert(last);
  } else {
    SIM_TRY(StageRank(c, last, x));  // the restarted client saves it again
  }
  return Resolve(c, Expect::kCommit);
}

// ---------------------------------------------------------------------------------------------
// The test cases

std::vector<uint64_t> Seeds(uint64_t first, size_t count) {
  if (const char* env = std::getenv("CKPTD_SIM_SEED")) return {std::strtoull(env, nullptr, 10)};
  std::vector<uint64_t> seeds;
  for (size_t i = 0; i < count; ++i) seeds.push_back(first + i);
  return seeds;
}

void RunSeeds(const std::vector<uint64_t>& seeds, int ops) {
  const spdlog::level::level_enum level = spdlog::get_level();
  if (std::getenv("CKPTD_SIM_LOG") == nullptr) spdlog::set_level(spdlog::level::off);
  SimStats stats;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t seed : seeds) {
    INFO("simulation seed " << seed << " (replay: CKPTD_SIM_SEED=" << seed << ")");
    const std::string failure = Sim(seed, ops, &stats).Run();
    if (!failure.empty()) {
      std::cerr << failure << "\n";
      UNSCOPED_INFO(failure);
    }
    CHECK(failure.empty());
  }
  spdlog::set_level(level);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << absl::StrCat(
                   "simulation: ", stats.seeds, " seeds (", stats.tmpfs_seeds, " on tmpfs, ",
                   stats.rocksdb_seeds, " with RocksDB), ", stats.ops, " ops: ", stats.committed,
                   " checkpoints committed (", stats.resharded, " by reshard), ", stats.aborted,
                   " aborted (", stats.stage_timeouts, " by stage timeout), ", stats.deleted,
                   " deleted; ", stats.loads, " loads verified; ", stats.faults_armed,
                   " faults injected (", stats.faults_fired, " met), ", stats.restarts,
                   " restarts, ", stats.races, " races, ", stats.deaths, " client deaths in ",
                   absl::StrFormat("%.1f", secs), " s")
            << std::endl;
}

// make test runs this binary under ASan and under TSan (Makefile): fewer seeds there keep each
// tier near the plain build's runtime (the same seeds, the first of them).
#if defined(__SANITIZE_THREAD__)
constexpr size_t kSeedsMakeTest = 6;
#elif defined(__SANITIZE_ADDRESS__)
constexpr size_t kSeedsMakeTest = 12;
#else
constexpr size_t kSeedsMakeTest = 24;
#endif

TEST_CASE("simulation: random saves, loads, deletes, reshards, client deaths, faults and "
          "restarts never lose or change a committed checkpoint",
          "[unit][simulation]") {
  RunSeeds(Seeds(1, kSeedsMakeTest), 200);
}

// The soak variant: 500 seeds from CKPTD_SIM_SEED_BASE (default 1000), 300 ops each.
TEST_CASE("simulation: soak, 500 seeds", "[.][soak][simulation_soak]") {
  const char* base = std::getenv("CKPTD_SIM_SEED_BASE");
  RunSeeds(Seeds(base != nullptr ? std::strtoull(base, nullptr, 10) : 1000, 500), 300);
}

}  // namespace
}  // namespace ckptd
