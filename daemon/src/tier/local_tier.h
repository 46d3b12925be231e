// LocalTier: the tier below the staging arena — a staged rank's blob on local storage, and when
// a checkpoint's ranks go there (docs/DESIGN.md "Flush", "Durable"):
//   - the flush gate (GateOpen): flushing beside ranks still copying into the arena slows their
//     copies (CPU for checksums, and the disk queue every rank's synced journal write waits
//     behind), so a checkpoint's flushes start once every rank is staged, or at the latest
//     flush_gate_ms after its first rank staged (GateElapsed, which housekeeping checks every
//     GateTick);
//   - the flush pool: Post runs one rank's flush there (the debug flush delay is applied there);
//   - writing one rank's blob (WriteRankBlob: lay out the shards, checksum every block — on the
//     checksum pool ("crc-<i>") while the blob is written, for large blobs — write with O_DIRECT
//     from where the bytes are staged, fdatasync).
// The lifecycle (service/flush.cc FlushRank) holds each checkpoint's state, so it asks the gate,
// posts the ranks the gate lets through and records each result ("persisted", extents freed).
// The remote and RAM tiers (remote_tier.h, ram_tier.h) take a persisted rank's blob further.
//
// Ownership: borrows the options, storage, arena and flush pool (they outlive it); owns the
// checksum pool (bounded, named threads; joined when the tier is destroyed). It holds no other
// state, so it has no lock.
// Threads: GateOpen/GateElapsed/GateTick/Post from any thread (the lifecycle calls them under its
// lock: none blocks); WriteRankBlob on a flush pool thread, with no lock held (it does the I/O).
// Errors (WriteRankBlob): the storage's errors naming the blob path; RESOURCE_EXHAUSTED when
// bounce pages cannot be allocated; the memory guard's error when staged client memory faults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/storage.h"
#include "ckptd/v1/index.pb.h"
#include "common/executor.h"
#include "common/limits.h"
#include "common/worker_pool.h"
#include "dataplane/arena.h"
#include "dataplane/region_registry.h"
#include "options.h"
#include "tier/delta.h"

namespace ckptd {

// The checksum block size a rank record was written with.
inline uint32_t RankBlockBytes(const v1::RankRecord& rec) {
  return rec.checksum_block_bytes() != 0 ? rec.checksum_block_bytes()
                                         : limits::kLegacyChecksumBlockBytes;
}

class LocalTier {
 public:
  LocalTier(const DaemonOptions* options, Storage* storage, StagingArena* arena, Executor* pool);

  // Whether a checkpoint's staged ranks may flush now: all `expected_ranks` of this daemon are
  // staged, or the gate elapsed (GateElapsed).
  bool GateOpen(size_t staged_ranks, size_t expected_ranks, uint64_t first_staged_unix_ms,
                uint64_t now_unix_ms) const;
  // Whether flush_gate_ms passed since a checkpoint's first rank staged (0: none staged yet).
  bool GateElapsed(uint64_t first_staged_unix_ms, uint64_t now_unix_ms) const;
  // How often housekeeping checks the gate.
  absl::Duration GateTick() const;
  // Posts one rank's flush; false when the pool refuses (full or shutting down).
  bool Post(std::function<void()> flush);
  // Writes the blob of `rec` (rec->blob_name() in `dir`) from its staged shards — in the arena
  // segment of its generation, or in `leases` for region-backed shards — and syncs it; fills
  // every shard's stored entry (offset, length, block checksums) and the rank's timings
  // (flush_us: laying out, checksumming and writing; fsync_us: the sync). To `to` when given (the
  // remote tier, for the policy TIER_REMOTE), else to local storage.
  // With `base` (deltas, local storage only): the shards unchanged since `base` are referenced
  // in its blobs, linked into `dir` (rec->linked_blobs), and only the others are written; each
  // referenced shard's bytes were compared with the linked file's first (ReferenceUnchanged).
  absl::Status WriteRankBlob(const std::string& dir, const std::vector<RegionLease>& leases,
                             v1::RankRecord* rec, Storage* to = nullptr,
                             const DeltaBase* base = nullptr);

 private:
  // Where a staged shard's bytes are: in the segment of the rank's generation (even a retired,
  // damaged one: read under the memory guard, never another segment's bytes), or a lease.
  const uint8_t* ShardSource(const std::string& arena_generation, const v1::StagedShard& s,
                             const std::vector<RegionLease>& leases) const;
  // Deltas: checksums every shard of `rec`, links the earlier files PlanDelta picks into `dir`,
  // compares each candidate's bytes with the file's through the link, and points the stored
  // entry of each that matches into it. Returns which shards are referenced (the rest are
  // written). A file that cannot be linked or read, or a shard whose bytes differ, is written
  // instead (logged): a delta never fails a flush that writing could do.
  absl::StatusOr<std::vector<bool>> ReferenceUnchanged(
      const std::string& dir, const DeltaBase& base,
      absl::FunctionRef<const uint8_t*(const v1::StagedShard&)> source, v1::RankRecord* rec);
  // ReferenceUnchanged's step for one earlier file: links it at `link`, compares each of the
  // group's shards with it through `buf`, and returns the indexes (into g.shards) that match; the
  // link is removed again when none does.
  std::vector<size_t> LinkAndCompare(
      const std::string& link, const DeltaBase& base, const DeltaGroup& g,
      absl::FunctionRef<const uint8_t*(const v1::StagedShard&)> source, const v1::RankRecord& rec,
      uint8_t* buf);

  const DaemonOptions* const options_;
  Storage* const storage_;
  StagingArena* const arena_;
  Executor* const pool_;
  // Block checksums of large blobs, summed while the blob is written (limits.h bounds it).
  WorkerPool checksum_pool_{"crc", limits::kChecksumPoolThreads, limits::kChecksumPoolQueueMax};
};

}  // namespace ckptd
