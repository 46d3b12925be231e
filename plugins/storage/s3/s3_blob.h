// The S3 plugin's BlobWriter and BlobReader (internal; the contract is in s3_storage.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "ckptd/storage.h"
#include "storage/s3/s3_http.h"

namespace ckptd::s3 {

// `client` must outlive both.
std::unique_ptr<BlobWriter> NewBlobWriter(Client* client, std::string key);
std::unique_ptr<BlobReader> NewBlobReader(Client* client, std::string key, uint64_t size_bytes);

// One blob for CopyBlobs: its key (prefixed) and where to read it.
struct KeyedSource {
  std::string key;
  BlobReader* source;
};
// Storage::CopyBlobsFrom (s3_storage.h): every blob uploaded whole, parts_in_flight parts in
// flight from the first part of the first blob to the last of the last (each read from its
// source into one of parts_in_flight part buffers as a slot frees), then each completed. On an
// error every upload not completed is aborted.
absl::Status CopyBlobs(Client* client, std::span<const KeyedSource> blobs,
                       std::atomic<uint64_t>* progress, const std::function<bool()>& stop);

// Aborts the multipart upload `upload_id` of `key` (an upload already gone is OK).
absl::Status AbortUpload(Client* client, const std::string& key, const std::string& upload_id);

}  // namespace ckptd::s3
