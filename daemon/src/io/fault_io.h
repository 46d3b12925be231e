// FaultIo: an Io for fault tests. It forwards every call to a wrapped Io and, when armed, fails
// chosen calls with an injected errno instead (the wrapped Io is then not called, so nothing of
// a failed write reaches the file). Errors carry ErrnoStatus() codes and messages naming the path
// (and offset for transfers) with "(injected)" appended, exactly as a real failure would.
//
// Arming: FailNext(op, err) fails the next call of `op` once; FailOnceAfter(op, n, err) fails only
// the (n+1)th call from now; FailAfter(op, n, err) lets the next n calls of `op` through and fails
// every later one until Clear(op) / ClearAll(). Counters count every call, failed or not.
//
// Thread safety: every method may be called from several threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/io.h"

namespace ckptd {

class FaultIo : public Io {
 public:
  // The operations faults can be injected into. kSync covers both Fdatasync and Fsync.
  enum class Op { kOpen, kWrite, kRead, kSync, kFsyncDir, kRename, kMkdir, kUnlink, kCount };

  // Wraps `base`, which must outlive this FaultIo.
  explicit FaultIo(Io* base);
  // Wraps and owns `base`.
  explicit FaultIo(std::unique_ptr<Io> base);

  void FailNext(Op op, int err);
  void FailAfter(Op op, uint64_t n, int err);
  // Lets the next n calls of `op` through and fails the one after them, once.
  void FailOnceAfter(Op op, uint64_t n, int err);
  void Clear(Op op);
  void ClearAll();
  // Calls of `op` so far (including failed ones).
  uint64_t calls(Op op) const;

  // Shorthands for the common cases.
  void FailNextWrite(int err) { FailNext(Op::kWrite, err); }
  void FailWritesAfter(uint64_t n, int err) { FailAfter(Op::kWrite, n, err); }
  void FailNextRead(int err) { FailNext(Op::kRead, err); }
  void FailReadsAfter(uint64_t n, int err) { FailAfter(Op::kRead, n, err); }
  void FailNextSync(int err) { FailNext(Op::kSync, err); }
  void FailSyncsAfter(uint64_t n, int err) { FailAfter(Op::kSync, n, err); }
  void FailNextFsyncDir(int err) { FailNext(Op::kFsyncDir, err); }
  void FailNextRename(int err) { FailNext(Op::kRename, err); }
  void FailNextOpen(int err) { FailNext(Op::kOpen, err); }
  uint64_t write_calls() const { return calls(Op::kWrite); }
  uint64_t read_calls() const { return calls(Op::kRead); }
  uint64_t sync_calls() const { return calls(Op::kSync); }
  uint64_t rename_calls() const { return calls(Op::kRename); }
  uint64_t open_calls() const { return calls(Op::kOpen); }

  absl::StatusOr<FileHandle> Open(const std::string& path, int flags, mode_t mode,
                                  bool want_direct) override;
  absl::Status Close(FileHandle& file) override;
  absl::Status WriteAll(const FileHandle& file, std::span<const IoSlice> slices) override;
  absl::Status ReadAll(const FileHandle& file, std::span<const IoSlice> slices) override;
  absl::Status Fdatasync(const FileHandle& file) override;
  absl::Status Fsync(const FileHandle& file) override;
  absl::StatusOr<uint64_t> FileSize(const FileHandle& file) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status FsyncDir(const std::string& dir) override;
  absl::Status MkdirAll(const std::string& dir) override;
  absl::Status Unlink(const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;

 private:
  struct Fault {
    bool armed = false;
    bool once = false;     // FailNext: disarm after firing
    uint64_t pass_left = 0;  // calls still let through before failing
    int err = 0;
  };
  static constexpr size_t kOps = static_cast<size_t>(Op::kCount);

  // Counts the call; returns the errno to inject, or 0 to forward it.
  int Check(Op op);

  std::unique_ptr<Io> owned_;
  Io* base_;
  mutable absl::Mutex mu_;
  std::array<Fault, kOps> faults_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, kOps> calls_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace ckptd
