#include "service/manifest_cache.h"

#include <algorithm>

#include "common/limits.h"

namespace ckptd {

std::shared_ptr<const Manifest> ManifestCache::Get(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  it->second.last_used = ++tick_;
  return it->second.manifest;
}

void ManifestCache::Put(const Key& key, std::shared_ptr<const Manifest> manifest) {
  absl::MutexLock lock(&mu_);
  entries_[key] = Entry{std::move(manifest), ++tick_};
  while (entries_.size() > limits::kManifestCacheMax) {
    auto lru = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    entries_.erase(lru);
  }
}

void ManifestCache::Erase(const Key& key) {
  absl::MutexLock lock(&mu_);
  entries_.erase(key);
}

}  // namespace ckptd
