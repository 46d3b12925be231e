#include "format/blob_encoding.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "common/limits.h"
#include "format/codec.h"
#include "format/crc32c.h"
#include "format/manifest.h"

namespace ckptd {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// A 1-D tensor item of `dtype` with one shard of `length` bytes at `offset` of blob 0.
v1::ItemEntry Flat(const std::string& name, v1::DType dtype, uint64_t elem, uint64_t offset,
                   uint64_t length, uint32_t block) {
  v1::ItemEntry item;
  item.set_name(name);
  item.set_kind(v1::TENSOR);
  item.set_dtype(dtype);
  item.add_shape(length / elem);
  v1::ShardEntry* s = item.add_shards();
  s->mutable_region()->mutable_flat()->set_start(0);
  s->mutable_region()->mutable_flat()->set_count(length / elem);
  s->set_offset(offset);
  s->set_length(length);
  for (uint64_t i = 0; i < BlockCount(length, block); ++i) s->add_block_crc32c(0);
  return item;
}

Manifest TwoShards(v1::DType a, uint64_t a_elem, v1::DType b, uint64_t b_elem) {
  Manifest m;
  m.header.set_job("j");
  m.header.set_step(1);
  m.header.set_world_size(1);
  m.header.set_checksum_block_bytes(4096);
  v1::BlobInfo* blob = m.header.add_blobs();
  blob->set_name("r00000.blob");
  blob->set_size_bytes(14 * kMiB);
  // a: [0, 6 MiB + 4 KiB); b: [6 MiB + 8 KiB, 14 MiB).
  m.items.push_back(Flat("a", a, a_elem, 0, 6 * kMiB + 4096, 4096));
  m.items.push_back(Flat("b", b, b_elem, 6 * kMiB + 8192, 8 * kMiB - 8192, 4096));
  return m;
}

v1::BlobInfo Encoded(uint64_t size, uint32_t chunk) {
  v1::BlobInfo b;
  b.set_id(3);
  b.set_name("r00003.blob");
  b.set_size_bytes(size);
  v1::BlobEncoding* e = b.mutable_encoding();
  e->set_codec(kBlobCodecCkc1);
  e->set_chunk_bytes(chunk);
  uint64_t sum = 0;
  for (uint64_t at = 0; at < size; at += chunk) {
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk, size - at) / 2 + 100);
    e->add_frame_bytes(n);
    sum += n;
  }
  e->set_encoded_bytes(sum);
  return b;
}

TEST_CASE("blob encoding: a consistent record is valid and its frames lie back to back",
          "[unit][codec]") {
  const v1::BlobInfo b = Encoded(10 * kMiB + 4096, 4 * kMiB);
  REQUIRE(ValidateBlobEncoding(b).ok());
  const BlobFrames f = FramesOf(b);
  REQUIRE(f.chunks() == 3);
  CHECK(f.offsets[0] == 0);
  CHECK(f.offsets[1] == 2 * kMiB + 100);
  CHECK(f.encoded_bytes() == b.encoding().encoded_bytes());
  CHECK(f.DecodedBytes(0) == 4 * kMiB);
  CHECK(f.DecodedBytes(2) == 2 * kMiB + 4096);  // the short last chunk
  v1::BlobInfo raw = b;
  raw.clear_encoding();
  CHECK(ValidateBlobEncoding(raw).ok());
}

TEST_CASE("blob encoding: a record whose sizes disagree is refused naming the blob",
          "[unit][codec]") {
  v1::BlobInfo b = Encoded(10 * kMiB, 4 * kMiB);
  std::string want;
  SECTION("another codec") {
    b.mutable_encoding()->set_codec("lz4");
    want = "codec \"lz4\"";
  }
  SECTION("a frame missing") {
    b.mutable_encoding()->mutable_frame_bytes()->RemoveLast();
    want = "2 frame sizes for 3 chunks";
  }
  SECTION("a frame larger than its chunk can encode to") {
    b.mutable_encoding()->set_frame_bytes(2, static_cast<uint32_t>(2 * kMiB + 1000));
    want = "frame 2 is";
  }
  SECTION("a frame smaller than a header") {
    b.mutable_encoding()->set_frame_bytes(0, 10);
    want = "frame 0 is 10 bytes";
  }
  SECTION("a total that is not the frames' sum") {
    b.mutable_encoding()->set_encoded_bytes(b.encoding().encoded_bytes() + 1);
    want = "the frames add up to";
  }
  SECTION("a chunk size that is not a power of two") {
    b.mutable_encoding()->set_chunk_bytes(3 * 4096);
    want = "chunk size 12288";
  }
  absl::Status st = ValidateBlobEncoding(b);
  INFO(st.ToString());
  CHECK(st.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(st.message().find("blob 3 (r00003.blob): encoding: ") != std::string_view::npos);
  CHECK(st.message().find(want) != std::string_view::npos);
}

TEST_CASE("blob encoding: a manifest file with an inconsistent record does not decode",
          "[unit][codec]") {
  Manifest m = TwoShards(v1::BFLOAT16, 2, v1::BFLOAT16, 2);
  m.header.mutable_blobs(0)->set_id(0);
  *m.header.mutable_blobs(0)->mutable_encoding() =
      Encoded(m.header.blobs(0).size_bytes(), 4 * kMiB).encoding();
  absl::StatusOr<std::string> bytes = EncodeManifest(m);
  REQUIRE(bytes.ok());
  REQUIRE(DecodeManifest(*bytes, "good").ok());
  // The same file with the header record rewritten: one frame size too many.
  uint32_t header_len = 0;
  std::memcpy(&header_len, bytes->data() + sizeof(kManifestMagic), 4);
  v1::ManifestHeader h;
  REQUIRE(h.ParseFromArray(bytes->data() + sizeof(kManifestMagic) + kManifestRecordHeaderBytes,
                           static_cast<int>(header_len)));
  h.mutable_blobs(0)->mutable_encoding()->add_frame_bytes(100);
  h.mutable_blobs(0)->mutable_encoding()->set_encoded_bytes(h.blobs(0).encoding().encoded_bytes() +
                                                            100);
  std::string bad(kManifestMagic, sizeof(kManifestMagic));
  AppendManifestRecord(h.SerializeAsString(), &bad);
  bad += bytes->substr(sizeof(kManifestMagic) + kManifestRecordHeaderBytes + header_len);
  absl::StatusOr<Manifest> got = DecodeManifest(bad, "bad");
  INFO(got.status().ToString());
  CHECK(got.status().code() == absl::StatusCode::kDataLoss);
  CHECK(got.status().message().find("blob 0 (r00000.blob): encoding: 5 frame sizes for 4 "
                                    "chunks") != std::string_view::npos);
}

TEST_CASE("blob encoding: each chunk's planes follow the dtype of the shards in it",
          "[unit][codec]") {
  // Chunks of 4 MiB: 0 holds a only, 1 the end of a and the start of b (and the padding
  // between), 2 and 3 b only.
  SECTION("bf16 then fp32: 2, mixed (1), 4, 4") {
    const Manifest m = TwoShards(v1::BFLOAT16, 2, v1::FLOAT32, 4);
    CHECK(ChunkPlanes(m, 0, 14 * kMiB, 4 * kMiB) == std::vector<uint8_t>{2, 1, 4, 4});
    CHECK(ChunkPlanes(m, 0, 14 * kMiB, 2 * kMiB) == std::vector<uint8_t>{2, 2, 2, 1, 4, 4, 4});
  }
  SECTION("a chunk spanning two shards of one element size takes it") {
    const Manifest m = TwoShards(v1::FLOAT16, 2, v1::BFLOAT16, 2);
    CHECK(ChunkPlanes(m, 0, 14 * kMiB, 4 * kMiB) == std::vector<uint8_t>{2, 2, 2, 2});
  }
  SECTION("fp64 (8) and uint8 (1)") {
    const Manifest m = TwoShards(v1::FLOAT64, 8, v1::UINT8, 1);
    CHECK(ChunkPlanes(m, 0, 14 * kMiB, 4 * kMiB) == std::vector<uint8_t>{8, 1, 1, 1});
  }
  SECTION("objects, other blobs and chunks without shard bytes take 1") {
    Manifest m = TwoShards(v1::FLOAT32, 4, v1::FLOAT32, 4);
    m.items[1].set_kind(v1::OBJECT);
    CHECK(ChunkPlanes(m, 0, 14 * kMiB, 4 * kMiB) == std::vector<uint8_t>{4, 1, 1, 1});
    CHECK(ChunkPlanes(m, 1, 14 * kMiB, 4 * kMiB) == std::vector<uint8_t>{1, 1, 1, 1});
    CHECK(ChunkPlanes(m, 0, 20 * kMiB, 4 * kMiB) == std::vector<uint8_t>{4, 1, 1, 1, 1});
  }
}

TEST_CASE("blob encoding: the chunk size is at least 4 MiB and grows to keep the record bounded",
          "[unit][codec]") {
  Manifest m = TwoShards(v1::BFLOAT16, 2, v1::BFLOAT16, 2);
  CHECK(EncodedChunkBytes(m) == limits::kEncodedChunkBytesMin);
  m.header.set_checksum_block_bytes(16 * kMiB);
  CHECK(EncodedChunkBytes(m) == 16 * kMiB);
  m.header.set_checksum_block_bytes(4096);
  // 2^22 frames of 4 MiB fit; one byte more doubles the chunk.
  m.header.mutable_blobs(0)->set_size_bytes(limits::kEncodedFramesPerManifestMax * 4 * kMiB);
  CHECK(EncodedChunkBytes(m) == 4 * kMiB);
  m.header.mutable_blobs(0)->set_size_bytes(limits::kEncodedFramesPerManifestMax * 4 * kMiB + 1);
  CHECK(EncodedChunkBytes(m) == 8 * kMiB);
  m.header.mutable_blobs(0)->set_size_bytes(limits::kEncodedFramesPerManifestMax * 16 * kMiB + 1);
  CHECK(EncodedChunkBytes(m) == std::nullopt);
}

}  // namespace
}  // namespace ckptd
