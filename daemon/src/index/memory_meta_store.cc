#include "index/memory_meta_store.h"

#include <vector>

namespace ckptd {
namespace {

bool HasPrefix(const std::string& key, std::string_view prefix) {
  return key.size() >= prefix.size() && std::string_view(key).substr(0, prefix.size()) == prefix;
}

}  // namespace

absl::StatusOr<std::optional<std::string>> MemoryMetaStore::Get(std::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

absl::Status MemoryMetaStore::CheckCrashedLocked() const {
  if (!crashed_) return absl::OkStatus();
  return absl::UnavailableError("memory index: write refused (crashed: the store is fenced)");
}

absl::Status MemoryMetaStore::Commit(std::span<const Write> writes, bool sync) {
  absl::MutexLock lock(&mu_);
  if (absl::Status st = CheckCrashedLocked(); !st.ok()) return st;
  for (const Write& w : writes) {
    if (w.value) {
      map_[w.key] = *w.value;
    } else {
      map_.erase(w.key);
    }
  }
  if (sync) durable_ = map_;  // the log is synced up to here: everything before is durable too
  return absl::OkStatus();
}

absl::Status MemoryMetaStore::DeletePrefix(std::string_view prefix, bool sync) {
  absl::MutexLock lock(&mu_);
  if (absl::Status st = CheckCrashedLocked(); !st.ok()) return st;
  auto it = map_.lower_bound(prefix);
  while (it != map_.end() && HasPrefix(it->first, prefix)) it = map_.erase(it);
  if (sync) durable_ = map_;
  return absl::OkStatus();
}

absl::Status MemoryMetaStore::Scan(
    std::string_view prefix, std::string_view start_after, size_t limit,
    const std::function<bool(std::string_view key, std::string_view value)>& fn) {
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

void MemoryMetaStore::Crash() {
  absl::MutexLock lock(&mu_);
  crashed_ = true;
}

void MemoryMetaStore::DropUnsynced() {
  absl::MutexLock lock(&mu_);
  map_ = durable_;
  crashed_ = false;
}

std::unique_ptr<MetaStore> NewMemoryMetaStore() { return std::make_unique<MemoryMetaStore>(); }

}  // namespace ckptd
