// CheckCoverage. Regions that are contiguous ranges of the tensor (flat ranges, row blocks,
// whole tensors) are checked as sorted intervals. When any region is a general box, every region
// becomes boxes (a flat range splits into at most 2 * dims - 1) and a recursive sweep checks
// them: along dim d, between consecutive box boundaries the set of active boxes is fixed, and
// those boxes must tile the remaining dims exactly; a set already checked is not checked again.
// The sweep is exact, so no separate volume check is needed. CheckNoOverlap runs the same sweeps
// stepping over gaps instead of reporting them.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "format/region.h"
#include "format/region_internal.h"

namespace ckptd {
namespace {

using region_internal::Dims;
using region_internal::Piece;

struct Interval {
  uint64_t start;
  uint64_t end;
  uint32_t region;
};

class CoverageChecker {
 public:
  CoverageChecker(std::span<const uint64_t> shape, std::span<const v1::Region> regions,
                  std::string_view item, bool gaps_allowed)
      : shape_(shape),
        regions_(regions),
        item_(item),
        n_(shape.size()),
        gaps_allowed_(gaps_allowed) {}

  absl::Status CheckIntervals(std::vector<Interval> intervals, uint64_t numel) const;
  absl::Status CheckBoxes(const std::vector<uint32_t>& general_boxes,
                          const std::vector<Interval>& intervals);

 private:
  absl::Status CoverDim(size_t d, std::vector<uint32_t> ids);
  absl::Status CoverLastDim(std::vector<uint32_t> ids) const;
  uint64_t Start(uint32_t id, size_t d) const { return boxes_[id].off[d]; }
  uint64_t End(uint32_t id, size_t d) const { return boxes_[id].off[d] + boxes_[id].len[d]; }

  absl::Status Overlap(uint32_t region_a, uint32_t region_b) const {
    return absl::InvalidArgumentError(absl::StrFormat("item \"%s\": regions %s and %s overlap",
                                                      item_, DescribeRegion(regions_[region_a]),
                                                      DescribeRegion(regions_[region_b])));
  }
  absl::Status Gap(const std::string& elements) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("item \"%s\": elements %s are not covered by any shard", item_, elements));
  }
  // The box of slab_ in dims < d, [lo, hi) in dim d, whole in dims > d.
  absl::Status GapBox(size_t d, uint64_t lo, uint64_t hi) const;

  std::span<const uint64_t> shape_;
  std::span<const v1::Region> regions_;
  std::string_view item_;
  size_t n_;
  bool gaps_allowed_;
  std::vector<Piece> boxes_;  // piece.base holds the index of the region it came from
  Piece slab_;                // the slab being checked, in dims before the current one
};

absl::Status CoverageChecker::CheckIntervals(std::vector<Interval> intervals,
                                             uint64_t numel) const {
  std::sort(intervals.begin(), intervals.end(), [](const Interval& a, const Interval& b) {
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  uint64_t reach = 0;
  uint32_t reach_region = 0;
  for (const Interval& iv : intervals) {
    if (iv.start > reach && !gaps_allowed_) {
      return Gap(absl::StrFormat("flat[%d:%d)", reach, iv.start));
    }
    if (iv.start < reach) return Overlap(reach_region, iv.region);
    reach = iv.end;
    reach_region = iv.region;
  }
  if (reach < numel && !gaps_allowed_) return Gap(absl::StrFormat("flat[%d:%d)", reach, numel));
  return absl::OkStatus();
}

absl::Status CoverageChecker::GapBox(size_t d, uint64_t lo, uint64_t hi) const {
  v1::Region gap;
  v1::Box* box = gap.mutable_box();
  for (size_t i = 0; i < n_; ++i) {
    uint64_t off = i < d ? slab_.off[i] : (i == d ? lo : 0);
    uint64_t len = i < d ? slab_.len[i] : (i == d ? hi - lo : shape_[i]);
    box->add_offsets(off);
    box->add_lengths(len);
  }
  return Gap(DescribeRegion(gap));
}

absl::Status CoverageChecker::CheckBoxes(const std::vector<uint32_t>& general_boxes,
                                         const std::vector<Interval>& intervals) {
  for (const Interval& iv : intervals) {
    size_t first = boxes_.size();
    region_internal::AppendFlatPieces(shape_, iv.start, iv.end - iv.start, &boxes_);
    for (size_t i = first; i < boxes_.size(); ++i) boxes_[i].base = iv.region;
  }
  for (uint32_t region : general_boxes) {
    Piece piece = region_internal::RegionPieces(shape_, regions_[region]).at(0);
    piece.base = region;
    boxes_.push_back(piece);
  }
  std::vector<uint32_t> ids(boxes_.size());
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  return CoverDim(0, std::move(ids));
}

absl::Status CoverageChecker::CoverDim(size_t d, std::vector<uint32_t> ids) {
  if (d + 1 == n_) return CoverLastDim(std::move(ids));
  std::vector<uint32_t> by_end = ids;
  std::sort(ids.begin(), ids.end(),
            [&](uint32_t a, uint32_t b) { return Start(a, d) < Start(b, d); });
  std::sort(by_end.begin(), by_end.end(),
            [&](uint32_t a, uint32_t b) { return End(a, d) < End(b, d); });
  std::vector<uint32_t> active;
  size_t next_start = 0;
  size_t next_end = 0;
  uint64_t pos = 0;
  while (pos < shape_[d]) {
    bool changed = false;
    while (next_start < ids.size() && Start(ids[next_start], d) == pos) {
      active.push_back(ids[next_start++]);
      changed = true;
    }
    if (next_end < by_end.size() && End(by_end[next_end], d) == pos) {
      while (next_end < by_end.size() && End(by_end[next_end], d) == pos) ++next_end;
      std::erase_if(active, [&](uint32_t id) { return End(id, d) == pos; });
      changed = true;
    }
    uint64_t next = shape_[d];
    if (next_start < ids.size()) next = std::min(next, Start(ids[next_start], d));
    if (next_end < by_end.size()) next = std::min(next, End(by_end[next_end], d));
    if (active.empty() && !gaps_allowed_) return GapBox(d, pos, next);
    slab_.off[d] = pos;
    slab_.len[d] = next - pos;
    // An unchanged active set tiles the remaining dims exactly as it did for the last slab.
    if (changed && !active.empty()) CKPTD_RETURN_IF_ERROR(CoverDim(d + 1, active));
    pos = next;
  }
  return absl::OkStatus();
}

absl::Status CoverageChecker::CoverLastDim(std::vector<uint32_t> ids) const {
  const size_t d = n_ - 1;
  std::sort(ids.begin(), ids.end(),
            [&](uint32_t a, uint32_t b) { return Start(a, d) < Start(b, d); });
  uint64_t reach = 0;
  uint32_t reach_id = 0;
  for (uint32_t id : ids) {
    if (Start(id, d) > reach && !gaps_allowed_) return GapBox(d, reach, Start(id, d));
    if (Start(id, d) < reach) {
      return Overlap(static_cast<uint32_t>(boxes_[reach_id].base),
                     static_cast<uint32_t>(boxes_[id].base));
    }
    reach = End(id, d);
    reach_id = id;
  }
  if (reach < shape_[d] && !gaps_allowed_) return GapBox(d, reach, shape_[d]);
  return absl::OkStatus();
}

absl::Status Check(std::span<const uint64_t> shape, std::span<const v1::Region> regions,
                   std::string_view item, bool gaps_allowed) {
  auto numel = NumElements(shape);
  if (!numel.ok()) return Annotate(numel.status(), absl::StrFormat("item \"%s\"", item));
  std::vector<Interval> intervals;
  std::vector<uint32_t> general_boxes;
  for (size_t i = 0; i < regions.size(); ++i) {
    absl::Status valid = ValidateRegion(regions[i], shape);
    if (!valid.ok()) return Annotate(valid, absl::StrFormat("item \"%s\" shard %d", item, i));
    if (RegionElements(regions[i], shape) == 0) continue;
    uint64_t start = 0;
    uint64_t count = 0;
    if (region_internal::ContiguousRange(shape, regions[i], &start, &count)) {
      intervals.push_back(Interval{start, start + count, static_cast<uint32_t>(i)});
    } else {
      general_boxes.push_back(static_cast<uint32_t>(i));
    }
  }
  CoverageChecker checker(shape, regions, item, gaps_allowed);
  if (general_boxes.empty()) return checker.CheckIntervals(std::move(intervals), *numel);
  return checker.CheckBoxes(general_boxes, intervals);
}

}  // namespace

absl::Status CheckCoverage(std::span<const uint64_t> shape, std::span<const v1::Region> regions,
                           std::string_view item) {
  return Check(shape, regions, item, /*gaps_allowed=*/false);
}

absl::Status CheckNoOverlap(std::span<const uint64_t> shape, std::span<const v1::Region> regions,
                            std::string_view item) {
  return Check(shape, regions, item, /*gaps_allowed=*/true);
}

}  // namespace ckptd
