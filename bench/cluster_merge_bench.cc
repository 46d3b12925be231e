// The coordinator's cost of a commit across nodes, simulated at 1,000 and 10,000 ranks: what the
// coordinator does once every node part is on the store — parse the parts, merge them
// (MergeNodeParts), build the manifest (BuildManifest) and validate + encode it (EncodeManifest)
// — side by side with what a single daemon does for the same ranks (AddRank per rank as Saves
// arrive, then BuildManifest + EncodeManifest), in the same run. Reports milliseconds (median of
// --reps), the ratio merge / single, the manifest's size and a node part's size.
//
// The state per rank, as a Megatron-style layout at that scale: --items tensors, each row-sharded
// over all ranks (one block per rank), one tensor every rank saves whole (a replicated region:
// one stored copy, world_size - 1 replicas whose checksums are compared), and one per-rank
// object. --ranks_per_node ranks per node (default 8).
//
// Usage: ckptd_bench_cluster_merge [--ranks 1000,10000] [--ranks_per_node 8] [--items 16]
//        [--reps 3]      (one JSON object per line per world size)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "format/manifest.h"
#include "format/names.h"
#include "service/node_parts.h"

namespace {

using ckptd::v1::NodePart;
using ckptd::v1::RankRecord;
using ckptd::v1::StagedShard;

constexpr uint32_t kBlock = 1 << 20;
constexpr uint64_t kRowsPerRank = 64, kCols = 1024;  // 256 KiB of f32 per rank per item

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

void AddTensor(RankRecord* rec, const std::string& item, std::vector<uint64_t> shape,
               std::vector<uint64_t> off, std::vector<uint64_t> len, uint64_t* blob_off,
               uint32_t crc) {
  StagedShard* s = rec->add_shards();
  s->mutable_spec()->set_item(item);
  auto* t = s->mutable_spec()->mutable_tensor();
  t->set_dtype(ckptd::v1::FLOAT32);
  for (uint64_t d : shape) t->add_global_shape(d);
  auto* box = t->mutable_region()->mutable_box();
  uint64_t elems = 1;
  for (size_t i = 0; i < off.size(); ++i) {
    box->add_offsets(off[i]);
    box->add_lengths(len[i]);
    elems *= len[i];
  }
  const uint64_t bytes = elems * 4;
  auto* stored = s->mutable_stored();
  *stored->mutable_region() = t->region();
  stored->set_blob_id(rec->rank());
  stored->set_offset(*blob_off);
  stored->set_length(bytes);
  stored->set_saved_by_rank(rec->rank());
  for (uint64_t b = 0; b < (bytes + kBlock - 1) / kBlock; ++b) stored->add_block_crc32c(crc + b);
  *blob_off += (bytes + 4095) / 4096 * 4096;
}

RankRecord Rank(uint32_t r, uint32_t world, uint32_t items) {
  RankRecord rec;
  rec.set_rank(r);
  rec.set_persisted(true);
  rec.set_blob_name(ckptd::BlobName(r));
  rec.set_checksum_block_bytes(kBlock);
  uint64_t off = 0;
  for (uint32_t i = 0; i < items; ++i) {
    AddTensor(&rec, "layers." + std::to_string(i) + ".weight", {kRowsPerRank * world, kCols},
              {kRowsPerRank * r, 0}, {kRowsPerRank, kCols}, &off, 1000 * i + r);
  }
  AddTensor(&rec, "embedding.norm", {kCols}, {0}, {kCols}, &off, 7);  // every rank: replicated
  StagedShard* o = rec.add_shards();
  o->mutable_spec()->set_item("rng_state");
  o->mutable_spec()->mutable_object()->set_scope(ckptd::v1::PER_RANK);
  o->mutable_stored()->set_blob_id(r);
  o->mutable_stored()->set_offset(off);
  o->mutable_stored()->set_length(64);
  o->mutable_stored()->set_saved_by_rank(r);
  o->mutable_stored()->add_block_crc32c(r);
  return rec;
}

struct Result {
  double merge_ms, single_ms;
  uint64_t manifest_bytes, part_bytes;
};

Result Run(uint32_t world, uint32_t per_node, uint32_t items) {
  std::vector<RankRecord> ranks;
  ranks.reserve(world);
  for (uint32_t r = 0; r < world; ++r) ranks.push_back(Rank(r, world, items));
  // The parts as the store holds them: serialized, one per node; within a node the replicated
  // region is stored by its first rank only.
  std::vector<std::string> wire;
  for (uint32_t first = 0; first < world; first += per_node) {
    NodePart p;
    p.set_format_version(ckptd::kNodePartFormatVersion);
    p.set_job("bench");
    p.set_step(1);
    p.set_world_size(world);
    p.set_node("node-" + std::to_string(first / per_node));
    p.set_checksum_block_bytes(kBlock);
    for (uint32_t r = first; r < std::min(world, first + per_node); ++r) {
      RankRecord* rec = p.add_ranks();
      *rec = ranks[r];
      if (r != first) {
        for (StagedShard& s : *rec->mutable_shards()) {
          if (s.spec().item() == "embedding.norm") s.set_replica(true);
        }
      }
    }
    wire.push_back(p.SerializeAsString());
  }
  Result res{};
  res.part_bytes = wire.front().size();

  auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, NodePart> parts;
  for (const std::string& w : wire) {
    NodePart p;
    if (!p.ParseFromString(w)) std::abort();
    std::string node = p.node();
    parts.emplace(std::move(node), std::move(p));
  }
  auto merged = ckptd::MergeNodeParts("bench", 1, world, false, parts);
  if (!merged.ok()) {
    std::fprintf(stderr, "merge: %s\n", merged.status().ToString().c_str());
    std::exit(1);
  }
  auto m = ckptd::BuildManifest(**merged, 1);
  auto bytes = m.ok() ? ckptd::EncodeManifest(*m) : m.status();
  if (!bytes.ok()) {
    std::fprintf(stderr, "manifest: %s\n", bytes.status().ToString().c_str());
    std::exit(1);
  }
  res.merge_ms = Ms(std::chrono::steady_clock::now() - t0);
  res.manifest_bytes = bytes->size();

  // The same ranks on one daemon: AddRank as each Save arrives, then the same build.
  auto t1 = std::chrono::steady_clock::now();
  ckptd::PendingCheckpoint single("bench", 1);
  single.world_size = world;
  single.checksum_block_bytes = kBlock;
  for (const RankRecord& rec : ranks) {
    ckptd::PendingRank pr;
    pr.rec = rec;
    single.AddRank(rec.rank(), std::move(pr));
  }
  auto m2 = ckptd::BuildManifest(single, 1);
  auto bytes2 = m2.ok() ? ckptd::EncodeManifest(*m2) : m2.status();
  if (!bytes2.ok()) std::abort();
  res.single_ms = Ms(std::chrono::steady_clock::now() - t1);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint32_t> worlds = {1000, 10000};
  uint32_t per_node = 8, items = 16, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string v = argv[i + 1];
    if (flag == "--ranks") {
      worlds.clear();
      for (absl::string_view w : absl::StrSplit(v, ',')) {
        uint32_t n = 0;
        if (!absl::SimpleAtoi(w, &n) || n == 0) return 2;
        worlds.push_back(n);
      }
    } else if (flag == "--ranks_per_node") {
      per_node = static_cast<uint32_t>(std::atoi(v.c_str()));
    } else if (flag == "--items") {
      items = static_cast<uint32_t>(std::atoi(v.c_str()));
    } else if (flag == "--reps") {
      reps = static_cast<uint32_t>(std::atoi(v.c_str()));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (per_node == 0 || reps == 0) return 2;
  for (uint32_t world : worlds) {
    std::vector<double> merge, single;
    Result r{};
    for (uint32_t i = 0; i < reps; ++i) {
      r = Run(world, per_node, items);
      merge.push_back(r.merge_ms);
      single.push_back(r.single_ms);
    }
    std::sort(merge.begin(), merge.end());
    std::sort(single.begin(), single.end());
    const double mm = merge[merge.size() / 2], sm = single[single.size() / 2];
    std::printf(
        "{\"bench\":\"cluster_merge\",\"ranks\":%u,\"nodes\":%u,\"items_per_rank\":%u,"
        "\"merge_ms\":%.1f,\"single_node_ms\":%.1f,\"ratio\":%.2f,\"manifest_bytes\":%llu,"
        "\"node_part_bytes\":%llu}\n",
        world, (world + per_node - 1) / per_node, items + 2, mm, sm, mm / sm,
        static_cast<unsigned long long>(r.manifest_bytes),
        static_cast<unsigned long long>(r.part_bytes));
  }
  return 0;
}
