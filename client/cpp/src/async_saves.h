// Internal to libckptd-client: the threads that run Client::SaveAsync's saves (the overlapped
// save, issue 37 §2; docs/USER_GUIDE.md "Overlapping the save with compute").
//
// Resources, who owns them, what ends them:
//   - The save threads: owned by AsyncSaves (one per Client), started lazily by the first
//     Submit (at most `threads`), joined by the destructor after the queue is drained. Each
//     lowers its own CPU priority once (setpriority on its thread id, `nice` > 0) so the copy
//     yields the cores to the trainer's compute it overlaps; a failure to do so (a seccomp
//     policy) is ignored: the save still runs, at the normal priority.
//   - A queued or running save: its State is shared by the PendingSave the caller holds and by
//     the queue entry. The caller's memory (the shards' bytes) is read until the State is done;
//     the caller promises it stays alive and unchanged until then (WaitStaged). So every end of
//     a PendingSave that could free that memory waits first: ~PendingSave waits, and
//     ~AsyncSaves (the Client's destruction) runs every queued save to its end before it joins.
//   - The bound: at most `max_in_flight` saves queued or running per client; one more is refused
//     with RESOURCE_EXHAUSTED naming the limit (never queued without bound, never dropped).
// When the other side fails: a daemon that dies or restarts makes the running Save fail (or
// re-connect, as Save does); the State then holds that error and WaitStaged returns it. Close()
// of the client does not cancel queued saves: they run and fail with the closed session's
// FAILED_PRECONDITION, so every PendingSave ends with an answer.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/client.h"

namespace ckptd::internal {

// One save's answer, set once by the save thread.
struct AsyncSaveState {
  absl::Mutex mu;
  std::optional<absl::StatusOr<SaveResult>> result ABSL_GUARDED_BY(mu);  // set once
};

class AsyncSaves {
 public:
  // threads >= 1; nice in [0, 19] (0: the threads keep the caller's priority); max_in_flight >= 1.
  AsyncSaves(uint32_t threads, int nice, uint32_t max_in_flight);
  ~AsyncSaves();  // runs what is queued, then joins the threads
  AsyncSaves(const AsyncSaves&) = delete;
  AsyncSaves& operator=(const AsyncSaves&) = delete;

  // Queues `save` (run on a save thread, its answer stored in the returned state);
  // RESOURCE_EXHAUSTED when max_in_flight saves are queued or running.
  absl::StatusOr<std::shared_ptr<AsyncSaveState>> Submit(
      std::function<absl::StatusOr<SaveResult>()> save);

  // Saves queued or running now (for tests and the error message).
  uint32_t in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::function<absl::StatusOr<SaveResult>()> save;
    std::shared_ptr<AsyncSaveState> state;
  };
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const uint32_t threads_max_;
  const int nice_;
  const uint32_t max_in_flight_;
  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  uint32_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> pool_ ABSL_GUARDED_BY(mu_);  // joined by the destructor
};

// Blocks until `state` holds its answer, then returns it.
absl::StatusOr<SaveResult> AwaitSave(AsyncSaveState& state) ABSL_LOCKS_EXCLUDED(state.mu);
// Whether `state` holds its answer (never blocks).
bool SaveDone(AsyncSaveState& state) ABSL_LOCKS_EXCLUDED(state.mu);

}  // namespace ckptd::internal
