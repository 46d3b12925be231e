#include "fuzz_util.h"

#include <algorithm>
#include <map>
#include <utility>

#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/region.h"
#include "google/protobuf/stubs/logging.h"

// libFuzzer calls this once before the first input: protobuf's log lines about invalid UTF-8 in
// string fields (the parse then fails, as in the daemon) would bury the fuzzer's own output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

namespace ckptd::fuzz {

std::optional<uint64_t> RefNumElements(std::span<const uint64_t> shape) {
  if (shape.size() > limits::kTensorDimsMax) return std::nullopt;
  u128 product = 1;
  bool zero = false;
  for (uint64_t dim : shape) {
    if (dim > limits::kTensorElementsMax) return std::nullopt;
    if (dim == 0) {
      zero = true;
      continue;
    }
    product *= dim;  // both factors <= 2^56: fits 128 bits
    if (product > limits::kTensorElementsMax) return std::nullopt;
  }
  return zero ? 0 : static_cast<uint64_t>(product);
}

bool RefRegionValid(const v1::Region& region, std::span<const uint64_t> shape) {
  std::optional<uint64_t> numel = RefNumElements(shape);
  if (!numel) return false;
  if (region.has_flat()) {
    return u128{region.flat().start()} + region.flat().count() <= *numel;
  }
  if (!region.has_box()) return true;
  const v1::Box& box = region.box();
  if (static_cast<size_t>(box.offsets_size()) != shape.size() ||
      static_cast<size_t>(box.lengths_size()) != shape.size()) {
    return false;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (u128{box.offsets(static_cast<int>(d))} + box.lengths(static_cast<int>(d)) > shape[d]) {
      return false;
    }
  }
  return true;
}

u128 RefRegionElements(const v1::Region& region, std::span<const uint64_t> shape) {
  if (region.has_flat()) return region.flat().count();
  if (!region.has_box()) return RefNumElements(shape).value_or(0);
  u128 n = 1;
  for (uint64_t len : region.box().lengths()) {
    if (len == 0) return 0;
    n *= len;
    if (n > limits::kTensorElementsMax) return n;  // not a valid region; stop before overflow
  }
  return n;
}

uint64_t GlobalIndex(const v1::Region& region, std::span<const uint64_t> shape, uint64_t i) {
  if (region.has_flat()) return region.flat().start() + i;
  if (!region.has_box()) return i;
  uint64_t g = 0;
  uint64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t len = region.box().lengths(static_cast<int>(d));
    g += (region.box().offsets(static_cast<int>(d)) + i % len) * stride;
    i /= len;
    stride *= shape[d];
  }
  return g;
}

std::vector<uint64_t> RefElements(const v1::Region& region, std::span<const uint64_t> shape) {
  const auto n = static_cast<uint64_t>(RefRegionElements(region, shape));
  std::vector<uint64_t> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = GlobalIndex(region, shape, i);
  return out;
}

uint32_t RefDTypeSize(int dtype) {
  switch (dtype) {
    case v1::FLOAT64:
    case v1::INT64:
    case v1::UINT64:
      return 8;
    case v1::FLOAT32:
    case v1::INT32:
    case v1::UINT32:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
    case v1::INT16:
    case v1::UINT16:
      return 2;
    case v1::FLOAT8_E4M3FN:
    case v1::FLOAT8_E5M2:
    case v1::INT8:
    case v1::UINT8:
    case v1::BOOL:
      return 1;
    default:
      return 0;
  }
}

uint64_t ConsumeNear(FuzzedDataProvider& fdp, uint64_t hint) {
  const auto small = fdp.ConsumeIntegralInRange<uint64_t>(0, 3);
  switch (fdp.ConsumeIntegralInRange<int>(0, 7)) {
    case 4:
      return hint - std::min(hint, small);
    case 5:
      return hint + 1 + small;  // may wrap: any value is a fair test
    case 6:
      return (uint64_t{1} << fdp.ConsumeIntegralInRange<int>(0, 63)) - small;
    case 7:
      return fdp.ConsumeIntegral<uint64_t>();
    default:
      return fdp.ConsumeIntegralInRange<uint64_t>(0, hint);
  }
}

std::vector<uint64_t> ConsumeShape(FuzzedDataProvider& fdp, bool wild) {
  std::vector<uint64_t> shape(
      fdp.ConsumeIntegralInRange<size_t>(0, wild ? limits::kTensorDimsMax + 1 : 4));
  for (uint64_t& dim : shape) {
    dim = wild ? ConsumeNear(fdp, uint64_t{1} << fdp.ConsumeIntegralInRange<int>(0, 57))
               : fdp.ConsumeIntegralInRange<uint64_t>(0, 8);
  }
  return shape;
}

v1::Region ConsumeRegion(FuzzedDataProvider& fdp, std::span<const uint64_t> shape, bool wild) {
  v1::Region region;
  const int kind = fdp.ConsumeIntegralInRange<int>(0, 2);
  if (kind == 0) return region;  // whole
  if (kind == 1) {
    size_t dims = shape.size();
    if (wild && fdp.ConsumeIntegralInRange<int>(0, 15) == 0) {
      dims = fdp.ConsumeIntegralInRange<size_t>(0, limits::kTensorDimsMax + 1);
    }
    v1::Box* box = region.mutable_box();
    for (size_t d = 0; d < dims; ++d) {
      const uint64_t dim = d < shape.size() ? shape[d] : 1;
      const uint64_t off =
          wild ? ConsumeNear(fdp, dim) : fdp.ConsumeIntegralInRange<uint64_t>(0, dim);
      const uint64_t room = dim >= off ? dim - off : 0;
      box->add_offsets(off);
      box->add_lengths(wild ? ConsumeNear(fdp, room)
                            : fdp.ConsumeIntegralInRange<uint64_t>(0, room));
    }
    if (wild && fdp.ConsumeIntegralInRange<int>(0, 31) == 0) box->add_offsets(0);
    return region;
  }
  const uint64_t numel = RefNumElements(shape).value_or(uint64_t{1} << 20);
  const uint64_t start =
      wild ? ConsumeNear(fdp, numel) : fdp.ConsumeIntegralInRange<uint64_t>(0, numel);
  const uint64_t room = numel >= start ? numel - start : 0;
  region.mutable_flat()->set_start(start);
  region.mutable_flat()->set_count(wild ? ConsumeNear(fdp, room)
                                        : fdp.ConsumeIntegralInRange<uint64_t>(0, room));
  return region;
}

bool RefPlanOptionsValid(uint64_t block_bytes, const PlanOptions& o) {
  return o.alignment_bytes != 0 && block_bytes % o.alignment_bytes == 0 &&
         u128{o.max_run_bytes} >= u128{2} * block_bytes &&
         o.max_run_bytes % o.alignment_bytes == 0 && o.merge_gap_fraction >= 0 &&
         o.merge_gap_fraction < 1;
}

namespace {

// Whether global element `g` of a tensor of `shape` is in the valid region.
bool RegionHolds(const v1::Region& region, std::span<const uint64_t> shape, uint64_t g) {
  if (region.has_flat()) {
    return g >= region.flat().start() && g - region.flat().start() < region.flat().count();
  }
  if (!region.has_box()) return true;
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t coord = g % shape[d];
    g /= shape[d];
    const uint64_t off = region.box().offsets(static_cast<int>(d));
    if (coord < off || coord - off >= region.box().lengths(static_cast<int>(d))) return false;
  }
  return true;
}

std::vector<uint64_t> ShapeOf(const v1::ItemEntry& item) {
  return std::vector<uint64_t>(item.shape().begin(), item.shape().end());
}

// Whether blocks of `shard` holding its bytes [begin, end) are verified by a check of the run.
bool Verified(const LoadPlan& plan, const ReadRun& run, const v1::ShardEntry* shard, uint64_t block,
              uint64_t begin, uint64_t end) {
  for (uint64_t b = begin / block; b <= (end - 1) / block; ++b) {
    bool found = false;
    for (uint32_t c = run.first_check; c < run.first_check + run.check_count && !found; ++c) {
      const BlockCheck& check = plan.checks[c];
      found = check.shard == shard && check.first_block <= b && b < check.end_block;
    }
    if (!found) return false;
  }
  return true;
}

// Whether copying blob bytes [src, src + bytes) from `shard` to request `r`'s buffer at `dst`
// moves each byte of each element to the same byte of the same global element.
bool SameElements(const PlanRequest& r, const v1::ShardEntry& shard, uint64_t src, uint64_t dst,
                  uint64_t bytes) {
  const uint64_t sp = src - shard.offset();
  if (r.item->kind() != v1::TENSOR) return sp == dst;
  const std::vector<uint64_t> shape = ShapeOf(*r.item);
  const uint32_t elem = RefDTypeSize(r.item->dtype());
  if (sp % elem != dst % elem) return false;
  for (uint64_t pos = 0; pos < bytes; pos += elem - (sp + pos) % elem) {
    if (GlobalIndex(shard.region(), shape, (sp + pos) / elem) !=
        GlobalIndex(r.region, shape, (dst + pos) / elem)) {
      return false;
    }
  }
  return true;
}

// The number of distinct bytes in the (blob, begin, end) ranges.
uint64_t UnionBytes(std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t total = 0;
  uint32_t blob = 0;
  uint64_t reach = 0;
  bool first = true;
  for (const auto& [b, begin, end] : ranges) {
    if (first || b != blob) blob = b, reach = 0, first = false;
    if (end > std::max(reach, begin)) total += end - std::max(reach, begin);
    reach = std::max(reach, end);
  }
  return total;
}

}  // namespace

bool RefRequestCovered(const PlanRequest& r) {
  if (r.item->kind() != v1::TENSOR) return true;
  const std::vector<uint64_t> shape = ShapeOf(*r.item);
  const auto n = static_cast<uint64_t>(RefRegionElements(r.region, shape));
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t g = GlobalIndex(r.region, shape, i);
    bool held = false;
    for (const v1::ShardEntry& s : r.item->shards()) {
      if (s.length() > 0 && RegionHolds(s.region(), shape, g)) {
        held = true;
        break;
      }
    }
    if (!held) return false;
  }
  return true;
}

void CheckPlan(const Manifest& m, std::span<const PlanRequest> requests, const PlanOptions& o,
               const LoadPlan& plan) {
  const uint64_t block = m.header.checksum_block_bytes();
  std::map<uint32_t, uint64_t> blob_size;
  for (const v1::BlobInfo& b : m.header.blobs()) blob_size[b.id()] = b.size_bytes();
  FUZZ_CHECK(plan.request_bytes.size() == requests.size(), "%zu request sizes for %zu requests",
             plan.request_bytes.size(), requests.size());
  std::vector<std::vector<uint8_t>> writes(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const PlanRequest& r = requests[i];
    const uint64_t want =
        r.item->kind() == v1::TENSOR
            ? static_cast<uint64_t>(RefRegionElements(r.region, ShapeOf(*r.item))) *
                  RefDTypeSize(r.item->dtype())
            : r.object_shard->length();
    FUZZ_CHECK(plan.request_bytes[i] == want, "request %zu: %lu bytes, want %lu", i,
               plan.request_bytes[i], want);
    writes[i].resize(want);
  }
  std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> sources;
  uint64_t read = 0;
  uint64_t next_check = 0;
  uint64_t next_copy = 0;
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    const ReadRun& run = plan.runs[k];
    auto blob = blob_size.find(run.blob_id);
    FUZZ_CHECK(blob != blob_size.end(), "run %zu: blob %u is not in the manifest", k, run.blob_id);
    const u128 end = u128{run.offset} + run.length;
    FUZZ_CHECK(run.length > 0 && end <= blob->second,
               "run %zu reads [%lu, +%lu) of blob %u of %lu bytes", k, run.offset, run.length,
               run.blob_id, blob->second);
    if (k > 0) {
      const ReadRun& prev = plan.runs[k - 1];
      FUZZ_CHECK(prev.blob_id < run.blob_id ||
                     (prev.blob_id == run.blob_id && prev.offset + prev.length <= run.offset),
                 "runs %zu and %zu are out of order or overlap", k - 1, k);
    }
    FUZZ_CHECK(run.offset % o.alignment_bytes == 0 &&
                   (end % o.alignment_bytes == 0 || end == blob->second),
               "run %zu [%lu, +%lu) is not aligned to %lu", k, run.offset, run.length,
               o.alignment_bytes);
    FUZZ_CHECK(run.length <= o.max_run_bytes, "run %zu is %lu bytes; max %lu", k, run.length,
               o.max_run_bytes);
    FUZZ_CHECK(run.first_check == next_check && run.first_copy == next_copy,
               "run %zu does not continue the checks and copies of the run before", k);
    next_check += run.check_count;
    next_copy += run.copy_count;
    FUZZ_CHECK(next_check <= plan.checks.size() && next_copy <= plan.copies.size(),
               "run %zu: checks or copies beyond the plan's", k);
    for (uint64_t c = run.first_check; c < next_check; ++c) {
      const BlockCheck& check = plan.checks[c];
      FUZZ_CHECK(check.shard != nullptr && check.shard->blob_id() == run.blob_id,
                 "check %lu of run %zu names another blob's shard", c, k);
      const uint64_t s_off = check.shard->offset();
      const uint64_t s_len = check.shard->length();
      FUZZ_CHECK(check.first_block < check.end_block &&
                     check.end_block <= BlockCount(s_len, static_cast<uint32_t>(block)),
                 "check %lu: blocks [%lu, %lu) of a shard of %lu bytes", c, check.first_block,
                 check.end_block, s_len);
      FUZZ_CHECK(s_off + check.first_block * block == run.offset + check.run_offset,
                 "check %lu: block %lu is not at run offset %lu", c, check.first_block,
                 check.run_offset);
      FUZZ_CHECK(std::min(s_off + check.end_block * block, s_off + s_len) <= end,
                 "check %lu ends after its run", c);
    }
    for (uint64_t c = run.first_copy; c < next_copy; ++c) {
      const RunCopy& copy = plan.copies[c];
      FUZZ_CHECK(copy.request < requests.size() && copy.bytes > 0 &&
                     u128{copy.run_offset} + copy.bytes <= run.length &&
                     u128{copy.dst_offset} + copy.bytes <= plan.request_bytes[copy.request],
                 "copy %lu (run offset %lu, %lu bytes to request %u at %lu) is out of bounds", c,
                 copy.run_offset, copy.bytes, copy.request, copy.dst_offset);
      const PlanRequest& r = requests[copy.request];
      const uint64_t src = run.offset + copy.run_offset;
      bool sourced = false;
      auto try_shard = [&](const v1::ShardEntry& s) {
        sourced = sourced ||
                  (s.blob_id() == run.blob_id && s.offset() <= src &&
                   u128{src} + copy.bytes <= u128{s.offset()} + s.length() &&
                   SameElements(r, s, src, copy.dst_offset, copy.bytes) &&
                   Verified(plan, run, &s, block, src - s.offset(), src - s.offset() + copy.bytes));
      };
      if (r.item->kind() == v1::TENSOR) {
        for (const v1::ShardEntry& s : r.item->shards()) try_shard(s);
      } else {
        try_shard(*r.object_shard);
      }
      FUZZ_CHECK(sourced,
                 "copy %lu: blob %u bytes [%lu, +%lu) → request %u at %lu are not the right, "
                 "verified bytes of a shard of item \"%s\"",
                 c, run.blob_id, src, copy.bytes, copy.request, copy.dst_offset,
                 r.item->name().c_str());
      for (uint64_t b = 0; b < copy.bytes; ++b) {
        uint8_t& w = writes[copy.request][copy.dst_offset + b];
        w = static_cast<uint8_t>(std::min(w + 1, 2));
      }
      sources.emplace_back(run.blob_id, src, src + copy.bytes);
    }
    read += run.length;
  }
  FUZZ_CHECK(next_check == plan.checks.size() && next_copy == plan.copies.size(),
             "checks or copies belong to no run");
  FUZZ_CHECK(read == plan.read_bytes, "read_bytes %lu, runs add up to %lu", plan.read_bytes, read);
  for (size_t i = 0; i < requests.size(); ++i) {
    for (uint64_t b = 0; b < writes[i].size(); ++b) {
      FUZZ_CHECK(writes[i][b] >= 1, "request %zu (item \"%s\"): byte %lu of %zu is never written",
                 i, requests[i].item->name().c_str(), b, writes[i].size());
      FUZZ_CHECK(writes[i][b] == 1, "request %zu: byte %lu is written twice", i, b);
    }
  }
  const uint64_t needed = UnionBytes(std::move(sources));
  FUZZ_CHECK(plan.needed_bytes == needed && needed <= plan.needed_aligned_bytes &&
                 plan.needed_aligned_bytes <= plan.read_bytes,
             "needed %lu (copies read %lu distinct bytes), aligned %lu, read %lu",
             plan.needed_bytes, needed, plan.needed_aligned_bytes, plan.read_bytes);
}

void CheckRoundTrip(const Manifest& m) {
  absl::StatusOr<std::string> bytes = EncodeManifest(m);
  FUZZ_CHECK(bytes.ok(), "a valid manifest does not encode: %s", bytes.status().ToString().c_str());
  absl::StatusOr<Manifest> back = DecodeManifest(*bytes, "round trip");
  FUZZ_CHECK(back.ok(), "an encoded manifest does not decode: %s",
             back.status().ToString().c_str());
  v1::ManifestHeader header = m.header;
  header.set_format_version(back->header.format_version());
  header.set_item_count(back->header.item_count());
  header.set_segment_count(back->header.segment_count());
  FUZZ_CHECK(header.SerializeAsString() == back->header.SerializeAsString(),
             "the header changed in a round trip");
  FUZZ_CHECK(back->items.size() == m.items.size(), "%zu items came back of %zu", back->items.size(),
             m.items.size());
  for (size_t i = 0; i < m.items.size(); ++i) {
    FUZZ_CHECK(m.items[i].SerializeAsString() == back->items[i].SerializeAsString(),
               "item %zu changed in a round trip", i);
    FUZZ_CHECK(FindItem(*back, m.items[i].name()) == &back->items[i], "FindItem misses item %zu",
               i);
  }
}

}  // namespace ckptd::fuzz
