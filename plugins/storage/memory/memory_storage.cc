#include "storage/memory/memory_storage.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/storage_path.h"

namespace ckptd {
namespace {

std::string DirPrefix(const std::string& dir) {
  if (dir.empty()) return "";
  std::string prefix(dir);
  if (prefix.back() != '/') prefix += '/';
  return prefix;
}

}  // namespace

class MemoryBlobWriter : public BlobWriter {
 public:
  MemoryBlobWriter(MemoryStorage* storage, std::string path)
      : storage_(storage), path_(std::move(path)) {}
  absl::Status Write(std::span<const IoSlice> slices) override {
    if (synced_) return absl::FailedPreconditionError("blob writer already synced");
    return storage_->WriteAt(path_, slices);
  }
  absl::Status Sync() override {
    if (synced_) return absl::FailedPreconditionError("blob writer already synced");
    synced_ = true;
    return storage_->SyncPath(path_);
  }

 private:
  MemoryStorage* storage_;
  std::string path_;
  bool synced_ = false;
};

class MemoryBlobReader : public BlobReader {
 public:
  MemoryBlobReader(const MemoryStorage* storage, std::string path, uint64_t size_bytes)
      : storage_(storage), path_(std::move(path)), size_bytes_(size_bytes) {}
  absl::Status Read(std::span<const IoSlice> slices) override {
    return storage_->ReadAt(path_, slices);
  }
  uint64_t size_bytes() const override { return size_bytes_; }

 private:
  const MemoryStorage* storage_;
  std::string path_;
  uint64_t size_bytes_;
};

absl::StatusOr<std::unique_ptr<BlobWriter>> MemoryStorage::CreateBlob(const std::string& path) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, false));
  absl::MutexLock lock(&mu_);
  files_[path].current = std::string();
  return std::make_unique<MemoryBlobWriter>(this, path);
}

absl::StatusOr<std::unique_ptr<BlobReader>> MemoryStorage::OpenBlob(const std::string& path) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, false));
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end() || !it->second.current) {
    return absl::NotFoundError(absl::StrCat("memory blob ", path, " does not exist"));
  }
  return std::make_unique<MemoryBlobReader>(this, path, it->second.current->size());
}

absl::Status MemoryStorage::PutAtomic(const std::string& path, std::string_view data) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, false));
  absl::MutexLock lock(&mu_);
  File& f = files_[path];
  f.current = std::string(data);
  f.durable = f.current;
  return absl::OkStatus();
}

absl::Status MemoryStorage::PutIfAbsent(const std::string& path, std::string_view data) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, false));
  absl::MutexLock lock(&mu_);
  File& f = files_[path];
  if (f.current) {
    return absl::AlreadyExistsError(absl::StrCat("memory object ", path, " already exists"));
  }
  f.current = std::string(data);
  f.durable = f.current;
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStorage::Get(const std::string& path) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, false));
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end() || !it->second.current) {
    return absl::NotFoundError(absl::StrCat("memory object ", path, " does not exist"));
  }
  return *it->second.current;
}

absl::StatusOr<bool> MemoryStorage::Exists(const std::string& path) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, true));
  absl::MutexLock lock(&mu_);
  if (path.empty()) return true;
  auto it = files_.find(path);
  if (it != files_.end() && it->second.current) return true;
  // A directory exists while anything lies under it.
  std::string prefix = DirPrefix(path);
  for (it = files_.lower_bound(prefix); it != files_.end() && absl::StartsWith(it->first, prefix);
       ++it) {
    if (it->second.current) return true;
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> MemoryStorage::List(const std::string& dir) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(dir, true));
  absl::MutexLock lock(&mu_);
  std::string prefix = DirPrefix(dir);
  std::vector<std::string> names;
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
    if (!it->second.current) continue;
    std::string_view rest = std::string_view(it->first).substr(prefix.size());
    std::string_view name = rest.substr(0, rest.find('/'));
    if (names.empty() || names.back() != name) names.emplace_back(name);
  }
  // Map order is not quite name order ("a/x" sorts after "a.b"); sort and dedup.
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

absl::Status MemoryStorage::RemoveAll(const std::string& path) {
  CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, false));
  absl::MutexLock lock(&mu_);
  files_.erase(path);
  std::string prefix = DirPrefix(path);
  auto it = files_.lower_bound(prefix);
  while (it != files_.end() && absl::StartsWith(it->first, prefix)) it = files_.erase(it);
  return absl::OkStatus();
}

void MemoryStorage::DropUnsynced() {
  absl::MutexLock lock(&mu_);
  for (auto it = files_.begin(); it != files_.end();) {
    if (!it->second.durable) {
      it = files_.erase(it);
    } else {
      it->second.current = it->second.durable;
      ++it;
    }
  }
}

bool MemoryStorage::IsDurable(const std::string& path) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  return it != files_.end() && it->second.current && it->second.current == it->second.durable;
}

absl::Status MemoryStorage::WriteAt(const std::string& path, std::span<const IoSlice> slices) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end() || !it->second.current) {
    return absl::NotFoundError(absl::StrCat("memory blob ", path, " was removed while written"));
  }
  std::string& data = *it->second.current;
  for (const IoSlice& s : slices) {
    if (s.len == 0) continue;
    if (s.len > UINT64_MAX - s.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("write memory blob ", path, " at offset ", s.offset, ": slice overflows"));
    }
    if (data.size() < s.offset + s.len) data.resize(s.offset + s.len);
    std::memcpy(data.data() + s.offset, s.buf, s.len);
  }
  return absl::OkStatus();
}

absl::Status MemoryStorage::SyncPath(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end() || !it->second.current) {
    return absl::NotFoundError(absl::StrCat("memory blob ", path, " was removed while written"));
  }
  it->second.durable = it->second.current;
  return absl::OkStatus();
}

absl::Status MemoryStorage::ReadAt(const std::string& path, std::span<const IoSlice> slices) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end() || !it->second.current) {
    return absl::NotFoundError(absl::StrCat("memory blob ", path, " does not exist"));
  }
  const std::string& data = *it->second.current;
  for (const IoSlice& s : slices) {
    if (s.offset > data.size() || data.size() - s.offset < s.len) {
      return absl::DataLossError(absl::StrCat("read memory blob ", path, " at offset ", s.offset,
                                              ": blob is ", data.size(), " bytes, slice ends at ",
                                              s.offset + s.len));
    }
    if (s.len > 0) std::memcpy(s.buf, data.data() + s.offset, s.len);
  }
  return absl::OkStatus();
}

std::unique_ptr<MemoryStorage> NewMemoryStorage() { return std::make_unique<MemoryStorage>(); }

absl::Status RegisterMemoryStorage(StorageRegistry& registry) {
  return registry.Register(
      "memory",
      [](const StorageUri& uri,
         const StorageContext& context) -> absl::StatusOr<std::unique_ptr<Storage>> {
        if (!context.settings.empty()) {
          return absl::InvalidArgumentError(absl::StrCat("memory storage ", uri.location,
                                                         " takes no settings (got ",
                                                         context.settings.begin()->first, ")"));
        }
        return std::unique_ptr<Storage>(NewMemoryStorage());
      });
}

}  // namespace ckptd
