// RemoteTier: the tier above local storage (docs/DESIGN.md "Tiers"). A checkpoint saved under the
// policy TIER_LOCAL_AND_REMOTE commits locally as always; its COMMITTED row is written in one
// synced batch with a PENDING upload row ('U' key, index/keys.h), and this part then copies it
// to the remote store in the background: every blob (read from local storage, written to the
// store, synced), then the manifest last (so the store never shows a manifest whose blobs are not
// all there), then the row DURABLE (synced). The remote copy keeps the checkpoint's relative
// directory, so the store is self-contained: any daemon configured with it loads from it.
//
// Ownership: borrows options, index, committer and both storages (they outlive it). Owns the
// tracked uploads (at most limits::kUploadsTrackedMax in memory; the rest stay PENDING in the
// index and are taken up as tracked ones finish), its threads ("upload-<i>",
// options.upload_threads), joined by Stop or the destructor, and a read pool ("upload-read",
// one thread per upload thread plus one for CopyBlobs). A store that streams copies itself
// (Storage::CopyBlobsFrom: S3) gets the local blobs of a checkpoint in batches and keeps its
// parts in flight across them; for any other store each blob is copied in chunks, the read pool
// reading the next chunk while the store takes this one (each copy in flight holds two buffers
// of options.upload_chunk_bytes and waits for its read in flight before it returns).
// Lifetimes: an upload lives from its PENDING row until its row is DURABLE or Remove deletes it
// with the checkpoint. A failed attempt (store down, 5xx, a local read error) is retried after a
// backoff doubling from 1 s to options.upload_retry_max_ms, forever: the checkpoint stays
// COMMITTED locally meanwhile, with the last error shown in its status. Stop abandons an attempt
// between two chunks; its row stays PENDING and the next start copies it again from the start
// (blobs are rewritten whole; the manifest is written only after every blob).
// Ownership on the store (docs/SECURITY.md "Ownership"): the store records each job's owner in
// <job>/owner.ckj (kJobOwnerFileName), claimed with PutIfAbsent by the first write of the job's
// data there (an upload, a node part, a TIER_REMOTE flush: ClaimStoreOwner). A write for another
// owner (mapped to uids here, common/owner_map.h) is refused with PERMISSION_DENIED: an upload so
// refused is UPLOAD_REFUSED and not retried until restart, and nothing of it reaches the store.
// Remove leaves a store copy another owner's job holds there. So a uid that claimed a job name
// on a node which had not seen the job can neither overwrite nor delete another uid's data on the
// shared store. Verified owners are cached per job (at most kStoreOwnersCachedMax).
// Threads: every public method from any thread. No lock is held across I/O: mu_ guards only the
// tracked set. The caller's locks (the lifecycle lock) must not be held across WaitDurable or
// Remove (both wait).
// Errors: the storages' and the index's; WaitDurable's FAILED_PRECONDITION for a checkpoint with
// no upload and DEADLINE_EXCEEDED naming the upload's state, progress and last error.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckptd/storage.h"
#include "ckptd/v1/index.pb.h"
#include "common/worker_pool.h"
#include "format/manifest.h"
#include "index/committer.h"
#include "index/meta_store.h"
#include "options.h"
#include "tier/encoded_store.h"

namespace ckptd {

class RemoteTier {
 public:
  // `remote` null: no remote tier (enabled() false; Track is a bug, the reads answer "none").
  // remote() is `remote` seen through an EncodedStore (tier/encoded_store.h): its readers decode
  // the blobs this tier stored encoded (remote_codec).
  RemoteTier(const DaemonOptions* options, MetaStore* meta, Committer* committer, Storage* local,
             Storage* remote);
  ~RemoteTier();

  bool enabled() const { return remote_ != nullptr; }
  Storage* remote() const { return remote_; }

  // The 'U' row of (job, step) for the caller's COMMITTED batch: UPLOAD_PENDING for a new upload,
  // UPLOAD_DURABLE for a checkpoint adopted from the store (already there).
  MetaStore::Write NewRow(const std::string& job, uint64_t step, const std::string& dir,
                          uint64_t bytes_total, v1::UploadState state) const;

  // Starts the upload threads and tracks every upload the index holds that is not DURABLE (a
  // restart resumes them). Once, after recovery.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Tracks the upload of (job, step) whose PENDING row is durable. Never blocks on I/O.
  void Track(const std::string& job, uint64_t step, const std::string& dir)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The 'U' row of (job, step), if any; DATA_LOSS when it does not parse.
  absl::StatusOr<std::optional<v1::UploadRecord>> ReadRow(const std::string& job,
                                                          uint64_t step) const;
  // Every 'U' row of `job`, by step (rows that do not parse are skipped).
  absl::StatusOr<std::map<uint64_t, v1::UploadRecord>> ReadRows(const std::string& job) const;
  // Fills out->remote and out->upload from `row` and, while it is being copied, its progress.
  void Fill(const std::string& job, uint64_t step, const std::optional<v1::UploadRecord>& row,
            v1::Tiers* out) const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until (job, step) is durable on the store (OK) or `deadline` (DEADLINE_EXCEEDED naming
  // state, progress and last error). FAILED_PRECONDITION when it has no upload.
  absl::Status WaitDurable(const std::string& job, uint64_t step, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For Delete (and recovery finishing one): stops the upload of (job, step) if one runs (waits
  // for its thread to let go), removes the remote copy (the manifest first, then the directory)
  // and the 'U' row (synced). Idempotent; OK when it has no remote copy or no remote tier. With
  // `owner_uid` (the job's owner here): a remote copy of a job the store records for another
  // owner is left there (only the row goes), with a warning.
  absl::Status Remove(const std::string& job, uint64_t step, const std::string& dir,
                      std::optional<uint32_t> owner_uid = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);

  // Claims `job` on the store for `owner` (the owner record a manifest or node part of it holds)
  // unless the store records an owner already: OK when the store's owner is `owner` (both mapped
  // to a uid here); PERMISSION_DENIED naming both when it is another; DATA_LOSS for an owner file
  // that does not parse; the store's error otherwise. Store I/O on the caller's thread (none once
  // the job is cached as verified).
  absl::Status ClaimStoreOwner(const std::string& job, const v1::Owner& owner)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Copies blobs of `dir` (path relative to `dir`, the size they must have; 0: the blob may be
  // absent, a rank that stored only replicas writes none) from local storage to the store, each
  // synced, on the caller's thread: a node's share of a checkpoint spanning nodes
  // (service/cluster.cc). CANCELLED once the tier stops.
  absl::Status CopyBlobs(const std::string& dir,
                         const std::vector<std::pair<std::string, uint64_t>>& blobs);

  // The uploads tracked now (queued, running or retrying), by (job, step).
  std::vector<std::pair<std::string, uint64_t>> Tracked() const ABSL_LOCKS_EXCLUDED(mu_);
  // Shutdown's drain (SIGTERM): waits until no upload is tracked or waiting in the index (every
  // one durable, or deleted), or `deadline`; the threads keep working meanwhile (an upload in a
  // retry's backoff is tried again when it is due). It stops waiting early when every upload left
  // failed its last attempt and none is running (a store that refuses them). Returns the uploads
  // still not durable then, each with its state and progress (empty: drained). Stop() afterwards
  // abandons those.
  std::vector<std::pair<std::pair<std::string, uint64_t>, v1::Upload>> Drain(absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the threads; an attempt in flight is abandoned between chunks (its row stays).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Uploads made durable since start.
  uint64_t durable_count() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Upload {
    std::string job;
    uint64_t step = 0;
    std::string dir;
    // Guarded by mu_ (the thread running it reads `cancel` through the atomic).
    v1::Upload state;
    bool running = false;
    absl::Time next_attempt = absl::InfinitePast();
    std::atomic<bool> cancel{false};
    std::atomic<uint64_t> bytes_done{0};
  };
  using Key = std::pair<std::string, uint64_t>;

  void ThreadMain() ABSL_LOCKS_EXCLUDED(mu_);
  // The runnable upload due first (not running, its backoff over), or null; *wake is when the
  // next one becomes due.
  std::shared_ptr<Upload> NextLocked(absl::Time now, absl::Time* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tracks rows of the index not tracked yet, up to kUploadsTrackedMax.
  absl::Status RefillFromIndex() ABSL_LOCKS_EXCLUDED(mu_);
  // One attempt: blobs, the manifest, the DURABLE row.
  absl::Status Attempt(Upload& u);
  // The uid here of the owner the store records for `job`; nullopt when it records none.
  // PERMISSION_DENIED when the record maps to no uid here, DATA_LOSS when it does not parse.
  absl::StatusOr<std::optional<uint32_t>> StoreOwnerUid(const std::string& job);
  // Whether the store records `job` for another owner than `uid` (the cache of verified owners
  // first; a record that maps to no uid here or does not parse counts as another's).
  absl::StatusOr<bool> StoreOwnedByOther(const std::string& job, uint32_t uid)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Copies blobs of `dir` (as CopyBlobs) to the store: in batches of kUploadBatchBlobsMax,
  // each one Storage::CopyBlobsFrom (the store reads and streams them), or for a store without it
  // CopyBlob of each.
  absl::Status CopyAll(Upload& u, const std::string& dir,
                       const std::vector<std::pair<std::string, uint64_t>>& blobs);
  // One blob through CreateBlob, Write and Sync: chunks of upload_chunk_bytes, the next read
  // (on the read pool) while this one is written.
  absl::Status CopyBlob(Upload& u, const std::string& path, BlobReader& reader);
  // The blobs of an attempt to the store: CopyAll, or with remote_codec (not for `own_part`)
  // EncodeAll, *manifest then being the store's manifest (m with the encodings).
  absl::Status StoreBlobs(Upload& u, bool own_part,
                          const std::vector<std::pair<std::string, uint64_t>>& blobs, Manifest* m,
                          std::string* manifest) ABSL_LOCKS_EXCLUDED(mu_);
  // remote_codec: every blob of `m` with bytes stored encoded (EncodeBlob, chunks of `chunk`
  // bytes) in `dir` on the store; the record of each set in m->header's BlobInfo.encoding.
  absl::Status EncodeAll(Upload& u, const std::string& dir, uint64_t chunk, Manifest* m);
  absl::Status WriteRow(const Upload& u, const v1::Upload& state);
  // After an attempt: forget it (durable or cancelled) or schedule its retry.
  void Finished(const std::shared_ptr<Upload>& u, const absl::Status& st)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DaemonOptions* const options_;
  MetaStore* const meta_;
  Committer* const committer_;
  Storage* const local_;
  // The store's plugin behind the decoding view every reader gets (null without a remote tier).
  const std::unique_ptr<EncodedStore> store_;
  Storage* const remote_;  // store_, or null

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // an upload became runnable, finished, or let go; stopping
  std::map<Key, std::shared_ptr<Upload>> tracked_ ABSL_GUARDED_BY(mu_);
  // Jobs whose owner on the store was verified (or claimed): job -> the owner's uid here.
  absl::flat_hash_map<std::string, uint32_t> store_owners_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool refill_ ABSL_GUARDED_BY(mu_) = false;  // the index may hold rows not tracked
  uint64_t durable_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  // Reads the next chunk of a blob from local storage while the store takes the current one
  // (CopyBlob); null without a remote tier. Destroyed after Stop joined the upload threads.
  std::unique_ptr<WorkerPool> readers_;
};

}  // namespace ckptd
