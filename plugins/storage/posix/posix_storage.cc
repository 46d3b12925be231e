// Storage on a local file system, every operation through an Io (so fault tests can wrap it).
//
// Blobs are written and read through two descriptors: an O_DIRECT one for slices whose buffer
// address, length and offset are all 4 KiB multiples (the staging arena's extents, which then go
// to the device without a copy), and a buffered one, opened on first need, for everything else
// (a blob's unaligned tail, small objects). Where O_DIRECT is refused (tmpfs), the first
// descriptor is buffered and takes every slice. With read_cached_through_cache, an aligned read
// slice the page cache holds whole goes through the buffered descriptor too: a copy out of the
// cache instead of a device read.
#include "storage/posix/posix_storage.h"

#include <fcntl.h>

#include <random>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "ckptd/storage.h"
#include "ckptd/storage_path.h"
#include "ckptd/sync_point.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

bool IsAligned(const IoSlice& s) {
  constexpr uint64_t kAlign = kIoAlignmentBytes;
  return reinterpret_cast<uintptr_t>(s.buf) % kAlign == 0 && s.len % kAlign == 0 &&
         s.offset % kAlign == 0;
}

std::string ParentOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string TempSuffix() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat(".tmp.%016x", rng());
}

// Closes a descriptor where no caller can act on the error any more (destructors).
void CloseQuietly(Io* io, FileHandle& file) {
  if (file.fd < 0) return;
  absl::Status s = io->Close(file);
  if (!s.ok()) spdlog::warn("{}", s.ToString());
}

// The direct descriptor plus a lazily opened buffered one on the same file.
class DualFile {
 public:
  DualFile(Io* io, FileHandle direct, int buffered_flags, bool read_cached_through_cache = false)
      : io_(io),
        direct_(std::move(direct)),
        buffered_flags_(buffered_flags),
        read_cached_through_cache_(read_cached_through_cache) {}
  ~DualFile() {
    CloseQuietly(io_, direct_);
    CloseQuietly(io_, buffered_);
  }

  bool open() const { return direct_.fd >= 0; }

  absl::Status Transfer(bool is_write, std::span<const IoSlice> slices) {
    std::vector<IoSlice> aligned;
    std::vector<IoSlice> unaligned;
    for (const IoSlice& s : slices) {
      (direct_.direct && IsAligned(s) && !(!is_write && Cached(s)) ? aligned : unaligned)
          .push_back(s);
    }
    const FileHandle* other = &direct_;
    if (direct_.direct && !unaligned.empty()) {
      CKPTD_RETURN_IF_ERROR(OpenBuffered());
      other = &buffered_;
    }
    if (!aligned.empty()) {
      CKPTD_RETURN_IF_ERROR(is_write ? io_->WriteAll(direct_, aligned)
                                     : io_->ReadAll(direct_, aligned));
    }
    if (!unaligned.empty()) {
      CKPTD_RETURN_IF_ERROR(is_write ? io_->WriteAll(*other, unaligned)
                                     : io_->ReadAll(*other, unaligned));
    }
    return absl::OkStatus();
  }

  // fdatasync every descriptor used, then close them all (the first error wins).
  absl::Status SyncAndClose() {
    absl::Status status;
    if (buffered_.fd >= 0) status = io_->Fdatasync(buffered_);
    if (status.ok()) status = io_->Fdatasync(direct_);
    absl::Status closed = io_->Close(direct_);
    if (status.ok()) status = closed;
    if (buffered_.fd >= 0) {
      closed = io_->Close(buffered_);
      if (status.ok()) status = closed;
    }
    return status;
  }

 private:
  // Whether the page cache holds all of `s` (read_cached_through_cache); an Io that cannot tell
  // answers no.
  bool Cached(const IoSlice& s) const {
    if (!read_cached_through_cache_) return false;
    absl::StatusOr<uint64_t> cached = io_->CachedBytes(direct_, s.offset, s.len);
    return cached.ok() && *cached == s.len;
  }

  absl::Status OpenBuffered() {
    if (buffered_.fd >= 0) return absl::OkStatus();
    CKPTD_ASSIGN_OR_RETURN(buffered_, io_->Open(direct_.path, buffered_flags_, 0600, false));
    return absl::OkStatus();
  }

  Io* io_;
  FileHandle direct_;
  FileHandle buffered_;
  int buffered_flags_;
  bool read_cached_through_cache_;
};

class PosixBlobWriter : public BlobWriter {
 public:
  PosixBlobWriter(Io* io, FileHandle file, std::string dir)
      : io_(io), file_(io, std::move(file), O_WRONLY), dir_(std::move(dir)) {}

  absl::Status Write(std::span<const IoSlice> slices) override {
    if (!file_.open()) return absl::FailedPreconditionError("blob writer already synced");
    return file_.Transfer(true, slices);
  }
  // The data, then the directory: the blob was just created, and fdatasync alone does not make
  // its directory entry durable (POSIX). Without it a power loss could keep a "persisted" rank
  // whose blob is gone, and recovery would commit a manifest naming it (found by the power-loss
  // crash matrix).
  absl::Status Sync() override {
    if (!file_.open()) return absl::FailedPreconditionError("blob writer already synced");
    CKPTD_RETURN_IF_ERROR(file_.SyncAndClose());
    return io_->FsyncDir(dir_);
  }

 private:
  Io* io_;
  DualFile file_;
  std::string dir_;
};

class PosixBlobReader : public BlobReader {
 public:
  PosixBlobReader(Io* io, FileHandle file, uint64_t size_bytes, bool read_cached_through_cache)
      : file_(io, std::move(file), O_RDONLY, read_cached_through_cache), size_bytes_(size_bytes) {}

  absl::Status Read(std::span<const IoSlice> slices) override {
    return file_.Transfer(false, slices);
  }
  uint64_t size_bytes() const override { return size_bytes_; }

 private:
  DualFile file_;
  uint64_t size_bytes_;
};

class PosixStorage : public Storage {
 public:
  PosixStorage(std::string root, Io* io, PosixStorageOptions options)
      : root_(std::move(root)), io_(io), options_(options) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  }

  std::string Describe() const override { return absl::StrCat("posix:", root_); }
  bool ReadsThroughKernel() const override { return true; }

  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, false));
    CKPTD_RETURN_IF_ERROR(io_->MkdirAll(ParentOf(full)));
    CKPTD_ASSIGN_OR_RETURN(FileHandle file,
                           io_->Open(full, O_WRONLY | O_CREAT | O_TRUNC, 0600, true));
    return std::make_unique<PosixBlobWriter>(io_, std::move(file), ParentOf(full));
  }

  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, false));
    CKPTD_ASSIGN_OR_RETURN(FileHandle file, io_->Open(full, O_RDONLY, 0, true));
    absl::StatusOr<uint64_t> size = io_->FileSize(file);
    if (!size.ok()) {
      CloseQuietly(io_, file);
      return size.status();
    }
    return std::make_unique<PosixBlobReader>(io_, std::move(file), *size,
                                             options_.read_cached_through_cache);
  }

  absl::Status PutAtomic(const std::string& path, std::string_view data) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, false));
    std::string parent = ParentOf(full);
    CKPTD_RETURN_IF_ERROR(io_->MkdirAll(parent));
    CKPTD_RETURN_IF_ERROR(RemoveStaleTemps(parent, full.substr(parent.size() + 1)));
    std::string tmp = full + TempSuffix();
    CKPTD_ASSIGN_OR_RETURN(FileHandle file,
                           io_->Open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600, false));
    absl::Status status = WriteTemp(file, data);
    if (status.ok()) {
      CKPTD_SYNC_POINT("put_atomic.tmp_synced");
      status = io_->Rename(tmp, full);
    }
    if (!status.ok()) {
      absl::Status removed = io_->Unlink(tmp);
      if (!removed.ok() && !absl::IsNotFound(removed)) spdlog::warn("{}", removed.ToString());
      return status;
    }
    CKPTD_SYNC_POINT("put_atomic.renamed");
    CKPTD_RETURN_IF_ERROR(io_->FsyncDir(parent));
    CKPTD_SYNC_POINT("put_atomic.dir_synced");
    return absl::OkStatus();
  }

  // The temporary file is complete and synced before it gets the name, and RENAME_NOREPLACE
  // gives the name to one writer only: a loser's temporary is removed, the winner's content
  // never torn.
  absl::Status PutIfAbsent(const std::string& path, std::string_view data) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, false));
    std::string parent = ParentOf(full);
    CKPTD_RETURN_IF_ERROR(io_->MkdirAll(parent));
    std::string tmp = full + TempSuffix();
    CKPTD_ASSIGN_OR_RETURN(FileHandle file,
                           io_->Open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600, false));
    absl::Status status = WriteTemp(file, data);
    if (status.ok()) {
      status = io_->RenameNoReplace(tmp, full);
    }
    if (!status.ok()) {
      absl::Status removed = io_->Unlink(tmp);
      if (!removed.ok() && !absl::IsNotFound(removed)) spdlog::warn("{}", removed.ToString());
      return status;
    }
    return io_->FsyncDir(parent);
  }

  absl::StatusOr<std::string> Get(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, false));
    CKPTD_ASSIGN_OR_RETURN(FileHandle file, io_->Open(full, O_RDONLY, 0, false));
    std::string data;
    absl::Status status = ReadWhole(file, &data);
    absl::Status closed = io_->Close(file);
    if (!status.ok()) return status;
    if (!closed.ok()) return closed;
    return data;
  }

  absl::StatusOr<bool> Exists(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, true));
    return io_->Exists(full);
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(dir, true));
    absl::StatusOr<std::vector<std::string>> names = io_->ListDir(full);
    if (absl::IsNotFound(names.status())) return std::vector<std::string>{};
    return names;
  }

  // link(2) to a temporary name, renamed over `to`: `to` is the old file or the new link,
  // never absent, and a crash leaves at most a temporary name that the next link removes.
  absl::Status LinkBlob(const std::string& from, const std::string& to) override {
    CKPTD_ASSIGN_OR_RETURN(std::string src, Full(from, false));
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(to, false));
    const std::string parent = ParentOf(full);
    CKPTD_RETURN_IF_ERROR(io_->MkdirAll(parent));
    CKPTD_RETURN_IF_ERROR(RemoveStaleTemps(parent, full.substr(parent.size() + 1)));
    const std::string tmp = full + TempSuffix();
    CKPTD_RETURN_IF_ERROR(io_->Link(src, tmp));
    absl::Status status = io_->Rename(tmp, full);
    if (!status.ok()) {
      absl::Status removed = io_->Unlink(tmp);
      if (!removed.ok() && !absl::IsNotFound(removed)) spdlog::warn("{}", removed.ToString());
      return status;
    }
    return io_->FsyncDir(parent);
  }

  absl::Status RemoveAll(const std::string& path) override {
    // Never the whole root: an empty path here is a caller's bug or bad input.
    CKPTD_ASSIGN_OR_RETURN(std::string full, Full(path, false));
    CKPTD_RETURN_IF_ERROR(io_->RemoveAll(full));
    // Durable removal: a deleted manifest must not reappear after a crash (recovery would adopt
    // it and bring back a deleted checkpoint).
    absl::Status synced = io_->FsyncDir(ParentOf(full));
    return absl::IsNotFound(synced) ? absl::OkStatus() : synced;
  }

 private:
  absl::StatusOr<std::string> Full(const std::string& path, bool allow_empty) const {
    CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, allow_empty));
    if (path.empty()) return root_;
    return absl::StrCat(root_, "/", path);
  }

  // Temporary files of an earlier PutAtomic of `name` in `dir` that a crash cut short (no writer
  // is left: PutAtomic of one path never runs twice at once, storage.h). Without this a crash
  // after the temporary manifest was written left it for good beside the manifest the restart
  // commits (found by the crash-point matrix). Not made durable: a power loss may bring one
  // back, and the next PutAtomic of the path removes it again.
  absl::Status RemoveStaleTemps(const std::string& dir, const std::string& name) {
    absl::StatusOr<std::vector<std::string>> entries = io_->ListDir(dir);
    if (!entries.ok()) return entries.status();
    const std::string prefix = name + ".tmp.";
    for (const std::string& e : *entries) {
      if (e.rfind(prefix, 0) != 0) continue;
      absl::Status removed = io_->Unlink(absl::StrCat(dir, "/", e));
      if (!removed.ok() && !absl::IsNotFound(removed)) return removed;
      spdlog::info("removed {}/{}, left by an interrupted write of {}", dir, e, name);
    }
    return absl::OkStatus();
  }

  // Writes, fsyncs and closes the temporary file (closing it even on failure).
  absl::Status WriteTemp(FileHandle& file, std::string_view data) {
    IoSlice slice{const_cast<char*>(data.data()), data.size(), 0};
    absl::Status status = io_->WriteAll(file, std::span<const IoSlice>(&slice, 1));
    if (status.ok()) status = io_->Fsync(file);
    absl::Status closed = io_->Close(file);
    return status.ok() ? closed : status;
  }

  absl::Status ReadWhole(const FileHandle& file, std::string* data) {
    CKPTD_ASSIGN_OR_RETURN(uint64_t size, io_->FileSize(file));
    data->resize(size);
    IoSlice slice{data->data(), size, 0};
    return io_->ReadAll(file, std::span<const IoSlice>(&slice, 1));
  }

  std::string root_;
  Io* io_;
  PosixStorageOptions options_;
};

}  // namespace

std::unique_ptr<Storage> NewPosixStorage(std::string root, Io* io, PosixStorageOptions options) {
  return std::make_unique<PosixStorage>(std::move(root), io, options);
}

absl::Status RegisterPosixStorage(StorageRegistry& registry) {
  return registry.Register(
      "file",
      [](const StorageUri& uri,
         const StorageContext& context) -> absl::StatusOr<std::unique_ptr<Storage>> {
        if (context.io == nullptr) {
          return absl::FailedPreconditionError(
              absl::StrCat("file storage ", uri.location, " opened without an I/O engine"));
        }
        PosixStorageOptions options;
        for (const auto& [name, value] : context.settings) {
          if (name != "read_cached_through_cache" ||
              !absl::SimpleAtob(value, &options.read_cached_through_cache)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "file storage ", uri.location, ": bad setting ", name, " = \"", value, "\""));
          }
        }
        return NewPosixStorage(uri.location, context.io, options);
      });
}

}  // namespace ckptd
