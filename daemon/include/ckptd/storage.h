// Storage: where checkpoint blobs and manifests live (local file system, S3-compatible store,
// memory). Paths are relative to the storage root and use '/'
// ("job/step-00000000000000000042/r00000.blob": format/names.h makes them). Plugins
// (plugins/storage/*) are built against daemon/include/ckptd only (CMakeLists: ckptd_plugin);
// each declares its own factory in its own header, and the daemon opens stores by URI through
// the registry (ckptd/storage_registry.h), so its core names no plugin.
//
// Thread safety: a Storage may be used from several threads at once; a BlobWriter / BlobReader by
// one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/io.h"

namespace ckptd {

// A new blob being written. Nothing written is visible to readers of other storages (an object
// store) or may be assumed to survive a crash before Sync returns OK.
//
// Caller memory contract: a writer may use a slice's memory only until the Write that passed it
// returns; the caller may then reuse it (the flush writes through bounce pages that it refills
// after every Write). A writer that needs bytes later (an object store's incomplete last part)
// copies them, at most one part's worth.
//
// Order: the caller writes the blob contiguously from offset 0, slices in increasing offset
// order within and across Write calls (the flush does). Posix and memory storage accept any
// order; the S3 storage answers INVALID_ARGUMENT to a gap, an overlap or a slice out of order.
// A writer destroyed without a successful Sync leaves nothing behind on an object store (its
// upload is aborted); on a file system it leaves an unsynced file that the caller removes.
class BlobWriter {
 public:
  virtual ~BlobWriter() = default;
  // Writes each slice at its offset. Slices whose buf, len and offset are 4 KiB multiples go
  // straight from memory with O_DIRECT where the storage supports it.
  virtual absl::Status Write(std::span<const IoSlice> slices) = 0;
  // Makes everything written durable — the data (fdatasync) and the blob's name in its directory
  // (a new file's entry needs its directory synced) — and closes. Until Sync returns OK nothing
  // written may be assumed to survive a crash.
  virtual absl::Status Sync() = 0;
};

class BlobReader {
 public:
  virtual ~BlobReader() = default;
  // Reads each slice completely (DATA_LOSS if the blob is shorter). Aligned slices use O_DIRECT.
  virtual absl::Status Read(std::span<const IoSlice> slices) = 0;
  virtual uint64_t size_bytes() const = 0;
};

// One blob for Storage::CopyBlobsFrom: its path on the storage and where to read it.
struct BlobCopy {
  std::string path;
  BlobReader* source;
};

class Storage {
 public:
  virtual ~Storage() = default;

  // For logs and errors, e.g. "posix:/var/lib/ckptd/data".
  virtual std::string Describe() const = 0;
  // True when this storage's BlobReader::Read fills slices only through the kernel (read(2),
  // io_uring): a slice in client memory that vanishes under the read then fails it with EFAULT
  // instead of raising SIGBUS in the daemon. The loader reads straight into client destinations
  // only through such storage. Default: false.
  virtual bool ReadsThroughKernel() const { return false; }

  // Creates (truncating) a blob, creating its parent directories durably.
  virtual absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) = 0;
  virtual absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) = 0;
  // Copies every blob of `copies` whole, each made durable as by CreateBlob, Write and Sync,
  // reading the sources itself — for a storage that overlaps reading and sending better than a
  // caller's Write calls can (the S3 plugin keeps parts_in_flight parts in flight from the first
  // part of the first blob to the last part of the last, reading each into one of
  // parts_in_flight part buffers as a slot frees; a Write returns only once its last part is
  // sent, so a caller's writes leave the store idle at every Write's end). Adds the bytes sent to
  // *progress; `stop` (may be empty) is asked between parts: true ends the copy CANCELLED. On an
  // error a blob not yet durable is not left behind on an object store (its upload aborted).
  // UNIMPLEMENTED (the default): the caller copies with CreateBlob, Write and Sync.
  virtual absl::Status CopyBlobsFrom(std::span<const BlobCopy> copies,
                                     std::atomic<uint64_t>* progress,
                                     const std::function<bool()>& stop) {
    (void)copies;
    (void)progress;
    (void)stop;
    return absl::UnimplementedError("this storage copies through CreateBlob and Write");
  }

  // Durably replaces `path` with `data`: write a temporary name, fsync, rename, fsync the
  // directory. Readers see the old content or the new, never a torn one. Temporary files that a
  // crashed PutAtomic of the same path left are removed; callers never run two PutAtomic of one
  // path at once.
  virtual absl::Status PutAtomic(const std::string& path, std::string_view data) = 0;
  // Creates `path` holding `data` only if `path` does not exist yet: ALREADY_EXISTS if it does.
  // Atomic: of several writers racing on one path (threads, processes, daemons on other nodes
  // sharing the store), exactly one succeeds — the multi-node commit primitive. Durable when it
  // returns OK, like PutAtomic. (Posix: a synced temporary file linked into place with
  // RENAME_NOREPLACE; S3: a conditional PUT, see plugins/storage/s3/s3_storage.h for stores
  // that lack it.)
  virtual absl::Status PutIfAbsent(const std::string& path, std::string_view data) = 0;
  // NOT_FOUND if absent.
  virtual absl::StatusOr<std::string> Get(const std::string& path) = 0;
  virtual absl::StatusOr<bool> Exists(const std::string& path) = 0;
  // Names of the entries directly under `dir` (sorted); an absent dir lists as empty.
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& dir) = 0;
  // Removes `path` and everything under it, durably (the parent directory is synced); absent is
  // OK.
  virtual absl::Status RemoveAll(const std::string& path) = 0;
  // Gives the durable blob `from` the second name `to`, sharing its bytes (a hard link; nothing
  // is copied), replacing whatever `to` was; durable when it returns OK (the parent directories
  // of `to` made and synced). The blob lives on until its last name is removed, so removing
  // `from` later leaves `to` whole. Deltas (docs/USER_GUIDE.md "Deltas") share the unchanged
  // blob of an earlier checkpoint this way. NOT_FOUND when `from` is gone. UNIMPLEMENTED (the
  // default): the storage cannot share bytes, and the caller writes them again.
  virtual absl::Status LinkBlob(const std::string& from, const std::string& to) {
    (void)from;
    (void)to;
    return absl::UnimplementedError("this storage cannot give a blob a second name");
  }
};

}  // namespace ckptd
