// Block checksums on a WorkerPool: the crc32c of every checksum_block_bytes block of one or many
// buffers, computed in parallel in tasks of whole blocks (about limits::kChecksumTaskBytes each),
// so a flush's checksums cost it wall time of roughly (bytes / threads) instead of a thread of its
// own per blob. The results are exactly BlockCrcs() of each buffer (format/crc32c.h), the block
// boundaries those of format/blob_layout.h.
//
// Thread safety: may be called from any thread except one of `pool`'s own (tasks are submitted
// with backpressure, WhenFull::kWait: a CHECK). Returns only once no task of the call still
// reads a buffer or writes a result, whatever the outcome.
// Status codes: the first error of `sum`; CANCELLED if the pool's shutdown dropped a task.
// A pool already shut down is no error: the work is then done on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/limits.h"
#include "common/worker_pool.h"

namespace ckptd {

// One buffer to checksum: out[0, BlockCount(length, block_bytes)) receives its block crcs.
struct CrcRange {
  const uint8_t* data = nullptr;
  uint64_t length = 0;
  uint32_t* out = nullptr;
};

// Computes the crcs of `length` bytes at `data` (whole blocks but the buffer's last) into `out`.
// The default is BlockCrcsInto; the flush passes one that guards client memory
// (dataplane/memory_guard.h) and reports a vanished mapping as a Status.
using BlockSumFn = std::function<absl::Status(const uint8_t* data, uint64_t length,
                                              uint32_t block_bytes, uint32_t* out)>;

// Fills every range's crcs. block_bytes > 0 (a bug otherwise). task_bytes is rounded down to
// whole blocks (at least one).
absl::Status ParallelBlockCrcs(WorkerPool& pool, std::span<const CrcRange> ranges,
                               uint32_t block_bytes, const BlockSumFn& sum = nullptr,
                               uint64_t task_bytes = limits::kChecksumTaskBytes);

// The crcs of one buffer, as BlockCrcs(data, n, block_bytes) returns them.
absl::StatusOr<std::vector<uint32_t>> ParallelBlockCrcs(
    WorkerPool& pool, const void* data, uint64_t n, uint32_t block_bytes,
    uint64_t task_bytes = limits::kChecksumTaskBytes);

}  // namespace ckptd
