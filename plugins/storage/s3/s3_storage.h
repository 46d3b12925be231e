// S3Storage: a Storage (ckptd/storage.h) on any S3-compatible object store (AWS S3, MinIO, Ceph
// RGW, SeaweedFS), over libcurl with SigV4 signing (CURLOPT_AWS_SIGV4) and pugixml for the XML
// answers.
//
// Layout: a storage path "job/step/r0.blob" is the object key "<prefix>/job/step/r0.blob" in
// `bucket` (no prefix: the path itself). A "directory" is a key prefix ending in '/'.
//
// Operations:
//   - CreateBlob: a BlobWriter (see storage.h for the caller's memory contract). Nothing is
//     visible until Sync. Writes must cover the blob contiguously from offset 0 in increasing
//     offset order; a gap, an overlap or a slice out of order is INVALID_ARGUMENT (and the
//     writer is then failed). Every full part_size_bytes of data goes out as one UploadPart of a
//     multipart upload, up to parts_in_flight at once, read straight from the caller's slices;
//     less than a part left at the end of a Write is copied into the writer (< one part). A
//     blob smaller than one part is one PUT at Sync. Sync sends the last part and completes the
//     upload (a 200 answer carrying an <Error> counts as the error it names). Any failure, and
//     a writer destroyed before Sync, aborts the multipart upload: no orphaned parts are left
//     (best effort: an abort that fails is logged, and RemoveAll of a prefix aborts leftovers).
//   - OpenBlob: one HEAD for the size (NOT_FOUND if absent). BlobReader::Read issues ranged GETs
//     of exactly each slice (adjacent slices merged, large ones split in part_size_bytes pieces),
//     get_in_flight at once, written straight into the slice buffers; a body shorter than asked,
//     or a slice past the blob's end, is DATA_LOSS.
//   - PutAtomic: one PUT (an S3 PUT is atomic: readers see the old object or the new one).
//   - PutIfAbsent: one PUT with "If-None-Match: *" (412 → ALREADY_EXISTS). A store that answers
//     501 / NotImplemented to it (older MinIO, Ceph RGW before Squid) gets a best effort
//     instead, logged once: HEAD, then a plain PUT if absent — NOT atomic against a concurrent
//     writer. SeaweedFS 4.48 and AWS S3 honour the header. A retried attempt that meets 412
//     reads the object back: if it holds `data`, the earlier attempt won and the call is OK.
//   - Get (GET), Exists (HEAD, then a one-key list: a "directory" exists while a key lies under
//     it), List (ListObjectsV2 with delimiter '/', paginated, names sorted), RemoveAll (DELETE of
//     the key, every key under "<key>/", and an abort of every multipart upload in progress
//     under them; absent is OK).
//
// Durability: whatever S3 acknowledged is durable; Sync and PutAtomic return once it has.
//
// Errors: every answer's status is checked. A message names the method, endpoint, bucket and
// key, the HTTP status and the S3 error Code and Message — never a credential. 404 → NOT_FOUND
// (NoSuchBucket names the bucket), 403 → PERMISSION_DENIED, 400 → INVALID_ARGUMENT, 412 →
// FAILED_PRECONDITION (ALREADY_EXISTS from PutIfAbsent), 501 → UNIMPLEMENTED. Retried with
// exponential backoff and full jitter: 5xx but 501, 429, SlowDown, RequestTimeout, and connection
// failures (refused, reset, timed out, empty reply); when retries_max attempts are spent the
// call is UNAVAILABLE. Other 4xx are never retried.
//
// Credentials (never logged, never in Describe() or an error): S3Options::credentials if set;
// else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN); else the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials), profile
// AWS_PROFILE (default "default"). A session token is sent as x-amz-security-token.
//
// Thread safety: the Storage may be used from many threads at once (each request has its own
// curl easy handle; connections are shared through one curl share handle); a BlobWriter or
// BlobReader by one thread at a time. Writers and readers must not outlive the storage.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ckptd/storage.h"
#include "ckptd/storage_registry.h"

namespace ckptd {

// The plugin's limits, all in one place.
namespace s3_limits {
// S3's own bounds on multipart uploads: parts of 5 MiB..5 GiB (the last one may be smaller),
// at most 10000 of them.
inline constexpr uint64_t kPartSizeMinBytes = 5ull << 20;
inline constexpr uint64_t kPartSizeMaxBytes = 5ull << 30;
inline constexpr uint32_t kPartsMax = 10000;
// A single PUT (PutAtomic, PutIfAbsent, a blob under one part) carries at most 5 GiB.
inline constexpr uint64_t kPutBytesMax = 5ull << 30;
// Requests in flight for one writer / one reader / one RemoveAll.
inline constexpr uint32_t kInFlightMax = 64;
inline constexpr uint32_t kRetriesMax = 20;
inline constexpr uint32_t kBackoffMaxMs = 60'000;
inline constexpr uint32_t kTimeoutMaxMs = 3'600'000;
// Keys per ListObjectsV2 / ListMultipartUploads page (S3's own maximum).
inline constexpr uint32_t kListPageKeys = 1000;
// A Get or a response body read into memory (XML answers, small objects): bigger is
// RESOURCE_EXHAUSTED (use OpenBlob for big objects).
inline constexpr uint64_t kGetBytesMax = 1ull << 30;
inline constexpr size_t kKeyBytesMax = 1024;  // S3's key length limit
}  // namespace s3_limits

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: none
};

struct S3Options {
  // Base URL of the store, "http(s)://host[:port]" (no path). Default: none (required)
  std::string endpoint;
  // Default: none (required)
  std::string bucket;
  // Key prefix, without leading or trailing '/'; empty: keys are the paths. Default: ""
  std::string prefix;
  // SigV4 signing region. Default: "us-east-1"
  std::string region = "us-east-1";
  // true: "<endpoint>/<bucket>/<key>" (MinIO, SeaweedFS, Ceph); false: virtual-host style
  // "<scheme>://<bucket>.<host>/<key>" (AWS). Default: true
  bool path_style = true;
  // Verify the server's TLS certificate and host name (https endpoints). Default: true
  bool tls_verify = true;
  // CA bundle file for TLS verification; empty: the system's. Default: ""
  std::string ca_path;
  // Size of every multipart part but the last, in [5 MiB, 5 GiB]; blobs smaller than this go
  // as one PUT. Also the largest single ranged GET. Default: 16 MiB
  uint64_t part_size_bytes = 16ull << 20;
  // UploadPart requests in flight per writer (so a writer may hold parts_in_flight parts of
  // caller memory at once, only during Write). Default: 8
  uint32_t parts_in_flight = 8;
  // Ranged GETs in flight per BlobReader::Read, and DELETEs per RemoveAll. Default: 8
  uint32_t get_in_flight = 8;
  // Attempts after the first for a retryable failure. Default: 5
  uint32_t retries_max = 5;
  // Backoff before retry n (0-based): uniform in [0, min(backoff_max_ms, backoff_base_ms·2^n)].
  // Default: 100
  uint32_t backoff_base_ms = 100;
  // Default: 5000
  uint32_t backoff_max_ms = 5000;
  // TCP (+TLS) connect timeout. Default: 5000
  uint32_t connect_timeout_ms = 5000;
  // Whole-request timeout (one attempt, e.g. one part); a timed-out attempt is retried.
  // Default: 300000
  uint32_t request_timeout_ms = 300'000;
  // Explicit credentials; unset: the standard places (see the top). Default: unset
  std::optional<S3Credentials> credentials;

  // INVALID_ARGUMENT naming the first bad option.
  absl::Status Validate() const;
};

// Credentials from the environment or the shared credentials file (see the top): NOT_FOUND if
// none, INVALID_ARGUMENT naming the file and profile if the file is malformed. Never logs them.
absl::StatusOr<S3Credentials> LoadS3Credentials();

// Validates `options`, finds the credentials and checks the bucket is reachable with them (a
// ListObjectsV2 of one key under the prefix): NOT_FOUND (no such bucket), PERMISSION_DENIED
// (wrong credentials or no access), UNAVAILABLE (store unreachable after the retries), each
// naming the endpoint and bucket.
absl::StatusOr<std::unique_ptr<Storage>> NewS3Storage(S3Options options);

// Registers scheme "s3" (s3_register.cc): "s3://bucket[/prefix]" opens NewS3Storage with that
// bucket and prefix. Settings (the S3Options of the same names): "endpoint", "region",
// "ca_path", "path_style" and "tls_verify" ("true"/"false"), "part_size_bytes",
// "parts_in_flight"; another name, or a value that does not parse, is INVALID_ARGUMENT naming
// it. Errors: Register's.
absl::Status RegisterS3Storage(StorageRegistry& registry);

}  // namespace ckptd
