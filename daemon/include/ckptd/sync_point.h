// Named crash and race points (RocksDB's TEST_SYNC_POINT): CKPTD_SYNC_POINT("flush.blob_synced")
// marks one step of a write, commit, replication, delete, reshard or recovery path, so tests can
// stop the daemon exactly between two steps instead of guessing with sleeps.
//
// Compiled in only when the build sets CKPTD_TEST_HOOKS=1 (the CMake option CKPTD_TEST_HOOKS, ON
// in the dev/test build of `make build` / `make test`, OFF in `make release`). Without it every
// CKPTD_SYNC_POINT compiles to nothing (its name is still checked against kSyncPoints).
//
// With hooks, a point costs one relaxed atomic load while nothing is armed. Two ways to arm:
//   - ArmSyncPointCrash (the daemon's --debug_crash_at=<point>[:<nth>]): the nth time the point
//     is reached the process writes one line to stderr and SIGKILLs itself — a kill -9 at
//     exactly that step: nothing is flushed, no destructor runs, unsynced page-cache data stays
//     (the kernel keeps it), shared memory stays.
//   - SetSyncPointCallback (in-process tests): called at every point reached, on the thread
//     reaching it, possibly under the service's locks (it must not call back into the service).
//
// Every point is listed in kSyncPoints (one place, so a driver can iterate them all); a name
// used in CKPTD_SYNC_POINT that is not listed does not compile.
//
// Part of the plugin API (daemon/include/ckptd): a storage plugin names the steps of its own
// durable writes here too (posix's put_atomic.*), so the crash matrices cover them. The
// implementation lives in the daemon (daemon/src/common/sync_point.cc), linked into it.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string_view>

#include "absl/status/statusor.h"

#ifndef CKPTD_TEST_HOOKS
#define CKPTD_TEST_HOOKS 0
#endif

namespace ckptd {

// Whether this build has its sync points compiled in.
inline constexpr bool kTestHooks = CKPTD_TEST_HOOKS != 0;

// Every sync point, "<area>.<step>", in the order a save, an abort, a delete, a reshard and a
// restart reach them. Each names the state just reached: a crash there leaves exactly that step
// done and the next one not started.
inline constexpr std::string_view kSyncPoints[] = {
    // Save (save.cc): the rank's journal row, synced, makes it "staged".
    "save.before_journal",  // validated, extents taken; nothing journaled yet
    "save.journaled",       // the rank's row is synced; the client is about to hear "staged"
    // Flush (flush.cc): one rank's blob.
    "flush.blob_written",    // the blob's bytes are written, not yet fdatasync'd
    "flush.blob_synced",     // the blob is fdatasync'd; "persisted" not yet journaled
    "flush.rank_persisted",  // "persisted" is journaled (synced); extents not yet freed
    "flush.extents_freed",   // the rank's extents are back in the arena
    // Commit (commit.cc, and the manifest's PutAtomic in plugins/storage/posix).
    "commit.manifest_built",    // every rank persisted; the manifest is built, not written
    "put_atomic.tmp_synced",    // the manifest's temporary file is written and fsync'd
    "put_atomic.renamed",       // renamed to manifest.ckm; its directory not yet fsync'd
    "put_atomic.dir_synced",    // the directory is fsync'd: the manifest is durable
    "commit.manifest_durable",  // PutAtomic returned; the index row is not COMMITTED yet
    "commit.indexed",           // the COMMITTED row (and item rows) are synced
    // Upload to the remote tier (tier/remote_tier.cc): blobs, then the manifest, then the row.
    "upload.blobs_copied",  // every blob is durable on the store; the manifest is not
    "upload.manifest_put",  // the manifest is durable on the store; the row is not DURABLE
    "upload.durable",       // the 'U' row is DURABLE (synced)
    // A checkpoint spanning nodes (service/cluster.cc), on each node, then on the coordinator.
    "cluster.part_replicated",   // this node's part is on its peers (every copy acknowledged:
                                 // their memory); the part naming them is not published yet
    "cluster.part_published",    // this node's blobs and part are durable on the shared tier
    "cluster.decision_written",  // the coordinator's commit decision is durable; no manifest yet
    "cluster.manifest_written",  // the manifest is durable on the shared tier; the row is not
    "cluster.committed",         // the COMMITTED row is synced; this node's local blobs remain
    // The peer tier (peer/peer_server.cc), on a node receiving another node's part.
    "peer.copy_stored",  // a copy is verified and in this node's peer store (memory only); its
                         // sender has not heard the acknowledgement
    // Abort (save.cc RecordAbort): the ABORTED row first, then the files.
    "abort.recorded",       // the ABORTED row is synced, journal rows gone; files still there
    "abort.files_removed",  // the checkpoint's directory is removed (durably)
    // Delete (catalog.cc RemoveCheckpoint, also run by recovery for a tombstone).
    "delete.tombstone_written",  // the DELETING row is synced
    "delete.remote_removed",     // the remote copy and its 'U' row are gone (remote tier)
    "delete.manifest_removed",   // the manifest is gone (durably)
    "delete.dir_removed",        // the directory is gone (durably)
    "delete.rows_removed",       // item/rank/blob rows deleted (not synced); the row remains
    "delete.done",               // the checkpoint row is deleted (synced)
    // Offline reshard (reshard.cc); its commit goes through commit.* and put_atomic.* too.
    "reshard.target_recorded",      // the target's PERSISTING row is synced
    "reshard.blob_written",         // one target blob is written and synced
    "reshard.committed",            // the target's manifest and COMMITTED row are durable
    "reshard.abort_files_removed",  // a failed or cancelled reshard's files are removed
    // Recovery (recovery.cc), after each phase of Recover() and inside an abort it records.
    "recovery.rows_repaired",           // 1: rows that do not parse repaired
    "recovery.deletes_finished",        // 2: interrupted deletes finished
    "recovery.manifests_adopted",       // 3: manifests without a COMMITTED row adopted
    "recovery.aborted_files_removed",   // in an abort: files removed, ABORTED row not yet written
    "recovery.pending_resumed",         // 4: staged checkpoints resumed (flushes posted) or aborted
    "recovery.committed_rows_checked",  // 5: COMMITTED rows without a manifest marked MISSING
    "recovery.newest_verified",         // 6: each job's newest manifest verified
};
inline constexpr size_t kSyncPointCount = std::size(kSyncPoints);

// The index of `name` in kSyncPoints. Evaluated at compile time by CKPTD_SYNC_POINT: an unlisted
// name is not a constant expression there, so it does not compile.
consteval size_t SyncPointId(std::string_view name) {
  for (size_t i = 0; i < kSyncPointCount; ++i) {
    if (kSyncPoints[i] == name) return i;
  }
  throw "CKPTD_SYNC_POINT names a point that is not listed in kSyncPoints";
}

// Where --debug_crash_at kills the process: the nth time (from 1) `point` is reached.
struct SyncPointCrash {
  size_t point = 0;
  uint64_t nth = 1;
};
// Parses "<point>[:<nth>]"; INVALID_ARGUMENT naming what is wrong (an unknown point lists the
// areas; nth must be 1 or more). Works in every build; arming needs kTestHooks.
absl::StatusOr<SyncPointCrash> ParseSyncPointCrash(std::string_view spec);

// Arms the crash (see the top). FAILED_PRECONDITION in a build without hooks.
absl::Status ArmSyncPointCrash(const SyncPointCrash& crash);
// Called at every point reached (nullptr: none). For in-process tests; replaces the previous one.
using SyncPointCallback = std::function<void(size_t point)>;
void SetSyncPointCallback(SyncPointCallback callback);
// Disarms everything and zeroes the hit counts.
void ResetSyncPoints();
// How often `point` was reached while something was armed.
uint64_t SyncPointHits(size_t point);

namespace sync_point_internal {
extern std::atomic<bool> armed;
void Reached(size_t point);
}  // namespace sync_point_internal

}  // namespace ckptd

#if CKPTD_TEST_HOOKS
#define CKPTD_SYNC_POINT(name)                                                 \
  do {                                                                         \
    constexpr size_t ckptd_sync_point_id_ = ::ckptd::SyncPointId(name);        \
    if (::ckptd::sync_point_internal::armed.load(std::memory_order_relaxed)) { \
      ::ckptd::sync_point_internal::Reached(ckptd_sync_point_id_);             \
    }                                                                          \
  } while (0)
#else
#define CKPTD_SYNC_POINT(name)                                            \
  do {                                                                    \
    static_assert(::ckptd::SyncPointId(name) < ::ckptd::kSyncPointCount); \
  } while (0)
#endif
