// Internals of region.cc and coverage.cc: regions as lists of "pieces", boxes of the global
// tensor each laid out row-major at a known position of the region's buffer. A box region is one
// piece; a flat range is at most 2 * dims - 1 pieces, each contiguous in the global tensor.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "ckptd/v1/common.pb.h"
#include "common/limits.h"

namespace ckptd::region_internal {

using Dims = std::array<uint64_t, limits::kTensorDimsMax>;

struct Piece {
  Dims off{};
  Dims len{};
  uint64_t base = 0;  // position (in elements) of the piece's first element in the buffer
};

// Row-major strides (in elements) of a tensor of `shape`.
Dims Strides(std::span<const uint64_t> shape);

// Appends the pieces of flat range [start, start + count) of a tensor of `shape`, the first at
// buffer position `base`.
void AppendFlatPieces(std::span<const uint64_t> shape, uint64_t start, uint64_t count,
                      std::vector<Piece>* out);

// The pieces of a valid region; empty if it has no elements.
std::vector<Piece> RegionPieces(std::span<const uint64_t> shape, const v1::Region& region);

// If the valid, non-empty region is contiguous in the global tensor, sets [*start, +*count) to
// its flat range and returns true.
bool ContiguousRange(std::span<const uint64_t> shape, const v1::Region& region, uint64_t* start,
                     uint64_t* count);

}  // namespace ckptd::region_internal
