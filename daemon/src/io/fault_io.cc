#include "io/fault_io.h"

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"

namespace ckptd {
namespace {

std::string Injected(const std::string& what) { return absl::StrCat(what, " (injected)"); }

std::string TransferWhat(const char* verb, const FileHandle& file,
                         std::span<const IoSlice> slices) {
  uint64_t offset = slices.empty() ? 0 : slices.front().offset;
  return absl::StrCat(verb, " ", file.path, " at offset ", offset);
}

}  // namespace

FaultIo::FaultIo(Io* base) : base_(base) {}

FaultIo::FaultIo(std::unique_ptr<Io> base) : owned_(std::move(base)), base_(owned_.get()) {}

void FaultIo::FailNext(Op op, int err) {
  absl::MutexLock lock(&mu_);
  faults_[static_cast<size_t>(op)] = Fault{true, true, 0, err};
}

void FaultIo::FailAfter(Op op, uint64_t n, int err) {
  absl::MutexLock lock(&mu_);
  faults_[static_cast<size_t>(op)] = Fault{true, false, n, err};
}

void FaultIo::FailOnceAfter(Op op, uint64_t n, int err) {
  absl::MutexLock lock(&mu_);
  faults_[static_cast<size_t>(op)] = Fault{true, true, n, err};
}

void FaultIo::Clear(Op op) {
  absl::MutexLock lock(&mu_);
  faults_[static_cast<size_t>(op)] = Fault{};
}

void FaultIo::ClearAll() {
  absl::MutexLock lock(&mu_);
  faults_.fill(Fault{});
}

uint64_t FaultIo::calls(Op op) const {
  absl::MutexLock lock(&mu_);
  return calls_[static_cast<size_t>(op)];
}

int FaultIo::Check(Op op) {
  absl::MutexLock lock(&mu_);
  auto i = static_cast<size_t>(op);
  ++calls_[i];
  Fault& f = faults_[i];
  if (!f.armed) return 0;
  if (f.pass_left > 0) {
    --f.pass_left;
    return 0;
  }
  int err = f.err;
  if (f.once) f = Fault{};
  return err;
}

absl::StatusOr<FileHandle> FaultIo::Open(const std::string& path, int flags, mode_t mode,
                                         bool want_direct) {
  if (int err = Check(Op::kOpen)) return ErrnoStatus(err, Injected(absl::StrCat("open ", path)));
  return base_->Open(path, flags, mode, want_direct);
}

absl::Status FaultIo::Close(FileHandle& file) { return base_->Close(file); }

absl::Status FaultIo::WriteAll(const FileHandle& file, std::span<const IoSlice> slices) {
  if (int err = Check(Op::kWrite)) {
    return ErrnoStatus(err, Injected(TransferWhat("write", file, slices)));
  }
  return base_->WriteAll(file, slices);
}

absl::Status FaultIo::ReadAll(const FileHandle& file, std::span<const IoSlice> slices) {
  if (int err = Check(Op::kRead)) {
    return ErrnoStatus(err, Injected(TransferWhat("read", file, slices)));
  }
  return base_->ReadAll(file, slices);
}

absl::Status FaultIo::Fdatasync(const FileHandle& file) {
  if (int err = Check(Op::kSync)) {
    return ErrnoStatus(err, Injected(absl::StrCat("fdatasync ", file.path)));
  }
  return base_->Fdatasync(file);
}

absl::Status FaultIo::Fsync(const FileHandle& file) {
  if (int err = Check(Op::kSync)) {
    return ErrnoStatus(err, Injected(absl::StrCat("fsync ", file.path)));
  }
  return base_->Fsync(file);
}

absl::StatusOr<uint64_t> FaultIo::FileSize(const FileHandle& file) {
  return base_->FileSize(file);
}

absl::Status FaultIo::Rename(const std::string& from, const std::string& to) {
  if (int err = Check(Op::kRename)) {
    return ErrnoStatus(err, Injected(absl::StrCat("rename ", from, " -> ", to)));
  }
  return base_->Rename(from, to);
}

absl::Status FaultIo::FsyncDir(const std::string& dir) {
  if (int err = Check(Op::kFsyncDir)) {
    return ErrnoStatus(err, Injected(absl::StrCat("fsync directory ", dir)));
  }
  return base_->FsyncDir(dir);
}

absl::Status FaultIo::MkdirAll(const std::string& dir) {
  if (int err = Check(Op::kMkdir)) return ErrnoStatus(err, Injected(absl::StrCat("mkdir ", dir)));
  return base_->MkdirAll(dir);
}

absl::Status FaultIo::Unlink(const std::string& path) {
  if (int err = Check(Op::kUnlink)) {
    return ErrnoStatus(err, Injected(absl::StrCat("unlink ", path)));
  }
  return base_->Unlink(path);
}

absl::Status FaultIo::RemoveAll(const std::string& path) { return base_->RemoveAll(path); }

absl::StatusOr<std::vector<std::string>> FaultIo::ListDir(const std::string& dir) {
  return base_->ListDir(dir);
}

absl::StatusOr<bool> FaultIo::Exists(const std::string& path) { return base_->Exists(path); }

}  // namespace ckptd
