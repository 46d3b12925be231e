// StorageRegistry: the storage plugins the daemon knows, by the scheme of a storage URI
// ("file:///mnt/shared/ckpt" or a bare path, "s3://bucket/prefix"). It is the other half of the
// closed plugin seam: a plugin is built against daemon/include/ckptd only, and the daemon's core
// (daemon/src) names no plugin: daemon/main.cc registers each plugin once at start, through the
// registration function the plugin's own header declares (RegisterPosixStorage, RegisterS3Storage,
// RegisterMemoryStorage), and then opens every store by its URI (docs/ARCHITECTURE.md "The
// layers"; `make check-layers` refuses a core source that includes a plugin's header).
//
// Thread safety: none. The registry is filled and used by one thread (the daemon's start-up
// thread); the Storage objects it opens are as thread-safe as storage.h says.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/io.h"
#include "ckptd/storage.h"

namespace ckptd {

// A storage URI taken apart: "<scheme>://<location>". A URI without "://" is a local path:
// scheme "file", location the path itself.
struct StorageUri {
  std::string scheme;    // lower case letters, digits, '+', '-', '.'; starts with a letter
  std::string location;  // what follows "://": a path for "file", "bucket[/prefix]" for "s3"
};

// INVALID_ARGUMENT naming the URI if it is empty, its scheme is not a valid scheme name, or
// nothing follows "<scheme>://".
absl::StatusOr<StorageUri> ParseStorageUri(std::string_view uri);

// What a plugin opens a store with, besides the URI.
struct StorageContext {
  // The daemon's I/O engine, for plugins that do file I/O (must outlive the storage); null
  // where there is none (the plugin then answers FAILED_PRECONDITION if it needs one).
  Io* io = nullptr;
  // The plugin's settings, by name (the daemon fills them from its options: the S3 plugin's
  // endpoint, region, ...). A plugin refuses a name it does not know (INVALID_ARGUMENT naming
  // it), so a setting meant for another plugin is never silently ignored.
  std::map<std::string, std::string> settings;
};

// Opens the store at `uri` (already parsed; uri.scheme is the plugin's own). Errors are the
// plugin's, naming the store.
using StorageFactory = std::function<absl::StatusOr<std::unique_ptr<Storage>>(
    const StorageUri& uri, const StorageContext& context)>;

class StorageRegistry {
 public:
  // Adds the plugin for `scheme`. ALREADY_EXISTS if a plugin already has that scheme (the first
  // one stays); INVALID_ARGUMENT for a scheme that is not a valid scheme name or a null factory.
  absl::Status Register(std::string scheme, StorageFactory factory);

  // Opens the store `uri` names (ParseStorageUri) with the plugin of its scheme. INVALID_ARGUMENT
  // for a URI that does not parse, or for a scheme no plugin registered (the message names the
  // scheme and every known one); else whatever the plugin answers.
  absl::StatusOr<std::unique_ptr<Storage>> Open(std::string_view uri,
                                                const StorageContext& context) const;

  // The registered schemes, sorted.
  std::vector<std::string> schemes() const;

 private:
  std::map<std::string, StorageFactory, std::less<>> factories_;
};

}  // namespace ckptd
