// MetaStore: the daemon's index and journal (a RocksDB database in the state dir; the key schema
// is in index/keys.h). A narrow seam so tests can run the service over an in-memory store and
// inject failures.
//
// Ownership: the daemon owns the one MetaStore; a RocksDB directory is opened by one daemon at a
// time (RocksDB's LOCK file).
// Thread safety: every method may be called concurrently. Scan sees a consistent snapshot; fn must
// not call back into the same store.
// Errors: FAILED_PRECONDITION when the database is held by another daemon, DATA_LOSS for
// corruption, RESOURCE_EXHAUSTED when the disk is full, INTERNAL/UNAVAILABLE for other I/O
// errors — each naming the database directory and carrying RocksDB's message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd {

class MetaStore {
 public:
  virtual ~MetaStore() = default;
  struct Write {
    std::string key;
    std::optional<std::string> value;  // nullopt deletes
  };
  // nullopt when absent (not an error).
  virtual absl::StatusOr<std::optional<std::string>> Get(std::string_view key) = 0;
  // Applies all writes atomically; sync=true: durable (WAL fsync'd) before returning.
  virtual absl::Status Commit(std::span<const Write> writes, bool sync) = 0;
  // Applies `batches` in order, each atomically, as one write where the store can (group commit:
  // one WriteBatch, one WAL sync for all); returns one status per batch. This default writes
  // them as one Commit, so every batch shares its status.
  virtual std::vector<absl::Status> CommitGroup(std::span<const std::vector<Write>> batches,
                                                bool sync) {
    std::vector<Write> all;
    for (const std::vector<Write>& b : batches) all.insert(all.end(), b.begin(), b.end());
    return std::vector<absl::Status>(batches.size(), Commit(all, sync));
  }
  // Deletes every key starting with `prefix`, atomically.
  virtual absl::Status DeletePrefix(std::string_view prefix, bool sync) = 0;
  // Bytes free on the volume holding the index (for the reserve checked before journaling new
  // work). The default — a store not on a volume — has no limit.
  virtual absl::StatusOr<uint64_t> AvailableBytes() const { return UINT64_MAX; }
  // Calls fn(key, value) for keys starting with `prefix` in key order, strictly after
  // `start_after` when non-empty, at most `limit` entries (0: no limit), until fn returns false.
  virtual absl::Status Scan(
      std::string_view prefix, std::string_view start_after, size_t limit,
      const std::function<bool(std::string_view key, std::string_view value)>& fn) = 0;
};

// Opens (creating if missing) the RocksDB database in `dir`.
absl::StatusOr<std::unique_ptr<MetaStore>> OpenRocksDbMetaStore(const std::string& dir);
// A std::map under a mutex, for tests (nothing is persisted; memory_meta_store.h models what a
// power loss would keep of it).
std::unique_ptr<MetaStore> NewMemoryMetaStore();

}  // namespace ckptd
