#include "io/posix_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>  // renameat2, RENAME_NOREPLACE

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "spdlog/spdlog.h"

namespace ckptd::io_internal {
namespace {

// Parent of a '/'-separated path ("" when it has none, "/" for a root entry).
std::string ParentDir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status CloseFd(int fd, const std::string& path) {
  // No retry on EINTR: on Linux the descriptor is released even then, and a retry could close
  // a descriptor another thread just opened.
  if (close(fd) != 0) return ErrnoStatus(errno, absl::StrCat("close ", path));
  return absl::OkStatus();
}

// One slice, split at kIoChunkBytesMax, retrying short transfers until done.
absl::Status TransferSlice(bool is_write, const FileHandle& file, const IoSlice& slice) {
  auto* buf = static_cast<char*>(slice.buf);
  uint64_t done = 0;
  while (done < slice.len) {
    uint64_t want = std::min(slice.len - done, limits::kIoChunkBytesMax);
    uint64_t offset = slice.offset + done;
    ssize_t n = is_write ? pwrite(file.fd, buf + done, want, static_cast<off_t>(offset))
                         : pread(file.fd, buf + done, want, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, TransferContext(is_write, file, offset, want));
    }
    if (n == 0) {
      if (!is_write) return ShortFileStatus(file, offset, slice.len - done);
      // A regular file never accepts 0 bytes of a non-empty write without an errno.
      return absl::DataLossError(
          absl::StrCat(TransferContext(is_write, file, offset, want), ": wrote 0 bytes"));
    }
    done += static_cast<uint64_t>(n);
    // O_DIRECT reads stop short only at the end of the file; asking again for the unaligned
    // remainder would fail with EINVAL instead of saying so.
    if (!is_write && file.direct && done < slice.len &&
        (slice.offset + done) % limits::kAlignmentBytes != 0) {
      return ShortFileStatus(file, slice.offset + done, slice.len - done);
    }
  }
  return absl::OkStatus();
}

absl::Status TransferAll(bool is_write, const FileHandle& file, std::span<const IoSlice> slices) {
  for (const IoSlice& slice : slices) {
    CKPTD_RETURN_IF_ERROR(TransferSlice(is_write, file, slice));
  }
  return absl::OkStatus();
}

// Removes `path` (file or tree) below an existing directory; ENOENT anywhere is fine.
absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("lstat ", path));
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("unlink ", path));
    }
    return absl::OkStatus();
  }
  PosixIo io;
  auto names = io.ListDir(path);
  if (!names.ok()) {
    if (absl::IsNotFound(names.status())) return absl::OkStatus();
    return names.status();
  }
  for (const std::string& name : *names) {
    CKPTD_RETURN_IF_ERROR(RemoveTree(absl::StrCat(path, "/", name)));
  }
  if (rmdir(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("rmdir ", path));
  }
  return absl::OkStatus();
}

// Creates one directory; on success (or when it races with another creator) fsyncs its parent
// so the new entry is durable before anything is created inside it.
absl::Status MkdirOne(PosixIo& io, const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0) {
    int err = errno;
    if (err != EEXIST) return ErrnoStatus(err, absl::StrCat("mkdir ", dir));
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
    if (!S_ISDIR(st.st_mode)) return ErrnoStatus(ENOTDIR, absl::StrCat("mkdir ", dir));
    // Another thread may have created it without having fsynced the parent yet.
  }
  std::string parent = ParentDir(dir);
  return io.FsyncDir(parent.empty() ? "." : parent);
}

}  // namespace

std::string TransferContext(bool is_write, const FileHandle& file, uint64_t offset, uint64_t len) {
  return absl::StrCat(is_write ? "write " : "read ", file.path, " at offset ", offset, " (", len,
                      " bytes)");
}

absl::Status ShortFileStatus(const FileHandle& file, uint64_t offset, uint64_t len) {
  return absl::DataLossError(absl::StrCat("read ", file.path, " at offset ", offset, ": file ends ",
                                          len, " bytes before the slice does"));
}

absl::StatusOr<FileHandle> PosixIo::Open(const std::string& path, int flags, mode_t mode,
                                         bool want_direct) {
  FileHandle file;
  file.path = path;
  flags |= O_CLOEXEC;
  if (want_direct) {
    int fd;
    do {
      fd = open(path.c_str(), flags | O_DIRECT, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      file.fd = fd;
      file.direct = true;
      return file;
    }
    // EINVAL: this file system does not do O_DIRECT (tmpfs, some FUSE); go buffered.
    if (errno != EINVAL) return ErrnoStatus(errno, absl::StrCat("open ", path));
  }
  int fd;
  do {
    fd = open(path.c_str(), flags, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  file.fd = fd;
  return file;
}

absl::Status PosixIo::Close(FileHandle& file) {
  if (file.fd < 0) return absl::OkStatus();
  int fd = file.fd;
  file.fd = -1;
  return CloseFd(fd, file.path);
}

absl::Status PosixIo::WriteAll(const FileHandle& file, std::span<const IoSlice> slices) {
  return TransferAll(true, file, slices);
}

absl::Status PosixIo::ReadAll(const FileHandle& file, std::span<const IoSlice> slices) {
  return TransferAll(false, file, slices);
}

absl::Status PosixIo::Fdatasync(const FileHandle& file) {
  int rc;
  do {
    rc = fdatasync(file.fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return ErrnoStatus(errno, absl::StrCat("fdatasync ", file.path));
  return absl::OkStatus();
}

absl::Status PosixIo::Fsync(const FileHandle& file) {
  int rc;
  do {
    rc = fsync(file.fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return ErrnoStatus(errno, absl::StrCat("fsync ", file.path));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PosixIo::FileSize(const FileHandle& file) {
  struct stat st;
  if (fstat(file.fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", file.path));
  return static_cast<uint64_t>(st.st_size);
}

absl::StatusOr<uint64_t> PosixIo::CachedBytes(const FileHandle& file, uint64_t offset,
                                              uint64_t len) {
  CKPTD_ASSIGN_OR_RETURN(const uint64_t size, FileSize(file));
  if (len == 0 || offset >= size) return 0;
  const uint64_t end = std::min(size, offset + std::min(len, size - offset));
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t first = offset / page * page;
  const uint64_t span = end - first;
  // A mapping only to ask: nothing is touched, so nothing is read in.
  void* map = mmap(nullptr, span, PROT_READ, MAP_SHARED, file.fd, static_cast<off_t>(first));
  if (map == MAP_FAILED) {
    return ErrnoStatus(errno, absl::StrCat("mmap ", file.path, " to ask the page cache"));
  }
  std::vector<unsigned char> resident((span + page - 1) / page);
  const int rc = mincore(map, span, resident.data());
  const int err = errno;
  munmap(map, span);
  if (rc != 0) return ErrnoStatus(err, absl::StrCat("mincore ", file.path));
  uint64_t cached = 0;
  for (size_t i = 0; i < resident.size(); ++i) {
    if ((resident[i] & 1) == 0) continue;
    const uint64_t lo = std::max(offset, first + i * page);
    const uint64_t hi = std::min(end, first + (i + 1) * page);
    cached += hi - lo;
  }
  return cached;
}

absl::Status PosixIo::Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("rename ", from, " -> ", to));
  }
  return absl::OkStatus();
}

absl::Status PosixIo::RenameNoReplace(const std::string& from, const std::string& to) {
  const std::string what = absl::StrCat("rename (no replace) ", from, " -> ", to);
  if (renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  // File systems without RENAME_NOREPLACE (EINVAL) still refuse to link over an existing name.
  if (errno != EINVAL && errno != ENOSYS) return ErrnoStatus(errno, what);
  return LinkNoReplace(from, to);
}

absl::Status PosixIo::FsyncDir(const std::string& dir) {
  int fd;
  do {
    fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open directory ", dir));
  int rc;
  do {
    rc = fsync(fd);
  } while (rc != 0 && errno == EINTR);
  absl::Status status;
  if (rc != 0) status = ErrnoStatus(errno, absl::StrCat("fsync directory ", dir));
  absl::Status closed = CloseFd(fd, dir);
  return status.ok() ? closed : status;
}

absl::Status PosixIo::MkdirAll(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return ErrnoStatus(ENOTDIR, absl::StrCat("mkdir ", dir));
  }
  if (errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  // Walk down from the top, creating what is missing. Each prefix ends before a '/'.
  std::vector<std::string> prefixes;
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos == dir.size() || dir[pos] == '/') {
      if (dir[pos - 1] != '/') prefixes.push_back(dir.substr(0, pos));
    }
  }
  for (const std::string& prefix : prefixes) {
    if (stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return ErrnoStatus(ENOTDIR, absl::StrCat("mkdir ", prefix));
      continue;
    }
    if (errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("stat ", prefix));
    CKPTD_RETURN_IF_ERROR(MkdirOne(*this, prefix));
  }
  return absl::OkStatus();
}

absl::Status PosixIo::Unlink(const std::string& path) {
  if (unlink(path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("unlink ", path));
  return absl::OkStatus();
}

absl::Status PosixIo::RemoveAll(const std::string& path) { return RemoveTree(path); }

absl::StatusOr<std::vector<std::string>> PosixIo::ListDir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("opendir ", dir));
  std::vector<std::string> names;
  absl::Status status;
  while (true) {
    errno = 0;
    struct dirent* entry = readdir(d);
    if (entry == nullptr) {
      if (errno != 0) status = ErrnoStatus(errno, absl::StrCat("readdir ", dir));
      break;
    }
    std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    names.emplace_back(name);
  }
  if (closedir(d) != 0 && status.ok()) {
    status = ErrnoStatus(errno, absl::StrCat("closedir ", dir));
  }
  if (!status.ok()) return status;
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<bool> PosixIo::Exists(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT || errno == ENOTDIR) return false;
  return ErrnoStatus(errno, absl::StrCat("stat ", path));
}

}  // namespace ckptd::io_internal

namespace ckptd {

absl::Status Io::Link(const std::string& from, const std::string& to) {
  if (link(from.c_str(), to.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("link ", from, " -> ", to));
  }
  return absl::OkStatus();
}

absl::Status LinkNoReplace(const std::string& from, const std::string& to) {
  const std::string what = absl::StrCat("link (no replace) ", from, " -> ", to);
  if (link(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, what);
  if (unlink(from.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat(what, ": unlink"));
  return absl::OkStatus();
}

std::unique_ptr<Io> NewPosixIo() { return std::make_unique<io_internal::PosixIo>(); }

}  // namespace ckptd
