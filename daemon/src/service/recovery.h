// Recovery: the daemon's start, before it serves (DESIGN.md "Recovery"). The manifest on storage
// is the truth; the index is the node's journal. Run() makes them agree, in this order (each step
// a named sync point, so the crash matrix can stop the daemon between any two):
//   1. RepairIndexRows: a checkpoint row that does not parse is rebuilt from its manifest when
//      that verifies, recorded CORRUPT when a manifest is there but does not verify, else ABORTED
//      (its partial files collected); job rows and keys that do not decode are reported;
//   2. FinishDeletes: rows left DELETING (a crashed Delete's tombstone) are deleted to the end;
//   3. AdoptManifests: every verified manifest whose row is not COMMITTED is indexed COMMITTED (a
//      crash between the manifest rename and the row, or a directory copied in from elsewhere);
//      then, with a remote tier, every verified manifest on the store of a checkpoint this node
//      has no row of is indexed COMMITTED on the remote tier alone (a store that cannot be listed
//      is a reported problem, not a failed start);
//   4. ResumePending: STAGING/PERSISTING rows resume from the arena when it is the one they were
//      staged into (same generation: their extents are restored and their flushes posted), else
//      they are ABORTED and their files removed; interrupted reshards are ABORTED (their source
//      is intact); ABORTED rows' leftover files are collected;
//   5. CheckCommittedRows: COMMITTED rows whose manifest is gone are ABORTED (kept COMMITTED on
//      the remote tier alone when it holds a durable copy); local files of a checkpoint read from
//      the remote tier alone are removed (a spanning node stopped before removing its blobs);
//   6. VerifyNewestCommitted: per job the newest COMMITTED manifest is verified; one that does not
//      verify is recorded CORRUPT and the next older one is verified, so `latest` always loads.
// What it cannot use it skips, names (path or index key) in the log and counts in one summary
// line; only a failing index, or a data dir whose root cannot be listed, stops the start.
//
// Ownership: a short-lived object on the start-up thread (CheckpointService::Recover); it borrows
// the service, whose lifecycle state (pending_, the committer, the manifest cache) it fills
// through the service's own operations, and owns only its list of problems.
// Threads: the start-up thread only, before the service serves and before housekeeping starts:
// nothing races it. It takes the lifecycle lock where it enters a resumed checkpoint into
// pending_ (the flush pool may already run that checkpoint's flushes).
// Errors (Run): the index's errors and a data dir whose root cannot be listed; everything else is
// a reported problem, not an error.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckptd/storage.h"
#include "ckptd/v1/index.pb.h"

namespace ckptd {

class CheckpointService;

class Recovery {
 public:
  explicit Recovery(CheckpointService& service) : svc_(service) {}
  Recovery(const Recovery&) = delete;
  Recovery& operator=(const Recovery&) = delete;

  // Steps 1..6 above, then the summary line.
  absl::Status Run();

 private:
  absl::Status RepairIndexRows();
  absl::Status FinishDeletes();
  // From local storage (the remote tier's are CheckpointService::ScanStore's: only checkpoints
  // this node has no row of, recorded on the remote tier alone, as while it runs).
  absl::Status AdoptManifests();
  absl::Status ResumePending();
  // Rebuilds one journaled checkpoint from its rows and enters it into the lifecycle.
  absl::Status ResumeOne(const v1::CheckpointRecord& rec, const std::vector<v1::RankRecord>& ranks);
  // Records `rec` ABORTED with `reason` (files removed first, then the row, then its journal).
  void AbortRecovered(const v1::CheckpointRecord& rec, const std::string& reason);
  absl::Status CheckCommittedRows();
  absl::Status VerifyNewestCommitted();
  // Logs one entry recovery could not use (naming its path or index key) and keeps it for the
  // summary.
  void Problem(std::string what);

  CheckpointService& svc_;
  std::vector<std::string> problems_;
};

}  // namespace ckptd
