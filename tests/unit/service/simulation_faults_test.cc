// The control-plane simulation's injected faults and races (simulation.h). (A *_test.cc file so
// the unit tests' glob compiles it into ckptd_unit_service.)
#include <cerrno>
#include <cstring>
#include <thread>

#include "index/keys.h"
#include "simulation.h"

namespace ckptd::sim {
// ---------------------------------------------------------------------------------------------
// Faults (OpFault)

namespace {

const char* OpName(FaultIo::Op op) {
  switch (op) {
    case FaultIo::Op::kWrite:
      return "write";
    case FaultIo::Op::kSync:
      return "fdatasync/fsync";
    case FaultIo::Op::kRename:
      return "rename";
    case FaultIo::Op::kFsyncDir:
      return "directory fsync";
    default:
      return "I/O call";
  }
}

// What a failing synced index write answers (MetaStore's codes).
absl::Status InjectedIndexError(std::mt19937_64& rng) {
  switch (Uniform(rng, 0, 2)) {
    case 0:
      return absl::UnavailableError("injected: the index is unavailable");
    case 1:
      return absl::ResourceExhaustedError("injected: the index volume is full");
    default:
      return absl::InternalError("injected: an index I/O error");
  }
}

}  // namespace

// The next write, sync, rename or directory sync fails while a new checkpoint is saved: met, it
// aborts the checkpoint; not met, the checkpoint commits.
bool Sim::FaultSave() {
  static const FaultIo::Op kOps[] = {FaultIo::Op::kWrite, FaultIo::Op::kSync, FaultIo::Op::kRename,
                                     FaultIo::Op::kFsyncDir};
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
      ok = Fail(absl::StrCat("Save of ", c.name(), " rank ", r,
                             " refused before any fault: ", st.ToString()));
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
  Log(absl::StrCat("fault: the next ", OpName(op), " fails (", std::strerror(err), "); reshard ",
                   src->name(), " to ", t.name(), " as \"", spec, "\": ", st.ToString()));
  const bool ok = Allowed(st, {Code::kOk}, "Reshard") && Resolve(t, Expect::kEither);
  const bool met = io.calls(op) > before;
  io.ClearAll();
  SIM_TRY(ok);
  stats_->faults_fired += met;
  if (met == (t.st == Ckpt::St::kCommitted)) {
    return Fail(absl::StrCat("reshard target ", t.name(),
                             met ? " COMMITTED although a " : " aborted although no ", OpName(op),
                             " failed"));
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
  return Converge(c);
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

// The ABORTED row of an Abort fails once: the abort stands (the row is written again), Abort
// says so when it answers before that (UNAVAILABLE: not durable yet), and the checkpoint ends
// ABORTED, never resumed.
bool Sim::FaultIndexAbort() {
  const std::string job = PickJob();
  if (job.empty()) return OpWait();
  Ckpt& c = NewCkpt(job, static_cast<uint32_t>(Uniform(rng_, 2, 4)));
  const uint32_t k = static_cast<uint32_t>(Uniform(rng_, 1, c.plan->world - 1));
  for (uint32_t r = 0; r < k; ++r) SIM_TRY(StageRank(c, r, AnyClient()));
  rig_->meta_gate.Arm(keys::Checkpoint(c.job, c.step), InjectedIndexError(rng_));
  absl::Status st = calls_->Abort(Me(), c.job, c.step);
  Log(absl::StrCat("fault: the ABORTED row of ", c.name(), " fails; abort: ", st.ToString()));
  const bool ok = Allowed(st, {Code::kOk, Code::kUnavailable}, "Abort whose ABORTED row fails") &&
                  Resolve(c, Expect::kAbort);
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
  Log(absl::StrCat("race: delete ", old->name(), " while it is saved again (world ", plan->world,
                   ")"));
  absl::Status deleted;
  std::thread t([&] { deleted = calls_->Delete(deleter, job, step); });
  std::vector<absl::Status> saved;
  for (uint32_t r = 0; r < plan->world; ++r) {
    saved.push_back(
        calls_->SaveRank(saver, job, step, plan->world, r, sim::RankShards(*plan, r), one[r]));
    if (!saved.back().ok()) break;
  }
  t.join();
  Log(absl::StrCat("  delete: ", deleted.ToString(), "; save of rank 0: ", saved[0].ToString()));
  SIM_TRY(Allowed(deleted, {Code::kOk}, "Delete racing a re-save"));
  SIM_TRY(Allowed(saved[0], {Code::kOk, Code::kAlreadyExists, Code::kAborted},
                  "a re-save racing its Delete"));
  Forget(*old, true);
  if (!saved[0].ok()) {
    SIM_TRY(ExpectAbsent(job, step));
    saved.clear();  // the trainer saves the step again, now that the delete is done
    for (uint32_t r = 0; r < plan->world; ++r) {
      saved.push_back(
          calls_->SaveRank(saver, job, step, plan->world, r, sim::RankShards(*plan, r), one[r]));
    }
  }
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
  SIM_TRY(Resolve(c, aborted.ok() ? Expect::kAbort : Expect::kCommit));
  return Converge(c);
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
  Log(absl::StrCat("race: reshard ", src->name(), " to ", t.name(),
                   " while the source is "
                   "deleted: reshard ",
                   started.ToString(), ", delete ", deleted.ToString()));
  SIM_TRY(Allowed(deleted, {Code::kOk, Code::kFailedPrecondition}, "Delete of a reshard source"));
  SIM_TRY(Allowed(started, {Code::kOk, Code::kAborted, Code::kNotFound, Code::kFailedPrecondition},
                  "a Reshard racing the Delete of its source"));
  if (!deleted.ok() && !started.ok()) return Fail("both the Reshard and the Delete were refused");
  if (deleted.ok()) {
    Forget(*src, true);
    SIM_TRY(ExpectAbsent(sjob, sstep));
  }
  if (started.ok()) {
    SIM_TRY(Resolve(t, deleted.ok() ? Expect::kEither : Expect::kCommit));
    SIM_TRY(Converge(t));
  } else {
    const std::string tjob = t.job;
    const uint64_t tstep = t.step;
    Forget(t, false);
    deleted_steps_[tjob].insert(tstep);
    SIM_TRY(ExpectAbsent(tjob, tstep));
  }
  // Both end absent, whichever way the race went.
  if (!deleted.ok()) SIM_TRY(DeleteChecked(ckpts_.at(Key{sjob, sstep})));
  return true;
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

}  // namespace ckptd::sim
