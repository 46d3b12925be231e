// MemoryStorage: a Storage kept in memory, for tests of everything above the storage layer. It
// models a crash: every path has a durable state and a current (possibly unsynced) state.
//   - CreateBlob truncates the current state; BlobWriter::Write changes it; Sync makes the
//     current state durable. Readers (OpenBlob, Get, List, Exists) see the current state, as
//     they would through a page cache.
//   - PutAtomic and RemoveAll are durable when they return (like their posix counterparts,
//     which fsync the directory).
//   - DropUnsynced() reverts every path to its durable state, as a power loss would: blobs that
//     were created but never synced vanish, blobs rewritten since their last Sync go back.
// Paths follow the posix rules: relative, no ".." component (else INVALID_ARGUMENT).
//
// Thread safety: every method may be called from several threads at once; a BlobWriter or
// BlobReader by one thread at a time. Writers and readers must not outlive the storage.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/storage.h"
#include "ckptd/storage_registry.h"

namespace ckptd {

class MemoryStorage : public Storage {
 public:
  MemoryStorage() = default;

  std::string Describe() const override { return "memory:"; }
  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override;
  absl::Status PutAtomic(const std::string& path, std::string_view data) override;
  // Durable when it returns, like PutAtomic; ALREADY_EXISTS while `path` exists now.
  absl::Status PutIfAbsent(const std::string& path, std::string_view data) override;
  absl::StatusOr<std::string> Get(const std::string& path) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override;
  absl::Status RemoveAll(const std::string& path) override;

  // Forgets everything not yet durable (see above).
  void DropUnsynced();
  // Whether `path`'s current content is durable (false for an absent path).
  bool IsDurable(const std::string& path) const;

 private:
  friend class MemoryBlobWriter;
  friend class MemoryBlobReader;

  struct File {
    std::optional<std::string> current;  // nullopt: absent now
    std::optional<std::string> durable;  // nullopt: absent after a crash
  };

  absl::Status WriteAt(const std::string& path, std::span<const IoSlice> slices);
  absl::Status SyncPath(const std::string& path);
  absl::Status ReadAt(const std::string& path, std::span<const IoSlice> slices) const;

  mutable absl::Mutex mu_;
  std::map<std::string, File> files_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<MemoryStorage> NewMemoryStorage();

// Registers scheme "memory" (tests and tools; the daemon does not register it, a store that
// a restart forgets being no tier): every Open of "memory://<name>" is a new, empty store. It
// takes no settings (INVALID_ARGUMENT naming one). Errors: Register's.
absl::Status RegisterMemoryStorage(StorageRegistry& registry);

}  // namespace ckptd
