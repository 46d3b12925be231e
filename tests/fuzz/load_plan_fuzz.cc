// The load planner (format/load_plan.h) as Load drives it. Input:
//   u16le n | n bytes: the recipe of a small, valid manifest and the plan options |
//   the rest: a serialized v1::LoadRequest.
// The recipe picks tensors (dtype, shape up to 4 dims of 8) partitioned into grid boxes, flat
// ranges or both (boxes that are contiguous respelled as flat ranges), objects, the ranks and
// blobs holding each shard, the checksum block size and whether the checkpoint is partial
// (shards dropped, one shard of any region added, which ValidateManifest must refuse if it
// overlaps another). Each LoadItemRequest goes through the checks Load
// makes before planning (the item by name, else the name's hash picks one; ValidateRegion; the
// object copy by rank); an invalid region must make PlanLoad fail with INVALID_ARGUMENT.
// Properties: the manifest validates iff no element is in two shards; PlanLoad fails only for
// invalid options (INVALID_ARGUMENT, iff the reference says so) or for elements no shard holds
// (FAILED_PRECONDITION, partial only);
// a plan passes CheckPlan (fuzz_util.h) — never reads outside the blobs, copies only verified
// bytes of the right shard to where the same elements go, delivers every requested byte — and the
// interval-index path (linear_shards_max = 0) reads exactly the runs the linear one does.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "ckptd/v1/ckptd.pb.h"
#include "common/align.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/names.h"
#include "format/region.h"
#include "fuzz_util.h"

namespace ckptd::fuzz {
namespace {

constexpr uint64_t kRequestBytesMax = 64 * 1024;

struct Recipe {
  Manifest m;
  PlanOptions options;
};

std::vector<uint64_t> Cuts(FuzzedDataProvider& fdp, uint64_t len, int max_cuts) {
  std::vector<uint64_t> cuts = {0, len};
  const int n = fdp.ConsumeIntegralInRange<int>(0, max_cuts);
  for (int i = 0; i < n; ++i) cuts.push_back(fdp.ConsumeIntegralInRange<uint64_t>(0, len));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Regions that cover `shape` exactly once: flat ranges, or grid boxes (some respelled as flat).
std::vector<v1::Region> Partition(FuzzedDataProvider& fdp, const std::vector<uint64_t>& shape) {
  std::vector<v1::Region> out;
  const uint64_t numel = NumElements(shape).value();
  if (shape.empty() || fdp.ConsumeIntegralInRange<int>(0, 5) == 0) {
    out.emplace_back();  // whole
    if (fdp.ConsumeBool()) out.back() = WholeBox(shape);
    return out;
  }
  if (fdp.ConsumeBool()) {
    std::vector<uint64_t> cuts = Cuts(fdp, numel, 5);
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      out.emplace_back();
      out.back().mutable_flat()->set_start(cuts[i]);
      out.back().mutable_flat()->set_count(cuts[i + 1] - cuts[i]);
    }
    return out;
  }
  std::vector<std::vector<uint64_t>> bounds;
  for (uint64_t dim : shape) {
    std::vector<uint64_t> c = Cuts(fdp, dim, 2);
    c.erase(std::unique(c.begin(), c.end()), c.end());
    if (c.size() == 1) c.push_back(c[0]);  // a 0 dim: one empty block
    bounds.push_back(std::move(c));
  }
  const bool respell = fdp.ConsumeBool();
  std::vector<size_t> at(shape.size(), 0);
  while (true) {
    v1::Region r;
    for (size_t d = 0; d < shape.size(); ++d) {
      r.mutable_box()->add_offsets(bounds[d][at[d]]);
      r.mutable_box()->add_lengths(bounds[d][at[d] + 1] - bounds[d][at[d]]);
    }
    const std::string key = RegionKey(r, shape);
    if (respell && key.rfind("flat:", 0) == 0) {
      const size_t plus = key.find('+');
      v1::Region flat;
      flat.mutable_flat()->set_start(std::stoull(key.substr(5, plus - 5)));
      flat.mutable_flat()->set_count(std::stoull(key.substr(plus + 1)));
      r = flat;
    }
    out.push_back(std::move(r));
    size_t d = shape.size();
    while (d > 0 && ++at[d - 1] + 1 == bounds[d - 1].size()) at[--d] = 0;
    if (d == 0) break;
  }
  return out;
}

// Appends a shard of `length` bytes to the blob of `rank`.
v1::ShardEntry Place(FuzzedDataProvider& fdp, std::map<uint32_t, uint64_t>& blob_end, uint32_t rank,
                     uint64_t length, uint32_t block) {
  v1::ShardEntry s;
  uint64_t& end = blob_end[rank];
  s.set_blob_id(rank * 7 + 3);
  s.set_offset(RoundUp(end, limits::kAlignmentBytes) +
               limits::kAlignmentBytes * fdp.ConsumeIntegralInRange<uint64_t>(0, 1));
  s.set_length(length);
  for (uint64_t b = 0; b < BlockCount(length, block); ++b) s.add_block_crc32c(0);
  s.set_saved_by_rank(rank);
  end = s.offset() + length;
  return s;
}

PlanOptions ConsumeOptions(FuzzedDataProvider& fdp, uint32_t block) {
  PlanOptions o;
  const uint64_t aligns[] = {1, 8, 512, 4096};
  o.alignment_bytes = fdp.PickValueInArray(aligns);
  o.max_run_bytes =
      RoundUp(2 * uint64_t{block} * fdp.ConsumeIntegralInRange<uint64_t>(1, 4), o.alignment_bytes);
  const double fractions[] = {0, 0.01, 0.05, 0.5, 0.99};
  o.merge_gap_fraction = fdp.PickValueInArray(fractions);
  const uint32_t linear[] = {0, 1, 16, 1u << 30};
  o.linear_shards_max = fdp.PickValueInArray(linear);
  if (fdp.ConsumeIntegralInRange<int>(0, 15) == 0) {  // any options: mostly invalid ones
    o.alignment_bytes = fdp.ConsumeIntegralInRange<uint64_t>(0, 1 << 14);
    o.max_run_bytes = fdp.ConsumeIntegralInRange<uint64_t>(0, 1 << 22);
    o.merge_gap_fraction = fdp.ConsumeFloatingPointInRange<double>(-1, 2);
  }
  return o;
}

Recipe Build(FuzzedDataProvider& fdp) {
  Recipe out;
  Manifest& m = out.m;
  const uint32_t blocks[] = {512, 4096, 8192, 12288, 65536};
  const uint32_t block = fdp.PickValueInArray(blocks);
  const uint32_t world = fdp.ConsumeIntegralInRange<uint32_t>(1, 8);
  const bool partial = fdp.ConsumeBool();
  std::map<uint32_t, uint64_t> blob_end;
  const int tensors = fdp.ConsumeIntegralInRange<int>(0, 4);
  for (int t = 0; t < tensors; ++t) {
    v1::ItemEntry item;
    item.set_name("t" + std::to_string(t));
    item.set_kind(v1::TENSOR);
    item.set_dtype(static_cast<v1::DType>(fdp.ConsumeIntegralInRange<int>(1, 15)));
    const uint32_t elem = RefDTypeSize(item.dtype());
    const std::vector<uint64_t> shape = ConsumeShape(fdp, /*wild=*/false);
    for (uint64_t d : shape) item.add_shape(d);
    std::vector<v1::Region> regions = Partition(fdp, shape);
    if (partial) {
      std::erase_if(regions,
                    [&](const v1::Region&) { return fdp.ConsumeIntegralInRange(0, 3) == 0; });
      if (fdp.ConsumeBool()) regions.push_back(ConsumeRegion(fdp, shape, /*wild=*/false));
    }
    for (const v1::Region& r : regions) {
      const uint32_t rank = fdp.ConsumeIntegralInRange<uint32_t>(0, world - 1);
      v1::ShardEntry s = Place(fdp, blob_end, rank, RegionElements(r, shape) * elem, block);
      *s.mutable_region() = r;
      *item.add_shards() = std::move(s);
    }
    m.items.push_back(std::move(item));
  }
  const int objects = fdp.ConsumeIntegralInRange<int>(0, 2);
  for (int o = 0; o < objects; ++o) {
    v1::ItemEntry item;
    item.set_name("o" + std::to_string(o));
    item.set_kind(v1::OBJECT);
    const bool per_rank = fdp.ConsumeBool();
    item.set_scope(per_rank ? v1::PER_RANK : v1::REPLICATED);
    for (uint32_t rank = 0; rank < world; ++rank) {
      if (per_rank ? !fdp.ConsumeBool() : rank > 0) continue;
      *item.add_shards() =
          Place(fdp, blob_end, rank, fdp.ConsumeIntegralInRange<uint64_t>(0, 3000), block);
    }
    if (!per_rank && item.shards_size() == 0) {
      *item.add_shards() = Place(fdp, blob_end, 0, 100, block);
    }
    m.items.push_back(std::move(item));
  }
  std::sort(m.items.begin(), m.items.end(),
            [](const v1::ItemEntry& a, const v1::ItemEntry& b) { return a.name() < b.name(); });
  v1::ManifestHeader& h = m.header;
  h.set_format_version(kManifestFormatVersion);
  h.set_job("fuzz-job");
  h.set_step(7);
  h.set_world_size(world);
  h.set_partial(partial);
  h.set_checksum_block_bytes(block);
  h.set_item_count(m.items.size());
  for (const auto& [rank, end] : blob_end) {
    h.add_ranks_present(rank);
    v1::BlobInfo* b = h.add_blobs();
    b->set_id(rank * 7 + 3);
    b->set_name(BlobName(rank));
    b->set_size_bytes(fdp.ConsumeBool() ? end : RoundUp(end, limits::kAlignmentBytes));
  }
  out.options = ConsumeOptions(fdp, block);
  return out;
}

// What Load does with one LoadItemRequest before planning; false if Load refuses it.
bool Resolve(const Manifest& m, const v1::LoadItemRequest& req, uint32_t rank, PlanRequest* out) {
  out->item = FindItem(m, req.item());
  if (out->item == nullptr) {
    if (m.items.empty()) return false;
    uint64_t h = 0;
    for (char c : req.item()) h = h * 131 + static_cast<uint8_t>(c);
    out->item = &m.items[h % m.items.size()];
  }
  const v1::ItemEntry& item = *out->item;
  if (item.kind() == v1::TENSOR) {
    const std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
    out->region = req.region();
    if (ValidateRegion(req.region(), shape).ok()) return true;
    // Load refuses it; planned anyway, it must be INVALID_ARGUMENT naming the item.
    absl::StatusOr<LoadPlan> plan = PlanLoad(m, {out, 1});
    FUZZ_CHECK(!plan.ok() && plan.status().code() == absl::StatusCode::kInvalidArgument,
               "PlanLoad of item \"%s\" %s: %s", item.name().c_str(),
               DescribeRegion(req.region()).c_str(), plan.status().ToString().c_str());
    return false;
  }
  const uint32_t want = req.has_saved_by_rank() ? req.saved_by_rank() : rank;
  for (const v1::ShardEntry& s : item.shards()) {
    if (item.scope() == v1::REPLICATED || s.saved_by_rank() == want) {
      out->object_shard = &s;
      return true;
    }
  }
  return false;
}

// Whether a tensor of the (small) manifest has an element in two shards: the partial recipe's
// added shard may overlap the others, which ValidateManifest must refuse.
bool HoldsAnElementTwice(const Manifest& m) {
  for (const v1::ItemEntry& item : m.items) {
    const std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
    std::vector<uint8_t> seen(RefNumElements(shape).value_or(0), 0);
    for (const v1::ShardEntry& s : item.shards()) {
      if (item.kind() != v1::TENSOR) break;
      for (uint64_t g : RefElements(s.region(), shape)) {
        if (seen[g]++ > 0) return true;
      }
    }
  }
  return false;
}

uint64_t RequestBytes(const PlanRequest& r) {
  if (r.item->kind() != v1::TENSOR) return r.object_shard->length();
  const std::vector<uint64_t> shape(r.item->shape().begin(), r.item->shape().end());
  return RegionElements(r.region, shape) * RefDTypeSize(r.item->dtype());
}

bool SameRuns(const LoadPlan& a, const LoadPlan& b) {
  if (a.runs.size() != b.runs.size() || a.read_bytes != b.read_bytes ||
      a.needed_bytes != b.needed_bytes || a.needed_aligned_bytes != b.needed_aligned_bytes) {
    return false;
  }
  for (size_t i = 0; i < a.runs.size(); ++i) {
    if (a.runs[i].blob_id != b.runs[i].blob_id || a.runs[i].offset != b.runs[i].offset ||
        a.runs[i].length != b.runs[i].length) {
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptd;
  using namespace ckptd::fuzz;
  if (size < 2) return 0;
  const size_t n = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - 2);
  FuzzedDataProvider fdp(data + 2, n);
  Recipe recipe = Build(fdp);
  const Manifest& m = recipe.m;
  absl::Status valid = ValidateManifest(m);
  const bool twice = HoldsAnElementTwice(m);
  FUZZ_CHECK(valid.ok() != twice,
             "ValidateManifest of the recipe (%s an element in two shards): %s",
             twice ? "with" : "without", valid.ToString().c_str());
  if (!valid.ok()) return 0;

  v1::LoadRequest load;
  if (!load.ParseFromArray(data + 2 + n, static_cast<int>(size - 2 - n))) return 0;
  std::vector<PlanRequest> requests;
  uint64_t bytes = 0;
  for (int i = 0; i < std::min(load.items_size(), 32); ++i) {
    PlanRequest r;
    if (!Resolve(m, load.items(i), load.rank(), &r)) continue;
    const uint64_t b = RequestBytes(r);
    if (b > kRequestBytesMax - bytes) continue;
    bytes += b;
    requests.push_back(r);
  }

  const uint32_t block = m.header.checksum_block_bytes();
  absl::StatusOr<LoadPlan> plan = PlanLoad(m, requests, recipe.options);
  if (!RefPlanOptionsValid(block, recipe.options)) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument,
               "PlanLoad took invalid options: %s", plan.status().ToString().c_str());
    return 0;
  }
  bool covered = true;
  for (const PlanRequest& r : requests) covered = covered && RefRequestCovered(r);
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition && !covered,
               "PlanLoad refused %zu requests the shards hold: %s", requests.size(),
               plan.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(covered, "PlanLoad planned %zu requests although some elements are in no shard",
             requests.size());
  CheckPlan(m, requests, recipe.options, *plan);

  PlanOptions other = recipe.options;
  other.linear_shards_max = other.linear_shards_max == 0 ? (1u << 30) : 0;
  absl::StatusOr<LoadPlan> plan2 = PlanLoad(m, requests, other);
  FUZZ_CHECK(plan2.ok() && SameRuns(*plan, *plan2),
             "the interval index and the linear scan plan different reads: %s",
             plan2.status().ToString().c_str());
  return 0;
}
