// The control-plane simulation (simulation.h says what it runs and checks): the driver's
// plumbing, its model, the actions that judge the daemon's answers, and the test cases.
#include "simulation.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "format/names.h"
#include "spdlog/spdlog.h"

namespace ckptd::sim {

bool Sim::Allowed(const absl::Status& st, Codes codes, const std::string& what) {
  std::vector<std::string> names;
  for (Code c : codes) {
    if (st.code() == c) return true;
    names.push_back(absl::StatusCodeToString(c));
  }
  return Fail(
      absl::StrCat(what, " answered ", st.ToString(), "; allowed: ", absl::StrJoin(names, ", ")));
}

bool Sim::Connect(sim::Client& c, uint32_t uid, bool attach) {
  absl::Status st = calls_->Connect(c, uid, next_connection_++, attach);
  return st.ok() || Fail(absl::StrCat("Hello/Attach: ", st.ToString()));
}

namespace {

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

}  // namespace

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
      {18, &Sim::OpSave},      {10, &Sim::OpStage},        {10, &Sim::OpWait},
      {12, &Sim::OpLoad},      {6, &Sim::OpDelete},        {4, &Sim::OpReshard},
      {4, &Sim::OpAbort},      {3, &Sim::OpPartialCommit}, {4, &Sim::OpClientDeath},
      {2, &Sim::OpUnattached}, {5, &Sim::OpAdvanceClock},  {7, &Sim::OpFault},
      {3, &Sim::OpRestart},    {4, &Sim::OpRace},          {2, &Sim::OpQuiesce},
      {1, &Sim::OpStranger},   {3, &Sim::OpRefusal}};
  int total = 0;
  for (const auto& [w, fn] : kOps) total += w;
  rng_.seed(sequence_());
  bool ok = Setup();
  for (op_ = 1; ok && op_ <= ops_; ++op_) {
    int pick = static_cast<int>(Uniform(sequence_, 0, total - 1));
    rng_.seed(sequence_());
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
    rng_.seed(sequence_());
    ok = Quiesce() && CheckQuiesced(true) && Restart(Chance(rng_, 0.5), true) && Quiesce() &&
         CheckQuiesced(true);
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
  return Pick(
      [&](const Ckpt& c) { return c.st == Ckpt::St::kOpen && !c.reshard && c.ready() == ready; });
}

Ckpt* Sim::PickCommitted(bool complete_only) {
  return Pick([&](const Ckpt& c) {
    return c.st == Ckpt::St::kCommitted && (!complete_only || !c.partial);
  });
}

std::string Sim::PickJob() {
  std::vector<std::string> jobs;
  for (const char* job : kJobs) {
    size_t open =
        Select([&](const Ckpt& c) { return c.job == job && c.st == Ckpt::St::kOpen; }).size();
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

bool Sim::StageRank(Ckpt& c, uint32_t rank, sim::Client& cl, Codes allowed, absl::Status* answer) {
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
  return Fail(absl::StrCat("Wait for ", c.name(), " (", c.staged.size(), " of ", c.plan->world,
                           " ranks staged", c.partial ? ", partial" : "", ") answered ",
                           st.ToString(), "; ranks: [", absl::StrJoin(ranks, ", "),
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
                             "; want ", v1::CheckpointState_Name(want), " (", s->summary().error(),
                             ")"));
  }
  return true;
}

bool Sim::ExpectAbsent(const std::string& job, uint64_t step) {
  absl::StatusOr<v1::CheckpointStatus> s = calls_->Status(Me(), job, step);
  if (!absl::IsNotFound(s.status())) {
    return Fail(absl::StrCat(
        job, "/", step, " should not exist; status says ",
        s.ok() ? v1::CheckpointState_Name(s->summary().state()) : s.status().ToString()));
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
    for (const v1::RankStatus& r : s->ranks()) {
      persisted += r.persisted() && c.due.contains(r.rank());
    }
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
        // A power loss with flushes in flight: what survived depends on timing.
        if (!keep_arena && !settled) SIM_TRY(Converge(*c));
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
                               keep_arena ? "the arena survived" : "its ranks were persisted", ": ",
                               s->summary().error()));
    }
    return Resolve(c, Expect::kAbort);
  }
  if (state != v1::STAGING) {
    return Fail(absl::StrCat(c.name(), " is ", v1::CheckpointState_Name(state),
                             " after a restart; want STAGING or ABORTED"));
  }
  if (!keep_arena && settled && !all_persisted) {
    return Fail(absl::StrCat(c.name(),
                             " resumed after the arena was lost, but its ranks were "
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

bool Sim::Converge(Ckpt& c) {
  if (c.st == Ckpt::St::kOpen) {
    absl::Status st = calls_->Abort(Me(), c.job, c.step);
    SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Abort of ", c.name())));
    SIM_TRY(Resolve(c, Expect::kAbort));
  }
  return DeleteChecked(c);
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
    const v1::CheckpointState want = it == ckpts_.end() ? v1::CHECKPOINT_STATE_UNSPECIFIED
                                     : it->second.st == Ckpt::St::kCommitted ? v1::COMMITTED
                                                                             : v1::ABORTED;
    if (s.state() != want) {
      return Fail(
          absl::StrCat("after quiescing, ", job, "/", s.step(), " is listed ",
                       v1::CheckpointState_Name(s.state()), "; the model says ",
                       it == ckpts_.end() ? "it does not exist" : v1::CheckpointState_Name(want)));
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
  // Every extent is free but those of hot checkpoints (the RAM tier); no save is in flight, so
  // none is provisional.
  const uint64_t free_bytes = rig_->arena->free_bytes(), cap = rig_->arena->capacity_bytes();
  const RamTier::Stats ram = rig_->svc->ram_tier_stats();
  if (free_bytes + ram.hot_bytes != cap || ram.provisional_bytes != 0) {
    return Fail(absl::StrCat("after quiescing the arena has ", free_bytes, " of ", cap,
                             " bytes free, ", ram.hot_bytes, " hot, ", ram.provisional_bytes,
                             " provisional: ", cap - free_bytes - ram.hot_bytes, " bytes leaked"));
  }
  for (const char* job : kJobs) SIM_TRY(CheckListing(job));
  for (Ckpt* c : Select([](const Ckpt& c) { return c.st == Ckpt::St::kCommitted; })) {
    if (verify_all || Chance(rng_, 0.2)) SIM_TRY(Verify(*c));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The test cases

namespace {

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
  std::cout << absl::StrCat("simulation: ", stats.seeds, " seeds (", stats.tmpfs_seeds,
                            " on tmpfs, ", stats.rocksdb_seeds, " with RocksDB), ", stats.ops,
                            " ops: ", stats.committed, " checkpoints committed (", stats.resharded,
                            " by reshard), ", stats.aborted, " aborted (", stats.stage_timeouts,
                            " by stage timeout), ", stats.deleted, " deleted; ", stats.loads,
                            " loads verified; ", stats.faults_armed, " faults injected (",
                            stats.faults_fired, " met), ", stats.restarts, " restarts, ",
                            stats.races, " races, ", stats.deaths, " client deaths in ",
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

TEST_CASE(
    "simulation: random saves, loads, deletes, reshards, client deaths, faults and "
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
}  // namespace ckptd::sim
