#include "format/checksum_pool.h"

#include <algorithm>
#include <future>

#include "ckptd/status.h"
#include "format/crc32c.h"

namespace ckptd {

absl::Status ParallelBlockCrcs(WorkerPool& pool, std::span<const CrcRange> ranges,
                               uint32_t block_bytes, const BlockSumFn& sum, uint64_t task_bytes) {
  CKPTD_CHECK(block_bytes > 0 && !pool.OnPoolThread());
  BlockSumFn run = sum;
  if (!run) {
    run = [](const uint8_t* data, uint64_t n, uint32_t block, uint32_t* out) {
      BlockCrcsInto(data, n, block, out);
      return absl::OkStatus();
    };
  }
  const uint64_t step = std::max<uint64_t>(block_bytes, task_bytes / block_bytes * block_bytes);
  struct Piece {
    const uint8_t* data;
    uint64_t length;
    uint32_t* out;
  };
  std::vector<Piece> pieces;
  for (const CrcRange& r : ranges) {
    for (uint64_t off = 0; off < r.length; off += step) {
      pieces.push_back(Piece{r.data + off, std::min(step, r.length - off),
                             r.out + off / block_bytes});
    }
  }
  // The last piece runs here, so the caller works too instead of only waiting.
  std::vector<std::future<absl::Status>> futures;
  absl::Status first;
  for (size_t i = 0; i + 1 < pieces.size(); ++i) {
    const Piece p = pieces[i];
    auto submitted = pool.Submit(
        [p, block_bytes, &run] { return run(p.data, p.length, block_bytes, p.out); },
        WorkerPool::WhenFull::kWait);
    if (submitted.ok()) {
      futures.push_back(*std::move(submitted));
    } else if (absl::Status st = run(p.data, p.length, block_bytes, p.out); first.ok()) {
      first = st;  // the pool is shut down: this thread does the rest
    }
  }
  if (!pieces.empty()) {
    const Piece& p = pieces.back();
    absl::Status st = run(p.data, p.length, block_bytes, p.out);
    if (first.ok()) first = st;
  }
  // Every task is waited for, failed or not: none may outlive the buffers or `run`.
  for (std::future<absl::Status>& f : futures) {
    absl::Status st = f.get();
    if (first.ok()) first = st;
  }
  return first;
}

absl::StatusOr<std::vector<uint32_t>> ParallelBlockCrcs(WorkerPool& pool, const void* data,
                                                        uint64_t n, uint32_t block_bytes,
                                                        uint64_t task_bytes) {
  CKPTD_CHECK(block_bytes > 0);
  std::vector<uint32_t> out(BlockCount(n, block_bytes));
  CrcRange r{static_cast<const uint8_t*>(data), n, out.data()};
  CKPTD_RETURN_IF_ERROR(ParallelBlockCrcs(pool, std::span(&r, 1), block_bytes, nullptr,
                                          task_bytes));
  return out;
}

}  // namespace ckptd
