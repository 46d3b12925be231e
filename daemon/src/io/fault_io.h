// FaultIo: an Io for fault tests. It forwards every call to a wrapped Io and, when armed, fails
// chosen calls with an injected errno instead (the wrapped Io is then not called, so nothing of
// a failed write reaches the file). Errors carry ErrnoStatus() codes and messages naming the path
// (and offset for transfers) with "(injected)" appended, exactly as a real failure would.
//
// Arming: FailNext(op, err) fails the next call of `op` once; FailOnceAfter(op, n, err) fails only
// the (n+1)th call from now; FailAfter(op, n, err) lets the next n calls of `op` through and fails
// every later one until Clear(op) / ClearAll(). Counters count every call, failed or not.
//
// Power loss (fault_io_power_loss.cc), off until EnablePowerLoss(trash_dir). From then on FaultIo
// remembers what a power loss would keep, counting everything on disk at that moment as durable:
//   - a file's data as of its last Fsync/Fdatasync through this FaultIo (a file that existed
//     before it was first opened for writing counts as synced as it was; one created since and
//     never synced comes back empty);
//   - directory entries: a file created, renamed over or removed (Unlink, RemoveAll) is durable
//     only once its directory is FsyncDir'd (MkdirAll is durable, as Io promises: its parents
//     count as synced). Until then Unlink and RemoveAll only move the entry into `trash_dir`
//     (same file system, outside every tree the code under test lists) so it can be put back.
// Crash() fences the disk as a dead process would see it: every later call that would change a
// file or a directory fails with EIO "(crashed)"; reads still work. PowerLoss() then leaves the
// files as the power loss would (unsynced namespace changes undone newest first, file data
// reverted to what was synced), clears the crash and starts the model again from that state.
// Directories are never renamed by the code under test; the model does not cover that.
//
// Thread safety: every method may be called from several threads at once.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
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

  // Power loss (see the top). `trash_dir` is created; it must be on the same file system as
  // every path written.
  absl::Status EnablePowerLoss(const std::string& trash_dir);
  void Crash();
  bool crashed() const { return crashed_.load(); }
  // The state after a power loss at Crash() (or now): see the top. Only while no other call
  // runs. INTERNAL naming the path when the disk cannot be put back.
  absl::Status PowerLoss();

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
  // Counted and failed as Op::kRename; tracked for power loss as a rename that replaced nothing.
  absl::Status RenameNoReplace(const std::string& from, const std::string& to) override;
  absl::Status FsyncDir(const std::string& dir) override;
  absl::Status MkdirAll(const std::string& dir) override;
  absl::Status Unlink(const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::StatusOr<bool> Exists(const std::string& path) override;

 private:
  struct Fault {
    bool armed = false;
    bool once = false;       // FailNext: disarm after firing
    uint64_t pass_left = 0;  // calls still let through before failing
    int err = 0;
  };
  static constexpr size_t kOps = static_cast<size_t>(Op::kCount);

  // Counts the call; returns the errno to inject, or 0 to forward it.
  int Check(Op op);

  // --- power loss (fault_io_power_loss.cc) ---
  // A namespace change not yet made durable by an FsyncDir of its directory.
  struct NamespaceOp {
    enum Kind { kCreate, kRename, kRemove } kind = kCreate;
    std::string path;   // created, renamed to, or removed
    std::string from;   // kRename: the old name
    std::string trash;  // kRemove: where the entry is; kRename: the entry it replaced, if any
    std::optional<std::string> displaced_synced;  // kRename: what the replaced file kept
  };
  bool tracking() const { return tracking_.load(); }
  // EIO "(crashed)" naming `what` once Crash() was called, else OK.
  absl::Status CheckCrashed(const std::string& what) const;
  // Before a file is opened for writing: remembers its durable content (or its creation).
  absl::Status TrackOpenLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  absl::Status TrackSyncLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  absl::Status TrackRenameLocked(const std::string& from, const std::string& to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  // Unlink / RemoveAll of an existing `path`: moved to the trash until its directory is synced.
  absl::Status TrackRemoveLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  absl::Status TrackMkdirLocked(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  // FsyncDir(dir) happened: the changes of entries in `dir` are durable.
  void CommitDirLocked(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  absl::Status UndoLocked(const NamespaceOp& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);
  std::string NextTrashLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pl_mu_);

  std::unique_ptr<Io> owned_;
  Io* base_;
  mutable absl::Mutex mu_;
  std::array<Fault, kOps> faults_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, kOps> calls_ ABSL_GUARDED_BY(mu_){};

  std::atomic<bool> tracking_{false};
  std::atomic<bool> crashed_{false};
  // Serializes the namespace calls and syncs while tracking, so ops_ is in the disk's order.
  absl::Mutex pl_mu_;
  std::string trash_dir_ ABSL_GUARDED_BY(pl_mu_);
  uint64_t trash_seq_ ABSL_GUARDED_BY(pl_mu_) = 0;
  // Files written since tracking began → the data a power loss keeps (nullopt: empty).
  std::map<std::string, std::optional<std::string>> synced_ ABSL_GUARDED_BY(pl_mu_);
  std::vector<NamespaceOp> ops_ ABSL_GUARDED_BY(pl_mu_);  // oldest first
};

}  // namespace ckptd
