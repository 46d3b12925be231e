// PlanDelta (delta.h): the unchanged shards of a rank, grouped by the earlier file holding them.
#include "tier/delta.h"

#include <algorithm>
#include <map>

#include "common/align.h"
#include "common/limits.h"
#include "format/names.h"

namespace ckptd {
namespace {

const v1::ItemEntry* FindItem(const Manifest& m, const std::string& name) {
  auto it =
      std::lower_bound(m.items.begin(), m.items.end(), name,
                       [](const v1::ItemEntry& e, const std::string& n) { return e.name() < n; });
  return it != m.items.end() && it->name() == name ? &*it : nullptr;
}

bool SameItem(const v1::ItemEntry& base, const v1::ShardSpec& spec) {
  if (spec.has_tensor()) {
    const v1::TensorShardSpec& t = spec.tensor();
    return base.kind() == v1::TENSOR && base.dtype() == t.dtype() &&
           std::equal(base.shape().begin(), base.shape().end(), t.global_shape().begin(),
                      t.global_shape().end());
  }
  return base.kind() == v1::OBJECT && base.scope() == spec.object().scope();
}

// The shard of `base` that `s` (saved by `rank`, its crcs computed) would repeat, or nullptr.
const v1::ShardEntry* SameShard(const v1::ItemEntry& base, const v1::ShardEntry& s, uint32_t rank) {
  const std::string region = s.region().SerializeAsString();
  for (const v1::ShardEntry& b : base.shards()) {
    if (b.saved_by_rank() != rank || b.length() != s.length()) continue;
    if (b.region().SerializeAsString() != region) continue;
    if (std::equal(b.block_crc32c().begin(), b.block_crc32c().end(), s.block_crc32c().begin(),
                   s.block_crc32c().end())) {
      return &b;
    }
  }
  return nullptr;
}

}  // namespace

uint32_t LinkedBlobId(uint32_t rank, uint32_t slot) {
  static_assert(uint64_t{limits::kWorldSizeMax} * (limits::kDeltaLinkedBlobsPerRankMax + 1) <=
                UINT32_MAX);
  return rank + (slot + 1) * limits::kWorldSizeMax;
}

std::vector<DeltaGroup> PlanDelta(const v1::RankRecord& rec, const DeltaBase& base) {
  const Manifest& m = *base.manifest;
  std::map<uint32_t, const v1::BlobInfo*> blobs;
  for (const v1::BlobInfo& b : m.header.blobs()) blobs[b.id()] = &b;
  std::map<uint32_t, DeltaGroup> by_blob;
  for (int i = 0; i < rec.shards_size(); ++i) {
    const v1::StagedShard& s = rec.shards(i);
    if (s.replica() || s.stored().length() == 0) continue;
    const v1::ItemEntry* item = FindItem(m, s.spec().item());
    if (item == nullptr || !SameItem(*item, s.spec())) continue;
    const v1::ShardEntry* same = SameShard(*item, s.stored(), rec.rank());
    if (same == nullptr) continue;
    auto blob = blobs.find(same->blob_id());
    // Only a file this rank wrote, by a name a blob may have (never a path).
    if (blob == blobs.end() || !IsBlobFileName(blob->second->name())) continue;
    const uint64_t written =
        blob->second->has_written_at_step() ? blob->second->written_at_step() : base.step;
    if (blob->second->name() != BlobName(rec.rank()) &&
        blob->second->name() != LinkedBlobName(rec.rank(), written)) {
      continue;
    }
    DeltaGroup& g = by_blob[same->blob_id()];
    g.base_blob_id = same->blob_id();
    g.base_name = blob->second->name();
    g.written_at_step = written;
    g.size_bytes = blob->second->size_bytes();
    g.bytes += same->length();
    g.shards.push_back(i);
    g.offsets.push_back(same->offset());
  }
  std::vector<DeltaGroup> groups;
  for (auto& [id, g] : by_blob) {
    // Pages, not bytes: a shard of 1 byte keeps a page of the file alive.
    uint64_t live = 0;
    for (int i : g.shards)
      live += RoundUp(rec.shards(i).stored().length(), limits::kAlignmentBytes);
    if (live * 100 >= g.size_bytes * base.live_min_percent) groups.push_back(std::move(g));
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const DeltaGroup& a, const DeltaGroup& b) { return a.bytes > b.bytes; });
  if (groups.size() > limits::kDeltaLinkedBlobsPerRankMax) {
    groups.resize(limits::kDeltaLinkedBlobsPerRankMax);
  }
  return groups;
}

}  // namespace ckptd
