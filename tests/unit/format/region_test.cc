#include "format/region.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>

#include "common/limits.h"
#include "region_test_util.h"

namespace ckptd {
namespace {

using testing::Box;
using testing::Flat;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("NumElements", "[unit]") {
  CHECK(*NumElements(std::vector<uint64_t>{}) == 1);
  CHECK(*NumElements(std::vector<uint64_t>{8, 8}) == 64);
  CHECK(*NumElements(std::vector<uint64_t>{3, 0, 5}) == 0);
  CHECK(*NumElements(std::vector<uint64_t>{limits::kTensorElementsMax}) ==
        limits::kTensorElementsMax);
  CHECK(NumElements(std::vector<uint64_t>{limits::kTensorElementsMax, 2}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(
      NumElements(std::vector<uint64_t>{uint64_t{1} << 32, uint64_t{1} << 32, 0}).status().code() ==
      absl::StatusCode::kInvalidArgument);
  CHECK(NumElements(std::vector<uint64_t>(limits::kTensorDimsMax, 2)).ok());
  CHECK(NumElements(std::vector<uint64_t>(limits::kTensorDimsMax + 1, 1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ValidateRegion and DescribeRegion", "[unit]") {
  std::vector<uint64_t> shape = {8, 8};
  CHECK(ValidateRegion(v1::Region(), shape).ok());
  CHECK(ValidateRegion(Box({0, 0}, {8, 8}), shape).ok());
  CHECK(ValidateRegion(Box({8, 0}, {0, 8}), shape).ok());
  CHECK(ValidateRegion(Flat(0, 64), shape).ok());
  CHECK(ValidateRegion(Flat(64, 0), shape).ok());
  absl::Status s = ValidateRegion(Box({0, 8}, {4, 8}), shape);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(s) == "region box[0:4, 8:16] is outside shape [8, 8] (dim 1)");
  CHECK(ValidateRegion(Box({0}, {4}), shape).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Box({0, 0}, {4}), shape).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Box({0, ~uint64_t{0}}, {4, 2}), shape).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Box({0, 2}, {4, ~uint64_t{0}}), shape).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Flat(60, 5), shape).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Flat(~uint64_t{0}, 2), shape).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateRegion(Box({}, {}), std::vector<uint64_t>{}).ok());
  CHECK(ValidateRegion(Flat(0, 1), std::vector<uint64_t>{}).ok());
  CHECK(ValidateRegion(Flat(1, 1), std::vector<uint64_t>{}).code() ==
        absl::StatusCode::kInvalidArgument);

  CHECK(DescribeRegion(Box({0, 0}, {4, 8})) == "box[0:4, 0:8]");
  CHECK(DescribeRegion(Box({}, {})) == "box[]");
  CHECK(DescribeRegion(Flat(100, 100)) == "flat[100:200)");
  CHECK(DescribeRegion(v1::Region()) == "whole");
  CHECK(DescribeRegion(Box({1, 2}, {3})) == "box[1:4, ?]");
  CHECK(DescribeShape(shape) == "[8, 8]");
  CHECK(DescribeShape(std::vector<uint64_t>{}) == "[]");
  CHECK(DescribeRegion(WholeBox(shape)) == "box[0:8, 0:8]");
  CHECK(RegionElements(Box({1, 2}, {3, 4}), shape) == 12);
  CHECK(RegionElements(Flat(3, 7), shape) == 7);
  CHECK(RegionElements(v1::Region(), shape) == 64);
  CHECK(RegionElements(Box({}, {}), std::vector<uint64_t>{}) == 1);
}

TEST_CASE("RegionKey identifies equivalent spellings", "[unit]") {
  std::vector<uint64_t> shape = {4, 6, 5};
  CHECK(RegionKey(v1::Region(), shape) == RegionKey(Flat(0, 120), shape));
  CHECK(RegionKey(WholeBox(shape), shape) == RegionKey(Flat(0, 120), shape));
  CHECK(RegionKey(Box({1, 0, 0}, {2, 6, 5}), shape) == RegionKey(Flat(30, 60), shape));
  CHECK(RegionKey(Box({1, 2, 0}, {1, 3, 5}), shape) == RegionKey(Flat(40, 15), shape));
  CHECK(RegionKey(Box({1, 2, 1}, {1, 1, 3}), shape) == RegionKey(Flat(41, 3), shape));
  CHECK(RegionKey(Box({1, 2, 0}, {2, 3, 5}), shape) != RegionKey(Flat(40, 15), shape));
  CHECK(RegionKey(Box({0, 0, 0}, {0, 6, 5}), shape) == RegionKey(Flat(7, 0), shape));
  CHECK(RegionKey(Box({}, {}), std::vector<uint64_t>{}) ==
        RegionKey(v1::Region(), std::vector<uint64_t>{}));

  uint64_t seed = testing::TestSeed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 2000; ++i) {
    CAPTURE(i);
    std::vector<uint64_t> s = testing::RandomShape(rng, 3, 4);
    v1::Region a = testing::RandomRegion(rng, s);
    v1::Region b = testing::RandomRegion(rng, s);
    bool same = testing::RefElements(s, a) == testing::RefElements(s, b);
    CAPTURE(DescribeShape(s), DescribeRegion(a), DescribeRegion(b));
    CHECK((RegionKey(a, s) == RegionKey(b, s)) == same);
  }
}

TEST_CASE("CheckCoverage finds gaps and overlaps", "[unit]") {
  std::vector<uint64_t> shape = {8, 8};
  std::vector<v1::Region> exact = {Box({0, 0}, {4, 8}), Box({4, 0}, {4, 4}), Flat(36, 4),
                                   Box({4, 4}, {4, 4})};
  // box[4:8, 4:8] is not contiguous, so this takes the sweep; flat[36:40) overlaps it.
  absl::Status s = CheckCoverage(shape, exact, "w");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(s).find("item \"w\": regions") == 0);
  CHECK(Message(s).find("overlap") != std::string::npos);

  std::vector<v1::Region> rows = {Box({0, 0}, {4, 8}), Box({4, 0}, {4, 8})};
  CHECK(CheckCoverage(shape, rows, "w").ok());
  std::vector<v1::Region> overlap = {Box({0, 0}, {4, 8}), Box({2, 0}, {4, 8})};
  CHECK(Message(CheckCoverage(shape, overlap, "w")) ==
        "item \"w\": regions box[0:4, 0:8] and box[2:6, 0:8] overlap");
  std::vector<v1::Region> gap = {Flat(0, 32), Flat(64, 0)};
  CHECK(Message(CheckCoverage(shape, gap, "w")) ==
        "item \"w\": elements flat[32:64) are not covered by any shard");
  std::vector<v1::Region> cols = {Box({0, 0}, {8, 4}), Box({0, 4}, {8, 4})};
  CHECK(CheckCoverage(shape, cols, "w").ok());
  std::vector<v1::Region> col_gap = {Box({0, 0}, {8, 4}), Box({0, 4}, {5, 4})};
  CHECK(Message(CheckCoverage(shape, col_gap, "w")) ==
        "item \"w\": elements box[5:8, 4:8] are not covered by any shard");
  std::vector<v1::Region> bad = {Box({0, 0}, {9, 8})};
  CHECK(CheckCoverage(shape, bad, "w").code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(CheckCoverage(shape, bad, "w")).find("item \"w\" shard 0: region") == 0);
  CHECK(CheckCoverage(shape, std::vector<v1::Region>{v1::Region()}, "w").ok());
  CHECK(!CheckCoverage(shape, std::vector<v1::Region>{}, "w").ok());
  CHECK(CheckCoverage(std::vector<uint64_t>{0, 3}, std::vector<v1::Region>{}, "w").ok());
  CHECK(CheckCoverage(std::vector<uint64_t>{}, std::vector<v1::Region>{Box({}, {})}, "w").ok());
  CHECK(
      !CheckCoverage(std::vector<uint64_t>{}, std::vector<v1::Region>{Box({}, {}), Flat(0, 1)}, "w")
           .ok());
}

TEST_CASE("CheckNoOverlap allows gaps, never overlaps", "[unit]") {
  std::vector<uint64_t> shape = {8, 8};
  CHECK(CheckNoOverlap(shape, std::vector<v1::Region>{}, "w").ok());
  CHECK(CheckNoOverlap(shape, std::vector<v1::Region>{Flat(0, 32), Flat(40, 8)}, "w").ok());
  CHECK(
      CheckNoOverlap(shape, std::vector<v1::Region>{Box({0, 0}, {8, 4}), Box({0, 4}, {5, 4})}, "w")
          .ok());
  // A gap in a dim of the sweep, then boxes again.
  CHECK(
      CheckNoOverlap(shape, std::vector<v1::Region>{Box({0, 0}, {2, 3}), Box({5, 2}, {3, 6})}, "w")
          .ok());
  CHECK(Message(CheckNoOverlap(shape, std::vector<v1::Region>{Flat(0, 2), Flat(1, 2)}, "w")) ==
        "item \"w\": regions flat[0:2) and flat[1:3) overlap");
  CHECK(Message(CheckNoOverlap(
            shape,
            std::vector<v1::Region>{Box({0, 0}, {2, 3}), Box({5, 2}, {3, 6}), Box({6, 0}, {1, 3})},
            "w")) == "item \"w\": regions box[6:7, 0:3] and box[5:8, 2:8] overlap");
  CHECK(!CheckNoOverlap(shape, std::vector<v1::Region>{Box({0, 0}, {9, 8})}, "w").ok());
}

// Brute force: does every element get covered exactly once?
bool RefExactCover(const std::vector<uint64_t>& shape, const std::vector<v1::Region>& regions) {
  std::vector<int> counts(testing::RefNumel(shape), 0);
  for (const v1::Region& r : regions) {
    for (uint64_t g : testing::RefElements(shape, r)) ++counts[g];
  }
  for (int c : counts) {
    if (c != 1) return false;
  }
  return true;
}

// Brute force: is no element covered twice?
bool RefAtMostOnce(const std::vector<uint64_t>& shape, const std::vector<v1::Region>& regions) {
  std::vector<int> counts(testing::RefNumel(shape), 0);
  for (const v1::Region& r : regions) {
    for (uint64_t g : testing::RefElements(shape, r)) {
      if (++counts[g] > 1) return false;
    }
  }
  return true;
}

TEST_CASE("CheckCoverage and CheckNoOverlap agree with brute force on random region sets",
          "[unit]") {
  uint64_t seed = testing::TestSeed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  int exact = 0;
  int general = 0;
  for (int i = 0; i < 3000; ++i) {
    CAPTURE(i);
    std::vector<uint64_t> shape = testing::RandomShape(rng, 4, 5);
    std::vector<v1::Region> regions;
    if (i % 2 == 0 && shape.size() >= 2) {
      testing::AppendBoxGrid(rng, shape, 0, shape[0], 4, &regions);  // mostly general boxes
    } else {
      regions = testing::RandomPartition(rng, shape);
    }
    int mutation = static_cast<int>(rng() % 4);
    if (mutation == 1 && !regions.empty()) {
      regions.erase(regions.begin() + static_cast<long>(rng() % regions.size()));
    } else if (mutation == 2 && !regions.empty()) {
      regions.push_back(regions[rng() % regions.size()]);
    } else if (mutation == 3) {
      regions.push_back(testing::RandomRegion(rng, shape));
    }
    CAPTURE(DescribeShape(shape), regions.size());
    absl::Status s = CheckCoverage(shape, regions, "t");
    INFO(s.ToString());
    CHECK(s.ok() == RefExactCover(shape, regions));
    absl::Status no_overlap = CheckNoOverlap(shape, regions, "t");
    INFO(no_overlap.ToString());
    CHECK(no_overlap.ok() == RefAtMostOnce(shape, regions));
    exact += s.ok();
    for (const v1::Region& r : regions) {
      if (r.has_box() && RegionElements(r, shape) != 0 &&
          RegionKey(r, shape).rfind("box:", 0) == 0) {
        ++general;
        break;
      }
    }
  }
  // Both outcomes, and the sweep over general boxes, are exercised.
  CHECK(exact > 500);
  CHECK(exact < 2500);
  CHECK(general > 400);
}

TEST_CASE("CheckCoverage handles 10k+ shards quickly", "[unit]") {
  auto start = std::chrono::steady_clock::now();
  // 16384 flat shards (ZeRO), 10000 row boxes, a 128 x 128 grid of boxes, 10000 column boxes.
  std::vector<v1::Region> flats;
  for (uint64_t i = 0; i < 16384; ++i) flats.push_back(Flat(i * 1000, 1000));
  CHECK(CheckCoverage(std::vector<uint64_t>{16384, 1000}, flats, "flat").ok());
  std::reverse(flats.begin(), flats.end());
  flats[5000] = Flat(flats[5000].flat().start() + 1, 999);
  CHECK(!CheckCoverage(std::vector<uint64_t>{16384, 1000}, flats, "flat").ok());

  std::vector<v1::Region> grid;
  for (uint64_t r = 0; r < 128; ++r) {
    for (uint64_t c = 0; c < 128; ++c) grid.push_back(Box({r * 4, c * 4}, {4, 4}));
  }
  CHECK(CheckCoverage(std::vector<uint64_t>{512, 512}, grid, "grid").ok());
  grid.back() = Box({508, 508}, {4, 3});
  CHECK(Message(CheckCoverage(std::vector<uint64_t>{512, 512}, grid, "grid")) ==
        "item \"grid\": elements box[508:512, 511:512] are not covered by any shard");

  std::vector<v1::Region> cols;
  for (uint64_t c = 0; c < 10000; ++c) cols.push_back(Box({0, c}, {64, 1}));
  CHECK(CheckCoverage(std::vector<uint64_t>{64, 10000}, cols, "cols").ok());
  cols.push_back(Box({63, 9999}, {1, 1}));
  CHECK(Message(CheckCoverage(std::vector<uint64_t>{64, 10000}, cols, "cols")) ==
        "item \"cols\": regions box[0:64, 9999:10000] and box[63:64, 9999:10000] overlap");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(secs < 5.0);
}

TEST_CASE("CopyRegion basic cases", "[unit]") {
  std::vector<uint64_t> shape = {4, 4};
  std::vector<uint32_t> global(16);
  for (uint32_t i = 0; i < 16; ++i) global[i] = 100 + i;
  const auto* g = reinterpret_cast<const uint8_t*>(global.data());
  // Whole -> box[1:3, 1:3].
  std::vector<uint32_t> out(4, 0);
  CHECK(CopyRegion(shape, 4, v1::Region(), g, Box({1, 1}, {2, 2}),
                   reinterpret_cast<uint8_t*>(out.data())) == 4);
  CHECK(out == std::vector<uint32_t>{105, 106, 109, 110});
  // flat[6:10) -> box[1:3, 1:3] copies elements 6 and 9.
  std::vector<uint32_t> src = {106, 107, 108, 109};
  out.assign(4, 0);
  CHECK(CopyRegion(shape, 4, Flat(6, 4), reinterpret_cast<const uint8_t*>(src.data()),
                   Box({1, 1}, {2, 2}), reinterpret_cast<uint8_t*>(out.data())) == 2);
  CHECK(out == std::vector<uint32_t>{0, 106, 109, 0});
  CHECK(NeededByteRanges(shape, 4, Flat(6, 4), Box({1, 1}, {2, 2})) ==
        std::vector<ByteRange>{{0, 4}, {12, 4}});
  CHECK(NeededByteRanges(shape, 4, Flat(0, 4), Box({1, 1}, {2, 2})).empty());
  // 0-d.
  uint64_t scalar = 0x1122334455667788, scalar_out = 0;
  CHECK(CopyRegion(std::vector<uint64_t>{}, 8, Box({}, {}),
                   reinterpret_cast<const uint8_t*>(&scalar), Flat(0, 1),
                   reinterpret_cast<uint8_t*>(&scalar_out)) == 1);
  CHECK(scalar_out == scalar);
}

TEST_CASE("CopyRegion copies rows with memcpy-sized runs", "[unit]") {
  // A 4096 x 4096 float tensor: whole -> rows box; the copy of 64 MiB must be fast (runs, not
  // elements) and NeededByteRanges merges full-width rows into one range.
  std::vector<uint64_t> shape = {4096, 4096};
  std::vector<float> src(4096 * 4096);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  std::vector<float> dst(1024 * 2048);
  v1::Region want = Box({1024, 1024}, {1024, 2048});
  auto start = std::chrono::steady_clock::now();
  CHECK(CopyRegion(shape, 4, v1::Region(), reinterpret_cast<const uint8_t*>(src.data()), want,
                   reinterpret_cast<uint8_t*>(dst.data())) == dst.size());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(secs < 1.0);
  CHECK(dst[0] == static_cast<float>(1024 * 4096 + 1024));
  CHECK(dst.back() == static_cast<float>(2047 * 4096 + 3071));
  CHECK(NeededByteRanges(shape, 4, v1::Region(), Box({5, 0}, {10, 4096})) ==
        std::vector<ByteRange>{{5 * 4096 * 4, 10 * 4096 * 4}});
  CHECK(NeededByteRanges(shape, 4, v1::Region(), want).size() == 1024);
}

// Extracts a region's buffer from the global tensor.
std::vector<uint8_t> RefExtract(const std::vector<uint64_t>& shape, uint32_t eb,
                                const v1::Region& r, const std::vector<uint8_t>& global) {
  std::vector<uint8_t> out;
  for (uint64_t g : testing::RefElements(shape, r)) {
    out.insert(out.end(), global.begin() + g * eb, global.begin() + (g + 1) * eb);
  }
  return out;
}

// Brute-force NeededByteRanges.
std::vector<ByteRange> RefNeeded(const std::vector<uint64_t>& shape, uint32_t eb,
                                 const v1::Region& src, const v1::Region& dst) {
  std::vector<ByteRange> out;
  std::vector<uint64_t> elems = testing::RefElements(shape, src);
  for (uint64_t i = 0; i < elems.size(); ++i) {
    if (!testing::RefContains(shape, dst, elems[i])) continue;
    if (!out.empty() && out.back().offset + out.back().len == i * eb) {
      out.back().len += eb;
    } else {
      out.push_back(ByteRange{i * eb, eb});
    }
  }
  return out;
}

TEST_CASE("CopyRegion reshards bit-exactly between random layouts", "[unit]") {
  uint64_t seed = testing::TestSeed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 3000; ++i) {
    CAPTURE(i);
    std::vector<uint64_t> shape = testing::RandomShape(rng, 4, 6);
    const uint32_t eb = 1u << (rng() % 4);
    const uint64_t numel = testing::RefNumel(shape);
    std::vector<uint8_t> global(numel * eb);
    for (uint8_t& b : global) b = static_cast<uint8_t>(rng());
    std::vector<v1::Region> srcs = testing::RandomPartition(rng, shape);
    std::vector<v1::Region> dsts = testing::RandomPartition(rng, shape);
    for (int extra = 0; extra < 3; ++extra) dsts.push_back(testing::RandomRegion(rng, shape));
    std::vector<std::vector<uint8_t>> src_bufs;
    for (const v1::Region& r : srcs) src_bufs.push_back(RefExtract(shape, eb, r, global));
    CAPTURE(DescribeShape(shape), eb, srcs.size(), dsts.size());
    for (const v1::Region& dst : dsts) {
      CAPTURE(DescribeRegion(dst));
      std::vector<uint8_t> out(RegionElements(dst, shape) * eb, 0xcd);
      uint64_t copied = 0;
      for (size_t s = 0; s < srcs.size(); ++s) {
        CAPTURE(DescribeRegion(srcs[s]));
        copied += CopyRegion(shape, eb, srcs[s], src_bufs[s].data(), dst, out.data());
        REQUIRE(NeededByteRanges(shape, eb, srcs[s], dst) == RefNeeded(shape, eb, srcs[s], dst));
      }
      CHECK(copied == RegionElements(dst, shape));
      REQUIRE(out == RefExtract(shape, eb, dst, global));
    }
  }
}

}  // namespace
}  // namespace ckptd
