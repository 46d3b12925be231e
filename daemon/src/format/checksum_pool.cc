#include "format/checksum_pool.h"

#include <algorithm>
#include <future>

#include "ckptd/status.h"
#include "format/crc32c.h"

namespace ckptd {

struct BlockCrcJob::State {
  BlockSumFn sum;
  std::vector<std::future<absl::Status>> futures;
  absl::Status first;  // of the pieces run on the calling thread
};

BlockCrcJob& BlockCrcJob::operator=(BlockCrcJob&& other) noexcept {
  if (this != &other) {
    (void)Wait();
    state_ = std::move(other.state_);
  }
  return *this;
}

BlockCrcJob::~BlockCrcJob() { (void)Wait(); }

absl::Status BlockCrcJob::Wait() {
  if (state_ == nullptr) return absl::OkStatus();
  // Every task is waited for, failed or not: none may outlive the buffers or `sum`.
  for (std::future<absl::Status>& f : state_->futures) {
    absl::Status st = f.get();
    if (state_->first.ok()) state_->first = st;
  }
  absl::Status first = state_->first;
  state_.reset();
  return first;
}

BlockCrcJob StartBlockCrcs(WorkerPool& pool, std::span<const CrcRange> ranges, uint32_t block_bytes,
                           BlockSumFn sum, uint64_t task_bytes) {
  CKPTD_CHECK(block_bytes > 0 && !pool.OnPoolThread());
  auto state = std::make_shared<BlockCrcJob::State>();
  state->sum = std::move(sum);
  if (!state->sum) {
    state->sum = [](const uint8_t* data, uint64_t n, uint32_t block, uint32_t* out) {
      BlockCrcsInto(data, n, block, out);
      return absl::OkStatus();
    };
  }
  const uint64_t step = std::max<uint64_t>(block_bytes, task_bytes / block_bytes * block_bytes);
  const BlockSumFn* run = &state->sum;  // stable: State is not moved while tasks run
  for (const CrcRange& r : ranges) {
    for (uint64_t off = 0; off < r.length; off += step) {
      const uint8_t* data = r.data + off;
      const uint64_t n = std::min(step, r.length - off);
      uint32_t* out = r.out + off / block_bytes;
      auto submitted = pool.Submit(
          [run, data, n, block_bytes, out] { return (*run)(data, n, block_bytes, out); },
          WorkerPool::WhenFull::kWait);
      if (submitted.ok()) {
        state->futures.push_back(*std::move(submitted));
        continue;
      }
      // The pool is shut down: this thread does the rest.
      absl::Status st = (*run)(data, n, block_bytes, out);
      if (state->first.ok()) state->first = st;
    }
  }
  return BlockCrcJob(std::move(state));
}

absl::Status ParallelBlockCrcs(WorkerPool& pool, std::span<const CrcRange> ranges,
                               uint32_t block_bytes, BlockSumFn sum, uint64_t task_bytes) {
  return StartBlockCrcs(pool, ranges, block_bytes, std::move(sum), task_bytes).Wait();
}

absl::StatusOr<std::vector<uint32_t>> ParallelBlockCrcs(WorkerPool& pool, const void* data,
                                                        uint64_t n, uint32_t block_bytes,
                                                        uint64_t task_bytes) {
  CKPTD_CHECK(block_bytes > 0);
  std::vector<uint32_t> out(BlockCount(n, block_bytes));
  CrcRange r{static_cast<const uint8_t*>(data), n, out.data()};
  CKPTD_RETURN_IF_ERROR(
      ParallelBlockCrcs(pool, std::span(&r, 1), block_bytes, nullptr, task_bytes));
  return out;
}

}  // namespace ckptd
