// The load planner: from a decoded manifest and the regions one load asks for, the list of byte
// runs to read from the blobs and, for each run, which checksum blocks to verify and which bytes
// to copy where. Pure code, no I/O (docs/DESIGN.md "Load"); the service executes a plan.
//
// How a plan is made:
//  1. For each request, the item's shards that overlap the requested region are found through a
//     per-item interval index over the item's most discriminating dimension (never all pairs).
//  2. For each overlapping (shard, request) pair, the contiguous element runs of the intersection
//     give the shard bytes needed and where each lands in the request's destination buffer.
//  3. Needed bytes are widened to whole checksum blocks of their shard (so every byte used is
//     verified), mapped to blob offsets, rounded out to `alignment_bytes` (O_DIRECT), and unioned
//     per blob; bytes asked for by several requests are read once.
//  4. Neighbouring runs merge only when the gap between them is at most
//     max(alignment_bytes, merge_gap_fraction * merged run length).
//  5. Runs longer than max_run_bytes are split at checksum-block boundaries, so each run fits a
//     bounded buffer and every block lies in one run.
//
// Thread-safe pure functions; a plan points into the manifest it was made from (shards), which
// must outlive it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "ckptd/v1/manifest.pb.h"
#include "format/manifest.h"

namespace ckptd {

// One destination of a load.
struct PlanRequest {
  const v1::ItemEntry* item = nullptr;  // an item of the manifest being planned
  // Tensors: the region wanted (must be valid for the item's shape: ValidateRegion).
  v1::Region region;
  // Objects: the copy to load (one of item->shards()); ignored for tensors.
  const v1::ShardEntry* object_shard = nullptr;
};

struct PlanOptions {
  // Runs start and end on multiples of this (except at a blob's end). Default: 4096
  uint64_t alignment_bytes = 4096;
  // Two runs merge when the gap between them is at most max(alignment_bytes, this fraction of the
  // merged run's length). Default: 0.05
  double merge_gap_fraction = 0.05;
  // Longer runs are split (at checksum-block boundaries). Must be >= 2 * the checksum block and a
  // multiple of alignment_bytes. Default: 16 MiB
  uint64_t max_run_bytes = uint64_t{16} * 1024 * 1024;
  // Items with at most this many shards are matched by trying each shard (bounded work per
  // request, cheaper than building an index); larger ones through the interval index.
  // Default: 16
  uint32_t linear_shards_max = 16;
};

// Copy `bytes` from the run's buffer at `run_offset` to request `request`'s destination buffer at
// `dst_offset`.
struct RunCopy {
  uint64_t run_offset = 0;
  uint32_t request = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};

// Verify blocks [first_block, end_block) of `shard`; block first_block starts at `run_offset` in
// the run's buffer.
struct BlockCheck {
  const v1::ShardEntry* shard = nullptr;
  uint64_t run_offset = 0;
  uint64_t first_block = 0;
  uint64_t end_block = 0;
};

// Read blob bytes [offset, offset + length) into a buffer, verify its checks, then do its copies.
struct ReadRun {
  uint32_t blob_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t first_check = 0;  // checks [first_check, first_check + check_count) of LoadPlan
  uint32_t check_count = 0;
  uint64_t first_copy = 0;  // copies [first_copy, first_copy + copy_count) of LoadPlan
  uint64_t copy_count = 0;
};

struct LoadPlan {
  std::vector<ReadRun> runs;  // sorted by (blob_id, offset), disjoint
  std::vector<BlockCheck> checks;
  std::vector<RunCopy> copies;
  // Bytes each request's destination receives (region elements * dtype size, or object length).
  std::vector<uint64_t> request_bytes;
  uint64_t needed_bytes = 0;          // distinct shard bytes the requests use
  uint64_t needed_aligned_bytes = 0;  // the same, each range rounded out to alignment_bytes
  uint64_t read_bytes = 0;            // sum of run lengths
};

// Plans a load of `requests` from `manifest`. INVALID_ARGUMENT for a request whose region does not
// fit its item (naming the item) or bad options; FAILED_PRECONDITION if the requested region of a
// tensor is not fully covered by the checkpoint's shards (a partial checkpoint), naming the item
// and the first uncovered elements.
absl::StatusOr<LoadPlan> PlanLoad(const Manifest& manifest, std::span<const PlanRequest> requests,
                                  const PlanOptions& options = {});

}  // namespace ckptd
