#include "io/reader_pool.h"

#include <algorithm>
#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/status.h"

namespace ckptd {

struct ReadTicket::State {
  State(std::string w, uint64_t pieces) : what(std::move(w)), remaining(pieces) {}
  const std::string what;  // names the read in a cancellation's message
  // Set at the first failure: pieces that have not started skip their read.
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  uint64_t remaining ABSL_GUARDED_BY(mu);
  absl::Status status ABSL_GUARDED_BY(mu);

  void Finish(uint64_t pieces, absl::Status st) {
    absl::MutexLock lock(&mu);
    if (!st.ok()) {
      failed = true;
      if (status.ok()) status = std::move(st);
    }
    remaining -= pieces;
  }
};

absl::Status ReadTicket::Wait() const {
  if (state_ == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(
      +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->remaining == 0; },
      state_.get()));
  return state_->status;
}

bool ReadTicket::done() const {
  if (state_ == nullptr) return true;
  absl::MutexLock lock(&state_->mu);
  return state_->remaining == 0;
}

ReaderPool::ReaderPool(Io* io, Options options)
    : io_(io),
      options_(std::move(options)),
      workers_(options_.name, options_.readers, options_.queue_max) {
  CKPTD_CHECK(options_.piece_bytes > 0 && options_.piece_bytes % kIoAlignmentBytes == 0);
}

namespace {

WorkerPool::Task CancellableTask(const std::shared_ptr<ReadTicket::State>& state,
                                 std::function<void()> run) {
  return WorkerPool::Task{std::move(run), [state] {
                            state->Finish(1, absl::CancelledError(absl::StrCat(
                                                 state->what, ": the reader pool shut down")));
                          }};
}

}  // namespace

absl::StatusOr<ReadTicket> ReaderPool::SubmitBlobRead(BlobReader* reader,
                                                      std::vector<IoSlice> slices, std::string what,
                                                      WorkerPool::WhenFull when_full) {
  CKPTD_CHECK(reader != nullptr);
  if (slices.empty()) return ReadTicket();
  auto state = std::make_shared<ReadTicket::State>(std::move(what), 1);
  CKPTD_RETURN_IF_ERROR(workers_.Post(CancellableTask(state,
                                                      [state, reader, slices = std::move(slices)] {
                                                        state->Finish(1, reader->Read(slices));
                                                      }),
                                      when_full));
  return ReadTicket(state);
}

ReaderPool::~ReaderPool() { workers_.Shutdown(WorkerPool::ShutdownMode::kCancel); }

absl::StatusOr<ReadTicket> ReaderPool::Submit(const ReadRequest& req,
                                              WorkerPool::WhenFull when_full) {
  if (io_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "read of ", req.file.path, ": the ", options_.name, " pool reads only through Storage"));
  }
  if (req.length == 0) return ReadTicket();
  if (req.dst == nullptr || req.offset > UINT64_MAX - req.length) {
    return absl::InvalidArgumentError(absl::StrCat("read of ", req.file.path, " at offset ",
                                                   req.offset, " (", req.length,
                                                   " bytes): no destination or past 2^64"));
  }
  const uint64_t piece = options_.piece_bytes;
  const uint64_t pieces = (req.length + piece - 1) / piece;
  auto state = std::make_shared<ReadTicket::State>(absl::StrCat("read of ", req.file.path), pieces);
  auto file = std::make_shared<const FileHandle>(req.file);
  std::vector<WorkerPool::Task> tasks;
  tasks.reserve(pieces);
  for (uint64_t k = 0; k < pieces; ++k) {
    const uint64_t at = k * piece;
    IoSlice slice{static_cast<uint8_t*>(req.dst) + at, std::min(piece, req.length - at),
                  req.offset + at};
    tasks.push_back(CancellableTask(state, [io = io_, state, file, slice] {
      if (state->failed.load()) return state->Finish(1, absl::OkStatus());
      state->Finish(1, io->ReadAll(*file, std::span<const IoSlice>(&slice, 1)));
    }));
  }
  // A request larger than the whole queue goes in as room frees (kWait only).
  absl::Status st;
  size_t posted = 0;
  if (pieces > options_.queue_max && when_full == WorkerPool::WhenFull::kWait) {
    for (WorkerPool::Task& t : tasks) {
      st = workers_.Post(std::move(t), when_full);
      if (!st.ok()) break;
      ++posted;
    }
  } else {
    st = workers_.PostBatch(std::move(tasks), when_full, &posted);
  }
  if (st.ok()) return ReadTicket(state);
  // Pieces never queued count as done; the queued ones are waited for, so no reader writes into
  // the destination once this returns.
  state->Finish(pieces - posted, st);
  ReadTicket ticket(state);
  (void)ticket.Wait();
  return st;
}

std::vector<absl::Status> ReaderPool::ReadAll(std::span<const ReadRequest> requests) {
  std::vector<absl::StatusOr<ReadTicket>> tickets;
  tickets.reserve(requests.size());
  for (const ReadRequest& r : requests) {
    tickets.push_back(Submit(r, WorkerPool::WhenFull::kWait));
  }
  std::vector<absl::Status> out;
  out.reserve(requests.size());
  for (absl::StatusOr<ReadTicket>& t : tickets) out.push_back(t.ok() ? t->Wait() : t.status());
  return out;
}

}  // namespace ckptd
