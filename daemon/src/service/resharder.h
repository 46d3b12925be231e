// Resharder: the data path of an offline reshard (docs/DESIGN.md "Reshard"). Given a COMMITTED,
// verified source manifest and a spec (format/reshard_spec.h), it writes the target's blobs — one
// per target rank, laid out as format/blob_layout.h says, each shard's block checksums computed as
// its bytes stream through — reading only the source bytes each target shard needs through the
// loader (verified as a load's are), in chunks of limits::kReshardChunkBytes, and builds the
// target's manifest. It does not write the manifest or any index row: the lifecycle claims the
// target, records it, commits or aborts it (reshard.cc), so a reshard is visible only as the
// lifecycle shows it.
//
// Ownership: borrows options, the local storage, the loader and the clock (they outlive it).
// Owns the reshard pool ("reshard-<i>", limits::kReshardPoolThreads), joined when it is destroyed;
// a running job is owned by its shared_ptr (held by the pool's task and the lifecycle's
// reshards_). Each job's target blobs are the files under its checkpoint dir, which the lifecycle
// removes when the job ends ABORTED.
// Threads: Start from any thread; Write runs on a pool thread, one job per thread, and reads only
// the job (its cancel flag and progress are atomics the lifecycle reads). No lock of its own.
// Errors (to Done): CANCELLED with the job's cancel_reason once it is cancelled (checked before
// every chunk); the loader's (DATA_LOSS for a source block that does not verify, the storage's
// read errors); the storage's write errors; RESOURCE_EXHAUSTED when no write buffer can be had.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/storage.h"
#include "ckptd/v1/index.pb.h"
#include "common/clock.h"
#include "common/limits.h"
#include "common/worker_pool.h"
#include "format/load_plan.h"
#include "format/manifest.h"
#include "format/reshard_spec.h"
#include "options.h"
#include "service/loader.h"

namespace ckptd {

// One offline reshard: what the lifecycle claimed, and the progress the resharder reports.
struct ReshardJob {
  std::pair<std::string, uint64_t> source;  // (job, step)
  std::pair<std::string, uint64_t> target;
  ReshardSpec spec;
  std::shared_ptr<const Manifest> src;  // verified
  std::vector<Storage*> src_tiers;      // where the source is read from, fastest first
  v1::CheckpointRecord rec;             // the target's row (PERSISTING until done)
  uint32_t owner_uid = 0;               // the target job's owner (recorded in its manifest)
  uint32_t world_size = 1;              // ReshardWorldSize
  std::atomic<uint64_t> bytes_done{0};
  std::atomic<bool> cancel{false};
  std::string cancel_reason;  // written before cancel is set
};

// The target's world size: the largest a rule of `spec` names for a tensor of `source`, and at
// least one more than every per-rank object's saving rank (they keep it).
uint32_t ReshardWorldSize(const ReshardSpec& spec, const Manifest& source);

class BlobAppender;

class Resharder {
 public:
  // Called on the pool thread with the job and its target manifest (the blobs written and
  // synced) or why it failed.
  using Done = std::function<void(ReshardJob& job, absl::StatusOr<Manifest> manifest)>;

  Resharder(const DaemonOptions* options, Storage* storage, Loader* loader, const Clock* clock);
  Resharder(const Resharder&) = delete;
  Resharder& operator=(const Resharder&) = delete;

  // Writes `job`'s target on a pool thread, then calls `done` there. UNAVAILABLE once the pool
  // stopped; RESOURCE_EXHAUSTED when limits::kReshardQueueMax jobs wait (the lifecycle admits at
  // most limits::kReshardJobsMax, so that is a bug).
  absl::Status Start(std::shared_ptr<ReshardJob> job, Done done);

 private:
  absl::StatusOr<Manifest> Write(ReshardJob& job);
  // Appends the bytes of `whole` (a target tensor region, or an object's copy) read from the
  // source to `out`, growing shard->length() and the job's progress.
  absl::Status CopyShard(ReshardJob& job, const PlanRequest& whole, BlobAppender& out,
                         v1::ShardEntry* shard);

  const DaemonOptions* const options_;
  Storage* const storage_;
  Loader* const loader_;
  const Clock* const clock_;
  // Last: destroyed (joined) first.
  WorkerPool pool_{"reshard", limits::kReshardPoolThreads, limits::kReshardQueueMax};
};

}  // namespace ckptd
