#include "dataplane/buffered_io.h"

namespace ckptd {
namespace {

class BufferedIo final : public Io {
 public:
  explicit BufferedIo(std::unique_ptr<Io> inner) : in_(std::move(inner)) {}
  absl::StatusOr<FileHandle> Open(const std::string& path, int flags, mode_t mode,
                                  bool /*want_direct*/) override {
    return in_->Open(path, flags, mode, false);
  }
  absl::Status Close(FileHandle& f) override { return in_->Close(f); }
  absl::Status WriteAll(const FileHandle& f, std::span<const IoSlice> s) override {
    return in_->WriteAll(f, s);
  }
  absl::Status ReadAll(const FileHandle& f, std::span<const IoSlice> s) override {
    return in_->ReadAll(f, s);
  }
  absl::Status Fdatasync(const FileHandle& f) override { return in_->Fdatasync(f); }
  absl::Status Fsync(const FileHandle& f) override { return in_->Fsync(f); }
  absl::StatusOr<uint64_t> FileSize(const FileHandle& f) override { return in_->FileSize(f); }
  absl::StatusOr<uint64_t> CachedBytes(const FileHandle& f, uint64_t offset,
                                       uint64_t len) override {
    return in_->CachedBytes(f, offset, len);
  }
  absl::Status Rename(const std::string& a, const std::string& b) override {
    return in_->Rename(a, b);
  }
  absl::Status RenameNoReplace(const std::string& a, const std::string& b) override {
    return in_->RenameNoReplace(a, b);
  }
  absl::Status FsyncDir(const std::string& d) override { return in_->FsyncDir(d); }
  absl::Status MkdirAll(const std::string& d) override { return in_->MkdirAll(d); }
  absl::Status Unlink(const std::string& p) override { return in_->Unlink(p); }
  absl::Status RemoveAll(const std::string& p) override { return in_->RemoveAll(p); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& d) override {
    return in_->ListDir(d);
  }
  absl::StatusOr<bool> Exists(const std::string& p) override { return in_->Exists(p); }

 private:
  std::unique_ptr<Io> in_;
};

}  // namespace

std::unique_ptr<Io> NewBufferedIo(std::unique_ptr<Io> inner) {
  return std::make_unique<BufferedIo>(std::move(inner));
}

}  // namespace ckptd
