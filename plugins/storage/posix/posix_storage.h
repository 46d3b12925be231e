// The posix storage plugin: a Storage (ckptd/storage.h) on a local file system, every operation
// through an Io (ckptd/io.h), so fault tests can wrap it. Scheme "file" in the storage registry
// (ckptd/storage_registry.h): "file:///mnt/shared/ckpt", or a bare path.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ckptd/io.h"
#include "ckptd/storage.h"
#include "ckptd/storage_registry.h"

namespace ckptd {

struct PosixStorageOptions {
  // Reads take each aligned slice that the page cache holds whole (Io::CachedBytes) through the
  // cache — a copy from memory, no device read — and every other aligned slice with O_DIRECT
  // (the daemon's load_io = auto). Off: aligned slices always go O_DIRECT. Default: false
  bool read_cached_through_cache = false;
};

// Local file system rooted at `root`, all I/O through `io` (which must outlive it).
std::unique_ptr<Storage> NewPosixStorage(std::string root, Io* io,
                                         PosixStorageOptions options = {});

// Registers scheme "file": the URI's location is the root; StorageContext::io is required
// (FAILED_PRECONDITION without one). Settings: "read_cached_through_cache" ("true" or "false",
// PosixStorageOptions). Errors: Register's (ALREADY_EXISTS if "file" is taken).
absl::Status RegisterPosixStorage(StorageRegistry& registry);

}  // namespace ckptd
