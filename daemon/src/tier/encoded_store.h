// Encoded blobs on the remote store (format/blob_encoding.h; docs/BLOB_FORMAT.md "Encoded blobs on
// the store"): writing one (EncodeBlob, the remote tier's upload with remote_codec on) and reading
// through them (EncodedStore, the remote tier's Storage as every reader of the store sees it).
//
// EncodedStore wraps the store's plugin. Every call passes through, except OpenBlob: for a blob
// whose checkpoint's manifest on the store records an encoding, it opens the encoded object and
// answers a BlobReader of the raw bytes, which fetches only the frames covering what is read,
// decodes them (each frame checked: format/codec.h) and copies the bytes asked out; the caller
// then checks its block crc32c as for any blob. A blob without an encoding (older uploads, the
// remote policy's flush, the peer tier's node uploads) opens as is. So the load and reshard
// paths, verify, the RAM tier's prefetch and a fresh daemon adopting from the store all read
// encoded blobs without knowing of them.
//
// Ownership: borrows the plugin (outlives it). Owns a cache of the encodings of the checkpoints
// it opened blobs of (at most limits::kEncodedStoreDirsCachedMax directories; manifests on the
// store are immutable once written, and this wrapper forgets a directory when it writes its
// manifest or removes anything). A manifest another daemon rewrote meanwhile (deleted and saved
// again under the same step) can leave a stale entry: the object's size then disagrees with the
// record, and the blob is opened again with the manifest read afresh once before DATA_LOSS.
// Threads: any (the cache has its own lock, never held across I/O); a reader by one thread at a
// time (it has its own lock too). Errors: the plugin's; DATA_LOSS naming the blob (and the
// chunk) for a manifest on the store that does not decode, an object whose size disagrees with
// its record, or a frame that does not decode.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/storage.h"
#include "ckptd/v1/manifest.pb.h"
#include "common/worker_pool.h"
#include "format/blob_encoding.h"

namespace ckptd {

class EncodedStore : public Storage {
 public:
  explicit EncodedStore(Storage* store) : store_(store) {}

  Storage* plugin() const { return store_; }

  std::string Describe() const override { return store_->Describe(); }
  // False: a decoded read copies into the caller's memory (no direct reads into destinations).
  bool ReadsThroughKernel() const override { return false; }
  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override {
    return store_->CreateBlob(path);
  }
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CopyBlobsFrom(std::span<const BlobCopy> copies, std::atomic<uint64_t>* progress,
                             const std::function<bool()>& stop) override {
    return store_->CopyBlobsFrom(copies, progress, stop);
  }
  absl::Status PutAtomic(const std::string& path, std::string_view data) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutIfAbsent(const std::string& path, std::string_view data) override {
    return store_->PutIfAbsent(path, data);
  }
  absl::StatusOr<std::string> Get(const std::string& path) override { return store_->Get(path); }
  absl::StatusOr<bool> Exists(const std::string& path) override { return store_->Exists(path); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    return store_->List(dir);
  }
  absl::Status RemoveAll(const std::string& path) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Blob name -> its frames, for the blobs of one checkpoint directory that are encoded.
  using Encodings = absl::flat_hash_map<std::string, BlobFrames>;
  // The encodings the manifest of `dir` on the store records (empty when it records none or the
  // store has no manifest there: not cached then). `fresh`: read the manifest again.
  absl::StatusOr<std::shared_ptr<const Encodings>> EncodingsOf(const std::string& dir, bool fresh)
      ABSL_LOCKS_EXCLUDED(mu_);
  // *stale: the object's size disagrees with the cached record (not set for a fresh one).
  absl::StatusOr<std::unique_ptr<BlobReader>> Open(const std::string& path, bool fresh,
                                                   bool* stale);

  Storage* const store_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Encodings>> cache_ ABSL_GUARDED_BY(mu_);
};

// What one EncodeBlob call reads and writes.
struct EncodeBlobJob {
  std::string path;         // for errors
  uint64_t size_bytes = 0;  // raw bytes of the blob (the source's first size_bytes)
  uint64_t chunk_bytes = 0;
  std::span<const uint8_t> planes;  // one per chunk (ChunkPlanes)
  int zstd_level = 0;               // checked by ValidateZstdLevel
  uint64_t piece_bytes = 0;  // raw bytes read at a time: a multiple of chunk_bytes and of 4096
};

// Encodes the blob `src` into `dst`: reads pieces of job.piece_bytes (the next on `readers`
// while this one is encoded and written), encodes each chunk with its plane count, writes the
// frames back to back from offset 0, and Syncs. Adds the raw bytes consumed to *progress; asks
// `stop` between pieces (true: CANCELLED). Returns the record of the object written. Errors:
// the reader's and writer's (annotated with the path), RESOURCE_EXHAUSTED without memory for
// the buffers, the encoder's INTERNAL.
absl::StatusOr<v1::BlobEncoding> EncodeBlob(const EncodeBlobJob& job, BlobReader& src,
                                            BlobWriter& dst, WorkerPool* readers,
                                            std::atomic<uint64_t>* progress,
                                            const std::function<bool()>& stop);

}  // namespace ckptd
