// CopyRegion and NeededByteRanges: both enumerate the contiguous runs of the intersection of two
// regions, as (source position, destination position, elements).
#include <algorithm>
#include <cstring>

#include "ckptd/status.h"
#include "format/region.h"
#include "format/region_internal.h"

namespace ckptd {
namespace {

using region_internal::Dims;
using region_internal::Piece;

// The intersection of two pieces as a box (in `out`); false if it is empty.
bool Intersect(size_t n, const Piece& a, const Piece& b, Piece* out) {
  for (size_t d = 0; d < n; ++d) {
    uint64_t lo = std::max(a.off[d], b.off[d]);
    uint64_t hi = std::min(a.off[d] + a.len[d], b.off[d] + b.len[d]);
    if (hi <= lo) return false;
    out->off[d] = lo;
    out->len[d] = hi - lo;
  }
  return true;
}

uint64_t PositionIn(size_t n, const Piece& piece, const Dims& strides, const Dims& coord) {
  uint64_t pos = piece.base;
  for (size_t d = 0; d < n; ++d) pos += (coord[d] - piece.off[d]) * strides[d];
  return pos;
}

// Calls fn(src_pos, dst_pos, elems) for each run of box `in` (inside both pieces) that is
// contiguous in both buffers. Trailing dims that `in` spans fully in both pieces fold into one
// run, so a run is a whole row or more.
template <typename Fn>
void ForEachRunInBox(size_t n, const Piece& in, const Piece& src, const Piece& dst, Fn&& fn) {
  if (n == 0) {
    fn(src.base, dst.base, uint64_t{1});
    return;
  }
  std::span<const uint64_t> src_len(src.len.data(), n);
  std::span<const uint64_t> dst_len(dst.len.data(), n);
  const Dims src_strides = region_internal::Strides(src_len);
  const Dims dst_strides = region_internal::Strides(dst_len);
  size_t k = n - 1;
  while (k > 0 && in.len[k] == src.len[k] && in.len[k] == dst.len[k]) --k;
  uint64_t run = 1;
  for (size_t d = k; d < n; ++d) run *= in.len[d];
  Dims coord = in.off;
  while (true) {
    fn(PositionIn(n, src, src_strides, coord), PositionIn(n, dst, dst_strides, coord), run);
    // Odometer over dims [0, k).
    size_t d = k;
    while (d > 0) {
      --d;
      if (++coord[d] < in.off[d] + in.len[d]) break;
      coord[d] = in.off[d];
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

template <typename Fn>
uint64_t ForEachRun(std::span<const uint64_t> shape, const v1::Region& src_region,
                    const v1::Region& dst_region, Fn&& fn) {
  CKPTD_CHECK(shape.size() <= limits::kTensorDimsMax);
  if (src_region.has_flat() && dst_region.has_flat()) {
    uint64_t src_start = src_region.flat().start();
    uint64_t dst_start = dst_region.flat().start();
    uint64_t lo = std::max(src_start, dst_start);
    uint64_t hi =
        std::min(src_start + src_region.flat().count(), dst_start + dst_region.flat().count());
    if (hi <= lo) return 0;
    fn(lo - src_start, lo - dst_start, hi - lo);
    return hi - lo;
  }
  const size_t n = shape.size();
  std::vector<Piece> src_pieces = region_internal::RegionPieces(shape, src_region);
  std::vector<Piece> dst_pieces = region_internal::RegionPieces(shape, dst_region);
  uint64_t total = 0;
  Piece in;
  for (const Piece& src : src_pieces) {
    for (const Piece& dst : dst_pieces) {
      if (!Intersect(n, src, dst, &in)) continue;
      ForEachRunInBox(n, in, src, dst, [&](uint64_t s, uint64_t t, uint64_t elems) {
        fn(s, t, elems);
        total += elems;
      });
    }
  }
  return total;
}

}  // namespace

uint64_t ForEachCopyRun(std::span<const uint64_t> shape, const v1::Region& src_region,
                        const v1::Region& dst_region,
                        absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn) {
  return ForEachRun(shape, src_region, dst_region, fn);
}

uint64_t CopyRegion(std::span<const uint64_t> shape, uint32_t elem_bytes,
                    const v1::Region& src_region, const uint8_t* src, const v1::Region& dst_region,
                    uint8_t* dst) {
  return ForEachRun(
      shape, src_region, dst_region, [&](uint64_t src_pos, uint64_t dst_pos, uint64_t elems) {
        std::memcpy(dst + dst_pos * elem_bytes, src + src_pos * elem_bytes, elems * elem_bytes);
      });
}

std::vector<ByteRange> NeededByteRanges(std::span<const uint64_t> shape, uint32_t elem_bytes,
                                        const v1::Region& src_region,
                                        const v1::Region& dst_region) {
  std::vector<ByteRange> ranges;
  ForEachRun(shape, src_region, dst_region, [&](uint64_t src_pos, uint64_t, uint64_t elems) {
    ranges.push_back(ByteRange{src_pos * elem_bytes, elems * elem_bytes});
  });
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (!merged.empty() && r.offset <= merged.back().offset + merged.back().len) {
      uint64_t end = std::max(merged.back().offset + merged.back().len, r.offset + r.len);
      merged.back().len = end - merged.back().offset;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

namespace {

void ChunkBox(std::vector<uint64_t>& off, std::vector<uint64_t>& len, size_t d, uint64_t max_elems,
              std::vector<v1::Region>* out) {
  const size_t n = len.size();
  auto emit = [&]() {
    v1::Region r;
    for (size_t k = 0; k < n; ++k) {
      r.mutable_box()->add_offsets(off[k]);
      r.mutable_box()->add_lengths(len[k]);
    }
    out->push_back(std::move(r));
  };
  uint64_t below = 1;  // elements of one step along dim d
  for (size_t k = d + 1; k < n; ++k) below *= len[k];
  if (d == n || below * len[d] <= max_elems) {
    emit();
    return;
  }
  const uint64_t start = off[d], total = len[d];
  if (below <= max_elems) {
    const uint64_t step = max_elems / below;
    for (uint64_t i = 0; i < total; i += step) {
      off[d] = start + i;
      len[d] = std::min(step, total - i);
      emit();
    }
  } else {
    for (uint64_t i = 0; i < total; ++i) {
      off[d] = start + i;
      len[d] = 1;
      ChunkBox(off, len, d + 1, max_elems, out);
    }
  }
  off[d] = start;
  len[d] = total;
}

}  // namespace

std::vector<v1::Region> ContiguousChunks(std::span<const uint64_t> shape, const v1::Region& region,
                                         uint64_t max_elems) {
  CKPTD_CHECK(max_elems >= 1);
  std::vector<v1::Region> out;
  if (RegionElements(region, shape) == 0) return out;
  if (region.has_flat()) {
    const uint64_t start = region.flat().start(), count = region.flat().count();
    for (uint64_t i = 0; i < count; i += max_elems) {
      v1::Region r;
      r.mutable_flat()->set_start(start + i);
      r.mutable_flat()->set_count(std::min(max_elems, count - i));
      out.push_back(std::move(r));
    }
    return out;
  }
  v1::Region box = region.has_box() ? region : WholeBox(shape);
  std::vector<uint64_t> off(box.box().offsets().begin(), box.box().offsets().end());
  std::vector<uint64_t> len(box.box().lengths().begin(), box.box().lengths().end());
  ChunkBox(off, len, 0, max_elems, &out);
  return out;
}

}  // namespace ckptd
