#include "format/blob_layout.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "format/crc32c.h"
#include "format/manifest.h"
#include "format/names.h"

namespace ckptd {
namespace {

constexpr uint64_t kPage = 4096;

std::vector<uint8_t> Bytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST_CASE("blob layout: shards back to back, 4 KiB aligned, byte-exact", "[unit]") {
  BlobLayout l;
  CHECK(l.size_bytes() == 0);
  CHECK(*l.Append(100) == ShardPlacement{0, 100, kPage, 0, 100});
  // An empty shard takes nothing and gets offset 0.
  CHECK(*l.Append(0) == ShardPlacement{0, 0, 0, 0, 0});
  CHECK(l.next_offset() == kPage);
  // Exactly one page: no tail, no padding.
  CHECK(*l.Append(kPage) == ShardPlacement{kPage, kPage, kPage, kPage, 0});
  // One byte more than a page: a body page and a one-byte tail.
  CHECK(*l.Append(kPage + 1) == ShardPlacement{2 * kPage, kPage + 1, 2 * kPage, kPage, 1});
  CHECK(*l.Append(4095) == ShardPlacement{4 * kPage, 4095, kPage, 0, 4095});
  CHECK(l.size_bytes() == 5 * kPage);
  CHECK(l.tail_padding_bytes() == 1);
  CHECK(l.shard_count() == 5);
  // A trailing empty shard changes neither the size nor the padding.
  CHECK(l.Append(0)->offset == 0);
  CHECK(l.size_bytes() == 5 * kPage);
  CHECK(l.tail_padding_bytes() == 1);
}

TEST_CASE("blob layout: a blob of only empty shards is empty", "[unit]") {
  BlobLayout l;
  for (int i = 0; i < 3; ++i) REQUIRE(l.Append(0).ok());
  CHECK(l.size_bytes() == 0);
  CHECK(l.tail_padding_bytes() == 0);
}

TEST_CASE("blob layout: the limits of limits.h", "[unit]") {
  SECTION("the largest object and the largest tensor shard fit") {
    BlobLayout l;
    CHECK(l.Append(limits::kObjectBytesMax)->padded_length == limits::kObjectBytesMax);
    auto big = l.Append(limits::kTensorElementsMax * 8);
    REQUIRE(big.ok());
    CHECK(big->offset == limits::kObjectBytesMax);
    CHECK(l.size_bytes() == limits::kObjectBytesMax + limits::kTensorElementsMax * 8);
  }
  SECTION("a blob exactly at the limit, and not a byte more") {
    BlobLayout l;
    REQUIRE(l.Append(limits::kBlobBytesMax - kPage).ok());
    auto last = l.Append(kPage - 1);  // padded to exactly the limit
    REQUIRE(last.ok());
    CHECK(last->end() == limits::kBlobBytesMax);
    CHECK(l.size_bytes() == limits::kBlobBytesMax);
    auto over = l.Append(1);
    CHECK(over.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(l.size_bytes() == limits::kBlobBytesMax);  // unchanged
    CHECK(l.Append(0).ok());                         // an empty shard still fits
  }
  SECTION("lengths that would overflow uint64 are refused, not wrapped") {
    BlobLayout l;
    CHECK(l.Append(UINT64_MAX).status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(l.Append(limits::kBlobBytesMax + 1).status().code() ==
          absl::StatusCode::kResourceExhausted);
    REQUIRE(l.Append(kPage).ok());
    CHECK(l.Append(limits::kBlobBytesMax).status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(l.size_bytes() == kPage);
  }
}

TEST_CASE("blob layout: blob size from stored entries matches the layout", "[unit]") {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    BlobLayout l;
    uint64_t max_end = 0;
    for (int i = 0; i < 20; ++i) {
      uint64_t len = rng() % 3 == 0 ? 0 : rng() % (3 * kPage);
      ShardPlacement p = *l.Append(len);
      v1::ShardEntry e;
      e.set_offset(p.offset);
      e.set_length(p.length);
      max_end = std::max(max_end, ShardEndInBlob(e));
      CHECK(p.offset % kPage == 0);
      CHECK(p.body_bytes + p.tail_bytes == p.length);
      CHECK(p.tail_bytes < kPage);
    }
    CHECK(max_end == l.size_bytes());
  }
}

TEST_CASE("blob layout: names and blob info", "[unit]") {
  v1::BlobInfo b = MakeBlobInfo(3, 8192);
  CHECK(b.id() == 3);
  CHECK(b.name() == "r00003.blob");
  CHECK(b.name() == BlobName(3));
  CHECK(b.size_bytes() == 8192);
}

TEST_CASE("blob layout: checksum block sizes and boundaries", "[unit]") {
  CHECK(ValidateChecksumBlockBytes(4096).ok());
  CHECK(ValidateChecksumBlockBytes(16 << 20).ok());
  CHECK(ValidateChecksumBlockBytes(1 << 20).ok());
  for (uint64_t bad : {0ull, 2048ull, 4097ull, 12288ull, 32ull << 20}) {
    INFO(bad);
    CHECK(ValidateChecksumBlockBytes(bad).code() == absl::StatusCode::kInvalidArgument);
  }
  // A shard of exactly one block has one full block; one byte more adds a 1-byte block.
  CHECK(BlockCount(4096, 4096) == 1);
  CHECK(ChecksumBlock(4096, 4096, 0) == BlockSpan{0, 4096});
  CHECK(BlockCount(4097, 4096) == 2);
  CHECK(ChecksumBlock(4097, 4096, 1) == BlockSpan{4096, 1});
  CHECK(BlockCount(0, 4096) == 0);
  CHECK(ChecksumBlock(10000, 4096, 2) == BlockSpan{8192, 1808});
}

TEST_CASE("blob layout: a streamed shard's block crcs equal BlockCrcs", "[unit]") {
  std::mt19937_64 rng(11);
  for (uint64_t len : {0ull, 1ull, 4095ull, 4096ull, 4097ull, 3 * 4096ull, 100000ull}) {
    std::vector<uint8_t> data = Bytes(len, len);
    BlockCrcStream s(4096);
    for (uint64_t off = 0; off < len;) {
      uint64_t take = std::min<uint64_t>(len - off, rng() % 9000);
      s.Update(data.data() + off, take);
      off += take;
    }
    INFO(len);
    CHECK(s.Finish() == BlockCrcs(data.data(), len, 4096));
    CHECK(s.Finish().empty());  // Finish reset it
  }
}

// Writes a blob as the layout says (shard bytes, zero padding) and checks what a reader checks.
TEST_CASE("blob layout: a blob built by the layout verifies, corruption is found", "[unit]") {
  const std::vector<uint64_t> lengths = {5000, 0, 4096, 1, 12288};
  BlobLayout l;
  std::vector<ShardPlacement> placed;
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < lengths.size(); ++i) {
    placed.push_back(*l.Append(lengths[i]));
    data.push_back(Bytes(lengths[i], i));
  }
  std::vector<uint8_t> blob(l.size_bytes(), 0);
  std::vector<v1::ShardEntry> entries;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::copy(data[i].begin(), data[i].end(), blob.begin() + placed[i].offset);
    v1::ShardEntry e;
    e.set_offset(placed[i].offset);
    e.set_length(placed[i].length);
    for (uint32_t c : BlockCrcs(data[i].data(), data[i].size(), 4096)) e.add_block_crc32c(c);
    entries.push_back(e);
  }
  CHECK(blob.size() == 8192 + 4096 + 4096 + 12288);
  CHECK(VerifyBlobPadding(blob, l.size_bytes(), placed, "b").ok());
  for (const v1::ShardEntry& e : entries) CHECK(VerifyShardBytes(blob, 0, e, 4096, "b").ok());
  // A read of only part of the blob verifies the shards inside it and refuses the others.
  std::span<const uint8_t> part(blob.data() + 8192, 8192);
  CHECK(VerifyShardBytes(part, 8192, entries[2], 4096, "b").ok());
  CHECK(VerifyShardBytes(part, 8192, entries[0], 4096, "b").code() ==
        absl::StatusCode::kInvalidArgument);

  std::vector<uint8_t> bad = blob;
  bad[5000] ^= 1;  // padding after shard 0
  CHECK(VerifyBlobPadding(bad, l.size_bytes(), placed, "b").code() == absl::StatusCode::kDataLoss);
  bad = blob;
  bad[8192 + 4096 + 4096 + 5000] ^= 0x80;  // shard 4's second block
  absl::Status st = VerifyShardBytes(bad, 0, entries[4], 4096, "b");
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(st.message()).find("block 1") != std::string::npos);
  bad = blob;
  bad.push_back(0);
  CHECK(VerifyBlobPadding(bad, l.size_bytes(), placed, "b").code() == absl::StatusCode::kDataLoss);
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// The golden checkpoint (tests/data/golden, written by the daemon's flush and commit): the layout
// module, given each blob's shard lengths in blob order, gives exactly the offsets and sizes the
// daemon wrote, and every blob file is byte for byte what the layout says (shards, zero padding,
// size), with every block crc matching.
TEST_CASE("blob layout: matches the blobs of the golden checkpoint", "[unit]") {
  const std::string dir = std::string(CKPTD_TEST_DATA) + "/golden/golden/" + StepDirName(7);
  std::vector<uint8_t> bytes = ReadFile(dir + "/" + kManifestFileName);
  auto m = DecodeManifest(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "golden");
  REQUIRE(m.ok());
  const uint32_t block = m->header.checksum_block_bytes();
  REQUIRE(ValidateChecksumBlockBytes(block).ok());
  std::map<uint32_t, std::vector<const v1::ShardEntry*>> by_blob;
  for (const v1::ItemEntry& item : m->items) {
    for (const v1::ShardEntry& s : item.shards()) by_blob[s.blob_id()].push_back(&s);
  }
  REQUIRE(m->header.blobs_size() >= 2);
  uint64_t unaligned = 0;
  for (const v1::BlobInfo& info : m->header.blobs()) {
    INFO(info.name());
    CHECK(info.name() == BlobName(info.id()));
    std::vector<const v1::ShardEntry*> shards = by_blob[info.id()];
    // Blob order: by offset (empty shards, at offset 0, anywhere: they take no bytes).
    std::stable_sort(shards.begin(), shards.end(), [](auto* a, auto* b) {
      return (a->length() > 0) < (b->length() > 0) ||
             ((a->length() > 0) == (b->length() > 0) && a->offset() < b->offset());
    });
    BlobLayout l;
    std::vector<ShardPlacement> placed;
    for (const v1::ShardEntry* s : shards) {
      ShardPlacement p = *l.Append(s->length());
      CHECK(p.offset == s->offset());
      CHECK(ShardEndInBlob(*s) == p.end());
      unaligned += s->length() % kPage != 0;
      placed.push_back(p);
    }
    CHECK(l.size_bytes() == info.size_bytes());
    CHECK(MakeBlobInfo(info.id(), l.size_bytes()).SerializeAsString() == info.SerializeAsString());
    std::vector<uint8_t> blob = ReadFile(dir + "/" + info.name());
    CHECK(VerifyBlobPadding(blob, l.size_bytes(), placed, info.name()).ok());
    for (const v1::ShardEntry* s : shards) {
      CHECK(VerifyShardBytes(blob, 0, *s, block, info.name()).ok());
    }
  }
  CHECK(unaligned > 0);  // the golden data exercises padding
}

}  // namespace
}  // namespace ckptd
