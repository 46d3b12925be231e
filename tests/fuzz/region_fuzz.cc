// Region arithmetic (format/region.h) on fuzzer-chosen shapes and regions, against the reference
// arithmetic of fuzz_util.h:
//  - NumElements, ValidateRegion, RegionElements agree with the 128-bit reference, for any shape
//    and region (valid or not), and a valid region never holds more elements than its shape;
//  - RegionKey: "empty" iff no elements, "flat:" iff the region is contiguous in the tensor, and
//    two valid regions share a key iff they hold the same elements in the same order;
//  - ContiguousChunks: bounded, non-empty, valid chunks that tile the region's buffer in order;
//  - ForEachCopyRun / CopyRegion / NeededByteRanges: every run inside both buffers and moving the
//    same global elements, the intersection copied exactly once, nothing else written (ASan
//    watches exact-size buffers), needed ranges sorted, merged and exactly the elements used;
//  - CheckCoverage: OK iff every element is covered exactly once; CheckNoOverlap: at most once.
// Small shapes (the input's first bit clear) are enumerated element by element; wild ones (up to
// 17 dims of any size) are checked for what can be computed without enumerating them.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "format/region.h"
#include "fuzz_util.h"

namespace ckptd::fuzz {
namespace {

using Shape = std::vector<uint64_t>;

// Checks the properties of one valid region.
void CheckOne(const Shape& shape, uint64_t numel, const v1::Region& r, bool small,
              FuzzedDataProvider& fdp) {
  const uint64_t e = RegionElements(r, shape);
  FUZZ_CHECK(e == RefRegionElements(r, shape) && e <= numel,
             "%s of shape %s: %lu elements, reference %lu, shape has %lu",
             DescribeRegion(r).c_str(), DescribeShape(shape).c_str(), e,
             static_cast<uint64_t>(RefRegionElements(r, shape)), numel);
  const std::string key = RegionKey(r, shape);
  FUZZ_CHECK((e == 0) == (key == "empty"), "%s: key %s", DescribeRegion(r).c_str(), key.c_str());
  if (absl::StartsWith(key, "flat:")) {
    std::vector<std::string> parts = absl::StrSplit(key.substr(5), '+');
    uint64_t start = 0, count = 0;
    FUZZ_CHECK(parts.size() == 2 && absl::SimpleAtoi(parts[0], &start) &&
                   absl::SimpleAtoi(parts[1], &count) && count == e,
               "%s: key %s", DescribeRegion(r).c_str(), key.c_str());
    v1::Region flat;
    flat.mutable_flat()->set_start(start);
    flat.mutable_flat()->set_count(count);
    FUZZ_CHECK(ValidateRegion(flat, shape).ok() && RegionKey(flat, shape) == key,
               "%s keys as %s, which is not a valid flat range of it", DescribeRegion(r).c_str(),
               key.c_str());
  }
  if (small) {
    const std::vector<uint64_t> elems = RefElements(r, shape);
    bool contiguous = !elems.empty();
    for (size_t i = 1; i < elems.size(); ++i) contiguous = contiguous && elems[i] == elems[0] + i;
    FUZZ_CHECK(contiguous == absl::StartsWith(key, "flat:"), "%s of %s: key %s",
               DescribeRegion(r).c_str(), DescribeShape(shape).c_str(), key.c_str());
  }
  if (e == 0 || e > (1 << 14)) return;
  // At least e / 256 elements a chunk: a few hundred chunks keep inputs fast.
  const uint64_t max_elems =
      fdp.ConsumeIntegralInRange<uint64_t>(std::max<uint64_t>(1, e / 256), e + 1);
  const std::vector<v1::Region> chunks = ContiguousChunks(shape, r, max_elems);
  uint64_t base = 0;
  for (const v1::Region& c : chunks) {
    const uint64_t ce = RegionElements(c, shape);
    FUZZ_CHECK(ValidateRegion(c, shape).ok() && ce >= 1 && ce <= max_elems,
               "chunk %s of %s (max %lu elements)", DescribeRegion(c).c_str(),
               DescribeRegion(r).c_str(), max_elems);
    // The chunk must be the next ce elements of r's buffer.
    uint64_t seen = 0;
    const uint64_t got = ForEachCopyRun(shape, r, c, [&](uint64_t s, uint64_t t, uint64_t n) {
      FUZZ_CHECK(s == base + t && t + n <= ce, "chunk %s is not at %lu of %s's buffer",
                 DescribeRegion(c).c_str(), base, DescribeRegion(r).c_str());
      seen += n;
    });
    FUZZ_CHECK(got == ce && seen == ce, "chunk %s: %lu of %lu elements inside %s",
               DescribeRegion(c).c_str(), got, ce, DescribeRegion(r).c_str());
    base += ce;
  }
  FUZZ_CHECK(base == e, "chunks of %s hold %lu of its %lu elements", DescribeRegion(r).c_str(),
             base, e);
}

// Value of global element g, `elem` bytes of it.
uint64_t Pattern(uint64_t g) { return g * 0x9E3779B97F4A7C15ull + 1; }

// Checks copying from src region a to dst region b, both valid, on a small shape.
void CheckPairSmall(const Shape& shape, const v1::Region& a, const v1::Region& b, uint32_t elem) {
  const std::vector<uint64_t> ea = RefElements(a, shape);
  const std::vector<uint64_t> eb = RefElements(b, shape);
  std::vector<int64_t> pos_in_a(RefNumElements(shape).value(), -1);
  for (size_t i = 0; i < ea.size(); ++i) pos_in_a[ea[i]] = static_cast<int64_t>(i);
  uint64_t common = 0;
  for (uint64_t g : eb) common += pos_in_a[g] >= 0;

  std::vector<uint8_t> hit(eb.size(), 0);
  const uint64_t total = ForEachCopyRun(shape, a, b, [&](uint64_t s, uint64_t t, uint64_t n) {
    FUZZ_CHECK(n > 0 && s + n <= ea.size() && t + n <= eb.size(),
               "run (%lu, %lu, %lu) outside %s / %s", s, t, n, DescribeRegion(a).c_str(),
               DescribeRegion(b).c_str());
    for (uint64_t k = 0; k < n; ++k) {
      FUZZ_CHECK(ea[s + k] == eb[t + k] && hit[t + k] == 0,
                 "run (%lu, %lu, %lu) from %s to %s: element %lu moves to %lu (or twice)", s, t, n,
                 DescribeRegion(a).c_str(), DescribeRegion(b).c_str(), ea[s + k], eb[t + k]);
      hit[t + k] = 1;
    }
  });
  FUZZ_CHECK(total == common, "%s ∩ %s: %lu elements, want %lu", DescribeRegion(a).c_str(),
             DescribeRegion(b).c_str(), total, common);

  // CopyRegion into exact-size heap buffers, so ASan reports any byte outside them.
  auto src = std::make_unique<uint8_t[]>(ea.size() * elem);
  auto dst = std::make_unique<uint8_t[]>(eb.size() * elem);
  for (size_t i = 0; i < ea.size(); ++i) {
    const uint64_t v = Pattern(ea[i]);
    std::memcpy(&src[i * elem], &v, elem);
  }
  std::memset(dst.get(), 0xEE, eb.size() * elem);
  const uint64_t copied = CopyRegion(shape, elem, a, src.get(), b, dst.get());
  FUZZ_CHECK(copied == common, "CopyRegion copied %lu elements, want %lu", copied, common);
  for (size_t t = 0; t < eb.size(); ++t) {
    uint64_t want = 0xEEEEEEEEEEEEEEEEull;
    if (pos_in_a[eb[t]] >= 0) want = Pattern(eb[t]);
    FUZZ_CHECK(std::memcmp(&dst[t * elem], &want, elem) == 0,
               "CopyRegion %s → %s: element %zu of the destination is wrong",
               DescribeRegion(a).c_str(), DescribeRegion(b).c_str(), t);
  }

  const std::vector<ByteRange> ranges = NeededByteRanges(shape, elem, a, b);
  std::vector<uint8_t> needed(ea.size(), 0);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const ByteRange& r = ranges[i];
    FUZZ_CHECK(r.len > 0 && r.offset % elem == 0 && r.len % elem == 0 &&
                   r.offset + r.len <= ea.size() * elem &&
                   (i == 0 || ranges[i - 1].offset + ranges[i - 1].len < r.offset),
               "needed range %zu [%lu, +%lu) of %s ∩ %s", i, r.offset, r.len,
               DescribeRegion(a).c_str(), DescribeRegion(b).c_str());
    for (uint64_t p = r.offset / elem; p < (r.offset + r.len) / elem; ++p) needed[p] = 1;
  }
  std::vector<uint8_t> in_b(pos_in_a.size(), 0);
  for (uint64_t g : eb) in_b[g] = 1;
  for (size_t i = 0; i < ea.size(); ++i) {
    FUZZ_CHECK(needed[i] == in_b[ea[i]], "NeededByteRanges(%s, %s): element %zu of the source",
               DescribeRegion(a).c_str(), DescribeRegion(b).c_str(), i);
  }
  FUZZ_CHECK((RegionKey(a, shape) == RegionKey(b, shape)) == (ea == eb), "%s keys %s, %s keys %s",
             DescribeRegion(a).c_str(), RegionKey(a, shape).c_str(), DescribeRegion(b).c_str(),
             RegionKey(b, shape).c_str());
}

// The elements two valid regions share, where that is easy to know without enumerating them:
// two flat ranges, or two boxes (whole counts as a box); -1 otherwise.
__int128 RefCommon(const Shape& shape, const v1::Region& a, const v1::Region& b) {
  if (a.has_flat() && b.has_flat()) {
    const uint64_t lo = std::max(a.flat().start(), b.flat().start());
    const uint64_t hi =
        std::min(a.flat().start() + a.flat().count(), b.flat().start() + b.flat().count());
    return hi > lo ? hi - lo : 0;
  }
  if (a.has_flat() || b.has_flat()) return -1;
  const v1::Region wa = a.has_box() ? a : WholeBox(shape);
  const v1::Region wb = b.has_box() ? b : WholeBox(shape);
  __int128 n = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int i = static_cast<int>(d);
    const uint64_t lo = std::max(wa.box().offsets(i), wb.box().offsets(i));
    const uint64_t hi = std::min(wa.box().offsets(i) + wa.box().lengths(i),
                                 wb.box().offsets(i) + wb.box().lengths(i));
    if (hi <= lo) return 0;
    n *= hi - lo;
    if (n > limits::kTensorElementsMax) n = limits::kTensorElementsMax + 1;
  }
  return n;
}

// Wild shapes: runs inside both buffers, and the right count where it is known.
void CheckPairWild(const Shape& shape, const v1::Region& a, const v1::Region& b) {
  const uint64_t ea = RegionElements(a, shape);
  const uint64_t eb = RegionElements(b, shape);
  const bool both_flat = a.has_flat() && b.has_flat();
  if (!both_flat && std::min(ea, eb) > (1 << 12)) return;  // too many runs to walk
  uint64_t sum = 0;
  const uint64_t total = ForEachCopyRun(shape, a, b, [&](uint64_t s, uint64_t t, uint64_t n) {
    FUZZ_CHECK(n > 0 && u128{s} + n <= ea && u128{t} + n <= eb,
               "run (%lu, %lu, %lu) outside %s / %s of %s", s, t, n, DescribeRegion(a).c_str(),
               DescribeRegion(b).c_str(), DescribeShape(shape).c_str());
    sum += n;
  });
  FUZZ_CHECK(total == sum && total <= std::min(ea, eb), "%s ∩ %s: %lu elements",
             DescribeRegion(a).c_str(), DescribeRegion(b).c_str(), total);
  const __int128 ref = RefCommon(shape, a, b);
  FUZZ_CHECK(ref < 0 || static_cast<__int128>(total) == ref, "%s ∩ %s of %s: %lu elements",
             DescribeRegion(a).c_str(), DescribeRegion(b).c_str(), DescribeShape(shape).c_str(),
             total);
}

void CheckCoverageOf(const Shape& shape, uint64_t numel, const std::vector<v1::Region>& all,
                     const std::vector<v1::Region>& valid, bool small) {
  absl::Status st = CheckCoverage(shape, all, "w");
  if (valid.size() != all.size()) {
    FUZZ_CHECK(!st.ok(), "CheckCoverage accepted an invalid region");
  }
  FUZZ_CHECK(valid.size() == all.size() || !CheckNoOverlap(shape, all, "w").ok(),
             "CheckNoOverlap accepted an invalid region");
  st = CheckCoverage(shape, valid, "w");
  absl::Status once = CheckNoOverlap(shape, valid, "w");
  if (small) {
    std::vector<uint32_t> count(numel, 0);
    for (const v1::Region& r : valid) {
      for (uint64_t g : RefElements(r, shape)) ++count[g];
    }
    const bool exact = std::all_of(count.begin(), count.end(), [](uint32_t c) { return c == 1; });
    const bool at_most = std::all_of(count.begin(), count.end(), [](uint32_t c) { return c <= 1; });
    FUZZ_CHECK(st.ok() == exact, "CheckCoverage of %zu regions of %s: %s, but exactly once is %d",
               valid.size(), DescribeShape(shape).c_str(), st.ToString().c_str(), exact);
    FUZZ_CHECK(once.ok() == at_most,
               "CheckNoOverlap of %zu regions of %s: %s, but at most once is %d", valid.size(),
               DescribeShape(shape).c_str(), once.ToString().c_str(), at_most);
    return;
  }
  u128 sum = 0;
  for (const v1::Region& r : valid) sum += RegionElements(r, shape);
  FUZZ_CHECK(!st.ok() || sum == numel,
             "CheckCoverage accepted %zu regions of %s that hold %lu "
             "elements of %lu",
             valid.size(), DescribeShape(shape).c_str(), static_cast<uint64_t>(sum), numel);
  FUZZ_CHECK(!once.ok() || sum <= numel,
             "CheckNoOverlap accepted %zu regions of %s that hold "
             "%lu elements of %lu",
             valid.size(), DescribeShape(shape).c_str(), static_cast<uint64_t>(sum), numel);
  FUZZ_CHECK(!st.ok() || once.ok(), "CheckCoverage accepted regions CheckNoOverlap refuses");
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptd;
  using namespace ckptd::fuzz;
  FuzzedDataProvider fdp(data, size);
  const bool wild = fdp.ConsumeBool();
  const uint32_t elem = 1u << fdp.ConsumeIntegralInRange<int>(0, 3);
  const Shape shape = ConsumeShape(fdp, wild);
  const absl::StatusOr<uint64_t> numel = NumElements(shape);
  const std::optional<uint64_t> ref = RefNumElements(shape);
  FUZZ_CHECK(numel.ok() == ref.has_value() && (!ref || *numel == *ref), "NumElements(%s): %s",
             DescribeShape(shape).c_str(),
             numel.ok() ? std::to_string(*numel).c_str() : numel.status().ToString().c_str());
  std::vector<v1::Region> all;
  std::vector<v1::Region> valid;
  const int n = fdp.ConsumeIntegralInRange<int>(1, 6);
  for (int i = 0; i < n; ++i) {
    all.push_back(ConsumeRegion(fdp, shape, wild));
    const v1::Region& r = all.back();
    (void)DescribeRegion(r);
    const bool ok = ValidateRegion(r, shape).ok();
    FUZZ_CHECK(ok == RefRegionValid(r, shape), "ValidateRegion(%s, %s) says %d",
               DescribeRegion(r).c_str(), DescribeShape(shape).c_str(), ok);
    if (ok) valid.push_back(r);
  }
  if (!numel.ok()) return 0;
  const bool small = *numel <= kSmallElementsMax;
  v1::Region whole;
  FUZZ_CHECK(RegionKey(WholeBox(shape), shape) == RegionKey(whole, shape),
             "WholeBox(%s) and the unset region key differently", DescribeShape(shape).c_str());
  for (const v1::Region& r : valid) CheckOne(shape, *numel, r, small, fdp);
  for (size_t i = 0; i + 1 < valid.size(); ++i) {
    if (small) {
      CheckPairSmall(shape, valid[i], valid[i + 1], elem);
    } else {
      CheckPairWild(shape, valid[i], valid[i + 1]);
    }
  }
  CheckCoverageOf(shape, *numel, all, valid, small);
  return 0;
}
