// O_DIRECT-aligned test buffers filled with seeded bytes, shared by the io tests.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "common/limits.h"

namespace ckptd::testing {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<char, FreeDeleter>;

inline AlignedBuf Aligned(uint64_t bytes) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  uint64_t rounded =
      (bytes + limits::kAlignmentBytes - 1) / limits::kAlignmentBytes * limits::kAlignmentBytes;
  void* p = std::aligned_alloc(limits::kAlignmentBytes, rounded);
  REQUIRE(p != nullptr);
  return AlignedBuf(static_cast<char*>(p));
}

inline void Fill(char* buf, uint64_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < len; i += 8) {
    uint64_t v = rng();
    std::memcpy(buf + i, &v, std::min<uint64_t>(8, len - i));
  }
}

}  // namespace ckptd::testing
