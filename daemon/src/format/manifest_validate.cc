// ValidateManifest. Every check names the job, step and item, so an operator can find the bad
// entry in a manifest of millions of items.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/blob_encoding.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/manifest.h"
#include "format/names.h"
#include "format/region.h"
#include "format/text.h"

namespace ckptd {
namespace {

using BlobSizes = absl::flat_hash_map<uint32_t, uint64_t>;

absl::Status Invalid(absl::string_view what) { return absl::FailedPreconditionError(what); }

absl::Status ValidateBlobName(std::string_view name) {
  // Blob names become paths under the checkpoint directory: the job name rules keep them plain
  // file names (no '/', no "..", not hidden).
  absl::Status s = ValidateJobName(name);
  if (s.ok()) return s;
  return Invalid(absl::StrFormat("blob name \"%s\" is not a plain file name", name));
}

absl::Status ValidateHeader(const Manifest& m, BlobSizes* blob_sizes) {
  const v1::ManifestHeader& h = m.header;
  if (absl::Status s = ValidateJobName(h.job()); !s.ok()) return Invalid(s.message());
  if (h.step() > limits::kStepMax) {
    return Invalid(absl::StrFormat("step %d exceeds the limit %d", h.step(), limits::kStepMax));
  }
  if (h.world_size() == 0 || h.world_size() > limits::kWorldSizeMax) {
    return Invalid(
        absl::StrFormat("world size %d is outside 1..%d", h.world_size(), limits::kWorldSizeMax));
  }
  for (uint32_t rank : h.ranks_present()) {
    if (rank >= h.world_size()) {
      return Invalid(absl::StrFormat("rank %d present but world size is %d", rank, h.world_size()));
    }
  }
  if (h.checksum_block_bytes() == 0) return Invalid("checksum block size is 0");
  if (m.items.size() > limits::kItemsPerCheckpointMax || h.item_count() != m.items.size()) {
    return Invalid(absl::StrFormat("header says %d items, manifest has %d (limit %d)",
                                   h.item_count(), m.items.size(), limits::kItemsPerCheckpointMax));
  }
  for (const v1::BlobInfo& blob : h.blobs()) {
    CKPTD_RETURN_IF_ERROR(ValidateBlobName(blob.name()));
    CKPTD_RETURN_IF_ERROR(ValidateBlobEncoding(blob));  // the store's copy only
    if (!blob_sizes->emplace(blob.id(), blob.size_bytes()).second) {
      return Invalid(absl::StrFormat("blob id %d appears twice", blob.id()));
    }
  }
  return absl::OkStatus();
}

// Checks that hold for tensor and object shards alike.
absl::Status ValidateShardPlacement(const v1::ManifestHeader& h, const BlobSizes& blob_sizes,
                                    const v1::ShardEntry& shard, size_t index) {
  auto blob = blob_sizes.find(shard.blob_id());
  if (blob == blob_sizes.end()) {
    return Invalid(
        absl::StrFormat("shard %d: blob %d is not in the manifest", index, shard.blob_id()));
  }
  if (shard.offset() % limits::kAlignmentBytes != 0) {
    return Invalid(absl::StrFormat("shard %d: offset %d is not %d-byte aligned", index,
                                   shard.offset(), limits::kAlignmentBytes));
  }
  if (shard.offset() > blob->second || shard.length() > blob->second - shard.offset()) {
    return Invalid(absl::StrFormat("shard %d: bytes [%d, +%d) are outside blob %d of %d bytes",
                                   index, shard.offset(), shard.length(), shard.blob_id(),
                                   blob->second));
  }
  uint64_t blocks = BlockCount(shard.length(), h.checksum_block_bytes());
  if (static_cast<uint64_t>(shard.block_crc32c_size()) != blocks) {
    return Invalid(absl::StrFormat("shard %d: %d block checksums for %d bytes (want %d)", index,
                                   shard.block_crc32c_size(), shard.length(), blocks));
  }
  if (shard.saved_by_rank() >= h.world_size()) {
    return Invalid(absl::StrFormat("shard %d: saved by rank %d of world size %d", index,
                                   shard.saved_by_rank(), h.world_size()));
  }
  for (uint32_t rank : shard.replica_ranks()) {
    if (rank >= h.world_size()) {
      return Invalid(absl::StrFormat("shard %d: replica rank %d of world size %d", index, rank,
                                     h.world_size()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTensor(const v1::ManifestHeader& h, const v1::ItemEntry& item) {
  auto elem_bytes = DTypeSize(item.dtype());
  if (!elem_bytes.ok()) return Invalid(elem_bytes.status().message());
  std::span<const uint64_t> shape(item.shape().data(), item.shape().size());
  if (auto numel = NumElements(shape); !numel.ok()) return Invalid(numel.status().message());
  std::vector<v1::Region> regions;
  regions.reserve(item.shards_size());
  for (int i = 0; i < item.shards_size(); ++i) {
    const v1::ShardEntry& shard = item.shards(i);
    absl::Status valid = ValidateRegion(shard.region(), shape);
    if (!valid.ok()) return Invalid(absl::StrFormat("shard %d: %s", i, valid.message()));
    uint64_t want = RegionElements(shard.region(), shape) * *elem_bytes;
    if (shard.length() != want) {
      return Invalid(absl::StrFormat("shard %d (%s): length %d bytes, want %d", i,
                                     DescribeRegion(shard.region()), shard.length(), want));
    }
    regions.push_back(shard.region());
  }
  // A partial checkpoint may lack elements, never hold one twice: the load planner counts the
  // elements the shards deliver, so two copies of some would hide missing others.
  absl::Status covered = h.partial() ? CheckNoOverlap(shape, regions, item.name())
                                     : CheckCoverage(shape, regions, item.name());
  if (covered.ok()) return covered;
  // The caller names the item; drop CheckCoverage's own "item \"w\": " prefix.
  std::string msg(covered.message());
  std::string prefix = absl::StrFormat("item \"%s\": ", item.name());
  if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
  return Invalid(msg);
}

absl::Status ValidateObject(const v1::ItemEntry& item) {
  absl::flat_hash_set<uint32_t> ranks;
  for (int i = 0; i < item.shards_size(); ++i) {
    const v1::ShardEntry& shard = item.shards(i);
    if (shard.has_region()) return Invalid(absl::StrFormat("shard %d: objects have no region", i));
    if (shard.length() > limits::kObjectBytesMax) {
      return Invalid(absl::StrFormat("shard %d: %d bytes exceeds the object limit %d", i,
                                     shard.length(), limits::kObjectBytesMax));
    }
    if (!ranks.insert(shard.saved_by_rank()).second) {
      return Invalid(absl::StrFormat("shard %d: rank %d saved it twice", i, shard.saved_by_rank()));
    }
  }
  switch (item.scope()) {
    case v1::REPLICATED:
      if (item.shards_size() != 1) {
        return Invalid(
            absl::StrFormat("replicated object has %d shards, want 1", item.shards_size()));
      }
      return absl::OkStatus();
    case v1::PER_RANK:
      return absl::OkStatus();
    default:
      return Invalid(absl::StrFormat("object scope %d is unspecified or unknown",
                                     static_cast<int>(item.scope())));
  }
}

absl::Status ValidateItem(const v1::ManifestHeader& h, const BlobSizes& blob_sizes,
                          const v1::ItemEntry& item) {
  if (absl::Status s = ValidateItemName(item.name()); !s.ok()) return Invalid(s.message());
  for (int i = 0; i < item.shards_size(); ++i) {
    CKPTD_RETURN_IF_ERROR(
        ValidateShardPlacement(h, blob_sizes, item.shards(i), static_cast<size_t>(i)));
  }
  switch (item.kind()) {
    case v1::TENSOR:
      return ValidateTensor(h, item);
    case v1::OBJECT:
      return ValidateObject(item);
    default:
      return Invalid(
          absl::StrFormat("item kind %d is unspecified or unknown", static_cast<int>(item.kind())));
  }
}

}  // namespace

absl::Status ValidateManifest(const Manifest& m) {
  const std::string where = absl::StrFormat("manifest of job \"%s\" step %d",
                                            EscapeName(m.header.job()), m.header.step());
  BlobSizes blob_sizes;
  CKPTD_RETURN_IF_ERROR(Annotate(ValidateHeader(m, &blob_sizes), where));
  for (size_t i = 0; i < m.items.size(); ++i) {
    const v1::ItemEntry& item = m.items[i];
    if (i > 0 && !(m.items[i - 1].name() < item.name())) {
      return Invalid(absl::StrFormat("%s: item \"%s\" is out of order or repeated", where,
                                     EscapeName(item.name())));
    }
    absl::Status s = ValidateItem(m.header, blob_sizes, item);
    if (!s.ok()) {
      return Annotate(s, absl::StrFormat("%s: item \"%s\"", where, EscapeName(item.name())));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd
