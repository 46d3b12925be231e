// Block checksums on a WorkerPool: the crc32c of every checksum_block_bytes block of one or many
// buffers, computed in parallel in tasks of whole blocks (about limits::kChecksumTaskBytes each),
// so a flush's checksums cost it wall time of roughly (bytes / threads) instead of a thread of its
// own per blob. The results are exactly BlockCrcs() of each buffer (format/crc32c.h), the block
// boundaries those of format/blob_layout.h.
//
// Thread safety: may be called from any thread except one of `pool`'s own (tasks are submitted
// with backpressure, WhenFull::kWait: a CHECK). A BlockCrcJob is used by one thread. Neither
// ParallelBlockCrcs nor a job's Wait or destructor returns while a task of it still reads a
// buffer or writes a result, whatever the outcome.
// Status codes: the first error of `sum`; CANCELLED if the pool's shutdown dropped a task.
// A pool already shut down is no error: the work is then done on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

// Checksums being computed on a pool (StartBlockCrcs). Wait() returns the outcome; destroying a
// job that was not waited for waits too, so no task ever outlives the buffers it reads.
class BlockCrcJob {
 public:
  struct State;
  BlockCrcJob() = default;  // nothing to compute: OK
  explicit BlockCrcJob(std::shared_ptr<State> state) : state_(std::move(state)) {}
  BlockCrcJob(BlockCrcJob&&) = default;
  BlockCrcJob& operator=(BlockCrcJob&& other) noexcept;
  ~BlockCrcJob();
  // Blocks until every task of the job is done; the first error.
  absl::Status Wait();

 private:
  std::shared_ptr<State> state_;
};

// Starts filling every range's crcs on `pool` and returns at once (having queued the tasks, with
// backpressure): the caller may do other work — the flush writes the blob meanwhile — and then
// Wait. The ranges' buffers and results must stay valid until the job is done; `ranges` itself
// need not. block_bytes > 0 (a bug otherwise). task_bytes is rounded down to whole blocks (at
// least one).
BlockCrcJob StartBlockCrcs(WorkerPool& pool, std::span<const CrcRange> ranges, uint32_t block_bytes,
                           BlockSumFn sum = nullptr,
                           uint64_t task_bytes = limits::kChecksumTaskBytes);

// StartBlockCrcs(...).Wait().
absl::Status ParallelBlockCrcs(WorkerPool& pool, std::span<const CrcRange> ranges,
                               uint32_t block_bytes, BlockSumFn sum = nullptr,
                               uint64_t task_bytes = limits::kChecksumTaskBytes);

// The crcs of one buffer, as BlockCrcs(data, n, block_bytes) returns them.
absl::StatusOr<std::vector<uint32_t>> ParallelBlockCrcs(
    WorkerPool& pool, const void* data, uint64_t n, uint32_t block_bytes,
    uint64_t task_bytes = limits::kChecksumTaskBytes);

}  // namespace ckptd
