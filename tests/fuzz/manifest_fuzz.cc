// Manifest decoding and validation (format/manifest.h). Input: one flag byte, then manifest file
// bytes. Flag bit 0 set: before decoding, each record's checksum is recomputed (walking the
// records as DecodeManifest would), so the fuzzer reaches the protobuf parsing and ValidateManifest
// instead of stopping at the first checksum. Properties:
//  - DecodeManifest never crashes and fails only with DATA_LOSS or FAILED_PRECONDITION;
//  - a decoded manifest validates, encodes, decodes back to itself, and FindItem finds each item;
//  - the shards of every tensor hold exactly its element count (at most, if partial);
//  - PlanLoad of each (small) tensor whole and each object copy gives a plan that CheckPlan
//    accepts (reads inside the blobs, verified bytes of the right shards, every byte delivered).
#include <string>
#include <vector>

#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/region.h"
#include "fuzz_util.h"

namespace ckptd::fuzz {
namespace {

uint32_t GetLe32(const std::string& s, size_t pos) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(s[pos + i])} << (8 * i);
  return v;
}

void PutLe32(std::string& s, size_t pos, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[pos + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// Rewrites the checksum of every complete record after the magic.
void FixChecksums(std::string& bytes) {
  size_t pos = sizeof(kManifestMagic);
  while (pos + kManifestRecordHeaderBytes <= bytes.size()) {
    const uint32_t len = GetLe32(bytes, pos);
    const size_t start = pos + kManifestRecordHeaderBytes;
    if (len > bytes.size() - start) return;
    PutLe32(bytes, pos + 4, MaskCrc(Crc32c(bytes.data() + start, len)));
    pos = start + len;
  }
}

// Bytes the planned requests of one input may ask for (CheckPlan walks them element by element).
constexpr uint64_t kPlanBytesMax = 64 * 1024;

// Load plans of each whole tensor (when small) and each object copy.
void CheckPlans(const Manifest& m) {
  const uint64_t block = m.header.checksum_block_bytes();
  PlanOptions options;  // as the daemon plans: 4 KiB alignment, runs of a quarter load buffer
  options.alignment_bytes = limits::kAlignmentBytes;
  options.max_run_bytes = std::max<uint64_t>(2 * block, 64 * limits::kKiB);
  if (!RefPlanOptionsValid(block, options)) return;  // checksum blocks the daemon never writes
  std::vector<PlanRequest> requests;
  uint64_t bytes = 0;
  for (const v1::ItemEntry& item : m.items) {
    if (item.kind() == v1::OBJECT) {
      for (const v1::ShardEntry& s : item.shards()) {
        if (s.length() > kPlanBytesMax - bytes) continue;
        bytes += s.length();
        requests.push_back(PlanRequest{.item = &item, .object_shard = &s});
      }
      continue;
    }
    std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
    const uint64_t numel = NumElements(shape).value();
    const uint64_t size = numel * DTypeSize(item.dtype()).value();
    if (size > kPlanBytesMax - bytes || item.shards_size() > 64) continue;
    bytes += size;
    requests.push_back(PlanRequest{.item = &item});
  }
  absl::StatusOr<LoadPlan> plan = PlanLoad(m, requests, options);
  if (!plan.ok()) {
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition && m.header.partial(),
               "PlanLoad of a valid %s manifest: %s", m.header.partial() ? "partial" : "complete",
               plan.status().ToString().c_str());
    bool all_covered = true;
    for (const PlanRequest& r : requests) all_covered = all_covered && RefRequestCovered(r);
    FUZZ_CHECK(!all_covered, "PlanLoad refused requests the shards hold: %s",
               plan.status().ToString().c_str());
    return;
  }
  CheckPlan(m, requests, options, *plan);
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptd;
  using namespace ckptd::fuzz;
  if (size < 1 || size > (1 << 20)) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) FixChecksums(bytes);
  absl::StatusOr<Manifest> m = DecodeManifest(bytes, "fuzz");
  if (!m.ok()) {
    const absl::StatusCode code = m.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition,
               "%s", m.status().ToString().c_str());
    return 0;
  }
  absl::Status valid = ValidateManifest(*m);
  FUZZ_CHECK(valid.ok(), "a decoded manifest does not validate: %s", valid.ToString().c_str());
  for (const v1::ItemEntry& item : m->items) {
    if (item.kind() != v1::TENSOR) continue;
    std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
    u128 sum = 0;
    for (const v1::ShardEntry& s : item.shards()) sum += RegionElements(s.region(), shape);
    const uint64_t numel = NumElements(shape).value();
    FUZZ_CHECK(m->header.partial() ? sum <= numel : sum == numel,
               "item \"%s\": shards hold %lu elements of %lu", item.name().c_str(),
               static_cast<uint64_t>(sum), numel);
  }
  CheckRoundTrip(*m);
  CheckPlans(*m);
  return 0;
}
