#include "format/manifest.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/limits.h"
#include "format/crc32c.h"
#include "format/names.h"

namespace ckptd {
namespace {

constexpr uint64_t kBlobBytes = 64 * 1024;

v1::ShardEntry TensorShard(const v1::Region& region, uint64_t length, uint64_t offset,
                           uint32_t rank) {
  v1::ShardEntry shard;
  *shard.mutable_region() = region;
  shard.set_blob_id(0);
  shard.set_offset(offset);
  shard.set_length(length);
  for (uint64_t i = 0; i < BlockCount(length, limits::kLegacyChecksumBlockBytes); ++i) {
    shard.add_block_crc32c(0x1000 + static_cast<uint32_t>(i));
  }
  shard.set_saved_by_rank(rank);
  return shard;
}

v1::Region RowBox(uint64_t row, uint64_t rows, uint64_t cols) {
  v1::Region r;
  r.mutable_box()->add_offsets(row);
  r.mutable_box()->add_offsets(0);
  r.mutable_box()->add_lengths(rows);
  r.mutable_box()->add_lengths(cols);
  return r;
}

// An 8x8 float32 tensor in two row halves, saved by ranks 0 and 1.
v1::ItemEntry Tensor(const std::string& name) {
  v1::ItemEntry item;
  item.set_name(name);
  item.set_kind(v1::TENSOR);
  item.set_dtype(v1::FLOAT32);
  item.add_shape(8);
  item.add_shape(8);
  *item.add_shards() = TensorShard(RowBox(0, 4, 8), 128, 0, 0);
  *item.add_shards() = TensorShard(RowBox(4, 4, 8), 128, 4096, 1);
  return item;
}

v1::ItemEntry Object(const std::string& name, v1::ObjectScope scope, int ranks) {
  v1::ItemEntry item;
  item.set_name(name);
  item.set_kind(v1::OBJECT);
  item.set_scope(scope);
  for (int r = 0; r < ranks; ++r) {
    *item.add_shards() = TensorShard(v1::Region(), 100, 8192 + 4096 * r, r);
    item.mutable_shards(r)->clear_region();
  }
  return item;
}

Manifest Sample() {
  Manifest m;
  v1::ManifestHeader& h = m.header;
  h.set_job("llama3-8b");
  h.set_step(1000);
  h.set_world_size(2);
  h.add_ranks_present(0);
  h.add_ranks_present(1);
  h.set_created_unix_ms(1700000000000);
  h.set_committed_unix_ms(1700000001000);
  h.set_total_bytes(456);
  h.set_checksum_block_bytes(limits::kLegacyChecksumBlockBytes);
  v1::BlobInfo* blob = h.add_blobs();
  blob->set_id(0);
  blob->set_name(BlobName(0));
  blob->set_size_bytes(kBlobBytes);
  m.items.push_back(Object("extra.rng", v1::PER_RANK, 2));
  m.items.push_back(Object("extra.step", v1::REPLICATED, 1));
  m.items.push_back(Tensor("model.layers.0.weight"));
  m.items.push_back(Tensor("model.layers.1.weight"));
  m.header.set_item_count(m.items.size());
  return m;
}

std::string Serialized(const Manifest& m) {
  std::string out = m.header.SerializeAsString();
  for (const v1::ItemEntry& item : m.items) out += "|" + item.SerializeAsString();
  return out;
}

// Encodes without validating, for manifests a buggy or malicious writer could produce.
std::string RawEncode(const v1::ManifestHeader& header, const std::vector<v1::ItemEntry>& items) {
  std::string out(kManifestMagic, sizeof(kManifestMagic));
  AppendManifestRecord(header.SerializeAsString(), &out);
  v1::ManifestSegment segment;
  for (const v1::ItemEntry& item : items) *segment.add_items() = item;
  if (header.segment_count() > 0) AppendManifestRecord(segment.SerializeAsString(), &out);
  return out;
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("Manifest round-trips", "[unit]") {
  Manifest m = Sample();
  REQUIRE(ValidateManifest(m).ok());
  auto bytes = EncodeManifest(m);
  REQUIRE(bytes.ok());
  CHECK(bytes->compare(0, 8, "CKPTMAN1") == 0);
  auto decoded = DecodeManifest(*bytes, "test");
  REQUIRE(decoded.ok());
  CHECK(decoded->header.format_version() == kManifestFormatVersion);
  CHECK(decoded->header.segment_count() == 1);
  m.header.set_format_version(kManifestFormatVersion);
  m.header.set_segment_count(1);
  CHECK(Serialized(*decoded) == Serialized(m));
  CHECK(FindItem(*decoded, "extra.step") == &decoded->items[1]);
  CHECK(FindItem(*decoded, "model.layers.1.weight") == &decoded->items[3]);
  CHECK(FindItem(*decoded, "model") == nullptr);
  CHECK(FindItem(*decoded, "zzz") == nullptr);
}

TEST_CASE("Manifest with no items round-trips", "[unit]") {
  Manifest m = Sample();
  m.items.clear();
  auto bytes = EncodeManifest(m);
  REQUIRE(bytes.ok());
  auto decoded = DecodeManifest(*bytes, "test");
  REQUIRE(decoded.ok());
  CHECK(decoded->items.empty());
  CHECK(decoded->header.segment_count() == 0);
}

TEST_CASE("Large manifests split into segments under the target", "[unit]") {
  Manifest m = Sample();
  m.items.clear();
  for (int i = 0; i < 12000; ++i) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "%06d", i);
    m.items.push_back(Tensor(std::string(900, 'p') + suffix));
  }
  auto bytes = EncodeManifest(m);
  REQUIRE(bytes.ok());
  auto decoded = DecodeManifest(*bytes, "big");
  REQUIRE(decoded.ok());
  CHECK(decoded->header.segment_count() >= 3);
  CHECK(decoded->items.size() == 12000);
  CHECK(decoded->items[11999].name() == m.items[11999].name());
  // Every record is within the segment target.
  size_t pos = 8;
  while (pos < bytes->size()) {
    uint32_t len = 0;
    std::memcpy(&len, bytes->data() + pos, 4);
    CHECK(len <= limits::kManifestSegmentBytesTarget);
    pos += 8 + len;
  }
  CHECK(pos == bytes->size());
  CHECK(FindItem(*decoded, m.items[7777].name()) != nullptr);
}

TEST_CASE("Any flipped byte or truncation is DATA_LOSS", "[unit]") {
  auto bytes = EncodeManifest(Sample());
  REQUIRE(bytes.ok());
  for (size_t i = 0; i < bytes->size(); ++i) {
    for (uint8_t bit : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::string bad = *bytes;
      bad[i] = static_cast<char>(bad[i] ^ bit);
      CAPTURE(i, bit);
      CHECK(DecodeManifest(bad, "flip").status().code() == absl::StatusCode::kDataLoss);
    }
  }
  for (size_t n = 0; n < bytes->size(); ++n) {
    CAPTURE(n);
    CHECK(DecodeManifest(bytes->substr(0, n), "cut").status().code() ==
          absl::StatusCode::kDataLoss);
  }
  CHECK(DecodeManifest(*bytes + "x", "tail").status().code() == absl::StatusCode::kDataLoss);
  std::string bad = *bytes;
  bad[8 + 8 + 3] ^= 0x10;  // inside the header record's payload
  CHECK(Message(DecodeManifest(bad, "m.ckm").status()) ==
        "manifest m.ckm: record 0 checksum mismatch");
}

TEST_CASE("Manifest framing errors", "[unit]") {
  Manifest m = Sample();
  m.header.set_format_version(99);
  m.header.set_segment_count(1);
  std::string v99 = RawEncode(m.header, m.items);
  absl::Status s = DecodeManifest(v99, "ckpt/manifest.ckm").status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Message(s) ==
        "manifest ckpt/manifest.ckm has format version 99; this build reads version 1");

  std::string bad_magic = *EncodeManifest(Sample());
  bad_magic[7] = '2';
  CHECK(Message(DecodeManifest(bad_magic, "x").status()).find("bad magic") != std::string::npos);
  CHECK(DecodeManifest("", "x").status().code() == absl::StatusCode::kDataLoss);

  m.header.set_format_version(kManifestFormatVersion);
  m.header.set_segment_count(2);  // one segment written
  CHECK(DecodeManifest(RawEncode(m.header, m.items), "x").status().code() ==
        absl::StatusCode::kDataLoss);

  std::string huge(kManifestMagic, sizeof(kManifestMagic));
  huge += std::string("\xff\xff\xff\x7f\0\0\0\0", 8);
  CHECK(Message(DecodeManifest(huge, "x").status()).find("record 0 claims") != std::string::npos);

  std::string garbage(kManifestMagic, sizeof(kManifestMagic));
  AppendManifestRecord("\xff\xff\xff", &garbage);
  CHECK(DecodeManifest(garbage, "x").status().code() == absl::StatusCode::kDataLoss);
}

absl::Status Validate(const Manifest& m) { return ValidateManifest(m); }

TEST_CASE("ValidateManifest rejects inconsistent manifests", "[unit]") {
  auto expect = [](Manifest m, std::string_view needle) {
    m.header.set_item_count(m.items.size());
    absl::Status s = Validate(m);
    CAPTURE(needle, s.ToString());
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Message(s).find(needle) != std::string::npos);
    CHECK(Message(s).find("manifest of job \"") == 0);
    CHECK(EncodeManifest(m).status().code() == absl::StatusCode::kFailedPrecondition);
    // The same manifest read from disk is DATA_LOSS.
    m.header.set_format_version(kManifestFormatVersion);
    m.header.set_segment_count(1);
    CHECK(DecodeManifest(RawEncode(m.header, m.items), "x").status().code() ==
          absl::StatusCode::kDataLoss);
  };
  Manifest m;
  m = Sample();
  m.items[2].mutable_shards(1)->mutable_region()->mutable_box()->set_offsets(0, 2);
  expect(m, "item \"model.layers.0.weight\": regions box[0:4, 0:8] and box[2:6, 0:8] overlap");
  m = Sample();
  m.items[3].mutable_shards()->RemoveLast();
  expect(m, "item \"model.layers.1.weight\": elements flat[32:64) are not covered");
  m = Sample();
  m.items[2].mutable_shards(0)->set_blob_id(7);
  expect(m, "blob 7 is not in the manifest");
  m = Sample();
  m.items[2].mutable_shards(0)->set_length(127);
  expect(m, "length 127 bytes, want 128");
  m = Sample();
  m.items[2].mutable_shards(0)->set_offset(100);
  expect(m, "not 4096-byte aligned");
  m = Sample();
  m.items[2].mutable_shards(1)->set_offset(kBlobBytes);
  expect(m, "outside blob 0");
  m = Sample();
  m.items[2].mutable_shards(0)->add_block_crc32c(1);
  expect(m, "2 block checksums for 128 bytes");
  m = Sample();
  m.items[2].mutable_shards(0)->mutable_region()->mutable_box()->set_lengths(1, 9);
  expect(m, "outside shape [8, 8]");
  m = Sample();
  m.items[2].set_dtype(v1::DTYPE_UNSPECIFIED);
  expect(m, "dtype");
  m = Sample();
  std::swap(m.items[2], m.items[3]);
  expect(m, "out of order");
  m = Sample();
  m.items[3] = m.items[2];
  expect(m, "out of order or repeated");
  m = Sample();
  *m.items[1].add_shards() = m.items[1].shards(0);
  m.items[1].mutable_shards(1)->set_saved_by_rank(1);
  expect(m, "replicated object has 2 shards");
  m = Sample();
  m.items[0].mutable_shards(1)->set_saved_by_rank(0);
  expect(m, "rank 0 saved it twice");
  m = Sample();
  m.items[0].set_scope(v1::OBJECT_SCOPE_UNSPECIFIED);
  expect(m, "object scope");
  m = Sample();
  m.items[0].set_kind(v1::ITEM_KIND_UNSPECIFIED);
  expect(m, "item kind");
  m = Sample();
  m.items[2].mutable_shards(1)->set_saved_by_rank(2);
  expect(m, "saved by rank 2 of world size 2");
  m = Sample();
  m.header.set_job("../etc");
  expect(m, "job name");
  m = Sample();
  m.header.mutable_blobs(0)->set_name("../x.blob");
  expect(m, "blob name");
  m = Sample();
  m.items[2].set_name("a\x01");
  std::swap(m.items[0], m.items[2]);
  std::swap(m.items[1], m.items[2]);
  expect(m, "control byte");
  m = Sample();
  m.header.set_checksum_block_bytes(0);
  expect(m, "checksum block size is 0");

  m = Sample();
  m.header.set_item_count(3);
  CHECK(Validate(m).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("A partial manifest may leave tensors uncovered", "[unit]") {
  Manifest m = Sample();
  m.items[3].mutable_shards()->RemoveLast();
  CHECK(!ValidateManifest(m).ok());
  m.header.set_partial(true);
  CHECK(ValidateManifest(m).ok());
  auto bytes = EncodeManifest(m);
  REQUIRE(bytes.ok());
  CHECK(DecodeManifest(*bytes, "p").ok());
}

// Found by tests/fuzz/load_plan_fuzz (regressions/load_plan/): a partial manifest whose shards
// held some elements twice validated, and the load planner, which counts delivered elements,
// then refused loads the shards could serve — or, with as many duplicated as missing elements,
// planned a load that left the missing ones unwritten.
TEST_CASE("A partial manifest may not hold an element twice", "[unit]") {
  Manifest m = Sample();
  m.header.set_partial(true);
  v1::ItemEntry& t = m.items[3];  // 8x8 float32 in two row halves; the second now rows 3..6
  t.mutable_shards(1)->mutable_region()->mutable_box()->set_offsets(0, 3);
  absl::Status s = ValidateManifest(m);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Message(s) ==
        "manifest of job \"llama3-8b\" step 1000: item \"model.layers.1.weight\": "
        "regions box[0:4, 0:8] and box[3:7, 0:8] overlap");
  CHECK(!EncodeManifest(m).ok());
  m.header.set_item_count(m.items.size());
  m.header.set_segment_count(1);
  m.header.set_format_version(kManifestFormatVersion);
  CHECK(DecodeManifest(RawEncode(m.header, m.items), "p").status().code() ==
        absl::StatusCode::kDataLoss);
  // Elements in no shard are still fine.
  t.mutable_shards()->RemoveLast();
  CHECK(ValidateManifest(m).ok());
}

}  // namespace
}  // namespace ckptd
