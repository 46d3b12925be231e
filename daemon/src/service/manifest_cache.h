// ManifestCache: decoded, verified manifests of recent commits and loads, by (job, step), least
// recently used evicted first (limits::kManifestCacheMax). Part of the catalog: a Load or Latest
// answered from it reads no manifest file.
//
// Ownership: owns the cached manifests (shared with the loads using them).
// Threads: any thread; every method takes only the cache's own lock, briefly (no I/O under it,
// no other lock taken inside it), so it may be called with the lifecycle lock held.
// Errors: none (a miss is nullptr).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "format/manifest.h"

namespace ckptd {

class ManifestCache {
 public:
  using Key = std::pair<std::string, uint64_t>;  // (job, step)

  // The cached manifest of `key` (marked used), or nullptr.
  std::shared_ptr<const Manifest> Get(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Caches `manifest` (it must verify) as the newest used, evicting the least recently used.
  void Put(const Key& key, std::shared_ptr<const Manifest> manifest) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `key` (a delete or a CORRUPT marking).
  void Erase(const Key& key) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::shared_ptr<const Manifest> manifest;
    uint64_t last_used = 0;
  };
  absl::Mutex mu_;
  std::map<Key, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd
