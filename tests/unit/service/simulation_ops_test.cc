// The control-plane simulation's operations (simulation.h): one is drawn for each step of a run.
// (A *_test.cc file so the unit tests' glob compiles it into ckptd_unit_service.)
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "absl/strings/str_join.h"
#include "common/limits.h"
#include "simulation.h"

namespace ckptd::sim {
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
  const bool replicated =
      std::any_of(c.plan->items.begin(), c.plan->items.end(),
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
  Ckpt* newest =
      Select([&](const Ckpt& r) { return r.job == job && r.st == Ckpt::St::kCommitted; }).back();
  uint64_t loaded = 0;
  absl::Status st =
      calls_->Load(AnyClient(), job, std::nullopt,
                   sim::RandomLoad(rng_, *newest->plan, newest->have()), &mismatch, &loaded);
  Log(absl::StrCat("load latest of ", job, ": ", st.ToString(), ", step ", loaded));
  if (!st.ok()) return Fail(absl::StrCat("load of latest of ", job, ": ", st.ToString()));
  if (loaded != newest->step) {
    return Fail(absl::StrCat("latest of ", job, " loaded step ", loaded,
                             "; the newest "
                             "committed is ",
                             newest->step));
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
  if (!cancel) return Resolve(t, Expect::kCommit);
  absl::Status ab = calls_->Abort(Me(), t.job, t.step);
  SIM_TRY(Allowed(ab, {Code::kOk, Code::kFailedPrecondition}, "Abort of a running reshard"));
  // The cancel may come after its last write.
  SIM_TRY(Resolve(t, ab.ok() ? Expect::kEither : Expect::kCommit));
  return Converge(t);
}

// Of a checkpoint short of ranks (one with every rank staged may be committing already: the
// race of RaceAbortLastRank).
bool Sim::OpAbort() {
  Ckpt* c = PickOpen(false);
  if (c == nullptr) return OpSave();
  absl::Status st = calls_->Abort(Me(), c->job, c->step);
  Log(absl::StrCat("abort ", c->name(), ": ", st.ToString()));
  SIM_TRY(Allowed(st, {Code::kOk}, absl::StrCat("Abort of ", c->name())));
  return Resolve(*c, Expect::kAbort);
}

bool Sim::OpPartialCommit() {
  Ckpt* c = PickOpen(false);
  if (c == nullptr) return OpSave();
  absl::Status st = calls_->CommitPartial(Me(), c->job, c->step);
  Log(absl::StrCat("commit ", c->name(), " partial with ranks [", absl::StrJoin(c->staged, ","),
                   "]: ", st.ToString()));
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
    std::memset(rig_->arena->At(x.caller.uid, 0) + e.offset(), 0x77, e.length());
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
  static const Op kRaces[] = {&Sim::RaceDeleteResave, &Sim::RaceAbortLastRank, &Sim::RaceLoadDelete,
                              &Sim::RaceReshardDelete, &Sim::RaceSaveDeath};
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
  absl::Status st =
      calls_->Load(s, c->job, c->step, sim::RandomLoad(rng_, *c->plan, c->have()), &mismatch);
  SIM_TRY(Allowed(st, {Code::kPermissionDenied}, "a stranger's Load"));
  st = calls_->SaveRank(s, c->job, next_step_[c->job] + 1, c->plan->world, 0,
                        sim::RankShards(*c->plan, 0), false);
  SIM_TRY(Allowed(st, {Code::kPermissionDenied}, "a stranger's Save"));
  SIM_TRY(Allowed(calls_->Delete(s.caller, c->job, c->step), {Code::kPermissionDenied},
                  "a stranger's Delete"));
  SIM_TRY(Allowed(calls_->Reshard(s.caller, c->job, c->step, "sim-stranger", 1, "rows:2"),
                  {Code::kPermissionDenied}, "a stranger's Reshard"));
  SIM_TRY(Allowed(calls_->Status(s.caller, c->job, c->step).status(), {Code::kPermissionDenied},
                  "a stranger's GetStatus"));
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
        SIM_TRY(Allowed(
            calls_->Reshard(Me(), p->job, p->step, p->job, next_step_[p->job] + 1000, "rows:2"),
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

}  // namespace ckptd::sim
