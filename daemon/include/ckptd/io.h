// Io: the daemon's only path to the operating system's file APIs (the seam that fault tests wrap to
// inject EIO, ENOSPC, short writes or lost unsynced data). Plugins are built against this header.
//
// Thread safety: every method may be called from several threads at once. Batched reads and
// writes run on the calling thread (the daemon calls them from its flush/load executors, never
// from an RPC reactor); the io_uring implementation keeps one ring per calling thread.
//
// Errors: ErrnoStatus() codes (NOT_FOUND, RESOURCE_EXHAUSTED for ENOSPC, DATA_LOSS for EIO, ...),
// each message naming the path and the byte offset concerned.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd {

// Offsets, lengths and buffer addresses of O_DIRECT I/O are multiples of this (the daemon's
// limits::kAlignmentBytes is the same number: staging extents and blob layouts use it).
inline constexpr uint64_t kIoAlignmentBytes = 4096;

// One transfer: `len` bytes between `buf` and the file at `offset`. For a file opened with
// O_DIRECT, buf, len and offset must be multiples of 4 KiB (Io does not check; the kernel answers
// EINVAL).
struct IoSlice {
  void* buf = nullptr;
  uint64_t len = 0;
  uint64_t offset = 0;
};

struct FileHandle {
  int fd = -1;
  std::string path;     // for error messages
  bool direct = false;  // opened with O_DIRECT
};

class Io {
 public:
  virtual ~Io() = default;

  // Opens `path` with open(2) flags. With `want_direct`, adds O_DIRECT and, where the file system
  // refuses it (EINVAL), opens without it: FileHandle::direct says which happened.
  virtual absl::StatusOr<FileHandle> Open(const std::string& path, int flags, mode_t mode,
                                          bool want_direct) = 0;
  virtual absl::Status Close(FileHandle& file) = 0;

  // Performs every slice completely (retrying short transfers), keeping up to the queue depth in
  // flight, splitting slices larger than limits::kIoChunkBytesMax. Returns the first failure.
  // ReadAll fails with DATA_LOSS if the file ends before a slice does.
  virtual absl::Status WriteAll(const FileHandle& file, std::span<const IoSlice> slices) = 0;
  virtual absl::Status ReadAll(const FileHandle& file, std::span<const IoSlice> slices) = 0;

  virtual absl::Status Fdatasync(const FileHandle& file) = 0;
  virtual absl::Status Fsync(const FileHandle& file) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const FileHandle& file) = 0;
  // How many bytes of [offset, offset + len) of the file are in the page cache now (mincore(2)
  // over a read-only mapping; the range is clamped to the file's size), so a reader can take
  // cached bytes through the cache and the rest with O_DIRECT. A hint: pages may come and go
  // right after. UNIMPLEMENTED (the default) where the Io cannot tell.
  virtual absl::StatusOr<uint64_t> CachedBytes(const FileHandle& file, uint64_t offset,
                                               uint64_t len) {
    (void)file;
    (void)offset;
    (void)len;
    return absl::UnimplementedError("this Io cannot tell what the page cache holds");
  }

  // Namespace operations. FsyncDir opens the directory and fsyncs it (makes renames/creates in it
  // durable). MkdirAll creates missing parents (mode 0700) and fsyncs each parent it changed.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Renames `from` to `to` only if `to` does not exist, atomically (renameat2 with
  // RENAME_NOREPLACE; where the file system refuses the flag, link(2) then unlink(2) of `from`):
  // ALREADY_EXISTS if it does. Fault injection counts it as a rename.
  virtual absl::Status RenameNoReplace(const std::string& from, const std::string& to) = 0;
  virtual absl::Status FsyncDir(const std::string& dir) = 0;
  // Gives the file `from` the new name `to` too (link(2): both names share its bytes);
  // ALREADY_EXISTS if `to` exists. Not durable until the directory of `to` is synced.
  // Default: link(2) itself.
  virtual absl::Status Link(const std::string& from, const std::string& to);
  virtual absl::Status MkdirAll(const std::string& dir) = 0;
  virtual absl::Status Unlink(const std::string& path) = 0;
  // Removes a file or a directory tree; a missing path is OK.
  virtual absl::Status RemoveAll(const std::string& path) = 0;
  // Names (not paths) of the entries of `dir`, sorted, without "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  virtual absl::StatusOr<bool> Exists(const std::string& path) = 0;
};

// io_uring with up to `queue_depth` transfers in flight per call; where io_uring is refused
// (ENOSYS, EPERM in a sandbox) it falls back to pread/pwrite and logs that once.
std::unique_ptr<Io> NewUringIo(uint32_t queue_depth);
// pread/pwrite only.
std::unique_ptr<Io> NewPosixIo();

// RenameNoReplace where the file system refuses RENAME_NOREPLACE (renameat2 answering EINVAL or
// ENOSYS: some NFS servers, FUSE and older file systems): link(2) `from` to `to`, which never
// replaces an existing name on any POSIX file system (EEXIST: ALREADY_EXISTS, `from` left for the
// caller to remove), then unlink(2) `from`. Only one of several racing writers gets the name, and
// the name points at a whole file. A crash between the two leaves `from` as a second name of the
// file (the caller's temporary, which it never reads).
absl::Status LinkNoReplace(const std::string& from, const std::string& to);

// An Io over `base` (not owned; it must outlive the result) whose RenameNoReplace always takes
// LinkNoReplace, as on a file system that refuses RENAME_NOREPLACE; every other call goes to
// `base`. The daemon's remote_dir_link_fallback option, and the tests of the fallback.
std::unique_ptr<Io> NewLinkNoReplaceIo(Io* base);

}  // namespace ckptd
