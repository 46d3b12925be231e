// S3Storage (s3_storage.h): paths to keys, listings, removal, the atomic puts and the start-up
// check. The HTTP (signing, retries, concurrency) is s3_http.cc; blobs are s3_blob.cc.
#include "storage/s3/s3_storage.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/storage_path.h"
#include "pugixml.hpp"
#include "spdlog/spdlog.h"
#include "storage/s3/s3_blob.h"
#include "storage/s3/s3_http.h"

namespace ckptd {

absl::Status S3Options::Validate() const {
  auto bad = [](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("S3 options: ", std::string(what)));
  };
  const bool http = absl::StartsWith(endpoint, "http://");
  const bool https = absl::StartsWith(endpoint, "https://");
  if (!http && !https) return bad("endpoint must start with http:// or https://");
  std::string_view host = std::string_view(endpoint).substr(http ? 7 : 8);
  if (host.empty() || host.find('/') != std::string_view::npos) {
    return bad("endpoint must be scheme://host[:port], with no path or trailing '/'");
  }
  if (bucket.empty() || bucket.size() > 255 || bucket.find_first_of("/?#") != std::string::npos) {
    return bad("bucket must be a non-empty bucket name");
  }
  if (!prefix.empty() && (prefix.front() == '/' || prefix.back() == '/')) {
    return bad("prefix must not begin or end with '/'");
  }
  if (absl::Status s = ValidateStoragePath(prefix, true); !s.ok()) {
    return bad(absl::StrCat("prefix: ", s.message()));
  }
  if (region.empty() || region.find(':') != std::string::npos) {
    return bad("region must be non-empty, without ':'");
  }
  if (part_size_bytes < s3_limits::kPartSizeMinBytes ||
      part_size_bytes > s3_limits::kPartSizeMaxBytes) {
    return bad(absl::StrCat("part_size_bytes must be in [", s3_limits::kPartSizeMinBytes, ", ",
                            s3_limits::kPartSizeMaxBytes, "]"));
  }
  if (parts_in_flight < 1 || parts_in_flight > s3_limits::kInFlightMax || get_in_flight < 1 ||
      get_in_flight > s3_limits::kInFlightMax) {
    return bad(absl::StrCat("parts_in_flight and get_in_flight must be in [1, ",
                            s3_limits::kInFlightMax, "]"));
  }
  if (retries_max > s3_limits::kRetriesMax) {
    return bad(absl::StrCat("retries_max must be at most ", s3_limits::kRetriesMax));
  }
  if (backoff_base_ms < 1 || backoff_max_ms < backoff_base_ms ||
      backoff_max_ms > s3_limits::kBackoffMaxMs) {
    return bad(
        absl::StrCat("need 1 <= backoff_base_ms <= backoff_max_ms <= ", s3_limits::kBackoffMaxMs));
  }
  if (connect_timeout_ms < 1 || connect_timeout_ms > s3_limits::kTimeoutMaxMs ||
      request_timeout_ms < 1 || request_timeout_ms > s3_limits::kTimeoutMaxMs) {
    return bad(absl::StrCat("connect_timeout_ms and request_timeout_ms must be in [1, ",
                            s3_limits::kTimeoutMaxMs, "]"));
  }
  if (credentials &&
      (credentials->access_key_id.empty() || credentials->secret_access_key.empty())) {
    return bad("credentials need an access key id and a secret access key");
  }
  return absl::OkStatus();
}

namespace {

using s3::Client;
using s3::QueryParams;
using s3::Request;

// One page of a ListObjectsV2 (or ListMultipartUploads) answer.
struct ListPage {
  std::vector<std::string> keys;      // Contents/Key (uploads: Upload/Key)
  std::vector<std::string> uploads;   // Upload/UploadId, beside keys
  std::vector<std::string> prefixes;  // CommonPrefixes/Prefix
  std::string next_token;             // empty: last page
};

absl::StatusOr<ListPage> ParseList(const Client& client, const Request& r, bool uploads) {
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(r.response.data(), r.response.size());
  pugi::xml_node root = doc.child(uploads ? "ListMultipartUploadsResult" : "ListBucketResult");
  if (!parsed || !root) {
    return absl::InternalError(absl::StrCat(
        client.What(r), " (", r.query, "): the answer is not a listing: ", parsed.description()));
  }
  ListPage page;
  for (pugi::xml_node n : root.children(uploads ? "Upload" : "Contents")) {
    page.keys.emplace_back(n.child_value("Key"));
    if (uploads) page.uploads.emplace_back(n.child_value("UploadId"));
  }
  for (pugi::xml_node n : root.children("CommonPrefixes")) {
    page.prefixes.emplace_back(n.child_value("Prefix"));
  }
  if (std::string_view(root.child_value("IsTruncated")) == "true") {
    if (uploads) {
      page.next_token = absl::StrCat(root.child_value("NextKeyMarker"), "\n",
                                     root.child_value("NextUploadIdMarker"));
    } else {
      page.next_token = root.child_value("NextContinuationToken");
    }
    if (page.next_token.empty() || page.next_token == "\n") {
      return absl::InternalError(
          absl::StrCat(client.What(r), ": a truncated listing without a continuation marker"));
    }
  }
  return page;
}

class S3Storage : public Storage {
 public:
  explicit S3Storage(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  std::string Describe() const override {
    const S3Options& o = client_->options();
    return absl::StrCat("s3:", o.endpoint, "/", o.bucket, o.prefix.empty() ? "" : "/", o.prefix);
  }

  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, false));
    return s3::NewBlobWriter(client_.get(), std::move(key));
  }

  absl::Status CopyBlobsFrom(std::span<const BlobCopy> copies, std::atomic<uint64_t>* progress,
                             const std::function<bool()>& stop) override {
    std::vector<s3::KeyedSource> keyed;
    for (const BlobCopy& c : copies) {
      CKPTD_ASSIGN_OR_RETURN(std::string key, Key(c.path, false));
      keyed.push_back({std::move(key), c.source});
    }
    return s3::CopyBlobs(client_.get(), keyed, progress, stop);
  }

  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, false));
    Request r = Simple("HEAD", key);
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    if (r.content_length < 0) {
      return absl::InternalError(absl::StrCat(client_->What(r), ": no Content-Length"));
    }
    return s3::NewBlobReader(client_.get(), std::move(key),
                             static_cast<uint64_t>(r.content_length));
  }

  absl::Status PutAtomic(const std::string& path, std::string_view data) override {
    CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, false));
    CKPTD_RETURN_IF_ERROR(CheckPutSize(key, data));
    Request r = Simple("PUT", key);
    r.body.push_back(data);
    return client_->RunOne(r);
  }

  absl::Status PutIfAbsent(const std::string& path, std::string_view data) override;

  absl::StatusOr<std::string> Get(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, false));
    Request r = Simple("GET", key);
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    return std::move(r.response);
  }

  absl::StatusOr<bool> Exists(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, true));
    if (path.empty()) return true;
    Request r = Simple("HEAD", key);
    r.not_found_ok = true;
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    if (r.http_status != 404) return true;
    // A "directory": any key under it.
    CKPTD_ASSIGN_OR_RETURN(ListPage page, ListOnce(key + "/", "", 1, ""));
    return !page.keys.empty() || !page.prefixes.empty();
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    CKPTD_ASSIGN_OR_RETURN(std::string key, Key(dir, true));
    const std::string prefix = key.empty() ? "" : key + "/";
    std::vector<std::string> names;
    std::string token;
    do {
      CKPTD_ASSIGN_OR_RETURN(ListPage page, ListOnce(prefix, "/", s3_limits::kListPageKeys, token));
      for (const std::string& k : page.keys) names.push_back(k.substr(prefix.size()));
      for (const std::string& p : page.prefixes) {
        names.push_back(p.substr(prefix.size(), p.size() - prefix.size() - 1));
      }
      token = std::move(page.next_token);
    } while (!token.empty());
    // "dir/" itself (a folder marker some tools create) is not an entry.
    names.erase(std::remove(names.begin(), names.end(), ""), names.end());
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  absl::Status RemoveAll(const std::string& path) override;

 private:
  static Request Simple(const char* method, const std::string& key) {
    Request r;
    r.method = method;
    r.key = key;
    return r;
  }

  absl::StatusOr<std::string> Key(const std::string& path, bool allow_empty) const {
    CKPTD_RETURN_IF_ERROR(ValidateStoragePath(path, allow_empty));
    const std::string& prefix = client_->options().prefix;
    std::string key = prefix.empty() || path.empty() ? prefix + path : prefix + "/" + path;
    if (key.size() > s3_limits::kKeyBytesMax) {
      return absl::InvalidArgumentError(
          absl::StrCat("S3 key for \"", path, "\" is over ", s3_limits::kKeyBytesMax, " bytes"));
    }
    return key;
  }

  static absl::Status CheckPutSize(const std::string& key, std::string_view data) {
    if (data.size() > s3_limits::kPutBytesMax) {
      return absl::InvalidArgumentError(absl::StrCat("S3 object ", key, ": ", data.size(),
                                                     " bytes is over a single PUT's ",
                                                     s3_limits::kPutBytesMax));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ListPage> ListOnce(const std::string& prefix, const std::string& delimiter,
                                    uint32_t max_keys, const std::string& token) {
    std::vector<std::pair<std::string, std::string>> q = {
        {"list-type", "2"}, {"max-keys", std::to_string(max_keys)}, {"prefix", prefix}};
    if (!delimiter.empty()) q.emplace_back("delimiter", delimiter);
    if (!token.empty()) q.emplace_back("continuation-token", token);
    Request r = Simple("GET", "");
    r.query = QueryParams(std::move(q));
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    return ParseList(*client_, r, false);
  }

  absl::StatusOr<ListPage> ListUploads(const std::string& prefix, const std::string& marker) {
    std::vector<std::pair<std::string, std::string>> q = {
        {"uploads", ""},
        {"max-uploads", std::to_string(s3_limits::kListPageKeys)},
        {"prefix", prefix}};
    if (!marker.empty()) {
      size_t nl = marker.find('\n');
      q.emplace_back("key-marker", marker.substr(0, nl));
      q.emplace_back("upload-id-marker", marker.substr(nl + 1));
    }
    Request r = Simple("GET", "");
    r.query = QueryParams(std::move(q));
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    return ParseList(*client_, r, true);
  }

  absl::Status DeleteKeys(const std::vector<std::string>& keys) {
    std::vector<Request> reqs;
    reqs.reserve(keys.size());
    for (const std::string& k : keys) {
      reqs.push_back(Simple("DELETE", k));
      reqs.back().not_found_ok = true;
    }
    std::vector<Request*> ptrs;
    ptrs.reserve(reqs.size());
    for (Request& r : reqs) ptrs.push_back(&r);
    return client_->Run(ptrs, client_->options().get_in_flight);
  }

  std::unique_ptr<Client> client_;
  // The store answered 501 to a conditional PUT once: PutIfAbsent is HEAD + PUT from then on.
  std::atomic<bool> no_conditional_put_{false};
};

absl::Status S3Storage::PutIfAbsent(const std::string& path, std::string_view data) {
  CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, false));
  CKPTD_RETURN_IF_ERROR(CheckPutSize(key, data));
  if (!no_conditional_put_.load()) {
    Request r = Simple("PUT", key);
    r.headers.push_back("If-None-Match: *");
    r.body.push_back(data);
    absl::Status s = client_->RunOne(r);
    if (s.ok()) return s;
    if (r.http_status == 412) {
      // A retried attempt may have lost its answer after the object was stored: then the
      // object is ours.
      if (r.attempts > 1) {
        absl::StatusOr<std::string> now = Get(path);
        if (now.ok() && *now == data) return absl::OkStatus();
      }
      return absl::AlreadyExistsError(
          absl::StrCat(client_->What(r), ": already exists (If-None-Match: * failed)"));
    }
    if (r.http_status != 501 && r.error_code != "NotImplemented") return s;
    if (!no_conditional_put_.exchange(true)) {
      spdlog::warn(
          "{}: the store does not implement conditional PUT (If-None-Match: *); PutIfAbsent "
          "falls back to HEAD then PUT, which is not atomic against a concurrent writer",
          Describe());
    }
  }
  Request head = Simple("HEAD", key);
  head.not_found_ok = true;
  CKPTD_RETURN_IF_ERROR(client_->RunOne(head));
  if (head.http_status != 404) {
    return absl::AlreadyExistsError(absl::StrCat(client_->What(head), ": already exists"));
  }
  Request put = Simple("PUT", key);
  put.body.push_back(data);
  return client_->RunOne(put);
}

absl::Status S3Storage::RemoveAll(const std::string& path) {
  // Never the whole prefix: an empty path is a caller's bug or bad input.
  CKPTD_ASSIGN_OR_RETURN(std::string key, Key(path, false));
  CKPTD_RETURN_IF_ERROR(DeleteKeys({key}));
  const std::string under = key + "/";
  std::string token;
  std::set<std::string> dirs = {under};
  do {
    CKPTD_ASSIGN_OR_RETURN(ListPage page, ListOnce(under, "", s3_limits::kListPageKeys, token));
    CKPTD_RETURN_IF_ERROR(DeleteKeys(page.keys));
    for (const std::string& k : page.keys) {
      for (size_t slash = k.find('/', under.size()); slash != std::string::npos;
           slash = k.find('/', slash + 1)) {
        dirs.insert(k.substr(0, slash + 1));
      }
    }
    token = std::move(page.next_token);
  } while (!token.empty());
  // Stores backed by a file system (SeaweedFS) keep emptied directories and list them as
  // common prefixes until "<dir>/" itself is deleted, deepest first; elsewhere these DELETEs
  // are no-ops.
  std::vector<std::string> deepest_first(dirs.begin(), dirs.end());
  std::sort(deepest_first.begin(), deepest_first.end(), [](const auto& a, const auto& b) {
    return std::count(a.begin(), a.end(), '/') > std::count(b.begin(), b.end(), '/');
  });
  for (const std::string& d : deepest_first) CKPTD_RETURN_IF_ERROR(DeleteKeys({d}));
  // Uploads in progress under the path (a writer that died before aborting): their parts are
  // invisible to listings but cost storage.
  std::string marker;
  do {
    CKPTD_ASSIGN_OR_RETURN(ListPage page, ListUploads(key, marker));
    for (size_t i = 0; i < page.keys.size(); ++i) {
      if (page.keys[i] != key && !absl::StartsWith(page.keys[i], under)) continue;
      CKPTD_RETURN_IF_ERROR(s3::AbortUpload(client_.get(), page.keys[i], page.uploads[i]));
    }
    marker = std::move(page.next_token);
  } while (!marker.empty());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> NewS3Storage(S3Options options) {
  CKPTD_RETURN_IF_ERROR(options.Validate());
  S3Credentials credentials;
  if (options.credentials) {
    credentials = *options.credentials;
    options.credentials.reset();  // kept only by the client, to sign
  } else {
    CKPTD_ASSIGN_OR_RETURN(credentials, LoadS3Credentials());
  }
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                         Client::Create(options, std::move(credentials)));
  // Reachable, the bucket there, and the credentials good for it: list one key.
  Request r;
  r.method = "GET";
  r.query = QueryParams({{"list-type", "2"},
                         {"max-keys", "1"},
                         {"prefix", options.prefix.empty() ? "" : options.prefix + "/"}});
  absl::Status s = client->RunOne(r);
  if (!s.ok()) {
    const std::string where =
        absl::StrCat("S3 bucket \"", options.bucket, "\" at ", options.endpoint);
    std::string why = "is not usable";
    if (absl::IsNotFound(s)) why = "does not exist";
    if (absl::IsPermissionDenied(s)) {
      why = "refused access: check the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE)";
    }
    if (absl::IsUnavailable(s)) why = "is unreachable";
    return absl::Status(s.code(), absl::StrCat(where, " ", why, " (", s.message(), ")"));
  }
  return std::unique_ptr<Storage>(new S3Storage(std::move(client)));
}

}  // namespace ckptd
