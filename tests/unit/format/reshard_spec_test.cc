#include "format/reshard_spec.h"

#include <catch2/catch.hpp>
#include <random>

#include "format/region.h"
#include "region_test_util.h"

namespace ckptd {
namespace {

std::string Error(std::string_view spec) {
  return std::string(ParseReshardSpec(spec).status().message());
}

TEST_CASE("ParseReshardSpec accepts the grammar and names bad rules", "[unit]") {
  for (const char* ok : {"consolidated", "rows:4", "cols:2", "dim2:3", "flat:7", "grid:2x4",
                         " *.bias = consolidated ; * = grid:2 x 4 ;", "layers.*=rows:8"}) {
    INFO(ok);
    CHECK(ParseReshardSpec(ok).ok());
  }
  CHECK_THAT(Error(""), Catch::Contains("empty"));
  CHECK_THAT(Error("rows:0"), Catch::Contains("rule 1 \"rows:0\": block count must be 1.."));
  CHECK_THAT(Error("rows:4; w=slices:3"),
             Catch::Contains("rule 2") && Catch::Contains("unknown layout \"slices\""));
  CHECK_THAT(Error("=rows:2"), Catch::Contains("empty item pattern"));
  CHECK_THAT(Error("grid:300x300"), Catch::Contains("at most 65536 blocks"));
  CHECK_THAT(Error("dim16:2"), Catch::Contains("unknown layout"));
  CHECK_THAT(Error("banana"), Catch::Contains("expected consolidated, rows:N"));
  CHECK_THAT(Error(";"), Catch::Contains("no rules"));
}

TEST_CASE("TargetRegions: first matching rule, blocks per target rank", "[unit]") {
  ReshardSpec spec = *ParseReshardSpec("*.bias=consolidated; emb=cols:3; *=rows:4");
  std::vector<uint64_t> shape = {10, 6};
  auto w = TargetRegions(spec, "layer.w", shape);
  REQUIRE(w.size() == 4);
  CHECK(DescribeRegion(w[0].second) == "box[0:2, 0:6]");
  CHECK(DescribeRegion(w[3].second) == "box[7:10, 0:6]");
  auto emb = TargetRegions(spec, "emb", shape);
  REQUIRE(emb.size() == 3);
  CHECK(DescribeRegion(emb[1].second) == "box[0:10, 2:4]");
  auto bias = TargetRegions(spec, "layer.bias", std::vector<uint64_t>{6});
  REQUIRE(bias.size() == 1);
  CHECK(DescribeRegion(bias[0].second) == "whole");
  // More blocks than rows: empty blocks are left out, ranks keep their numbers.
  auto small = TargetRegions(spec, "x", std::vector<uint64_t>{2, 3});
  REQUIRE(small.size() == 2);
  CHECK(small[0].first == 1);
  CHECK(small[1].first == 3);
  CHECK(TargetRegions(spec, "x", std::vector<uint64_t>{}).size() == 1);  // 0-d
  CHECK(TargetRegions(spec, "x", std::vector<uint64_t>{0, 4}).empty());  // no elements
}

TEST_CASE("TargetRegions cover every tensor exactly once (random shapes and specs)", "[unit]") {
  const uint64_t seed = testing::TestSeed();
  INFO("seed " << seed << " (replay: CKPTD_TEST_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  const char* specs[] = {"consolidated", "rows:3",   "cols:5",     "dim1:2",      "dim7:2",
                         "flat:7",       "grid:2x3", "grid:3x1x2", "grid:4x4x4x4"};
  for (int i = 0; i < 500; ++i) {
    std::vector<uint64_t> shape = testing::RandomShape(rng, 4, 9);
    const char* text = specs[rng() % std::size(specs)];
    INFO(text << " shape " << DescribeShape(shape));
    ReshardSpec spec = *ParseReshardSpec(text);
    std::vector<v1::Region> regions;
    uint32_t world = RuleWorldSize(spec.rules[0]);
    uint32_t last_rank = 0;
    for (auto& [rank, region] : TargetRegions(spec, "t", shape)) {
      CHECK(rank < world);
      CHECK((regions.empty() || rank > last_rank));
      last_rank = rank;
      regions.push_back(region);
    }
    CHECK(CheckCoverage(shape, regions, "t").ok());
  }
}

}  // namespace
}  // namespace ckptd
