// The format-level validation of a Save RPC. Input: a serialized v1::SaveRequest. Each check the
// service makes before staging (CheckpointService::ValidateSave and CheckItemsLocked, modelled
// here on the pure functions they call: names.h, dtype.h, region.h) is compared with a reference,
// then the request is turned into the manifest its commit would write. Two checks are modelled
// that the service does not make yet: shards of one item in one Save agree on dtype, shape and
// kind (CheckItemsLocked compares with earlier ranks only), and do not overlap (CheckNoOverlap);
// without them, a Save acknowledged as staged makes a manifest that fails validation at commit.
// Properties:
//  - ValidateJobName / ValidateItemName / DTypeSize / NumElements / ValidateRegion agree with
//    the references; a valid job's checkpoint directory is "<job>/step-<20 digits>" and
//    ParseStepDirName inverts StepDirName; BlobName(rank) is a valid plain file name;
//  - a valid tensor shard's byte count fits 64 bits; two shards with equal RegionKey hold the
//    same number of elements;
//  - a Save the checks accept becomes a manifest (as BuildManifest builds it: one blob for
//    the rank, shards packed at 4 KiB offsets) that ValidateManifest accepts as partial — what
//    the daemon acknowledged as staged must be committable — and that round-trips through
//    EncodeManifest / DecodeManifest.
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ckptd/v1/ckptd.pb.h"
#include "common/align.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/names.h"
#include "format/region.h"
#include "fuzz_util.h"

namespace ckptd::fuzz {
namespace {

bool RefJobNameValid(std::string_view job) {
  if (job.empty() || job.size() > limits::kJobNameBytesMax || job.front() == '.') return false;
  if (job.find("..") != std::string_view::npos) return false;
  for (char c : job) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool RefItemNameValid(std::string_view item) {
  if (item.empty() || item.size() > limits::kItemNameBytesMax) return false;
  for (char c : item) {
    if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f) return false;
  }
  return true;
}

void CheckNames(const v1::SaveRequest& req) {
  const bool job_ok = ValidateJobName(req.job()).ok();
  FUZZ_CHECK(job_ok == RefJobNameValid(req.job()), "ValidateJobName(\"%s\") says %d",
             req.job().c_str(), job_ok);
  const std::string step_dir = StepDirName(req.step());
  absl::StatusOr<uint64_t> step = ParseStepDirName(step_dir);
  FUZZ_CHECK(req.step() > limits::kStepMax ? !step.ok() : (step.ok() && *step == req.step()),
             "ParseStepDirName(StepDirName(%lu))", req.step());
  if (job_ok) {
    FUZZ_CHECK(
        CheckpointDir(req.job(), req.step()) == req.job() + "/" + step_dir && step_dir.size() == 25,
        "CheckpointDir(\"%s\", %lu)", req.job().c_str(), req.step());
  }
  absl::StatusOr<uint64_t> parsed = ParseStepDirName(req.job());  // any string
  FUZZ_CHECK(!parsed.ok() || StepDirName(*parsed) == req.job(), "ParseStepDirName(\"%s\")",
             req.job().c_str());
  FUZZ_CHECK(ValidateJobName(BlobName(req.rank())).ok(), "BlobName(%u) is not a plain file name",
             req.rank());
}

// ValidateSave's checks of one shard; its region key in *key.
bool ShardValid(const v1::ShardSpec& s, std::string* key) {
  const bool name_ok = ValidateItemName(s.item()).ok();
  FUZZ_CHECK(name_ok == RefItemNameValid(s.item()), "ValidateItemName says %d", name_ok);
  if (!name_ok) return false;
  uint64_t expect_bytes = 0;
  if (s.has_tensor()) {
    const v1::TensorShardSpec& t = s.tensor();
    absl::StatusOr<uint32_t> elem = DTypeSize(t.dtype());
    FUZZ_CHECK(elem.ok() == (RefDTypeSize(t.dtype()) != 0) &&
                   (!elem.ok() || *elem == RefDTypeSize(t.dtype())),
               "DTypeSize(%d)", static_cast<int>(t.dtype()));
    absl::StatusOr<v1::DType> named = ParseDType(DTypeName(t.dtype()));
    FUZZ_CHECK(named.ok() == elem.ok() && (!named.ok() || *named == t.dtype()),
               "ParseDType(DTypeName(%d))", static_cast<int>(t.dtype()));
    const std::vector<uint64_t> shape(t.global_shape().begin(), t.global_shape().end());
    const bool shape_ok = NumElements(shape).ok();
    FUZZ_CHECK(shape_ok == RefNumElements(shape).has_value(), "NumElements(%s)",
               DescribeShape(shape).c_str());
    const bool region_ok = ValidateRegion(t.region(), shape).ok();
    FUZZ_CHECK(region_ok == RefRegionValid(t.region(), shape), "ValidateRegion(%s, %s) says %d",
               DescribeRegion(t.region()).c_str(), DescribeShape(shape).c_str(), region_ok);
    if (!elem.ok() || !region_ok) return false;
    const u128 bytes = RefRegionElements(t.region(), shape) * *elem;
    FUZZ_CHECK(bytes < (u128{1} << 64), "%s of %s: %lu elements overflow a byte count",
               DescribeRegion(t.region()).c_str(), DescribeShape(shape).c_str(),
               RegionElements(t.region(), shape));
    expect_bytes = RegionElements(t.region(), shape) * *elem;
    FUZZ_CHECK(expect_bytes == bytes, "byte count of %s", DescribeRegion(t.region()).c_str());
    *key = RegionKey(t.region(), shape);
  } else if (s.has_object()) {
    if (s.object().scope() != v1::REPLICATED && s.object().scope() != v1::PER_RANK) return false;
    if (s.data().length() > limits::kObjectBytesMax) return false;
    expect_bytes = s.data().length();
    key->clear();
  } else {
    return false;
  }
  if (s.data().length() != expect_bytes) return false;
  return expect_bytes == 0 || s.data().target_case() != v1::MemRef::TARGET_NOT_SET;
}

// Whether shards of one item agree on kind, dtype, shape and scope (CheckItemsLocked, which the
// service applies against earlier ranks' shards only; here also within the request).
bool SameItem(const v1::ShardSpec& a, const v1::ShardSpec& b) {
  if (a.has_tensor() != b.has_tensor()) return false;
  if (!a.has_tensor()) return a.object().scope() == b.object().scope();
  return a.tensor().dtype() == b.tensor().dtype() &&
         std::equal(a.tensor().global_shape().begin(), a.tensor().global_shape().end(),
                    b.tensor().global_shape().begin(), b.tensor().global_shape().end());
}

// The manifest a commit of this one rank's Save would write (commit.cc BuildManifest).
Manifest BuildManifest(const v1::SaveRequest& req, uint32_t block) {
  Manifest m;
  v1::ManifestHeader& h = m.header;
  h.set_format_version(kManifestFormatVersion);
  h.set_job(req.job());
  h.set_step(req.step());
  h.set_world_size(req.world_size());
  h.set_partial(true);
  h.set_checksum_block_bytes(block);
  h.add_ranks_present(req.rank());
  std::map<std::string, v1::ItemEntry> items;
  uint64_t offset = 0;
  for (const v1::ShardSpec& spec : req.shards()) {
    v1::ItemEntry& item = items[spec.item()];
    if (item.name().empty()) {
      item.set_name(spec.item());
      item.set_kind(spec.has_tensor() ? v1::TENSOR : v1::OBJECT);
      if (spec.has_tensor()) {
        item.set_dtype(spec.tensor().dtype());
        *item.mutable_shape() = spec.tensor().global_shape();
      } else {
        item.set_scope(spec.object().scope());
      }
    }
    v1::ShardEntry* s = item.add_shards();
    if (spec.has_tensor() && spec.tensor().has_region()) {
      *s->mutable_region() = spec.tensor().region();
    }
    s->set_blob_id(req.rank());
    s->set_offset(offset);
    s->set_length(spec.data().length());
    for (uint64_t b = 0; b < BlockCount(s->length(), block); ++b) s->add_block_crc32c(0);
    s->set_saved_by_rank(req.rank());
    offset += RoundUp(s->length(), limits::kAlignmentBytes);
  }
  v1::BlobInfo* blob = h.add_blobs();
  blob->set_id(req.rank());
  blob->set_name(BlobName(req.rank()));
  blob->set_size_bytes(offset);
  for (auto& [name, item] : items) m.items.push_back(std::move(item));
  h.set_item_count(m.items.size());
  return m;
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptd;
  using namespace ckptd::fuzz;
  v1::SaveRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  CheckNames(req);
  bool accepted = ValidateJobName(req.job()).ok() && req.step() <= limits::kStepMax &&
                  req.world_size() >= 1 && req.world_size() <= limits::kWorldSizeMax &&
                  req.rank() < req.world_size() &&
                  static_cast<uint64_t>(req.shards_size()) <= limits::kShardsPerSaveMax;
  absl::flat_hash_map<std::string, std::pair<uint64_t, int>> seen;  // item \0 key → elements
  std::map<std::string, int> first_of_item;
  u128 total_bytes = 0;
  for (int i = 0; i < req.shards_size(); ++i) {
    const v1::ShardSpec& s = req.shards(i);
    std::string key;
    if (!ShardValid(s, &key)) {
      accepted = false;
      continue;
    }
    total_bytes += RoundUp(s.data().length(), limits::kAlignmentBytes);
    uint64_t elements = 0;
    if (s.has_tensor()) {
      const std::vector<uint64_t> shape(s.tensor().global_shape().begin(),
                                        s.tensor().global_shape().end());
      elements = RegionElements(s.tensor().region(), shape);
    }
    auto [it, inserted] =
        seen.emplace(s.item() + std::string(1, '\0') + key, std::make_pair(elements, i));
    if (!inserted) {
      // Same key: the same elements (the service refuses the request as a repeated region).
      FUZZ_CHECK(!SameItem(s, req.shards(it->second.second)) || it->second.first == elements,
                 "shards %d and %d key as %s but hold %lu and %lu elements", it->second.second, i,
                 key.c_str(), it->second.first, elements);
      accepted = false;
    }
    auto [first, new_item] = first_of_item.emplace(s.item(), i);
    if (!new_item && !SameItem(s, req.shards(first->second))) accepted = false;
  }
  // Shards of one item in one Save may not overlap (the service does not check this yet).
  std::map<std::string, std::vector<v1::Region>> regions_of_item;
  for (const v1::ShardSpec& s : req.shards()) {
    if (accepted && s.has_tensor()) regions_of_item[s.item()].push_back(s.tensor().region());
  }
  for (const auto& [item, regions] : regions_of_item) {
    const v1::TensorShardSpec& t = req.shards(first_of_item.at(item)).tensor();
    const std::vector<uint64_t> shape(t.global_shape().begin(), t.global_shape().end());
    if (!CheckNoOverlap(shape, regions, item).ok()) accepted = false;
  }
  // A Save the arena could hold (at most kStagingBytesMax), with at most ~1024 checksums per
  // shard: the block size grows with the bytes (a power of two, as the daemon's option is).
  if (!accepted || total_bytes > limits::kStagingBytesMax || req.shards_size() > 4096) return 0;
  uint32_t block = req.step() % 2 == 0 ? 4096 : limits::kLegacyChecksumBlockBytes;
  while (block < (1u << 31) && total_bytes / block > 1024) block *= 2;
  Manifest m = BuildManifest(req, block);
  absl::Status valid = ValidateManifest(m);
  FUZZ_CHECK(valid.ok(), "an accepted Save makes a manifest that does not validate: %s",
             valid.ToString().c_str());
  CheckRoundTrip(m);
  return 0;
}
