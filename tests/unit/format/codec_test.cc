#include "format/codec.h"

#include <zstd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckptd/v1/dtype_table.h"
#include "common/limits.h"
#include "format/crc32c.h"

namespace ckptd {
namespace {

using Bytes = std::vector<uint8_t>;

std::span<const uint8_t> AsSpan(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Bytes RandomBytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Gaussian weights (std 0.02, as initialised transformer weights) as fp32, or as bf16 (the high
// half of each fp32, rounded to nearest even).
Bytes GaussianWeights(uint64_t elements, uint32_t element_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  Bytes b(elements * element_bytes);
  for (uint64_t i = 0; i < elements; ++i) {
    const float f = dist(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (element_bytes == 4) {
      std::memcpy(&b[i * 4], &u, 4);
    } else {
      const uint16_t h = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}

std::string EncodeOk(const Bytes& in, uint32_t planes, int level = kCodecZstdLevelDefault) {
  ChunkEncoder enc(level);
  std::string frame;
  REQUIRE(enc.Encode(in, planes, &frame).ok());
  REQUIRE(frame.size() <= CodecFrameBytesMax(in.size(), planes));
  return frame;
}

Bytes DecodeOk(const std::string& frame, uint64_t n) {
  ChunkDecoder dec;
  Bytes out(n);
  const absl::Status s = dec.Decode(AsSpan(frame), out, "j/1 item w");
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

absl::Status DecodeStatus(const std::string& frame, uint64_t n) {
  ChunkDecoder dec;
  Bytes out(n);
  return dec.Decode(AsSpan(frame), out, "j/1 item w");
}

uint32_t Load32(const std::string& s, uint64_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

void Store32(std::string& s, uint64_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }

// Rewrites the frame's checksums after a test edited it: what a lying writer does.
void Reseal(std::string& frame) {
  const uint64_t header = CodecHeaderBytes(static_cast<uint8_t>(frame[4]));
  Store32(frame, 16, Crc32c(frame.data() + header, frame.size() - header));
  Store32(frame, header - 4, MaskCrc(Crc32c(frame.data(), header - 4)));
}

struct DTypeRow {
  v1::DType dtype;
  const char* name;
  uint32_t size;
};
#define CKPTD_ROW(PROTO, CLIENT, NAME, SIZE, ST, NP) DTypeRow{v1::PROTO, NAME, SIZE},
const DTypeRow kRows[] = {CKPTD_DTYPES(CKPTD_ROW)};
#undef CKPTD_ROW

TEST_CASE("codec round-trips every dtype's plane count at odd sizes and levels", "[unit]") {
  const uint64_t sizes[] = {1, 2, 3, 5, 7, 8, 9, 4095, 4096, 4097, 65536 + 3, (1u << 20) + 5};
  for (const DTypeRow& row : kRows) {
    absl::StatusOr<uint32_t> planes = CodecPlanesFor(row.dtype);
    REQUIRE(planes.ok());
    CHECK(*planes == (row.size == 2 || row.size == 4 || row.size == 8 ? row.size : 1));
    for (uint64_t n : sizes) {
      for (int kind = 0; kind < 3; ++kind) {
        INFO(row.name << " n=" << n << " kind=" << kind);
        Bytes in = kind == 0   ? RandomBytes(n, n)
                   : kind == 1 ? Bytes(n, 0)
                               : GaussianWeights(n / 4 + 1, 4, n);
        in.resize(n);
        const std::string frame = EncodeOk(in, *planes);
        CHECK(DecodeOk(frame, n) == in);
      }
    }
  }
  for (int level : {limits::kCodecZstdLevelMin, -1, 1, 3, limits::kCodecZstdLevelMax}) {
    INFO("level " << level);
    const Bytes in = GaussianWeights(20000, 2, 7);
    CHECK(DecodeOk(EncodeOk(in, 2, level), in.size()) == in);
  }
  CHECK_FALSE(CodecPlanesFor(v1::DTYPE_UNSPECIFIED).ok());
}

TEST_CASE("codec: the largest chunk round-trips, byte grouping shrinks weights", "[unit]") {
  const Bytes big = GaussianWeights(limits::kCodecChunkBytesMax / 2, 2, 3);
  REQUIRE(big.size() == limits::kCodecChunkBytesMax);
  const std::string grouped = EncodeOk(big, 2);
  CHECK(DecodeOk(grouped, big.size()) == big);
  const std::string plain = EncodeOk(big, 1);
  // bf16 gaussian weights: the exponent plane compresses, the mantissa plane stays about raw.
  CHECK(grouped.size() < plain.size());
  CHECK(static_cast<double>(big.size()) / static_cast<double>(grouped.size()) > 1.2);
  absl::StatusOr<CodecFrameInfo> info = ParseCodecFrameHeader(AsSpan(grouped), "t");
  REQUIRE(info.ok());
  CHECK(info->planes == 2);
  CHECK((info->zstd_planes & 2) != 0);  // the sign+exponent byte
  CHECK(info->decoded_bytes == big.size());
  CHECK(info->decoded_crc32c == Crc32c(big.data(), big.size()));
  CHECK(info->frame_bytes == grouped.size());
}

TEST_CASE("codec: incompressible chunks are stored raw, at most a header larger", "[unit]") {
  for (uint32_t planes : {1u, 2u, 4u, 8u}) {
    const Bytes in = RandomBytes(100003, planes);
    const std::string frame = EncodeOk(in, planes);
    CHECK(frame.size() == CodecHeaderBytes(planes) + in.size());
    absl::StatusOr<CodecFrameInfo> info = ParseCodecFrameHeader(AsSpan(frame), "t");
    REQUIRE(info.ok());
    CHECK(info->zstd_planes == 0);
    // A raw frame is the header, then the planes, then the tail: readable by hand.
    if (planes == 1) CHECK(std::memcmp(frame.data() + CodecHeaderBytes(1), in.data(), 100) == 0);
  }
}

TEST_CASE("codec: the frame header is as BLOB_FORMAT.md says", "[unit]") {
  Bytes in = RandomBytes(4 * 1000 + 3, 9);
  for (uint64_t i = 3; i < 4000; i += 4) in[i] = 0x3c;
  const std::string frame = EncodeOk(in, 4);
  CHECK(frame.substr(0, 4) == "CKC1");
  CHECK(frame[4] == 4);
  CHECK(static_cast<uint8_t>(frame[5]) == 0x8);  // only the constant high byte compresses
  CHECK(frame[6] == 0);
  CHECK(frame[7] == 0);
  CHECK(Load32(frame, 8) == in.size());
  CHECK(Load32(frame, 12) == Crc32c(in.data(), in.size()));
  CHECK(Load32(frame, 16) == Crc32c(frame.data() + 40, frame.size() - 40));
  CHECK(Load32(frame, 20) == 1000);  // planes 0..2: raw
  CHECK(Load32(frame, 24) == 1000);
  CHECK(Load32(frame, 28) == 1000);
  CHECK(UnmaskCrc(Load32(frame, 36)) == Crc32c(frame.data(), 36));
  CHECK(frame.size() == 40 + 3000 + Load32(frame, 32) + 3);
  // Plane 0 (raw) is byte 0 of each element; the 3 tail bytes end the frame.
  CHECK(static_cast<uint8_t>(frame[40]) == in[0]);
  CHECK(static_cast<uint8_t>(frame[41]) == in[4]);
  CHECK(static_cast<uint8_t>(frame[40 + 1000]) == in[1]);
  CHECK(frame.substr(frame.size() - 3) ==
        std::string({char(in[4000]), char(in[4001]), char(in[4002])}));
  // Plane 3 is one zstd frame with its content size.
  CHECK(ZSTD_getFrameContentSize(frame.data() + 40 + 3000, Load32(frame, 32)) == 1000);
}

TEST_CASE("codec: the encoder refuses bad arguments", "[unit]") {
  ChunkEncoder enc;
  std::string out = "keep";
  absl::Status s = enc.Encode({}, 1, &out);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("kCodecChunkBytesMax"));
  Bytes big(limits::kCodecChunkBytesMax + 1);
  CHECK(enc.Encode(big, 1, &out).code() == absl::StatusCode::kInvalidArgument);
  Bytes one(16);
  s = enc.Encode(one, 3, &out);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("plane count 3"));
  CHECK(out == "keep");
  CHECK(ValidateZstdLevel(limits::kCodecZstdLevelMax + 1).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ValidateZstdLevel(limits::kCodecZstdLevelMin - 1).code() ==
        absl::StatusCode::kInvalidArgument);
  // Frames append: two chunks back to back, each decodable by its own bounds.
  const Bytes a = GaussianWeights(3000, 2, 1), b = RandomBytes(777, 2);
  std::string two;
  REQUIRE(enc.Encode(a, 2, &two).ok());
  const uint64_t first = two.size();
  REQUIRE(enc.Encode(b, 1, &two).ok());
  CHECK(DecodeOk(two.substr(0, first), a.size()) == a);
  CHECK(DecodeOk(two.substr(first), b.size()) == b);
}

TEST_CASE("codec: truncated, extended or mis-sized frames are DATA_LOSS", "[unit]") {
  const Bytes in = GaussianWeights(5000, 2, 11);
  const std::string frame = EncodeOk(in, 2);
  for (uint64_t len = 0; len < frame.size(); ++len) {
    INFO("length " << len);
    const absl::Status s = DecodeStatus(frame.substr(0, len), in.size());
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(s.message()), Catch::StartsWith("j/1 item w: encoded chunk: "));
  }
  absl::Status s = DecodeStatus(frame + "x", in.size());
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(s.message()), Catch::Contains("but its header says"));
  s = DecodeStatus(frame, in.size() - 1);
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(s.message()), Catch::Contains("expected 9999"));
}

TEST_CASE("codec: every flipped bit of a frame is detected", "[unit]") {
  for (uint32_t planes : {1u, 2u}) {
    const Bytes in = GaussianWeights(700, 2, planes);
    const std::string frame = EncodeOk(in, planes);
    for (uint64_t i = 0; i < frame.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = frame;
        bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
        INFO("planes " << planes << " byte " << i << " bit " << bit);
        CHECK(DecodeStatus(bad, in.size()).code() == absl::StatusCode::kDataLoss);
      }
    }
  }
}

TEST_CASE("codec: a resealed header that lies is refused before anything is trusted", "[unit]") {
  const Bytes in = GaussianWeights(4096, 2, 5);
  const std::string frame = EncodeOk(in, 2);
  auto expect = [&](std::string bad, const char* what, uint64_t n = 0) {
    Reseal(bad);
    const absl::Status s = DecodeStatus(bad, n != 0 ? n : in.size());
    INFO(s.ToString());
    CHECK(s.code() == absl::StatusCode::kDataLoss);
    CHECK_THAT(std::string(s.message()), Catch::Contains(what));
  };
  std::string bad = frame;
  bad[0] = 'X';
  CHECK_THAT(std::string(DecodeStatus(bad, in.size()).message()), Catch::Contains("bad magic"));
  bad = frame;
  bad[4] = 3;
  CHECK_THAT(std::string(DecodeStatus(bad, in.size()).message()), Catch::Contains("plane count 3"));
  bad = frame;
  bad[5] = static_cast<char>(bad[5] | 4);
  expect(bad, "reserved header bits");
  bad = frame;
  bad[6] = 1;
  expect(bad, "reserved header bits");
  bad = frame;
  Store32(bad, 8, limits::kCodecChunkBytesMax + 2);
  expect(bad, "kCodecChunkBytesMax");
  bad = frame;
  Store32(bad, 8, 0);
  expect(bad, "decoded size 0");
  bad = frame;
  bad[5] = static_cast<char>(bad[5] & ~2);  // plane 1 claimed raw, but stores fewer bytes
  expect(bad, "raw plane 1");
  bad = frame;
  Store32(bad, 24, 4096);  // plane 1 zstd but "as large as raw"
  expect(bad, "zstd plane 1 stores 4096 bytes");
  bad = frame;
  Store32(bad, 12, Load32(frame, 12) ^ 1);
  expect(bad, "decoded crc32c mismatch");
  bad = frame;
  Store32(bad, 8, 2 * 4096 + 2);  // a bigger chunk: the zstd plane holds fewer bytes than said
  Store32(bad, 20, 4097);         // raw plane 0 one byte longer, so only the zstd plane lies
  bad.insert(CodecHeaderBytes(2), 1, 'x');
  expect(bad, "holds 4096 bytes, not the plane's 4097", 2 * 4096 + 2);
  bad = frame;
  bad.back() = static_cast<char>(bad.back() ^ 1);
  CHECK_THAT(std::string(DecodeStatus(bad, in.size()).message()),
             Catch::Contains("stored crc32c mismatch"));
  CHECK(VerifyCodecFrame(AsSpan(bad), "t").status().code() == absl::StatusCode::kDataLoss);
  CHECK(VerifyCodecFrame(AsSpan(frame), "t").ok());
}

TEST_CASE("codec: zstd planes without a content size or with trailing bytes are refused",
          "[unit]") {
  const Bytes plane(5000, 7);
  auto frame_with_plane = [&](const std::string& z) {
    std::string f(CodecHeaderBytes(1), '\0');
    std::memcpy(f.data(), kCodecFrameMagic, 4);
    f[4] = 1;
    f[5] = 1;
    Store32(f, 8, plane.size());
    Store32(f, 12, Crc32c(plane.data(), plane.size()));
    Store32(f, 20, z.size());
    f += z;
    Reseal(f);
    return f;
  };
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  std::string z(ZSTD_compressBound(plane.size()), '\0');
  REQUIRE(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
  size_t r = ZSTD_compress2(cctx, z.data(), z.size(), plane.data(), plane.size());
  REQUIRE(!ZSTD_isError(r));
  absl::Status s = DecodeStatus(frame_with_plane(z.substr(0, r)), plane.size());
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(s.message()), Catch::Contains("states no content size"));
  REQUIRE(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1)));
  r = ZSTD_compress2(cctx, z.data(), z.size(), plane.data(), plane.size());
  REQUIRE(!ZSTD_isError(r));
  CHECK(DecodeOk(frame_with_plane(z.substr(0, r)), plane.size()) == plane);
  s = DecodeStatus(frame_with_plane(z.substr(0, r) + "junk"), plane.size());
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(s.message()), Catch::Contains("does not end at the plane's"));
  ZSTD_freeCCtx(cctx);
}

}  // namespace
}  // namespace ckptd
