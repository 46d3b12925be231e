// Seeded control-plane simulation (docs/STYLE.md "Failure is tested"): one seed drives a
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
// (CKPTD_SIM_SEED=<n>). The few outcomes that depend on timing (the races, a commit beating the
// arming of a fault, a restart cutting flushes short) are each accepted by the model, and the
// operation then deletes what it touched, so the run goes on the same whichever way they went.
// A failure prints "simulation seed <n> failed at op <k>: <what>" and the last operations.
//
// Files: simulation.h (this: the model and the driver's declaration), simulation_test.cc (the
// driver's plumbing, its checks and the test cases), simulation_ops_test.cc (the operations),
// simulation_faults_test.cc (injected faults and races), simulation_model.h (layouts, bytes and
// loads), simulation_calls.h (the calls a client makes).
//
// Ownership: a Sim owns, for one seed's run, its Rig (the service, its storage, index and arena)
// and the FakeClock the service reads. Threads: one thread drives a Sim; a race starts one more
// thread and joins it before judging the outcome.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "service_rig.h"
#include "simulation_calls.h"
#include "simulation_model.h"

namespace ckptd::sim {

using Code = absl::StatusCode;
using Codes = std::initializer_list<Code>;

constexpr uint32_t kSimUid = 5000;           // the clients: neither the test's uid nor root
constexpr uint32_t kStrangerUid = 5001;      // owns no job
constexpr uint32_t kWaitMs = 5000;           // real time; a Wait or poll that takes longer hangs
constexpr uint64_t kStageTimeoutMs = 60000;  // fake time, as every other time below
constexpr size_t kClients = 3;
constexpr size_t kOpenPerJobMax = 8;        // below limits::kOpenCheckpointsPerJobMax
constexpr size_t kCommittedPerJobMax = 10;  // more are deleted, oldest first
const char* const kJobs[] = {"sim-a", "sim-b"};
const char* const kSpecs[] = {"consolidated",  "rows:2", "rows:3",   "cols:2",
                              "flat:2",        "flat:5", "grid:2x2", "*.w=rows:2; *=consolidated",
                              "model.*=flat:3"};

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
      : seed_(seed),
        ops_(ops),
        stats_(stats),
        sequence_(seed),
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
  // Keeps the last operations for a failure's report; CKPTD_SIM_TRACE=1 prints every one.
  void Log(std::string what) {
    log_.push_back(absl::StrCat("op ", op_, ": ", what));
    if (trace_) std::cerr << "seed " << seed_ << " " << log_.back() << "\n";
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
  // Deletes `c` (COMMITTED, ABORTED or DELETING; open ones are aborted first), checked: the end
  // state of an operation whose outcome depends on timing, so the run goes on the same.
  bool Converge(Ckpt& c);
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
  // The sequence of operations draws from sequence_, twice per operation (which one, and the
  // seed of rng_); everything an operation draws comes from rng_. So an outcome that depends on
  // timing (a race) can change what one operation draws, never the operations that follow.
  std::mt19937_64 sequence_;
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
  const bool trace_ = std::getenv("CKPTD_SIM_TRACE") != nullptr;
};

#define SIM_TRY(expr)          \
  do {                         \
    if (!(expr)) return false; \
  } while (0)

}  // namespace ckptd::sim
