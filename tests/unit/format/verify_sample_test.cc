#include "format/verify_sample.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace ckptd {
namespace {

constexpr uint64_t kBlock = 4096;

// How many of the `count` blocks of a shard at byte 0 of blob 3 `s` checks.
uint64_t Checked(const BlockSample& s, uint64_t count) {
  uint64_t n = 0;
  for (uint64_t i = 0; i < count; ++i) n += s.Checks(3, i * kBlock, i, count) ? 1 : 0;
  return n;
}

TEST_CASE("verify sample: every block without a sample, or with the fraction 1", "[unit]") {
  CHECK(BlockSample().all());
  CHECK(BlockSample(1.0, 7).all());
  CHECK(Checked(BlockSample(), 1000) == 1000);
  CHECK(Checked(BlockSample(1.0, 7), 1000) == 1000);
  CHECK_FALSE(BlockSample(0.5, 7).all());
}

TEST_CASE("verify sample: a shard's first and last blocks are always checked", "[unit]") {
  const BlockSample tiny(1e-9, 42);
  for (uint64_t count : {1, 2, 3, 100}) {
    INFO(count);
    CHECK(tiny.Checks(0, 0, 0, count));
    CHECK(tiny.Checks(0, (count - 1) * kBlock, count - 1, count));
  }
  CHECK(Checked(tiny, 100000) == 2);  // nothing in the middle at this fraction
}

TEST_CASE("verify sample: about the fraction asked for, reproducible from the seed", "[unit]") {
  constexpr uint64_t kCount = 200000;
  for (double f : {0.01, 0.1, 0.5, 0.9}) {
    INFO(f);
    const double got = static_cast<double>(Checked(BlockSample(f, 1234), kCount)) / kCount;
    CHECK(std::fabs(got - f) < 0.01);
  }
  // The same seed picks the same blocks; another seed other ones.
  const BlockSample a(0.25, 99), b(0.25, 99), c(0.25, 100);
  uint64_t same_ab = 0, same_ac = 0;
  for (uint64_t i = 1; i + 1 < kCount; ++i) {
    same_ab += a.Checks(5, i * kBlock, i, kCount) == b.Checks(5, i * kBlock, i, kCount) ? 1 : 0;
    same_ac += a.Checks(5, i * kBlock, i, kCount) == c.Checks(5, i * kBlock, i, kCount) ? 1 : 0;
  }
  CHECK(same_ab == kCount - 2);
  CHECK(same_ac < kCount - 2);
}

TEST_CASE("verify sample: a block's choice depends on its blob and offset, not its shard",
          "[unit]") {
  // The same bytes seen as block 5 of a long shard or block 1 of another (not first or last in
  // either): the same answer. So every tier's copy of a blob is sampled alike.
  const BlockSample s(0.3, 5);
  uint64_t differs_by_blob = 0;
  for (uint64_t off = kBlock; off < 1000 * kBlock; off += kBlock) {
    CHECK(s.Checks(2, off, 5, 10) == s.Checks(2, off, 1, 3));
    differs_by_blob += s.Checks(2, off, 5, 10) != s.Checks(3, off, 5, 10) ? 1 : 0;
  }
  CHECK(differs_by_blob > 0);
}

TEST_CASE("verify sample: fractions outside (0, 1] are refused", "[unit]") {
  CHECK(BlockSample::ValidateFraction(0.5).ok());
  CHECK(BlockSample::ValidateFraction(1.0).ok());
  CHECK(BlockSample::ValidateFraction(1e-12).ok());
  for (double bad : {0.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    INFO(bad);
    CHECK(absl::IsInvalidArgument(BlockSample::ValidateFraction(bad)));
  }
}

}  // namespace
}  // namespace ckptd
