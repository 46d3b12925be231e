// ReaderPool: a fixed set of long-lived reader threads ("reader-<i>") that read file ranges into
// callers' buffers through the Io seam (ckptd/io.h). It replaces a thread made per load batch:
// the io_uring implementation keeps one ring per calling thread (uring_io.cc), so a reader that
// lives as long as the pool keeps its ring for its whole life instead of building one per batch,
// and with FaultIo as the Io every read can be made to fail (EIO, ...).
//
// A request (file, offset, length, destination) larger than the pool's piece size is split into
// pieces that several readers read at once; each piece is one Io::ReadAll, which keeps up to
// piece_bytes / limits::kIoChunkBytesMax transfers in flight on that reader's ring. Pieces of all
// requests wait in one bounded queue (limits::kReaderQueueMax): readers take the next piece as
// soon as they finish one, so the disk queue stays full across requests and batches.
//
// Each request completes with its own Status (ReadTicket::Wait): OK once every byte is in place;
// the first failure of its pieces otherwise (ErrnoStatus codes from Io: DATA_LOSS for EIO or a
// file shorter than the range, ...), the message naming the path and offset. After a failure the
// request's pieces not yet started are skipped; Wait returns only when none is still writing
// into the destination, so the caller may then free it. A request dropped by Shutdown(kCancel)
// completes CANCELLED.
//
// Reads through a Storage plugin (SubmitBlobRead: a BlobReader and its slices, as the loader
// reads a batch of runs of one blob) run on the same readers, as one task each: a BlobReader is
// used by one thread at a time (storage.h), so such a read is never split. The posix plugin reads
// through the daemon's Io, so these too use the reader's long-lived ring.
//
// Submission: WhenFull::kWait waits for room in the queue (backpressure; a request of more pieces
// than the queue holds goes in as room frees); WhenFull::kRefuse answers RESOURCE_EXHAUSTED
// unless the queue has room for all of its pieces. UNAVAILABLE once the pool is shut down.
// INVALID_ARGUMENT for a request with no destination, or one whose end overflows.
//
// Thread safety: every method may be called from any thread at once, except Submit(kWait),
// SubmitBlobRead(kWait), ReadAll and Shutdown from a reader thread (a CHECK). The Io must outlive
// the pool; a request's file (or BlobReader) must stay open and its destination valid until its
// ticket is done.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/io.h"
#include "ckptd/storage.h"
#include "common/limits.h"
#include "common/worker_pool.h"

namespace ckptd {

struct ReadRequest {
  FileHandle file;  // opened through the pool's Io; for an O_DIRECT file, offset, length and
                    // dst must be kIoAlignmentBytes multiples (Io's rule)
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dst = nullptr;  // length bytes
};

// The completion of one request. Copyable; every copy sees the same outcome.
class ReadTicket {
 public:
  struct State;
  ReadTicket() = default;  // done, OK
  explicit ReadTicket(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Blocks until every piece of the request is done; returns the request's Status.
  absl::Status Wait() const;
  bool done() const;

 private:
  std::shared_ptr<State> state_;
};

class ReaderPool {
 public:
  struct Options {
    std::string name = "reader";
    size_t readers = limits::kReaderPoolThreads;
    size_t queue_max = limits::kReaderQueueMax;  // pieces
    // A multiple of kIoAlignmentBytes (so pieces of an O_DIRECT read stay aligned), > 0.
    uint64_t piece_bytes = limits::kReaderPieceBytes;
  };
  // `io` must outlive the pool; null for a pool that serves only SubmitBlobRead (Submit is then
  // FAILED_PRECONDITION). Option values out of range are a bug (a CHECK).
  ReaderPool(Io* io, Options options);
  explicit ReaderPool(Io* io) : ReaderPool(io, Options{}) {}
  ~ReaderPool();  // Shutdown(kCancel)

  absl::StatusOr<ReadTicket> Submit(const ReadRequest& request, WorkerPool::WhenFull when_full);
  // Reads every slice through `reader` on one reader thread; `what` names the read in a
  // cancellation's message (e.g. the blob's path). The reader's own errors are the ticket's.
  absl::StatusOr<ReadTicket> SubmitBlobRead(BlobReader* reader, std::vector<IoSlice> slices,
                                            std::string what, WorkerPool::WhenFull when_full);
  // Submits every request (kWait) and waits for all; one Status per request, in order.
  std::vector<absl::Status> ReadAll(std::span<const ReadRequest> requests);

  void Shutdown(WorkerPool::ShutdownMode mode) { workers_.Shutdown(mode); }

  // The reader threads themselves, for work that must run on a reader's long-lived ring but is
  // not a plain file range: a Storage plugin's BlobReader::Read (the loader's batches).
  WorkerPool& workers() { return workers_; }
  const Options& options() const { return options_; }

 private:
  Io* io_;
  Options options_;
  WorkerPool workers_;
};

}  // namespace ckptd
