// Retention: which copies of a job's COMMITTED checkpoints to let go, per tier (docs/OPERATIONS.md
// "Tiers", "Retention"). keep_local = N keeps the local copies of the job's N newest checkpoints
// that have one; keep_remote = N keeps the remote copies of its N newest with a durable one (0:
// keep all); keep_every = K also keeps every copy of the checkpoints whose step is a multiple of K
// (milestones; 0: none), on every tier they are on (they count among the N newest).
// A checkpoint past N on one tier loses that tier's copy, or is deleted when that copy is its
// only durable one. Two rules no plan breaks, whatever the options:
//   - a local copy whose upload is still under way is never dropped (it is the only durable
//     copy until the upload is DURABLE);
//   - the newest COMMITTED checkpoint keeps a durable copy (N >= 1 whenever retention is on, and
//     it is first on every tier it is on).
// Pure code, no I/O: the catalog executes the plan (service/catalog.cc CollectGarbage).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ckptd {

// One COMMITTED checkpoint of a job, as retention sees it.
struct RetainedCheckpoint {
  uint64_t step = 0;
  bool local = false;           // its local copy is there
  bool remote = false;          // its remote copy is durable
  bool upload_pending = false;  // an upload to the remote tier is recorded and not durable yet
};

enum class RetentionAction { kDropLocal, kDropRemote, kDelete };

struct RetentionStep {
  uint64_t step = 0;
  RetentionAction action = RetentionAction::kDelete;
  std::string why;  // "local copy 3 of keep_local 2", ...
};

// The plan for one job: `newest_first` its COMMITTED checkpoints, newest first.
std::vector<RetentionStep> PlanRetention(std::span<const RetainedCheckpoint> newest_first,
                                         uint32_t keep_local, uint32_t keep_remote,
                                         uint64_t keep_every = 0);

const char* RetentionActionName(RetentionAction a);  // "drop local", "drop remote", "delete"

}  // namespace ckptd
