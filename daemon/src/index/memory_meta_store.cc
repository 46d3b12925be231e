#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "index/meta_store.h"

namespace ckptd {
namespace {

bool HasPrefix(const std::string& key, std::string_view prefix) {
  return key.size() >= prefix.size() && std::string_view(key).substr(0, prefix.size()) == prefix;
}

class MemoryMetaStore : public MetaStore {
 public:
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override {
    absl::MutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }

  absl::Status Commit(std::span<const Write> writes, bool /*sync*/) override {
    absl::MutexLock lock(&mu_);
    for (const Write& w : writes) {
      if (w.value) {
        map_[w.key] = *w.value;
      } else {
        map_.erase(w.key);
      }
    }
    return absl::OkStatus();
  }

  absl::Status DeletePrefix(std::string_view prefix, bool /*sync*/) override {
    absl::MutexLock lock(&mu_);
    auto it = map_.lower_bound(prefix);
    while (it != map_.end() && HasPrefix(it->first, prefix)) it = map_.erase(it);
    return absl::OkStatus();
  }

  absl::Status Scan(
      std::string_view prefix, std::string_view start_after, size_t limit,
      const std::function<bool(std::string_view key, std::string_view value)>& fn) override {
    // Copy the page out first so fn runs without the lock (as RocksDB's snapshot allows).
    std::vector<std::pair<std::string, std::string>> page;
    {
      absl::MutexLock lock(&mu_);
      bool after = !start_after.empty() && start_after >= prefix;
      auto it = after ? map_.upper_bound(start_after) : map_.lower_bound(prefix);
      for (; it != map_.end() && HasPrefix(it->first, prefix); ++it) {
        if (limit != 0 && page.size() == limit) break;
        page.emplace_back(it->first, it->second);
      }
    }
    for (const auto& [key, value] : page) {
      if (!fn(key, value)) break;
    }
    return absl::OkStatus();
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> map_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<MetaStore> NewMemoryMetaStore() { return std::make_unique<MemoryMetaStore>(); }

}  // namespace ckptd
