// Regions of tensor items (common.proto): which elements of a tensor of shape `shape` a shard
// holds or a load asks for. A region is a Box (offsets/lengths per dim), a FlatRange
// ([start, start + count) in row-major order of the global tensor) or unset (the whole tensor).
// A 0-d tensor (shape {}) has one element and its only box has 0 dims; a tensor with a 0 in its
// shape has no elements.
//
// The buffer of a region holds its elements in row-major order: a box's own row-major order, or
// consecutive global elements for a flat range. Both agree with the global row-major order, so a
// box that is contiguous in the global tensor and the equivalent flat range are the same region.
//
// Unless a comment says otherwise, functions taking a region and a shape require that
// ValidateRegion(region, shape) returned OK (a bug otherwise: callers validate client input
// first). Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/common.pb.h"

namespace ckptd {

// Elements of a tensor of `shape`. INVALID_ARGUMENT if it has more than limits::kTensorDimsMax
// dims, or a dim or the product exceeds limits::kTensorElementsMax.
absl::StatusOr<uint64_t> NumElements(std::span<const uint64_t> shape);

// OK iff `shape` is valid (NumElements) and `region` lies inside it: a box has one offset and one
// length per dim and offset + length <= dim for each; a flat range has start + count <= elements.
// INVALID_ARGUMENT "region box[0:4, 8:16] is outside shape [8, 8] (dim 1)" otherwise.
absl::Status ValidateRegion(const v1::Region& region, std::span<const uint64_t> shape);

// "box[0:4, 0:8]" (start:end per dim; "box[]" for 0-d), "flat[100:200)" or "whole". Any region,
// valid or not.
std::string DescribeRegion(const v1::Region& region);
// "[8, 8]"; "[]" for 0-d.
std::string DescribeShape(std::span<const uint64_t> shape);

// The box covering the whole tensor.
v1::Region WholeBox(std::span<const uint64_t> shape);

// Elements in `region`.
uint64_t RegionElements(const v1::Region& region, std::span<const uint64_t> shape);

// Canonical key: two regions covering the same elements (hence in the same order) get the same
// key, so replicas saved with different spellings are detected. A region contiguous in the
// global tensor (a flat range, the whole tensor, a box of full trailing dims) keys as
// "flat:<start>+<count>", any other box as "box:<offset>+<length>,..."; empty regions as "empty".
std::string RegionKey(const v1::Region& region, std::span<const uint64_t> shape);

// OK iff `regions` cover every element of a tensor of `shape` exactly once. Validates each
// region. INVALID_ARGUMENT naming the item and the first problem:
//   item "w": regions box[0:4, 0:8] and box[2:6, 0:8] overlap
//   item "w": elements flat[32:64) are not covered by any shard
// O(N log N) for regions that are contiguous ranges of the tensor; a recursive sweep over the
// dims (with an active set, never all pairs) for general boxes.
absl::Status CheckCoverage(std::span<const uint64_t> shape, std::span<const v1::Region> regions,
                           std::string_view item);

// OK iff no element of a tensor of `shape` is in two of `regions` (elements in none are fine): the
// check of a partial checkpoint's shards. Validates each region; the errors of CheckCoverage except
// the one for uncovered elements. Same cost.
absl::Status CheckNoOverlap(std::span<const uint64_t> shape, std::span<const v1::Region> regions,
                            std::string_view item);

// Copies every element in the intersection of src_region and dst_region from `src` (the buffer
// of src_region) to its place in `dst` (the buffer of dst_region), a memcpy per contiguous run.
// Returns the number of elements copied. src and dst must not overlap.
uint64_t CopyRegion(std::span<const uint64_t> shape, uint32_t elem_bytes,
                    const v1::Region& src_region, const uint8_t* src, const v1::Region& dst_region,
                    uint8_t* dst);

// Calls fn(src_pos, dst_pos, elems) for each run of elements of the intersection of src_region
// and dst_region that is contiguous in both regions' buffers (positions in elements from the start
// of each buffer). Runs come in the order of the destination's pieces, not sorted. Returns the
// number of elements in the intersection.
uint64_t ForEachCopyRun(std::span<const uint64_t> shape, const v1::Region& src_region,
                        const v1::Region& dst_region,
                        absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn);

// Splits a valid region into sub-regions of at most max_elems elements (max_elems >= 1) that are
// each contiguous in the region's buffer and come in buffer order, so a large region can be
// copied chunk by chunk through a bounded buffer. Flat ranges split into flat ranges; boxes into
// boxes (blocks of the outermost dim that has room, recursing into single rows when one row is
// too large). Empty for an empty region.
std::vector<v1::Region> ContiguousChunks(std::span<const uint64_t> shape, const v1::Region& region,
                                         uint64_t max_elems);

// A byte range [offset, offset + len).
struct ByteRange {
  uint64_t offset;
  uint64_t len;
  bool operator==(const ByteRange&) const = default;
};

// The byte ranges of src_region's buffer that CopyRegion(shape, elem_bytes, src_region, ...,
// dst_region, ...) reads: sorted, disjoint, adjacent ones merged. Empty if they do not intersect.
std::vector<ByteRange> NeededByteRanges(std::span<const uint64_t> shape, uint32_t elem_bytes,
                                        const v1::Region& src_region, const v1::Region& dst_region);

}  // namespace ckptd
