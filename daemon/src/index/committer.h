// Committer: every synced index write of the service goes through here — journal rows of staged
// ranks, "persisted" rows, COMMITTED rows, ABORTED rows, DELETING tombstones, CORRUPT markings and
// reshard targets. Group commit as LevelDB's writer queue (DBImpl::Write): writers queue their
// batches in one FIFO; a waiter that finds a write slot free becomes a leader, takes the batches
// queued at the front (bounded by kGroupBatchesMax / kGroupBytesMax) and writes them as one synced
// MetaStore::CommitGroup — one WAL fsync for all — while the others wait; then it wakes them with
// their results. Unlike LevelDB, up to kLeadersMax groups are written at once, so one slow or
// stuck write (a device hiccup, a test holding it) does not stop every other writer: the next
// group forms and is written beside it.
//
// Order: every batch names an order key (the checkpoint it is about: index/keys.h Checkpoint);
// batches of one key are applied in the order they were queued — a group never takes a batch
// whose key is in a group being written, nor one queued after such a batch. A caller that must
// order its rows (the journal of one checkpoint: a newer summary lands after an older one)
// enqueues them under its own lock, in that order, and awaits with its lock released — so no
// synced write holds a lock other calls wait on across the fsync.
//
// Ownership: borrows the MetaStore (it outlives the committer). Owns the queue.
// Threads: any thread may Enqueue and Await, concurrently; Await blocks the caller until its
// batch is durable or failed (a leader's thread does the write). Never call Await holding a lock
// that a caller of the committer may wait on (the lifecycle lock, the catalog lock).
// Errors: what MetaStore::CommitGroup answers for the batch (RocksDB writes a group as one
// WriteBatch, so all of it fails alike).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "index/meta_store.h"

namespace ckptd {

class Committer {
 public:
  // A group holds at most this many batches, and grows past kGroupBytesMax by one batch at most
  // (a large batch is never split), so one writer's latency stays bounded.
  static constexpr size_t kGroupBatchesMax = 64;
  static constexpr uint64_t kGroupBytesMax = 1 << 20;
  // Groups written at once.
  static constexpr int kLeadersMax = 2;

  explicit Committer(MetaStore* meta) : meta_(meta) {}

  struct Writer {
    std::string order_key;
    std::vector<MetaStore::Write> writes;
    bool done = false;  // guarded by Committer::mu_, as is status
    absl::Status status;
  };
  // A queued batch: pass it to Await.
  using Ticket = std::shared_ptr<Writer>;

  // Queues `writes` as one atomic batch after everything queued before under `order_key`.
  // Never blocks on I/O.
  Ticket Enqueue(std::string order_key, std::vector<MetaStore::Write> writes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the batch of `ticket` is durable (or its write failed), leading a group write
  // when a slot is free; returns its status.
  absl::Status Await(const Ticket& ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Enqueue + Await.
  absl::Status Commit(std::string order_key, std::vector<MetaStore::Write> writes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return Await(Enqueue(std::move(order_key), std::move(writes)));
  }

  // Synced group writes done so far, and the batches they carried (batches / groups is the
  // group commit's gain).
  uint64_t groups() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t batches() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Whether a free slot could take a group now: a batch is queued whose key is not being
  // written (and none queued before it under that key waits).
  bool CanLeadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the group at the front of the queue for the caller to write; marks its keys written.
  std::vector<Ticket> TakeGroupLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes `group` (mu_ released around the write) and hands each writer its status.
  void WriteGroupLocked(std::vector<Ticket> group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetaStore* const meta_;
  mutable absl::Mutex mu_;
  std::deque<Ticket> queue_ ABSL_GUARDED_BY(mu_);
  int leaders_ ABSL_GUARDED_BY(mu_) = 0;  // groups being written
  absl::flat_hash_set<std::string> writing_keys_ ABSL_GUARDED_BY(mu_);
  uint64_t groups_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd
