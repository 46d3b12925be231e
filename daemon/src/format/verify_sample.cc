#include "format/verify_sample.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ckptd {
namespace {

// SplitMix64's finalizer: every input bit reaches every output bit, so consecutive offsets (the
// blocks of one shard) give unrelated hashes.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

BlockSample::BlockSample(double fraction, uint64_t seed) : seed_(seed) {
  // 2^64 * fraction, computed in 2^-53 steps so that it never overflows; 1 is every block.
  threshold_ = fraction >= 1.0 ? kAll : static_cast<uint64_t>(std::ldexp(fraction, 53)) << 11;
}

absl::Status BlockSample::ValidateFraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {  // NaN fails both comparisons
    return absl::InvalidArgumentError(
        absl::StrCat("the sample must be a fraction of the blocks in (0, 1], got ", fraction));
  }
  return absl::OkStatus();
}

bool BlockSample::Checks(uint32_t blob_id, uint64_t offset, uint64_t index, uint64_t count) const {
  if (threshold_ == kAll || index == 0 || index + 1 >= count) return true;
  return Mix(Mix(seed_ ^ blob_id) + offset) < threshold_;
}

}  // namespace ckptd
