// EncodedStore and EncodeBlob (tier/encoded_store.h): a blob stored encoded and recorded in the
// store's manifest reads back bit-exact through the store, whole and in pieces (only the frames
// covering a read are fetched), a blob without a record passes through, and damage — a flipped
// frame byte, an object whose size disagrees with its record — is DATA_LOSS naming the blob.
#include "tier/encoded_store.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "format/codec.h"
#include "format/crc32c.h"
#include "format/manifest.h"
#include "format/names.h"

namespace ckptd {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr char kDir[] = "j/step-00000000000000000001";

// Objects in memory; counts the bytes its readers read.
class MapStorage : public Storage {
 public:
  std::map<std::string, std::string> objects;
  uint64_t bytes_read = 0;

  std::string Describe() const override { return "map"; }
  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override {
    struct W : BlobWriter {
      std::string* out;
      absl::Status Write(std::span<const IoSlice> slices) override {
        for (const IoSlice& s : slices) {
          if (s.offset != out->size()) return absl::InvalidArgumentError("a gap");
          out->append(static_cast<const char*>(s.buf), s.len);
        }
        return absl::OkStatus();
      }
      absl::Status Sync() override { return absl::OkStatus(); }
    };
    auto w = std::make_unique<W>();
    objects[path].clear();
    w->out = &objects[path];
    return w;
  }
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override {
    auto it = objects.find(path);
    if (it == objects.end()) return absl::NotFoundError(path);
    struct R : BlobReader {
      const std::string* data;
      uint64_t* read;
      absl::Status Read(std::span<const IoSlice> slices) override {
        for (const IoSlice& s : slices) {
          if (s.offset + s.len > data->size()) return absl::DataLossError("short");
          std::memcpy(s.buf, data->data() + s.offset, s.len);
          *read += s.len;
        }
        return absl::OkStatus();
      }
      uint64_t size_bytes() const override { return data->size(); }
    };
    auto r = std::make_unique<R>();
    r->data = &it->second;
    r->read = &bytes_read;
    return r;
  }
  absl::Status PutAtomic(const std::string& path, std::string_view data) override {
    objects[path] = std::string(data);
    return absl::OkStatus();
  }
  absl::Status PutIfAbsent(const std::string& path, std::string_view data) override {
    return PutAtomic(path, data);
  }
  absl::StatusOr<std::string> Get(const std::string& path) override {
    auto it = objects.find(path);
    if (it == objects.end()) return absl::NotFoundError(path);
    return it->second;
  }
  absl::StatusOr<bool> Exists(const std::string& path) override { return objects.contains(path); }
  absl::StatusOr<std::vector<std::string>> List(const std::string&) override {
    return std::vector<std::string>{};
  }
  absl::Status RemoveAll(const std::string& path) override {
    std::erase_if(objects, [&](const auto& kv) { return kv.first.starts_with(path); });
    return absl::OkStatus();
  }
};

// bf16-like bytes: random mantissas, exponents from a narrow range.
std::string Bf16Like(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (uint64_t i = 0; i + 1 < n; i += 2) {
    out[i] = static_cast<char>(rng());
    out[i + 1] = static_cast<char>(0x3c + rng() % 3);
  }
  return out;
}

v1::ItemEntry Flat(const std::string& name, v1::DType dtype, uint64_t elem, uint64_t offset,
                   uint64_t length, const std::string& blob) {
  v1::ItemEntry item;
  item.set_name(name);
  item.set_kind(v1::TENSOR);
  item.set_dtype(dtype);
  item.add_shape(length / elem);
  v1::ShardEntry* s = item.add_shards();
  s->mutable_region()->mutable_flat()->set_count(length / elem);
  s->set_offset(offset);
  s->set_length(length);
  for (uint64_t at = 0; at < length; at += 4096) {
    const uint64_t n = std::min<uint64_t>(4096, length - at);
    s->add_block_crc32c(Crc32c(reinterpret_cast<const uint8_t*>(blob.data()) + offset + at, n));
  }
  return item;
}

// A checkpoint of one blob (`size` bytes: a bf16 item, then an fp32 item 4 KiB after it) stored
// raw in local storage `local`; its manifest.
Manifest MakeCheckpoint(MapStorage& local, uint64_t size) {
  std::string blob = Bf16Like(size, 7);
  const uint64_t a = (size / 2) / 4096 * 4096;
  std::memset(blob.data() + a, 0, 4096);  // padding
  Manifest m;
  m.header.set_job("j");
  m.header.set_step(1);
  m.header.set_world_size(1);
  m.header.set_checksum_block_bytes(4096);
  v1::BlobInfo* b = m.header.add_blobs();
  b->set_name("r00000.blob");
  b->set_size_bytes(size);
  m.items.push_back(Flat("a", v1::BFLOAT16, 2, 0, a, blob));
  m.items.push_back(Flat("b", v1::FLOAT32, 4, a + 4096, size - a - 4096, blob));
  local.objects[absl::StrCat(kDir, "/r00000.blob")] = blob;
  return m;
}

// Encodes the blob of `m` from `local` onto `store` (chunks of `chunk`) and puts the store's
// manifest, with the record, there. Returns the record.
v1::BlobEncoding Upload(MapStorage& local, MapStorage& store, Manifest m, uint64_t chunk,
                        WorkerPool* pool) {
  const std::string path = absl::StrCat(kDir, "/r00000.blob");
  auto reader = local.OpenBlob(path);
  auto writer = store.CreateBlob(path);
  REQUIRE(reader.ok());
  REQUIRE(writer.ok());
  const uint64_t size = m.header.blobs(0).size_bytes();
  const std::vector<uint8_t> planes = ChunkPlanes(m, 0, size, chunk);
  std::atomic<uint64_t> progress{0};
  absl::StatusOr<v1::BlobEncoding> enc =
      EncodeBlob(EncodeBlobJob{.path = path,
                               .size_bytes = size,
                               .chunk_bytes = chunk,
                               .planes = planes,
                               .zstd_level = kCodecZstdLevelDefault,
                               .piece_bytes = 2 * chunk},
                 **reader, **writer, pool, &progress, {});
  REQUIRE(enc.ok());
  CHECK(progress == size);
  CHECK(enc->encoded_bytes() == store.objects[path].size());
  *m.header.mutable_blobs(0)->mutable_encoding() = *enc;
  absl::StatusOr<std::string> bytes = EncodeManifest(m);
  REQUIRE(bytes.ok());
  REQUIRE(store.PutAtomic(absl::StrCat(kDir, "/", kManifestFileName), *bytes).ok());
  return *enc;
}

std::string ReadRange(Storage& s, uint64_t offset, uint64_t len, absl::Status* st) {
  std::string out(len, '\0');
  absl::StatusOr<std::unique_ptr<BlobReader>> r = s.OpenBlob(absl::StrCat(kDir, "/r00000.blob"));
  if (!r.ok()) {
    *st = r.status();
    return "";
  }
  IoSlice slice{out.data(), len, offset};
  *st = (*r)->Read(std::span<const IoSlice>(&slice, 1));
  return out;
}

TEST_CASE("encoded store: a blob stored encoded reads back bit-exact, whole and in pieces",
          "[unit][codec]") {
  WorkerPool pool("test-read", 1, 1);
  MapStorage local, plugin;
  // 10 MiB + 8 KiB: chunks of 4 MiB, the last short (2 MiB + 8 KiB); the middle chunk spans both
  // shards (planes 1), the first is bf16 (2), the last fp32 (4).
  const uint64_t size = 10 * kMiB + 8192;
  Manifest m = MakeCheckpoint(local, size);
  const v1::BlobEncoding enc = Upload(local, plugin, m, 4 * kMiB, &pool);
  CHECK(enc.frame_bytes_size() == 3);
  CHECK(enc.encoded_bytes() < size);  // bf16-like exponents compress
  const std::string& raw = local.objects[absl::StrCat(kDir, "/r00000.blob")];
  EncodedStore store(&plugin);
  absl::Status st;

  std::string all = ReadRange(store, 0, size, &st);
  REQUIRE(st.ok());
  CHECK(all == raw);
  // A piece inside the last chunk fetches only its frame.
  plugin.bytes_read = 0;
  std::string piece = ReadRange(store, 9 * kMiB + 4096, 12288, &st);
  REQUIRE(st.ok());
  CHECK(piece == raw.substr(9 * kMiB + 4096, 12288));
  CHECK(plugin.bytes_read == enc.frame_bytes(2));
  // Across the chunk boundary at 4 MiB: two frames.
  plugin.bytes_read = 0;
  piece = ReadRange(store, 4 * kMiB - 4096, 8192, &st);
  REQUIRE(st.ok());
  CHECK(piece == raw.substr(4 * kMiB - 4096, 8192));
  CHECK(plugin.bytes_read == uint64_t{enc.frame_bytes(0)} + enc.frame_bytes(1));
  // Past the end: DATA_LOSS, as a short blob.
  ReadRange(store, size - 4096, 8192, &st);
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  // Many small reads of one reader decode the chunk once.
  {
    auto r = store.OpenBlob(absl::StrCat(kDir, "/r00000.blob"));
    REQUIRE(r.ok());
    CHECK((*r)->size_bytes() == size);
    plugin.bytes_read = 0;
    std::string buf(4096, '\0');
    for (uint64_t off = 0; off < kMiB; off += 65536) {
      IoSlice s{buf.data(), 4096, off};
      REQUIRE((*r)->Read(std::span<const IoSlice>(&s, 1)).ok());
      CHECK(buf == raw.substr(off, 4096));
    }
    CHECK(plugin.bytes_read == enc.frame_bytes(0));
  }
}

TEST_CASE("encoded store: a blob without a record passes through", "[unit][codec]") {
  MapStorage plugin;
  const std::string raw = Bf16Like(8192, 3);
  plugin.objects[absl::StrCat(kDir, "/r00000.blob")] = raw;
  EncodedStore store(&plugin);
  absl::Status st;
  CHECK(ReadRange(store, 0, 8192, &st) == raw);  // no manifest on the store
  CHECK(st.ok());
}

TEST_CASE("encoded store: a damaged frame or object is DATA_LOSS naming the blob and chunk",
          "[unit][codec]") {
  WorkerPool pool("test-read", 1, 1);
  MapStorage local, plugin;
  const uint64_t size = 6 * kMiB;
  Manifest m = MakeCheckpoint(local, size);
  const v1::BlobEncoding enc = Upload(local, plugin, m, 4 * kMiB, &pool);
  std::string& object = plugin.objects[absl::StrCat(kDir, "/r00000.blob")];
  EncodedStore store(&plugin);
  absl::Status st;
  SECTION("a flipped byte in the second frame") {
    object[enc.frame_bytes(0) + 100] ^= 0x40;
    ReadRange(store, 0, 4 * kMiB, &st);
    CHECK(st.ok());  // the first chunk is intact
    ReadRange(store, 5 * kMiB, 4096, &st);
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(st.message().find("blob j/step-00000000000000000001/r00000.blob chunk 1") !=
          std::string_view::npos);
  }
  SECTION("an object shorter than its record") {
    object.resize(object.size() - 1);
    ReadRange(store, 0, 4096, &st);
    INFO(st.ToString());
    CHECK(st.code() == absl::StatusCode::kDataLoss);
    CHECK(st.message().find("r00000.blob on map is") != std::string_view::npos);
  }
  SECTION("a manifest on the store that does not decode") {
    plugin.objects[absl::StrCat(kDir, "/", kManifestFileName)] += "x";
    ReadRange(store, 0, 4096, &st);
    CHECK(st.code() == absl::StatusCode::kDataLoss);
  }
}

}  // namespace
}  // namespace ckptd
