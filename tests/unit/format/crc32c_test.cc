#include "format/crc32c.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace ckptd {
namespace {

using CrcFn = uint32_t (*)(const void*, size_t, uint32_t);

std::vector<std::pair<const char*, CrcFn>> Implementations() {
  std::vector<std::pair<const char*, CrcFn>> fns = {{"portable", &Crc32cPortable},
                                                    {"dispatch", &Crc32c}};
  if (Crc32cHardwareAvailable()) fns.push_back({"hardware", &Crc32cHardware});
  return fns;
}

TEST_CASE("Crc32c known vectors on every implementation", "[unit]") {
  for (auto [name, fn] : Implementations()) {
    INFO(name);
    CHECK(fn("123456789", 9, 0) == 0xE3069283u);
    CHECK(fn("", 0, 0) == 0u);
    std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
    for (int i = 0; i < 32; ++i) {
      inc[i] = static_cast<uint8_t>(i);
      dec[i] = static_cast<uint8_t>(31 - i);
    }
    // RFC 3720 B.4 test vectors.
    CHECK(fn(zeros.data(), 32, 0) == 0x8A9136AAu);
    CHECK(fn(ones.data(), 32, 0) == 0x62A8AB43u);
    CHECK(fn(inc.data(), 32, 0) == 0x46DD794Eu);
    CHECK(fn(dec.data(), 32, 0) == 0x113FDB5Cu);
  }
}

TEST_CASE("Crc32c implementations agree and extend", "[unit]") {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(5008);  // room for misalignment
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n :
       {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{4096}, size_t{4999}}) {
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{3}}) {
      const uint8_t* p = buf.data() + misalign;
      uint32_t whole = Crc32cPortable(p, n);
      for (auto [name, fn] : Implementations()) {
        INFO(name << " n=" << n << " misalign=" << misalign);
        CHECK(fn(p, n, 0) == whole);
        size_t split = n / 3;
        CHECK(fn(p + split, n - split, fn(p, split, 0)) == whole);
      }
    }
  }
}

TEST_CASE("MaskCrc round-trips and changes the value", "[unit]") {
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xffffffffu, 0x12345678u}) {
    CHECK(UnmaskCrc(MaskCrc(crc)) == crc);
    CHECK(MaskCrc(crc) != crc);
    CHECK(MaskCrc(MaskCrc(crc)) != crc);
  }
}

TEST_CASE("BlockCount and BlockCrcs", "[unit]") {
  CHECK(BlockCount(0, 4096) == 0);
  CHECK(BlockCount(1, 4096) == 1);
  CHECK(BlockCount(4096, 4096) == 1);
  CHECK(BlockCount(4097, 4096) == 2);
  CHECK(BlockCount(uint64_t{1} << 62, 1) == uint64_t{1} << 62);
  CHECK(BlockCrcs("x", 0, 16).empty());
  std::string data(100, 'a');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  auto crcs = BlockCrcs(data.data(), data.size(), 32);
  REQUIRE(crcs.size() == 4);
  CHECK(crcs[0] == Crc32c(data.data(), 32));
  CHECK(crcs[3] == Crc32c(data.data() + 96, 4));
}

TEST_CASE("BlockCrcs three blocks at a time equals one block at a time", "[unit]") {
  // Lengths around multiples of three blocks, with and without a short last block, and blocks
  // whose length is not a multiple of 8 (the byte tail of the three-way loop).
  std::string data(3 * 4096 * 5 + 777, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  for (uint32_t block : {13u, 64u, 4096u}) {
    const uint64_t b = block;
    for (uint64_t n : std::vector<uint64_t>{0, b, 3 * b, 3 * b + 1, 7 * b - 5, data.size()}) {
      if (n > data.size()) continue;
      std::vector<uint32_t> got = BlockCrcs(data.data(), n, block);
      REQUIRE(got.size() == BlockCount(n, block));
      for (size_t b = 0; b < got.size(); ++b) {
        uint64_t len = std::min<uint64_t>(block, n - b * block);
        INFO("block " << block << " n " << n << " index " << b);
        CHECK(got[b] == Crc32cPortable(data.data() + b * block, len));
      }
      if (n > 0) CHECK(VerifyBlocks(data.data(), 0, n, n, got, block, "t").ok());
    }
  }
  // A flipped byte past the first group of blocks VerifyBlocks checksums at once is named.
  constexpr uint32_t kBlock = 64;
  const uint64_t n = 100 * kBlock;
  std::vector<uint32_t> crcs = BlockCrcs(data.data(), n, kBlock);
  data[50 * kBlock + 3] ^= 1;
  absl::Status s = VerifyBlocks(data.data(), 0, n, n, crcs, kBlock, "t");
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(s.message()), Catch::Contains("block 50 crc32c mismatch"));
}

TEST_CASE("VerifyBlocks checks whole blocks of a shard", "[unit]") {
  constexpr uint32_t kBlock = 16;
  std::string shard(70, '\0');  // blocks 0..3 of 16 bytes and block 4 of 6
  for (size_t i = 0; i < shard.size(); ++i) shard[i] = static_cast<char>(i * 13 + 1);
  auto crcs = BlockCrcs(shard.data(), shard.size(), kBlock);
  REQUIRE(crcs.size() == 5);
  const uint64_t n = shard.size();

  CHECK(VerifyBlocks(shard.data(), 0, n, n, crcs, kBlock, "ctx").ok());
  CHECK(VerifyBlocks(shard.data() + 16, 1, 32, n, crcs, kBlock, "ctx").ok());
  CHECK(VerifyBlocks(shard.data() + 48, 3, 22, n, crcs, kBlock, "ctx").ok());
  CHECK(VerifyBlocks(shard.data() + 64, 4, 6, n, crcs, kBlock, "ctx").ok());
  CHECK(VerifyBlocks(shard.data(), 5, 0, n, crcs, kBlock, "ctx").ok());
  CHECK(VerifyBlocks(nullptr, 0, 0, 0, {}, kBlock, "ctx").ok());

  SECTION("a mismatch is DATA_LOSS naming the block") {
    std::string bad = shard;
    bad[40] ^= 1;
    absl::Status s = VerifyBlocks(bad.data() + 16, 1, 48, n, crcs, kBlock, "item \"w\" shard 2");
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    std::string msg(s.message());
    CHECK(msg.find("item \"w\" shard 2") != std::string::npos);
    CHECK(msg.find("block 2") != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
  }
  SECTION("ranges that are not whole blocks are INVALID_ARGUMENT") {
    auto code = [&](uint64_t first, uint64_t len) {
      return VerifyBlocks(shard.data(), first, len, n, crcs, kBlock, "ctx").code();
    };
    CHECK(code(0, 15) == absl::StatusCode::kInvalidArgument);
    CHECK(code(3, 21) == absl::StatusCode::kInvalidArgument);
    CHECK(code(3, 23) == absl::StatusCode::kInvalidArgument);
    CHECK(code(4, 16) == absl::StatusCode::kInvalidArgument);
    CHECK(code(6, 0) == absl::StatusCode::kInvalidArgument);
    CHECK(code(uint64_t{1} << 60, 16) == absl::StatusCode::kInvalidArgument);
    CHECK(code(0, ~uint64_t{0}) == absl::StatusCode::kInvalidArgument);
    CHECK(VerifyBlocks(shard.data(), 0, n, n, std::span(crcs).first(4), kBlock, "ctx").code() ==
          absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("crc32c: CopyAndBlockCrcs copies and checksums as BlockCrcsInto, any length", "[unit]") {
  std::vector<uint8_t> src(3 * 65536 + 12345);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  for (uint32_t block : {4096u, 65536u, 100u}) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{3} * 4096, size_t{3} * 4096 + 7, src.size()}) {
      for (size_t dst_offset : {size_t{0}, size_t{3}}) {  // aligned (streamed) and not
        CAPTURE(block, n, dst_offset);
        std::vector<uint8_t> dst(n + 16, 0xEE);
        std::vector<uint32_t> got(BlockCount(n, block) + 1, 0);
        CopyAndBlockCrcs(dst.data() + dst_offset, src.data(), n, block, got.data());
        got.pop_back();
        CHECK(got == BlockCrcs(src.data(), n, block));
        CHECK(std::equal(src.begin(), src.begin() + static_cast<long>(n),
                         dst.begin() + static_cast<long>(dst_offset)));
        CHECK(dst[dst_offset + n] == 0xEE);  // nothing past the end
      }
    }
  }
}

}  // namespace
}  // namespace ckptd
