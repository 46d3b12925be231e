#include "io/fault_io.h"

#include <fcntl.h>

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
  const bool writes = (flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) != 0;
  if (!writes) return base_->Open(path, flags, mode, want_direct);
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("open ", path, " for writing")));
  if (!tracking()) return base_->Open(path, flags, mode, want_direct);
  absl::MutexLock lock(&pl_mu_);
  CKPTD_RETURN_IF_ERROR(TrackOpenLocked(path));
  return base_->Open(path, flags, mode, want_direct);
}

absl::Status FaultIo::Close(FileHandle& file) { return base_->Close(file); }

absl::Status FaultIo::WriteAll(const FileHandle& file, std::span<const IoSlice> slices) {
  if (int err = Check(Op::kWrite)) {
    return ErrnoStatus(err, Injected(TransferWhat("write", file, slices)));
  }
  CKPTD_RETURN_IF_ERROR(CheckCrashed(TransferWhat("write", file, slices)));
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
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("fdatasync ", file.path)));
  CKPTD_RETURN_IF_ERROR(base_->Fdatasync(file));
  if (!tracking()) return absl::OkStatus();
  absl::MutexLock lock(&pl_mu_);
  return TrackSyncLocked(file.path);
}

absl::Status FaultIo::Fsync(const FileHandle& file) {
  if (int err = Check(Op::kSync)) {
    return ErrnoStatus(err, Injected(absl::StrCat("fsync ", file.path)));
  }
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("fsync ", file.path)));
  CKPTD_RETURN_IF_ERROR(base_->Fsync(file));
  if (!tracking()) return absl::OkStatus();
  absl::MutexLock lock(&pl_mu_);
  return TrackSyncLocked(file.path);
}

absl::StatusOr<uint64_t> FaultIo::FileSize(const FileHandle& file) { return base_->FileSize(file); }
absl::StatusOr<uint64_t> FaultIo::CachedBytes(const FileHandle& file, uint64_t offset,
                                              uint64_t len) {
  return base_->CachedBytes(file, offset, len);
}

absl::Status FaultIo::Rename(const std::string& from, const std::string& to) {
  if (int err = Check(Op::kRename)) {
    return ErrnoStatus(err, Injected(absl::StrCat("rename ", from, " -> ", to)));
  }
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("rename ", from, " -> ", to)));
  if (!tracking()) return base_->Rename(from, to);
  absl::MutexLock lock(&pl_mu_);
  return TrackRenameLocked(from, to);
}

absl::Status FaultIo::RenameNoReplace(const std::string& from, const std::string& to) {
  const std::string what = absl::StrCat("rename (no replace) ", from, " -> ", to);
  if (int err = Check(Op::kRename)) return ErrnoStatus(err, Injected(what));
  CKPTD_RETURN_IF_ERROR(CheckCrashed(what));
  if (!tracking()) return base_->RenameNoReplace(from, to);
  // pl_mu_ serializes every namespace change made through this FaultIo, so the check and the
  // rename cannot be split by another of them.
  absl::MutexLock lock(&pl_mu_);
  CKPTD_ASSIGN_OR_RETURN(bool exists, base_->Exists(to));
  if (exists) return ErrnoStatus(EEXIST, what);
  return TrackRenameLocked(from, to);
}

absl::Status FaultIo::FsyncDir(const std::string& dir) {
  if (int err = Check(Op::kFsyncDir)) {
    return ErrnoStatus(err, Injected(absl::StrCat("fsync directory ", dir)));
  }
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("fsync directory ", dir)));
  CKPTD_RETURN_IF_ERROR(base_->FsyncDir(dir));
  if (!tracking()) return absl::OkStatus();
  absl::MutexLock lock(&pl_mu_);
  CommitDirLocked(dir);
  return absl::OkStatus();
}

absl::Status FaultIo::MkdirAll(const std::string& dir) {
  if (int err = Check(Op::kMkdir)) return ErrnoStatus(err, Injected(absl::StrCat("mkdir ", dir)));
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("mkdir ", dir)));
  if (!tracking()) return base_->MkdirAll(dir);
  absl::MutexLock lock(&pl_mu_);
  return TrackMkdirLocked(dir);
}

absl::Status FaultIo::Unlink(const std::string& path) {
  if (int err = Check(Op::kUnlink)) {
    return ErrnoStatus(err, Injected(absl::StrCat("unlink ", path)));
  }
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("unlink ", path)));
  if (!tracking()) return base_->Unlink(path);
  absl::MutexLock lock(&pl_mu_);
  CKPTD_ASSIGN_OR_RETURN(bool exists, base_->Exists(path));
  if (!exists) return base_->Unlink(path);  // NOT_FOUND, as the real call says
  return TrackRemoveLocked(path);
}

absl::Status FaultIo::RemoveAll(const std::string& path) {
  CKPTD_RETURN_IF_ERROR(CheckCrashed(absl::StrCat("remove ", path)));
  if (!tracking()) return base_->RemoveAll(path);
  absl::MutexLock lock(&pl_mu_);
  CKPTD_ASSIGN_OR_RETURN(bool exists, base_->Exists(path));
  if (!exists) return absl::OkStatus();
  return TrackRemoveLocked(path);
}

absl::StatusOr<std::vector<std::string>> FaultIo::ListDir(const std::string& dir) {
  return base_->ListDir(dir);
}

absl::StatusOr<bool> FaultIo::Exists(const std::string& path) { return base_->Exists(path); }

}  // namespace ckptd
