#include "format/region.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/region_internal.h"

namespace ckptd {

using region_internal::Dims;
using region_internal::Piece;

namespace region_internal {

Dims Strides(std::span<const uint64_t> shape) {
  Dims strides{};
  uint64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape[d];
  }
  return strides;
}

void AppendFlatPieces(std::span<const uint64_t> shape, uint64_t start, uint64_t count,
                      std::vector<Piece>* out) {
  const size_t n = shape.size();
  if (count == 0) return;
  if (n == 0) {
    out->push_back(Piece{});
    return;
  }
  const Dims strides = Strides(shape);
  const uint64_t end = start + count;
  uint64_t cur = start;
  while (cur < end) {
    // The outermost dim k at which `cur` is aligned and at least one whole step of dim k fits
    // gives the largest contiguous box starting at `cur`; dim n-1 always qualifies.
    for (size_t k = 0; k < n; ++k) {
      if (cur % strides[k] != 0 || end - cur < strides[k]) continue;
      Piece piece;
      piece.base = cur - start;
      for (size_t d = 0; d <= k; ++d) {
        piece.off[d] = (cur / strides[d]) % shape[d];
        piece.len[d] = 1;
      }
      piece.len[k] = std::min(shape[k] - piece.off[k], (end - cur) / strides[k]);
      for (size_t d = k + 1; d < n; ++d) piece.len[d] = shape[d];
      cur += piece.len[k] * strides[k];
      out->push_back(piece);
      break;
    }
  }
}

std::vector<Piece> RegionPieces(std::span<const uint64_t> shape, const v1::Region& region) {
  std::vector<Piece> pieces;
  if (region.has_flat()) {
    AppendFlatPieces(shape, region.flat().start(), region.flat().count(), &pieces);
    return pieces;
  }
  Piece piece;
  for (size_t d = 0; d < shape.size(); ++d) {
    piece.off[d] = region.has_box() ? region.box().offsets(static_cast<int>(d)) : 0;
    piece.len[d] = region.has_box() ? region.box().lengths(static_cast<int>(d)) : shape[d];
    if (piece.len[d] == 0) return pieces;
  }
  pieces.push_back(piece);
  return pieces;
}

bool ContiguousRange(std::span<const uint64_t> shape, const v1::Region& region, uint64_t* start,
                     uint64_t* count) {
  if (region.has_flat()) {
    *start = region.flat().start();
    *count = region.flat().count();
    return true;
  }
  std::vector<Piece> pieces = RegionPieces(shape, region);
  CKPTD_CHECK(pieces.size() == 1);
  const Piece& box = pieces[0];
  const size_t n = shape.size();
  // Contiguous iff, below the innermost partial dim k, all dims are full and above it all are 1.
  size_t k = n;
  while (k > 0 && box.len[k - 1] == shape[k - 1]) --k;
  for (size_t d = 0; d + 1 < k; ++d) {
    if (box.len[d] != 1) return false;
  }
  const Dims strides = Strides(shape);
  *start = 0;
  *count = 1;
  for (size_t d = 0; d < n; ++d) {
    *start += box.off[d] * strides[d];
    *count *= box.len[d];
  }
  return true;
}

}  // namespace region_internal

namespace {

absl::Status BoxError(const v1::Region& region, std::span<const uint64_t> shape,
                      std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("region %s %s shape %s", DescribeRegion(region), why, DescribeShape(shape)));
}

absl::Status ValidateBox(const v1::Region& region, std::span<const uint64_t> shape) {
  const v1::Box& box = region.box();
  if (static_cast<size_t>(box.offsets_size()) != shape.size() ||
      static_cast<size_t>(box.lengths_size()) != shape.size()) {
    return BoxError(region, shape,
                    absl::StrFormat("has %d offsets and %d lengths; want %d dims for",
                                    box.offsets_size(), box.lengths_size(), shape.size()));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    uint64_t off = box.offsets(static_cast<int>(d));
    uint64_t len = box.lengths(static_cast<int>(d));
    if (off > shape[d] || len > shape[d] - off) {
      return absl::InvalidArgumentError(absl::StrFormat("region %s is outside shape %s (dim %d)",
                                                        DescribeRegion(region),
                                                        DescribeShape(shape), d));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> NumElements(std::span<const uint64_t> shape) {
  if (shape.size() > limits::kTensorDimsMax) {
    return absl::InvalidArgumentError(absl::StrFormat("shape %s has %d dims; the limit is %d",
                                                      DescribeShape(shape), shape.size(),
                                                      limits::kTensorDimsMax));
  }
  uint64_t numel = 1;
  bool zero = false;
  for (uint64_t dim : shape) {
    zero = zero || dim == 0;
    if (dim > limits::kTensorElementsMax ||
        (dim != 0 && numel > limits::kTensorElementsMax / dim)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("shape %s has more than %d elements (limits::kTensorElementsMax)",
                          DescribeShape(shape), limits::kTensorElementsMax));
    }
    if (dim != 0) numel *= dim;
  }
  return zero ? 0 : numel;
}

absl::Status ValidateRegion(const v1::Region& region, std::span<const uint64_t> shape) {
  CKPTD_ASSIGN_OR_RETURN(uint64_t numel, NumElements(shape));
  if (region.has_box()) return ValidateBox(region, shape);
  if (region.has_flat()) {
    uint64_t start = region.flat().start();
    uint64_t count = region.flat().count();
    if (start > numel || count > numel - start) {
      return absl::InvalidArgumentError(
          absl::StrFormat("region %s is outside shape %s (%d elements)", DescribeRegion(region),
                          DescribeShape(shape), numel));
    }
  }
  return absl::OkStatus();
}

std::string DescribeRegion(const v1::Region& region) {
  if (region.has_flat()) {
    const v1::FlatRange& flat = region.flat();
    return absl::StrFormat("flat[%d:%d)", flat.start(), flat.start() + flat.count());
  }
  if (!region.has_box()) return "whole";
  const v1::Box& box = region.box();
  std::vector<std::string> dims;
  int n = std::max(box.offsets_size(), box.lengths_size());
  for (int d = 0; d < n; ++d) {
    if (d >= box.offsets_size() || d >= box.lengths_size()) {
      dims.push_back("?");
      continue;
    }
    dims.push_back(absl::StrFormat("%d:%d", box.offsets(d), box.offsets(d) + box.lengths(d)));
  }
  return absl::StrCat("box[", absl::StrJoin(dims, ", "), "]");
}

std::string DescribeShape(std::span<const uint64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

v1::Region WholeBox(std::span<const uint64_t> shape) {
  v1::Region region;
  v1::Box* box = region.mutable_box();
  for (uint64_t dim : shape) {
    box->add_offsets(0);
    box->add_lengths(dim);
  }
  return region;
}

uint64_t RegionElements(const v1::Region& region, std::span<const uint64_t> shape) {
  if (region.has_flat()) return region.flat().count();
  if (!region.has_box()) return NumElements(shape).value_or(0);
  uint64_t numel = 1;
  for (uint64_t len : region.box().lengths()) numel *= len;
  return numel;
}

std::string RegionKey(const v1::Region& region, std::span<const uint64_t> shape) {
  if (RegionElements(region, shape) == 0) return "empty";
  uint64_t start = 0;
  uint64_t count = 0;
  if (region_internal::ContiguousRange(shape, region, &start, &count)) {
    return absl::StrFormat("flat:%d+%d", start, count);
  }
  std::vector<std::string> dims;
  dims.reserve(region.box().offsets_size());
  for (int d = 0; d < region.box().offsets_size(); ++d) {
    dims.push_back(absl::StrFormat("%d+%d", region.box().offsets(d), region.box().lengths(d)));
  }
  return absl::StrCat("box:", absl::StrJoin(dims, ","));
}

}  // namespace ckptd
