// Internal to the io module: the pread/pwrite implementation of Io, which the io_uring
// implementation extends (it inherits every namespace and sync operation and replaces only the
// batched transfers). Other modules use NewPosixIo() / NewUringIo() from ckptd/io.h.
//
// Thread safety: stateless; every method may be called from several threads at once.
#pragma once

#include <string>
#include <vector>

#include "ckptd/io.h"

namespace ckptd::io_internal {

class PosixIo : public Io {
 public:
  absl::StatusOr<FileHandle> Open(const std::string& path, int flags, mode_t mode,
                                  bool want_direct) override;
  absl::Status Close(FileHandle& file) override;
  absl::Status WriteAll(const FileHandle& file, std::span<const IoSlice> slices) override;
  absl::Status ReadAll(const FileHandle& file, std::span<const IoSlice> slices) override;
  absl::Status Fdatasync(const FileHandle& file) override;
  absl::Status Fsync(const FileHandle& file) override;
  absl::StatusOr<uint64_t> FileSize(const FileHandle& file) override;
  absl::StatusOr<uint64_t> CachedBytes(const FileHandle& file, uint64_t offset,
                                       uint64_t len) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status RenameNoReplace(const std::string& from, const std::string& to) override;
  absl::Status FsyncDir(const std::string& dir) override;
  absl::Status MkdirAll(const std::string& dir) override;
  absl::Status Unlink(const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;
};

// The context every transfer error carries: "write <path> at offset <offset> (<len> bytes)".
std::string TransferContext(bool is_write, const FileHandle& file, uint64_t offset, uint64_t len);

// DATA_LOSS for a read that reached the end of the file before its slice did.
absl::Status ShortFileStatus(const FileHandle& file, uint64_t offset, uint64_t len);

// True when io_uring rings can be created in this process (probed once, cached).
bool UringSupported();

}  // namespace ckptd::io_internal
