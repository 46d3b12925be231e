// MemoryMetaStore: the MetaStore of unit tests — a std::map under a mutex, with a power-loss
// model of RocksDB's write-ahead log: a synced write (Commit or DeletePrefix with sync=true)
// makes it and every write before it durable; unsynced writes are durable only once a later
// synced write is done. Crash() fences the store as a dead process would see it (every later
// write fails UNAVAILABLE "(crashed)"; reads still work); DropUnsynced() then forgets every write
// since the last synced one, as a power loss would, and clears the crash.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "index/meta_store.h"

namespace ckptd {

class MemoryMetaStore : public MetaStore {
 public:
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override;
  absl::Status Commit(std::span<const Write> writes, bool sync) override;
  absl::Status DeletePrefix(std::string_view prefix, bool sync) override;
  absl::Status Scan(
      std::string_view prefix, std::string_view start_after, size_t limit,
      const std::function<bool(std::string_view key, std::string_view value)>& fn) override;

  void Crash();
  void DropUnsynced();

 private:
  using Map = std::map<std::string, std::string, std::less<>>;
  absl::Status CheckCrashedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  Map map_ ABSL_GUARDED_BY(mu_);      // what readers see
  Map durable_ ABSL_GUARDED_BY(mu_);  // what a power loss keeps
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckptd
