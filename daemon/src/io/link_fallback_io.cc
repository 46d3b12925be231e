// NewLinkNoReplaceIo (ckptd/io.h): every call to the base Io, except RenameNoReplace, which takes
// the link(2) fallback of a file system without RENAME_NOREPLACE, so that path runs (and is
// tested) on any file system.
#include "ckptd/io.h"

namespace ckptd {
namespace {

class LinkNoReplaceIo final : public Io {
 public:
  explicit LinkNoReplaceIo(Io* base) : base_(base) {}
  absl::StatusOr<FileHandle> Open(const std::string& path, int flags, mode_t mode,
                                  bool want_direct) override {
    return base_->Open(path, flags, mode, want_direct);
  }
  absl::Status Close(FileHandle& f) override { return base_->Close(f); }
  absl::Status WriteAll(const FileHandle& f, std::span<const IoSlice> s) override {
    return base_->WriteAll(f, s);
  }
  absl::Status ReadAll(const FileHandle& f, std::span<const IoSlice> s) override {
    return base_->ReadAll(f, s);
  }
  absl::Status Fdatasync(const FileHandle& f) override { return base_->Fdatasync(f); }
  absl::Status Fsync(const FileHandle& f) override { return base_->Fsync(f); }
  absl::StatusOr<uint64_t> FileSize(const FileHandle& f) override { return base_->FileSize(f); }
  absl::StatusOr<uint64_t> CachedBytes(const FileHandle& f, uint64_t offset,
                                       uint64_t len) override {
    return base_->CachedBytes(f, offset, len);
  }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    return base_->Rename(a, b);
  }
  absl::Status RenameNoReplace(const std::string& a, const std::string& b) override {
    return LinkNoReplace(a, b);
  }
  absl::Status FsyncDir(const std::string& d) override { return base_->FsyncDir(d); }
  absl::Status MkdirAll(const std::string& d) override { return base_->MkdirAll(d); }
  absl::Status Unlink(const std::string& p) override { return base_->Unlink(p); }
  absl::Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& d) override {
    return base_->ListDir(d);
  }
  absl::StatusOr<bool> Exists(const std::string& p) override { return base_->Exists(p); }

 private:
  Io* const base_;
};

}  // namespace

std::unique_ptr<Io> NewLinkNoReplaceIo(Io* base) { return std::make_unique<LinkNoReplaceIo>(base); }

}  // namespace ckptd
