// The S3 plugin's HTTP layer (internal): signed S3 requests over libcurl, many in flight on one
// curl multi handle, each retried on its own with exponential backoff and full jitter.
//
// A Request names what to send and where the answer goes; Client::Run sends a batch and returns
// once every request has succeeded (2xx) or one has failed for good, in which case the others
// still in flight are cancelled before Run returns — so when Run returns, no request of the batch
// touches its body or sink memory any more (the BlobWriter memory contract rests on this).
//
// Thread safety: Run may be called from many threads at once; each call takes a curl multi
// handle (with its connection cache) from a pool guarded by a mutex and gives it back after.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/s3/s3_storage.h"

namespace ckptd::s3 {

struct Request {
  // ---- what to send ----
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string key;     // the object key (already prefixed); empty: the bucket itself
  // Query string without '?', already canonical: parameters sorted by name, each "name=value"
  // (value possibly empty) and URI-encoded (QueryParams builds it). curl 7.88 signs it as is.
  std::string query;
  std::vector<std::string> headers;    // extra "Name: value" headers (signed)
  std::vector<std::string_view> body;  // sent back to back, read in place (not owned)
  // Success answers of a GET go here (exactly `sink_len` bytes expected at most); null: into
  // `response` (bounded by s3_limits::kGetBytesMax).
  char* sink = nullptr;
  uint64_t sink_len = 0;
  // A 200 answer whose body is an <Error> document is that error (CompleteMultipartUpload).
  bool error_in_200 = false;
  // A 404 answer counts as success (DELETE of what may be gone, HEAD of what may be absent).
  bool not_found_ok = false;

  // ---- what came back (the last attempt) ----
  long http_status = 0;
  std::string response;         // the body (the error body when a sink is set)
  std::string etag;             // the ETag header, quotes kept
  uint64_t received = 0;        // bytes written into sink
  int64_t content_length = -1;  // Content-Length of the answer (HEAD: the object's size)
  std::string error_code;       // S3 <Code> of an error answer
  std::string error_message;    // S3 <Message> of an error answer
  uint32_t attempts = 0;
};

// Encodes name=value pairs into a canonical query string (sorted, each part URI-encoded).
std::string QueryParams(std::vector<std::pair<std::string, std::string>> params);
// S3's URI encoding: unreserved characters kept, '/' kept iff keep_slash, the rest %XX.
std::string UriEncode(std::string_view s, bool keep_slash);

class Client {
 public:
  // `options` validated; the credentials are kept only to sign.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const S3Options& options,
                                                        S3Credentials credentials);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends every request, up to `in_flight` at once (see the top). OK iff all succeeded; else
  // the status of the first request that failed for good (s3_storage.h: the code mapping).
  absl::Status Run(std::span<Request* const> requests, uint32_t in_flight);
  // Run for requests made while it runs: `next` (on this thread) gives the next request, or null
  // when there are no more, or an error that ends the run as a failed request does; it is called
  // only while fewer than `in_flight` requests are outstanding (in flight or waiting to be
  // retried), so at most `in_flight` requests hold their memory at once. `succeeded` (may be
  // null; on this thread) is told each request that succeeded: its memory is the caller's again.
  absl::Status RunStream(const std::function<absl::StatusOr<Request*>()>& next,
                         const std::function<void(Request*)>& succeeded, uint32_t in_flight);
  absl::Status RunOne(Request& request) {
    Request* r = &request;
    return Run(std::span<Request* const>(&r, 1), 1);
  }

  // "PUT http://host:port bucket b key k" for messages (never a credential).
  std::string What(const Request& r) const;
  const S3Options& options() const { return options_; }

 private:
  struct Multi;
  class Stream;  // one RunStream's requests: in flight, backing off, ready (s3_http.cc)
  Client(const S3Options& options, S3Credentials credentials);
  std::string Url(const Request& r) const;

  std::unique_ptr<Multi> TakeMulti();
  void GiveBackMulti(std::unique_ptr<Multi> multi);

  friend struct Transfer;
  const S3Options options_;
  const S3Credentials credentials_;
  std::string sigv4_;  // "aws:amz:<region>:s3"
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Multi>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::s3
