// Alignment helpers shared by the data path: rounding to a multiple and O_DIRECT-aligned buffers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/limits.h"

namespace ckptd {

// v rounded up / down to a multiple of a (a > 0).
inline uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
// Heap memory aligned to limits::kAlignmentBytes (for O_DIRECT); null when allocation failed.
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;

// At least `bytes` (rounded up to the alignment, as aligned_alloc requires); null on failure.
inline AlignedBuffer AllocateAligned(uint64_t bytes) {
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(
      limits::kAlignmentBytes, RoundUp(bytes == 0 ? 1 : bytes, limits::kAlignmentBytes))));
}

}  // namespace ckptd
