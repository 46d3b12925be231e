// Load-planner benchmark (issue 3): planning time for one rank's load from a decoded manifest,
// decode time reported separately, and the planner's interval index side by side with the
// all-pairs matching other tools do (every saved chunk of an item against every requested one).
//
//   ckptd_bench_planner [--tensors N] [--shards_per_tensor K] [--reps R]
//
// Scenario A ("many tensors"): N tensors [rows, 256] bf16, each saved as K row blocks spread over
// 8 blobs; rank 0 of an 8-way row split loads its block of every tensor (N requests).
// Scenario B ("one flattened tensor"): one [N*K/16, 1024] fp32 tensor saved as N*K flat ranges
// (ZeRO-style), loaded as 1000 row blocks; the all-pairs baseline tests every pair.
// Prints one JSON object per measurement.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "format/load_plan.h"
#include "format/manifest.h"
#include "format/region.h"

namespace ckptd {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
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

// Adds a shard of `bytes` at the end of blob `blob` (4 KiB-aligned), with one crc per 4 KiB.
void AddShard(Manifest* m, std::vector<uint64_t>* blob_end, v1::ItemEntry* item,
              const v1::Region& r, uint64_t bytes, uint32_t blob) {
  v1::ShardEntry* s = item->add_shards();
  *s->mutable_region() = r;
  s->set_blob_id(blob);
  s->set_offset((*blob_end)[blob]);
  s->set_length(bytes);
  s->set_saved_by_rank(blob);
  for (uint64_t b = 0; b < (bytes + 4095) / 4096; ++b) s->add_block_crc32c(0x12345678u + b);
  (*blob_end)[blob] += (bytes + 4095) / 4096 * 4096;
  (void)m;
}

void Finish(Manifest* m, const std::vector<uint64_t>& blob_end) {
  v1::ManifestHeader& h = m->header;
  h.set_job("bench");
  h.set_step(1);
  h.set_world_size(static_cast<uint32_t>(blob_end.size()));
  h.set_checksum_block_bytes(4096);
  for (uint32_t b = 0; b < blob_end.size(); ++b) {
    h.add_ranks_present(b);
    v1::BlobInfo* bi = h.add_blobs();
    bi->set_id(b);
    bi->set_name("r" + std::to_string(b) + ".blob");
    bi->set_size_bytes(blob_end[b]);
  }
}

// All-pairs matching: every shard of the item against the request, intersections counted with
// the same exact run enumeration the planner uses.
uint64_t AllPairs(const v1::ItemEntry& item, const v1::Region& want) {
  std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
  uint64_t elems = 0;
  for (const v1::ShardEntry& s : item.shards()) {
    elems += ForEachCopyRun(shape, s.region(), want, [](uint64_t, uint64_t, uint64_t) {});
  }
  return elems;
}

void Report(const char* scenario, const char* what, double ms, uint64_t shards, uint64_t requests,
            const std::string& extra = "") {
  std::printf(
      "{\"scenario\": \"%s\", \"measure\": \"%s\", \"ms\": %.2f, \"shards\": %llu, "
      "\"requests\": %llu%s}\n",
      scenario, what, ms, static_cast<unsigned long long>(shards),
      static_cast<unsigned long long>(requests), extra.c_str());
  std::fflush(stdout);
}

int ScenarioMany(uint64_t tensors, uint64_t k, int reps) {
  Manifest m;
  std::vector<uint64_t> blob_end(8, 0);
  const uint64_t rows = 640, cols = 256;
  char name[32];
  for (uint64_t t = 0; t < tensors; ++t) {
    v1::ItemEntry item;
    std::snprintf(name, sizeof(name), "layer%06llu.w", static_cast<unsigned long long>(t));
    item.set_name(name);
    item.set_kind(v1::TENSOR);
    item.set_dtype(v1::BFLOAT16);
    item.add_shape(rows);
    item.add_shape(cols);
    for (uint64_t i = 0; i < k; ++i) {
      uint64_t r0 = rows * i / k, r1 = rows * (i + 1) / k;
      AddShard(&m, &blob_end, &item, Box({r0, 0}, {r1 - r0, cols}), (r1 - r0) * cols * 2,
               static_cast<uint32_t>(i % 8));
    }
    m.items.push_back(std::move(item));
  }
  Finish(&m, blob_end);
  absl::StatusOr<std::string> bytes = EncodeManifest(m);
  if (!bytes.ok()) {
    std::fprintf(stderr, "encode: %s\n", bytes.status().ToString().c_str());
    return 1;
  }
  auto t0 = Clock::now();
  absl::StatusOr<Manifest> decoded = DecodeManifest(*bytes, "bench");
  auto t1 = Clock::now();
  if (!decoded.ok()) {
    std::fprintf(stderr, "decode: %s\n", decoded.status().ToString().c_str());
    return 1;
  }
  const uint64_t shards = tensors * k;
  Report("many_tensors", "decode", Ms(t0, t1), shards, 0,
         ", \"manifest_bytes\": " + std::to_string(bytes->size()));
  std::vector<PlanRequest> reqs;
  for (const v1::ItemEntry& item : decoded->items) {
    reqs.push_back(PlanRequest{&item, Box({0, 0}, {rows / 8, cols}), nullptr});
  }
  for (int r = 0; r < reps; ++r) {
    auto a = Clock::now();
    absl::StatusOr<LoadPlan> plan = PlanLoad(*decoded, reqs);
    auto b = Clock::now();
    if (!plan.ok()) return 1;
    Report("many_tensors", "plan", Ms(a, b), shards, reqs.size(),
           ", \"runs\": " + std::to_string(plan->runs.size()) + ", \"read_over_needed\": " +
               std::to_string(static_cast<double>(plan->read_bytes) /
                              static_cast<double>(plan->needed_aligned_bytes)));
    a = Clock::now();
    uint64_t elems = 0;
    for (const PlanRequest& q : reqs) elems += AllPairs(*q.item, q.region);
    b = Clock::now();
    Report("many_tensors", "all_pairs_match", Ms(a, b), shards, reqs.size(),
           ", \"elements\": " + std::to_string(elems));
  }
  return 0;
}

int ScenarioFlat(uint64_t shards, int reps) {
  Manifest m;
  std::vector<uint64_t> blob_end(8, 0);
  const uint64_t cols = 1024, rows = std::max<uint64_t>(shards / 16, 1000);
  const uint64_t numel = rows * cols;
  v1::ItemEntry item;
  item.set_name("flat_param");
  item.set_kind(v1::TENSOR);
  item.set_dtype(v1::FLOAT32);
  item.add_shape(rows);
  item.add_shape(cols);
  for (uint64_t i = 0; i < shards; ++i) {
    uint64_t s = numel * i / shards, e = numel * (i + 1) / shards;
    AddShard(&m, &blob_end, &item, Flat(s, e - s), (e - s) * 4, static_cast<uint32_t>(i % 8));
  }
  m.items.push_back(std::move(item));
  Finish(&m, blob_end);
  std::vector<PlanRequest> reqs;
  const uint64_t blocks = 1000;
  for (uint64_t i = 0; i < blocks; ++i) {
    uint64_t r0 = rows * i / blocks, r1 = rows * (i + 1) / blocks;
    reqs.push_back(PlanRequest{&m.items[0], Box({r0, 0}, {r1 - r0, cols}), nullptr});
  }
  for (int r = 0; r < reps; ++r) {
    auto a = Clock::now();
    absl::StatusOr<LoadPlan> plan = PlanLoad(m, reqs);
    auto b = Clock::now();
    if (!plan.ok()) return 1;
    Report("one_flat_tensor", "plan", Ms(a, b), shards, reqs.size(),
           ", \"runs\": " + std::to_string(plan->runs.size()));
  }
  // All pairs on a sample of the requests (the full product takes minutes), scaled up.
  const uint64_t sample = 10;
  auto a = Clock::now();
  uint64_t elems = 0;
  for (uint64_t i = 0; i < sample; ++i) elems += AllPairs(m.items[0], reqs[i * 97 % blocks].region);
  auto b = Clock::now();
  Report("one_flat_tensor", "all_pairs_match_extrapolated", Ms(a, b) * blocks / sample, shards,
         reqs.size(),
         ", \"sampled_requests\": " + std::to_string(sample) +
             ", \"elements\": " + std::to_string(elems));
  return 0;
}

}  // namespace
}  // namespace ckptd

int main(int argc, char** argv) {
  uint64_t tensors = 100000, k = 10;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    uint64_t v = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &v) || v == 0) {
      std::fprintf(stderr, "%s needs a positive number\n", flag.c_str());
      return 2;
    }
    if (flag == "--tensors") {
      tensors = v;
    } else if (flag == "--shards_per_tensor") {
      k = v;
    } else if (flag == "--reps") {
      reps = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (int rc = ckptd::ScenarioMany(tensors, k, reps); rc != 0) return rc;
  return ckptd::ScenarioFlat(tensors * k, reps);
}
