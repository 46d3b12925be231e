#include "tier/ram_tier.h"

#include <algorithm>

#include "ckptd/status.h"
#include "index/keys.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

uint64_t ExtentBytes(const HotParts& parts) {
  uint64_t bytes = 0;
  for (const HotExtent& x : parts.extents) bytes += x.length;
  return bytes;
}

}  // namespace

HotCopy::HotCopy(StagingArena* arena, std::vector<HotRange> ranges, std::vector<HotExtent> extents)
    : arena_(arena), ranges_(std::move(ranges)), extents_(std::move(extents)) {
  std::sort(ranges_.begin(), ranges_.end(), [](const HotRange& a, const HotRange& b) {
    return std::pair(a.blob_id, a.blob_offset) < std::pair(b.blob_id, b.blob_offset);
  });
  for (const HotExtent& e : extents_) bytes_ += e.length;
  // Resolved once: a segment stays mapped at one address for the arena's life, and these extents
  // are ours until the destructor, so Find (per run of a load) takes no arena lock.
  at_.reserve(ranges_.size());
  for (const HotRange& r : ranges_) at_.push_back(arena_->At(r.uid, r.arena_offset));
}

HotCopy::~HotCopy() {
  std::vector<uint64_t> ids;
  ids.reserve(extents_.size());
  for (const HotExtent& e : extents_) ids.push_back(e.id);
  arena_->Free(ids);
}

size_t HotCopy::IndexOf(uint32_t blob, uint64_t offset, uint64_t length) const {
  // The last range starting at or before (blob, offset).
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::pair(blob, offset),
                             [](const std::pair<uint32_t, uint64_t>& k, const HotRange& r) {
                               return k < std::pair(r.blob_id, r.blob_offset);
                             });
  if (it == ranges_.begin()) return ranges_.size();
  const size_t i = static_cast<size_t>(std::prev(it) - ranges_.begin());
  const HotRange& r = ranges_[i];
  if (r.blob_id != blob || offset + length > r.blob_offset + r.length) return ranges_.size();
  return i;
}

const uint8_t* HotCopy::Find(uint32_t blob, uint64_t offset, uint64_t length) const {
  const size_t i = IndexOf(blob, offset, length);
  return i < ranges_.size() ? at_[i] + (offset - ranges_[i].blob_offset) : nullptr;
}

const HotRange* HotCopy::FindRange(uint32_t blob, uint64_t offset, uint64_t length) const {
  const size_t i = IndexOf(blob, offset, length);
  return i < ranges_.size() ? &ranges_[i] : nullptr;
}

v1::HotRecord HotCopy::Record() const {
  v1::HotRecord rec;
  for (const HotRange& r : ranges_) {
    v1::HotRange* o = rec.add_ranges();
    o->set_blob_id(r.blob_id);
    o->set_blob_offset(r.blob_offset);
    o->set_length(r.length);
    o->set_uid(r.uid);
    o->set_arena_offset(r.arena_offset);
  }
  for (const HotExtent& e : extents_) {
    v1::HotExtent* o = rec.add_extents();
    o->set_id(e.id);
    o->set_uid(e.uid);
    o->set_offset(e.offset);
    o->set_length(e.length);
    (*rec.mutable_generations())[e.uid] = arena_->Generation(e.uid);
  }
  return rec;
}

RamTier::RamTier(Options options, StagingArena* arena, MetaStore* meta)
    : options_(options), arena_(arena), meta_(meta) {}

RamTier::~RamTier() {
  Victims v;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, e] : entries_) {
      if (e.copy) {
        v.copies.push_back(std::move(e.copy));
      } else {
        for (const HotExtent& x : e.extents) v.extent_ids.push_back(x.id);
      }
    }
    entries_.clear();
    bytes_ = 0;
  }
  Release(std::move(v));  // rows stay: a restart adopts what the segments still hold
}

uint64_t RamTier::budget_bytes() const {
  return options_.bytes_max == 0 ? arena_->capacity_bytes() : options_.bytes_max;
}

void RamTier::EvictLocked(std::map<Key, Entry>::iterator it, Victims* v) {
  Entry& e = it->second;
  if (e.copy) {
    absl::Status st = meta_->Commit(
        std::vector<MetaStore::Write>{{keys::Hot(it->first.first, it->first.second), std::nullopt}},
        /*sync=*/false);
    // A row left behind names bytes that will be reused: recovery's verification drops it.
    if (!st.ok())
      spdlog::warn("RAM tier: removing the row of {}/{}: {}", it->first.first, it->first.second,
                   st.ToString());
    v->copies.push_back(std::move(e.copy));
  } else {
    for (const HotExtent& x : e.extents) v->extent_ids.push_back(x.id);
  }
  bytes_ -= e.bytes;
  ++evictions_;
  entries_.erase(it);
}

bool RamTier::MakeRoomLocked(uint64_t incoming, const Key* keep, Victims* v) {
  const uint64_t budget = budget_bytes();
  if (incoming > budget) return false;
  while (bytes_ + incoming > budget) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (keep != nullptr && it->first == *keep) continue;
      if (victim == entries_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim == entries_.end()) return false;
    EvictLocked(victim, v);
  }
  return true;
}

void RamTier::TrimJobLocked(const std::string& job, const Key* keep, Victims* v) {
  // Hot steps of `job`, newest first; provisional ones (saves in flight) are not counted.
  std::vector<std::map<Key, Entry>::iterator> hot;
  for (auto it = entries_.lower_bound(Key{job, 0}); it != entries_.end() && it->first.first == job;
       ++it) {
    if (it->second.copy) hot.push_back(it);
  }
  std::reverse(hot.begin(), hot.end());
  if (keep != nullptr) {
    std::stable_partition(hot.begin(), hot.end(), [&](auto it) { return it->first == *keep; });
  }
  for (size_t i = options_.keep_per_job; i < hot.size(); ++i) EvictLocked(hot[i], v);
}

void RamTier::WriteRowLocked(const Key& key, const HotCopy& copy) {
  absl::Status st =
      meta_->Commit(std::vector<MetaStore::Write>{{keys::Hot(key.first, key.second),
                                                   copy.Record().SerializeAsString()}},
                    /*sync=*/false);
  // Without its row the copy still serves this daemon; a restart just does not find it.
  if (!st.ok())
    spdlog::warn("RAM tier: writing the row of {}/{}: {}", key.first, key.second, st.ToString());
}

void RamTier::Release(Victims v) {
  v.copies.clear();  // each frees its extents once no load pins it
  if (!v.extent_ids.empty()) arena_->Free(v.extent_ids);
}

bool RamTier::AddRank(const Key& key, HotParts parts) {
  if (!enabled()) return false;
  const uint64_t bytes = ExtentBytes(parts);
  Victims v;
  bool taken = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || !it->second.copy) {  // a committed key takes no ranks
      taken = MakeRoomLocked(bytes, nullptr, &v);
      if (taken) {
        Entry& e = entries_[key];
        e.ranges.insert(e.ranges.end(), parts.ranges.begin(), parts.ranges.end());
        e.extents.insert(e.extents.end(), parts.extents.begin(), parts.extents.end());
        e.bytes += bytes;
        e.last_use = ++clock_;
        bytes_ += bytes;
      }
    }
  }
  Release(std::move(v));
  return taken;
}

void RamTier::Commit(const Key& key) {
  Victims v;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.copy) return;
    Entry& e = it->second;
    e.copy = std::make_shared<const HotCopy>(arena_, std::move(e.ranges), std::move(e.extents));
    e.ranges.clear();
    e.extents.clear();
    e.last_use = ++clock_;
    WriteRowLocked(key, *e.copy);
    TrimJobLocked(key.first, nullptr, &v);
  }
  Release(std::move(v));
}

bool RamTier::Insert(const Key& key, HotParts parts, bool write_row) {
  if (!enabled()) return false;
  const uint64_t bytes = ExtentBytes(parts);
  Victims v;
  bool taken = false;
  {
    absl::MutexLock lock(&mu_);
    if (!entries_.contains(key)) {
      taken = MakeRoomLocked(bytes, nullptr, &v);
      if (taken) {
        Entry& e = entries_[key];
        e.copy = std::make_shared<const HotCopy>(arena_, std::move(parts.ranges),
                                                 std::move(parts.extents));
        e.bytes = bytes;
        e.last_use = ++clock_;
        bytes_ += bytes;
        if (write_row) WriteRowLocked(key, *e.copy);
        TrimJobLocked(key.first, &key, &v);
      }
    }
  }
  Release(std::move(v));
  return taken;
}

void RamTier::Drop(const Key& key) {
  Victims v;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    EvictLocked(it, &v);
  }
  Release(std::move(v));
}

std::shared_ptr<const HotCopy> RamTier::Pin(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.copy) return nullptr;
  it->second.last_use = ++clock_;
  return it->second.copy;
}

std::optional<uint64_t> RamTier::HotBytes(const Key& key) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.copy) return std::nullopt;
  return it->second.bytes;
}

bool RamTier::Reclaim(uint64_t bytes) {
  Victims v;
  uint64_t handed = 0;
  {
    absl::MutexLock lock(&mu_);
    while (handed < bytes && !entries_.empty()) {
      // Committed copies first (oldest use first), then provisional ones.
      auto victim = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (victim == entries_.end()) {
          victim = it;
          continue;
        }
        const bool hot = it->second.copy != nullptr;
        const bool victim_hot = victim->second.copy != nullptr;
        if (hot != victim_hot ? hot : it->second.last_use < victim->second.last_use) victim = it;
      }
      handed += victim->second.bytes;
      EvictLocked(victim, &v);
    }
  }
  const bool any = !v.copies.empty() || !v.extent_ids.empty();
  if (any) spdlog::info("RAM tier: evicted {} bytes for staging", handed);
  Release(std::move(v));
  return any;
}

RamTier::Stats RamTier::stats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  for (const auto& [key, e] : entries_) {
    if (e.copy) {
      s.hot_bytes += e.bytes;
      ++s.hot_checkpoints;
    } else {
      s.provisional_bytes += e.bytes;
    }
  }
  s.evictions = evictions_;
  return s;
}

}  // namespace ckptd
