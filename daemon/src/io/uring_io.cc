// io_uring implementation of Io's batched transfers. Namespace and sync operations are plain
// syscalls inherited from PosixIo: they are rare and cheap next to the data path.
//
// Each thread that calls WriteAll/ReadAll gets its own ring (thread_local, created on first use,
// sized to the largest queue depth asked for on that thread), so calls never contend on a ring.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "io/posix_io.h"
#include "spdlog/spdlog.h"

namespace ckptd::io_internal {
namespace {

bool IsRefused(int err) { return err == ENOSYS || err == EPERM || err == EACCES; }

void LogFallbackOnce(int err) {
  static std::once_flag once;
  std::call_once(once, [err] {
    spdlog::warn("io_uring is refused here ({}, errno {}); using pread/pwrite instead",
                 std::strerror(err), err);
  });
}

// The calling thread's ring. Torn down when the thread exits.
struct ThreadRing {
  io_uring ring{};
  unsigned entries = 0;  // 0 = no ring

  ~ThreadRing() { Reset(); }
  void Reset() {
    if (entries != 0) io_uring_queue_exit(&ring);
    entries = 0;
  }
  // Returns 0 or a negative errno from io_uring_queue_init.
  int Ensure(unsigned want_entries) {
    if (entries >= want_entries) return 0;
    Reset();
    int rc = io_uring_queue_init(want_entries, &ring, 0);
    if (rc < 0) return rc;
    entries = want_entries;
    return 0;
  }
};

thread_local ThreadRing tls_ring;

// Walks the slices chunk by chunk (each at most kIoChunkBytesMax).
class ChunkCursor {
 public:
  explicit ChunkCursor(std::span<const IoSlice> slices) : slices_(slices) {}
  struct Chunk {
    char* buf;
    uint64_t len;
    uint64_t offset;
  };
  bool Next(Chunk* chunk) {
    while (index_ < slices_.size() && done_ >= slices_[index_].len) {
      ++index_;
      done_ = 0;
    }
    if (index_ == slices_.size()) return false;
    const IoSlice& s = slices_[index_];
    chunk->buf = static_cast<char*>(s.buf) + done_;
    chunk->len = std::min(s.len - done_, limits::kIoChunkBytesMax);
    chunk->offset = s.offset + done_;
    done_ += chunk->len;
    return true;
  }

 private:
  std::span<const IoSlice> slices_;
  size_t index_ = 0;
  uint64_t done_ = 0;
};

// One batched call: keeps up to `depth` chunks in flight on `ring`, resubmits the remainder of
// short transfers, and never returns while the kernel still holds one of the caller's buffers.
class Batch {
 public:
  Batch(io_uring* ring, uint32_t depth, bool is_write, const FileHandle& file,
        std::span<const IoSlice> slices)
      : ring_(ring), is_write_(is_write), file_(file), cursor_(slices), ops_(depth) {
    for (uint32_t i = 0; i < depth; ++i) free_.push_back(depth - 1 - i);
  }

  // Returns the first failure. Sets *ring_broken when the ring itself failed (the caller then
  // discards it, so unsubmitted entries are never submitted later).
  absl::Status Run(bool* ring_broken) {
    while (true) {
      ChunkCursor::Chunk chunk;
      while (status_.ok() && !broken_ && !free_.empty() && cursor_.Next(&chunk)) {
        uint32_t slot = free_.back();
        free_.pop_back();
        ops_[slot] = chunk;
        Prepare(slot);
      }
      if (unsubmitted_ > 0 && !broken_) Submit();
      if (in_kernel_ == 0) {
        if (unsubmitted_ == 0 || broken_) break;
        continue;  // the submit was interrupted before the kernel took anything: retry
      }
      Reap();
    }
    *ring_broken = broken_;
    return status_;
  }

 private:
  void Prepare(uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_);
    // The ring has at least `depth` entries and at most `depth` ops are ever outstanding.
    CKPTD_CHECK(sqe != nullptr);
    const ChunkCursor::Chunk& op = ops_[slot];
    auto len = static_cast<unsigned>(op.len);  // <= kIoChunkBytesMax
    if (is_write_) {
      io_uring_prep_write(sqe, file_.fd, op.buf, len, op.offset);
    } else {
      io_uring_prep_read(sqe, file_.fd, op.buf, len, op.offset);
    }
    io_uring_sqe_set_data64(sqe, slot);
    ++unsubmitted_;
  }

  void Submit() {
    int rc = io_uring_submit(ring_);
    if (rc >= 0) {
      unsubmitted_ -= static_cast<unsigned>(rc);
      in_kernel_ += static_cast<unsigned>(rc);
      return;
    }
    // Transient: completions must be reaped first (or a signal came); retry after reaping.
    if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && in_kernel_ > 0) return;
    if (rc == -EINTR) return;
    Fail(ErrnoStatus(-rc, absl::StrCat("io_uring_submit for ", file_.path)));
    broken_ = true;
  }

  void Reap() {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(ring_, &cqe);
    if (rc == -EINTR || rc == -EAGAIN) return;
    if (rc < 0) {
      // The ring no longer reports completions: nothing more can be learned from it.
      Fail(ErrnoStatus(-rc, absl::StrCat("io_uring_wait_cqe for ", file_.path)));
      broken_ = true;
      in_kernel_ = 0;
      return;
    }
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(ring_, head, cqe) {
      Complete(static_cast<uint32_t>(io_uring_cqe_get_data64(cqe)), cqe->res);
      ++seen;
    }
    io_uring_cq_advance(ring_, seen);
  }

  void Complete(uint32_t slot, int res) {
    CKPTD_CHECK(slot < ops_.size() && in_kernel_ > 0);
    --in_kernel_;
    ChunkCursor::Chunk& op = ops_[slot];
    if (res == -EINTR || res == -EAGAIN) {
      if (status_.ok() && !broken_) return Prepare(slot);
    } else if (res < 0) {
      Fail(ErrnoStatus(-res, TransferContext(is_write_, file_, op.offset, op.len)));
    } else if (res == 0) {
      if (is_write_) {
        Fail(absl::DataLossError(
            absl::StrCat(TransferContext(is_write_, file_, op.offset, op.len), ": wrote 0 bytes")));
      } else {
        Fail(ShortFileStatus(file_, op.offset, op.len));
      }
    } else {
      auto n = static_cast<uint64_t>(res);
      CKPTD_CHECK(n <= op.len);
      op.buf += n;
      op.offset += n;
      op.len -= n;
      if (op.len > 0 && !is_write_ && file_.direct && op.offset % limits::kAlignmentBytes != 0) {
        // O_DIRECT reads stop short only at the end of the file (see posix_io.cc).
        Fail(ShortFileStatus(file_, op.offset, op.len));
      } else if (op.len > 0 && status_.ok() && !broken_) {
        return Prepare(slot);  // short transfer: the remainder
      }
    }
    free_.push_back(slot);
  }

  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  io_uring* ring_;
  bool is_write_;
  const FileHandle& file_;
  ChunkCursor cursor_;
  std::vector<ChunkCursor::Chunk> ops_;  // by slot
  std::vector<uint32_t> free_;           // free slots
  unsigned unsubmitted_ = 0;             // prepared, not yet taken by the kernel
  unsigned in_kernel_ = 0;               // submitted, completion not yet reaped
  bool broken_ = false;
  absl::Status status_;
};

class UringIo : public PosixIo {
 public:
  explicit UringIo(uint32_t queue_depth) : depth_(queue_depth) {}

  absl::Status WriteAll(const FileHandle& file, std::span<const IoSlice> slices) override {
    return Transfer(true, file, slices);
  }
  absl::Status ReadAll(const FileHandle& file, std::span<const IoSlice> slices) override {
    return Transfer(false, file, slices);
  }

 private:
  absl::Status Transfer(bool is_write, const FileHandle& file, std::span<const IoSlice> slices) {
    if (slices.empty()) return absl::OkStatus();
    int rc = tls_ring.Ensure(depth_);
    if (rc < 0) {
      if (IsRefused(-rc)) {
        LogFallbackOnce(-rc);
        return is_write ? PosixIo::WriteAll(file, slices) : PosixIo::ReadAll(file, slices);
      }
      return ErrnoStatus(-rc, absl::StrCat("io_uring_queue_init(", depth_, ") for ", file.path));
    }
    bool ring_broken = false;
    absl::Status status = Batch(&tls_ring.ring, depth_, is_write, file, slices).Run(&ring_broken);
    if (ring_broken) tls_ring.Reset();
    return status;
  }

  uint32_t depth_;
};

}  // namespace

bool UringSupported() {
  static const int probe_err = [] {
    io_uring ring;
    int rc = io_uring_queue_init(1, &ring, 0);
    if (rc < 0) return -rc;
    io_uring_queue_exit(&ring);
    return 0;
  }();
  if (probe_err != 0) LogFallbackOnce(probe_err);
  return probe_err == 0;
}

}  // namespace ckptd::io_internal

namespace ckptd {

std::unique_ptr<Io> NewUringIo(uint32_t queue_depth) {
  if (!io_internal::UringSupported()) return NewPosixIo();
  uint32_t depth = std::clamp<uint32_t>(queue_depth, 1, limits::kIoQueueDepthMax);
  return std::make_unique<io_internal::UringIo>(depth);
}

}  // namespace ckptd
