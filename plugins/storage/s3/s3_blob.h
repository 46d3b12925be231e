// The S3 plugin's BlobWriter and BlobReader (internal; the contract is in s3_storage.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckptd/storage.h"
#include "storage/s3/s3_http.h"

namespace ckptd::s3 {

// `client` must outlive both.
std::unique_ptr<BlobWriter> NewBlobWriter(Client* client, std::string key);
std::unique_ptr<BlobReader> NewBlobReader(Client* client, std::string key, uint64_t size_bytes);

// Aborts the multipart upload `upload_id` of `key` (an upload already gone is OK).
absl::Status AbortUpload(Client* client, const std::string& key, const std::string& upload_id);

}  // namespace ckptd::s3
