// Writes the seed corpora of the fuzzers into <dir>/<fuzzer>/ (tests/fuzz/corpus is committed):
//   build-fuzz/tests/fuzz/ckptd_fuzz_corpus tests/fuzz/corpus
// Seeds are small valid inputs of each target's format (fuzzers start deeper from them than from
// nothing); random bytes come from a fixed seed, so the output is the same every run.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ckptd/v1/ckptd.pb.h"
#include "ckptd/v1/index.pb.h"
#include "common/align.h"
#include "format/codec.h"
#include "format/crc32c.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/region.h"
#include "index/keys.h"

namespace ckptd {
namespace {

namespace fs = std::filesystem;

fs::path g_root;
std::mt19937_64 g_rng(20240611);

void Write(const std::string& fuzzer, const std::string& name, const std::string& bytes) {
  fs::create_directories(g_root / fuzzer);
  std::ofstream(g_root / fuzzer / name, std::ios::binary) << bytes;
}

std::string Random(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(g_rng());
  return s;
}

v1::Region Box(std::vector<uint64_t> off, std::vector<uint64_t> len) {
  v1::Region r;
  for (uint64_t o : off) r.mutable_box()->add_offsets(o);
  for (uint64_t l : len) r.mutable_box()->add_lengths(l);
  return r;
}

v1::Region Flat(uint64_t start, uint64_t count) {
  v1::Region r;
  r.mutable_flat()->set_start(start);
  r.mutable_flat()->set_count(count);
  return r;
}

// A manifest under construction: shards appended to the blob of their rank.
struct ManifestBuilder {
  Manifest m;
  std::vector<uint64_t> blob_end = std::vector<uint64_t>(4, 0);

  explicit ManifestBuilder(uint32_t world, bool partial) {
    m.header.set_job("llama3-8b");
    m.header.set_step(1000);
    m.header.set_world_size(world);
    m.header.set_partial(partial);
    m.header.set_created_unix_ms(1700000000000);
    m.header.set_committed_unix_ms(1700000001000);
    m.header.set_checksum_block_bytes(4096);
  }
  v1::ShardEntry Shard(uint32_t rank, uint64_t length) {
    v1::ShardEntry s;
    s.set_blob_id(rank);
    s.set_offset(RoundUp(blob_end[rank], limits::kAlignmentBytes));
    s.set_length(length);
    for (uint64_t b = 0; b < BlockCount(length, 4096); ++b) s.add_block_crc32c(0x1000 + b);
    s.set_saved_by_rank(rank);
    blob_end[rank] = s.offset() + length;
    return s;
  }
  void Tensor(const std::string& name, v1::DType dtype, uint32_t elem, std::vector<uint64_t> shape,
              const std::vector<v1::Region>& regions) {
    v1::ItemEntry item;
    item.set_name(name);
    item.set_kind(v1::TENSOR);
    item.set_dtype(dtype);
    for (uint64_t d : shape) item.add_shape(d);
    for (size_t i = 0; i < regions.size(); ++i) {
      v1::ShardEntry s = Shard(static_cast<uint32_t>(i % m.header.world_size()),
                               RegionElements(regions[i], shape) * elem);
      *s.mutable_region() = regions[i];
      *item.add_shards() = s;
    }
    m.items.push_back(item);
  }
  void Object(const std::string& name, v1::ObjectScope scope, uint32_t ranks) {
    v1::ItemEntry item;
    item.set_name(name);
    item.set_kind(v1::OBJECT);
    item.set_scope(scope);
    for (uint32_t r = 0; r < ranks; ++r) *item.add_shards() = Shard(r, 100 + 17 * r);
    m.items.push_back(item);
  }
  std::string Encode() {
    std::sort(m.items.begin(), m.items.end(),
              [](const v1::ItemEntry& a, const v1::ItemEntry& b) { return a.name() < b.name(); });
    m.header.clear_blobs();
    m.header.clear_ranks_present();
    for (uint32_t r = 0; r < m.header.world_size(); ++r) {
      if (!m.header.partial() || blob_end[r] > 0) m.header.add_ranks_present(r);
      v1::BlobInfo* b = m.header.add_blobs();
      b->set_id(r);
      b->set_name(BlobName(r));
      b->set_size_bytes(RoundUp(blob_end[r], limits::kAlignmentBytes));
    }
    absl::StatusOr<std::string> bytes = EncodeManifest(m);
    if (!bytes.ok()) {
      std::fprintf(stderr, "seed manifest: %s\n", bytes.status().ToString().c_str());
      std::exit(1);
    }
    return *bytes;
  }
};

void ManifestSeeds() {
  std::vector<std::string> manifests;
  {
    ManifestBuilder b(2, false);
    b.Tensor("model.w", v1::FLOAT32, 4, {8, 8}, {Box({0, 0}, {4, 8}), Box({4, 0}, {4, 8})});
    b.Object("extra.rng", v1::PER_RANK, 2);
    b.Object("extra.step", v1::REPLICATED, 1);
    manifests.push_back(b.Encode());
  }
  {
    ManifestBuilder b(3, false);
    b.Tensor("flat", v1::BFLOAT16, 2, {5, 7}, {Flat(0, 10), Flat(10, 13), Flat(23, 12)});
    b.Tensor("mixed", v1::INT8, 1, {4, 6},
             {Box({0, 0}, {2, 6}), Box({2, 0}, {2, 3}), Box({2, 3}, {2, 3})});
    b.Tensor("scalar", v1::FLOAT64, 8, {}, {v1::Region()});
    b.Tensor("empty", v1::FLOAT16, 2, {3, 0}, {});
    b.Tensor("cube", v1::UINT16, 2, {2, 3, 4},
             {Box({0, 0, 0}, {1, 3, 4}), Flat(12, 8), Box({1, 2, 0}, {1, 1, 4})});
    manifests.push_back(b.Encode());
  }
  {
    ManifestBuilder b(4, true);  // partial: only rank 0's shards
    b.Tensor("w", v1::FLOAT32, 4, {16, 4}, {Box({0, 0}, {4, 4})});
    b.Tensor("v", v1::FLOAT32, 4, {2048}, {Flat(0, 1500)});
    manifests.push_back(b.Encode());
  }
  for (size_t i = 0; i < manifests.size(); ++i) {
    Write("manifest", "valid-" + std::to_string(i), std::string(1, '\0') + manifests[i]);
    Write("manifest", "fixcrc-" + std::to_string(i), std::string(1, '\1') + manifests[i]);
  }
}

std::string Framed(const std::vector<std::string>& values) {
  std::string out;
  for (const std::string& v : values) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v.size() >> (8 * i)) & 0xff));
    out += v;
  }
  return out;
}

v1::ShardSpec TensorSpec(const std::string& item, v1::DType dtype, std::vector<uint64_t> shape,
                         const v1::Region& region, uint64_t bytes, uint64_t extent) {
  v1::ShardSpec s;
  s.set_item(item);
  s.mutable_tensor()->set_dtype(dtype);
  for (uint64_t d : shape) s.mutable_tensor()->add_global_shape(d);
  if (region.kind_case() != v1::Region::KIND_NOT_SET) {
    *s.mutable_tensor()->mutable_region() = region;
  }
  s.mutable_data()->set_extent_id(extent);
  s.mutable_data()->set_length(bytes);
  return s;
}

v1::ShardSpec ObjectSpec(const std::string& item, v1::ObjectScope scope, uint64_t bytes) {
  v1::ShardSpec s;
  s.set_item(item);
  s.mutable_object()->set_scope(scope);
  s.mutable_data()->set_extent_id(9);
  s.mutable_data()->set_length(bytes);
  return s;
}

void IndexSeeds() {
  const std::vector<std::string> keys = {keys::Job("llama"),
                                         keys::Checkpoint("llama", 1000),
                                         keys::Rank("llama", 1000, 3),
                                         keys::Item("llama", 1000, "model.w"),
                                         keys::Blob("llama", 1000, "r00003.blob"),
                                         keys::Meta("schema")};
  for (size_t i = 0; i < keys.size(); ++i) {
    Write("index", "key-" + std::to_string(i), std::string(1, '\0') + keys[i]);
  }
  for (int i = 0; i < 3; ++i) {
    Write("index", "encode-" + std::to_string(i), std::string(1, '\1') + Random(16 + 24 * i));
  }
  v1::CheckpointRecord rec;
  rec.mutable_summary()->set_job("llama");
  rec.mutable_summary()->set_step(1000);
  rec.mutable_summary()->set_state(v1::PERSISTING);
  rec.mutable_summary()->set_world_size(2);
  rec.set_dir("llama/step-00000000000000001000");
  std::vector<std::string> values = {rec.SerializeAsString()};
  for (uint32_t r = 0; r < 2; ++r) {
    v1::RankRecord rr;
    rr.set_rank(r);
    rr.set_arena_generation("gen-1");
    rr.set_persisted(true);
    rr.set_blob_name(BlobName(r));
    rr.set_checksum_block_bytes(4096);
    v1::StagedShard* sh = rr.add_shards();
    *sh->mutable_spec() = TensorSpec("w", v1::FLOAT32, {8, 8}, Box({4 * r, 0}, {4, 8}), 128, 1);
    sh->set_arena_offset(4096 * (r + 1));
    sh->set_extent_length(4096);
    sh->set_extent_id(r + 1);
    v1::ShardEntry* st = sh->mutable_stored();
    *st->mutable_region() = Box({4 * r, 0}, {4, 8});
    st->set_blob_id(r);
    st->set_length(128);
    st->add_block_crc32c(0x1234);
    st->set_saved_by_rank(r);
    v1::StagedShard* obj = rr.add_shards();
    *obj->mutable_spec() = ObjectSpec("rng", v1::PER_RANK, 10);
    obj->mutable_stored()->set_blob_id(r);
    obj->mutable_stored()->set_offset(4096);
    obj->mutable_stored()->set_length(10);
    obj->mutable_stored()->add_block_crc32c(0x99);
    obj->mutable_stored()->set_saved_by_rank(r);
    rr.set_bytes(138);
    values.push_back(rr.SerializeAsString());
  }
  Write("index", "records-0", std::string(1, '\2') + Framed(values));
  values.resize(2);
  Write("index", "records-1", std::string(1, '\2') + Framed(values));
}

void RegionSeeds() {
  for (int i = 0; i < 12; ++i) {
    std::string s = Random(8u << (i % 6));
    s[0] = static_cast<char>(i < 6 ? 0 : 1);  // small shapes, then wild ones
    Write("region", "random-" + std::to_string(i), s);
  }
}

void ReshardSeeds() {
  const std::vector<std::string> specs = {"consolidated",
                                          "rows:4",
                                          "cols:3",
                                          "dim2:5",
                                          "flat:7",
                                          "grid:2x3x2",
                                          "*.bias=consolidated; *=grid:2x4",
                                          "model.*=rows:2;opt.*=flat:3;",
                                          " * = dim1 : 2 "};
  for (size_t i = 0; i < specs.size(); ++i) {
    Write("reshard_spec", "spec-" + std::to_string(i),
          specs[i] + std::string(1, '\0') + Random(48));
  }
}

void SaveSeeds() {
  v1::SaveRequest req;
  req.set_session_id("s-1");
  req.set_job("llama3-8b");
  req.set_step(1000);
  req.set_rank(1);
  req.set_world_size(4);
  *req.add_shards() = TensorSpec("model.w", v1::BFLOAT16, {8, 4}, Box({2, 0}, {2, 4}), 16, 1);
  *req.add_shards() = TensorSpec("model.b", v1::FLOAT32, {4}, v1::Region(), 16, 2);
  *req.add_shards() = TensorSpec("opt.flat", v1::FLOAT32, {10, 10}, Flat(25, 25), 100, 3);
  *req.add_shards() = ObjectSpec("rng", v1::PER_RANK, 40);
  *req.add_shards() = ObjectSpec("step", v1::REPLICATED, 8);
  Write("save_request", "valid-0", req.SerializeAsString());
  req.clear_shards();
  req.set_world_size(1);
  req.set_rank(0);
  *req.add_shards() = TensorSpec("x", v1::INT64, {3, 5, 7}, Box({0, 1, 2}, {3, 4, 5}), 480, 1);
  *req.add_shards() = TensorSpec("scalar", v1::FLOAT64, {}, v1::Region(), 8, 2);
  *req.add_shards() = TensorSpec("none", v1::UINT8, {0, 9}, v1::Region(), 0, 0);
  Write("save_request", "valid-1", req.SerializeAsString());
}

void LoadPlanSeeds() {
  v1::LoadRequest req;
  req.set_session_id("s-1");
  req.set_job("fuzz-job");
  req.set_step(7);
  req.set_rank(1);
  for (const char* item : {"t0", "t1", "t2", "t3"}) {
    v1::LoadItemRequest* it = req.add_items();
    it->set_item(item);
    it->mutable_dest()->set_extent_id(1);
  }
  *req.mutable_items(1)->mutable_region() = Box({0, 0}, {1, 1});
  *req.mutable_items(2)->mutable_region() = Flat(1, 3);
  v1::LoadItemRequest* o0 = req.add_items();
  o0->set_item("o0");
  v1::LoadItemRequest* o1 = req.add_items();
  o1->set_item("o1");
  o1->set_saved_by_rank(0);
  const std::string request = req.SerializeAsString();
  for (int i = 0; i < 8; ++i) {
    const size_t n = 32u << (i % 4);
    std::string s;
    s.push_back(static_cast<char>(n & 0xff));
    s.push_back(static_cast<char>(n >> 8));
    Write("load_plan", "recipe-" + std::to_string(i), s + Random(n) + request);
  }
}

// Codec: frames of every plane count over compressible, incompressible and short chunks (mode
// byte 0: decode), and the chunks themselves (odd mode bytes: encode with a plane count/level).
void CodecSeeds() {
  ChunkEncoder encoder;
  const std::string chunks[] = {std::string(300, '\0'), Random(257), std::string("abc"),
                                std::string(64, '\x3c') + Random(64) + std::string(64, '\x3c')};
  for (uint32_t planes : {1u, 2u, 4u, 8u}) {
    for (size_t i = 0; i < std::size(chunks); ++i) {
      std::string frame;
      const std::string& c = chunks[i];
      if (!encoder.Encode({reinterpret_cast<const uint8_t*>(c.data()), c.size()}, planes, &frame)
               .ok()) {
        std::abort();
      }
      const std::string tag = std::to_string(planes) + "-" + std::to_string(i);
      Write("codec", "frame-" + tag, std::string(1, '\0') + frame);
      Write("codec", "chunk-" + tag,
            std::string(1, static_cast<char>(1 | ((planes == 1   ? 0
                                                   : planes == 2 ? 1
                                                   : planes == 4 ? 2
                                                                 : 3)
                                                  << 1))) +
                c);
    }
  }
}

}  // namespace
}  // namespace ckptd

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  ckptd::g_root = argv[1];
  ckptd::ManifestSeeds();
  ckptd::IndexSeeds();
  ckptd::RegionSeeds();
  ckptd::ReshardSeeds();
  ckptd::SaveSeeds();
  ckptd::LoadPlanSeeds();
  ckptd::CodecSeeds();
  return 0;
}
