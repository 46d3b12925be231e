// Which checksum blocks a sampled verify checks (ckptctl verify --sample, VerifyRequest.sample).
// The choice of a block is a pure function of (seed, blob id, the block's byte offset in its
// blob), so it needs no state while a verify streams through the blobs, and one seed picks the
// same blocks on every tier (the local, remote and RAM copies of a blob share offsets) and in
// every run: a failure seen with a seed is seen again with it. Each shard's first and last
// blocks are always checked: the ends of a shard are where truncation and misplaced writes show.
//
// Pure code, no I/O; a BlockSample is a value, safe to share between threads.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace ckptd {

class BlockSample {
 public:
  // Every block.
  BlockSample() = default;
  // About `fraction` of the blocks in the middle of shards (plus every shard's ends); fraction
  // must be valid (ValidateFraction), 1 meaning every block.
  BlockSample(double fraction, uint64_t seed);

  // OK for a fraction in (0, 1]; INVALID_ARGUMENT otherwise (0, negative, above 1, NaN).
  static absl::Status ValidateFraction(double fraction);

  // True when block `index` of a shard of `count` blocks, at byte `offset` of blob `blob_id`, is
  // checked. index < count.
  bool Checks(uint32_t blob_id, uint64_t offset, uint64_t index, uint64_t count) const;
  // Every block is checked (no sampling).
  bool all() const { return threshold_ == kAll; }

 private:
  static constexpr uint64_t kAll = UINT64_MAX;
  // A block in the middle of a shard is checked when its hash is below this (kAll: always).
  uint64_t threshold_ = kAll;
  uint64_t seed_ = 0;
};

}  // namespace ckptd
