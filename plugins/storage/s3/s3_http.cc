// Why the requests are built the way they are:
//   - Every request carries "x-amz-content-sha256: UNSIGNED-PAYLOAD": S3 requires the header,
//     curl 7.88 does not add it, and signing the payload's hash would mean reading every part
//     twice. With the header set, curl signs it and uses its value as the payload hash.
//   - curl's own "Expect: 100-continue" on uploads is left alone: removing it with an empty
//     "Expect:" header makes curl 7.88 sign a header it then does not send (SignatureDoesNotMatch).
//   - A fresh easy handle per attempt, on a multi handle kept in a pool: the multi handle's
//     connection cache is what makes connections survive from one call to the next. (curl's
//     share interface is not used for connections: sharing them between threads is a known
//     curl bug.)
#include "storage/s3/s3_http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckptd/status.h"
#include "pugixml.hpp"
#include "spdlog/spdlog.h"

namespace ckptd::s3 {

std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && keep_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string QueryParams(std::vector<std::pair<std::string, std::string>> params) {
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out.push_back('&');
    absl::StrAppend(&out, UriEncode(name, false), "=", UriEncode(value, false));
  }
  return out;
}

namespace {

// Fails the process-wide curl initialisation only once, and reports it on every Create.
CURLcode GlobalInit() {
  static CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT);
  return rc;
}

bool RetryableCurl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
      return true;
    default:
      return false;
  }
}

// 501 NotImplemented never passes on a retry (a store without conditional PUT answers it at
// once, and PutIfAbsent then falls back).
bool RetryableHttp(long status, const std::string& code) {
  if (status == 501 || code == "NotImplemented") return false;
  return status >= 500 || status == 429 || code == "SlowDown" || code == "RequestTimeout" ||
         code == "InternalError" || code == "ServiceUnavailable";
}

// Code and Message of an S3 <Error> document (empty when the body is not one).
void ParseError(const std::string& body, std::string* code, std::string* message) {
  if (body.empty()) return;
  pugi::xml_document doc;
  if (!doc.load_buffer(body.data(), body.size())) return;
  pugi::xml_node error = doc.child("Error");
  if (!error) return;
  *code = error.child_value("Code");
  *message = error.child_value("Message");
}

absl::Status HttpStatus(const std::string& what, const Request& r) {
  std::string msg = absl::StrCat(what, ": HTTP ", r.http_status);
  if (!r.error_code.empty()) absl::StrAppend(&msg, " ", r.error_code);
  if (!r.error_message.empty()) absl::StrAppend(&msg, ": ", r.error_message);
  if (r.error_code == "NoSuchBucket") return absl::NotFoundError(msg);
  switch (r.http_status) {
    case 400:
      return absl::InvalidArgumentError(msg);
    case 401:
    case 403:
      return absl::PermissionDeniedError(msg);
    case 404:
      return absl::NotFoundError(msg);
    case 409:
    case 412:
      return absl::FailedPreconditionError(msg);
    case 416:
      return absl::DataLossError(msg);
    case 501:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// A transport failure in words: curl's code name, its error buffer where it says more, and for a
// certificate that did not verify, what it was checked against.
std::string CurlFailure(CURLcode rc, const char* error, const S3Options& o) {
  std::string out = curl_easy_strerror(rc);
  if (error[0] != '\0' && out != error) absl::StrAppend(&out, " (", error, ")");
  if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE) {
    absl::StrAppend(&out, "; the store's TLS certificate was checked against ",
                    o.ca_path.empty() ? "the system's CA certificates"
                                      : absl::StrCat("the CA file ", o.ca_path));
  }
  return out;
}

absl::Duration Backoff(const S3Options& o, uint32_t retry) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  uint64_t cap = o.backoff_base_ms;
  for (uint32_t i = 0; i < retry && cap < o.backoff_max_ms; ++i) cap *= 2;
  cap = std::min<uint64_t>(cap, o.backoff_max_ms);
  return absl::Milliseconds(std::uniform_int_distribution<uint64_t>(0, cap)(rng));
}

}  // namespace

// One attempt of one request: the easy handle and the state its callbacks use.
struct Transfer {
  Request* r = nullptr;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  size_t piece = 0;      // body: the piece being sent
  size_t piece_off = 0;  // and the offset in it
  bool sink_overflow = false;
  bool body_overflow = false;
  // curl's own words for a transport failure (CURLOPT_ERRORBUFFER), e.g. which certificate check
  // failed: more than curl_easy_strerror's code name.
  char error[CURL_ERROR_SIZE] = {};

  ~Transfer() {
    if (easy != nullptr) curl_easy_cleanup(easy);
    curl_slist_free_all(headers);
  }

  uint64_t BodyBytes() const {
    uint64_t n = 0;
    for (std::string_view p : r->body) n += p.size();
    return n;
  }

  static size_t Read(char* out, size_t size, size_t n, void* arg) {
    auto* t = static_cast<Transfer*>(arg);
    size_t want = size * n;
    size_t done = 0;
    while (done < want && t->piece < t->r->body.size()) {
      std::string_view p = t->r->body[t->piece];
      size_t take = std::min(want - done, p.size() - t->piece_off);
      std::memcpy(out + done, p.data() + t->piece_off, take);
      done += take;
      t->piece_off += take;
      if (t->piece_off == p.size()) {
        ++t->piece;
        t->piece_off = 0;
      }
    }
    return done;
  }

  // curl rewinds a body it must send again (a redirect, a rejected connection reuse).
  static int Seek(void* arg, curl_off_t offset, int origin) {
    auto* t = static_cast<Transfer*>(arg);
    if (origin != SEEK_SET || offset < 0) return CURL_SEEKFUNC_CANTSEEK;
    t->piece = 0;
    t->piece_off = 0;
    auto left = static_cast<uint64_t>(offset);
    while (t->piece < t->r->body.size() && left >= t->r->body[t->piece].size()) {
      left -= t->r->body[t->piece].size();
      ++t->piece;
    }
    if (t->piece == t->r->body.size() && left > 0) return CURL_SEEKFUNC_FAIL;
    t->piece_off = left;
    return CURL_SEEKFUNC_OK;
  }

  static size_t Write(char* data, size_t size, size_t n, void* arg) {
    auto* t = static_cast<Transfer*>(arg);
    size_t len = size * n;
    long status = 0;
    if (curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK) return 0;
    Request* r = t->r;
    if (r->sink != nullptr && status >= 200 && status < 300) {
      if (r->received > r->sink_len || len > r->sink_len - r->received) {
        t->sink_overflow = true;
        return 0;
      }
      std::memcpy(r->sink + r->received, data, len);
      r->received += len;
      return len;
    }
    if (r->response.size() + len > s3_limits::kGetBytesMax) {
      t->body_overflow = true;
      return 0;
    }
    r->response.append(data, len);
    return len;
  }

  static size_t Header(char* data, size_t size, size_t n, void* arg) {
    auto* t = static_cast<Transfer*>(arg);
    absl::string_view line(data, size * n);
    if (absl::StartsWith(line, "HTTP/")) {  // a new answer (after a 100 Continue)
      t->r->etag.clear();
    } else if (absl::StartsWithIgnoreCase(line, "etag:")) {
      t->r->etag = std::string(absl::StripAsciiWhitespace(line.substr(5)));
    }
    return size * n;
  }
};

struct Client::Multi {
  CURLM* handle = nullptr;
  ~Multi() {
    if (handle != nullptr) curl_multi_cleanup(handle);
  }
};

Client::Client(const S3Options& options, S3Credentials credentials)
    : options_(options),
      credentials_(std::move(credentials)),
      sigv4_(absl::StrCat("aws:amz:", options.region, ":s3")) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const S3Options& options,
                                                       S3Credentials credentials) {
  if (CURLcode rc = GlobalInit(); rc != CURLE_OK) {
    return absl::InternalError(absl::StrCat("curl_global_init: ", curl_easy_strerror(rc)));
  }
  return std::unique_ptr<Client>(new Client(options, std::move(credentials)));
}

std::string Client::Url(const Request& r) const {
  std::string key = UriEncode(r.key, true);
  std::string url;
  if (options_.path_style) {
    url = absl::StrCat(options_.endpoint, "/", options_.bucket, "/", key);
  } else {
    size_t scheme_end = options_.endpoint.find("://") + 3;
    url = absl::StrCat(options_.endpoint.substr(0, scheme_end), options_.bucket, ".",
                       options_.endpoint.substr(scheme_end), "/", key);
  }
  if (!r.query.empty()) absl::StrAppend(&url, "?", r.query);
  return url;
}

std::string Client::What(const Request& r) const {
  return absl::StrCat("S3 ", r.method, " ", options_.endpoint, " bucket \"", options_.bucket, "\"",
                      r.key.empty() ? "" : absl::StrCat(" key \"", r.key, "\""));
}

std::unique_ptr<Client::Multi> Client::TakeMulti() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Multi> m = std::move(idle_.back());
      idle_.pop_back();
      return m;
    }
  }
  auto m = std::make_unique<Multi>();
  m->handle = curl_multi_init();
  if (m->handle == nullptr) return nullptr;
  if (curl_multi_setopt(m->handle, CURLMOPT_MAXCONNECTS, long{s3_limits::kInFlightMax}) !=
      CURLM_OK) {
    return nullptr;
  }
  return m;
}

void Client::GiveBackMulti(std::unique_ptr<Multi> multi) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < s3_limits::kInFlightMax) idle_.push_back(std::move(multi));
}

namespace {

// Sets the options of one attempt; the first failing setopt is the answer.
CURLcode Configure(Transfer& t, const S3Options& o, const S3Credentials& c,
                   const std::string& sigv4, const std::string& url) {
  CURL* e = t.easy;
  Request& r = *t.r;
  CURLcode rc = CURLE_OK;
  auto set = [&](CURLoption opt, auto value) {
    if (rc == CURLE_OK) rc = curl_easy_setopt(e, opt, value);
  };
  std::vector<std::string> lines = {"x-amz-content-sha256: UNSIGNED-PAYLOAD"};
  if (!c.session_token.empty()) lines.push_back("x-amz-security-token: " + c.session_token);
  lines.insert(lines.end(), r.headers.begin(), r.headers.end());
  for (const std::string& line : lines) {
    curl_slist* next = curl_slist_append(t.headers, line.c_str());
    if (next == nullptr) return CURLE_OUT_OF_MEMORY;
    t.headers = next;
  }
  set(CURLOPT_URL, url.c_str());
  set(CURLOPT_PRIVATE, static_cast<void*>(&t));
  set(CURLOPT_ERRORBUFFER, t.error);
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_AWS_SIGV4, sigv4.c_str());
  set(CURLOPT_USERNAME, c.access_key_id.c_str());
  set(CURLOPT_PASSWORD, c.secret_access_key.c_str());
  set(CURLOPT_HTTPHEADER, t.headers);
  set(CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_ms));
  set(CURLOPT_TIMEOUT_MS, static_cast<long>(o.request_timeout_ms));
  set(CURLOPT_SSL_VERIFYPEER, o.tls_verify ? 1L : 0L);
  set(CURLOPT_SSL_VERIFYHOST, o.tls_verify ? 2L : 0L);
  if (!o.ca_path.empty()) set(CURLOPT_CAINFO, o.ca_path.c_str());
  set(CURLOPT_WRITEFUNCTION, &Transfer::Write);
  set(CURLOPT_WRITEDATA, static_cast<void*>(&t));
  set(CURLOPT_HEADERFUNCTION, &Transfer::Header);
  set(CURLOPT_HEADERDATA, static_cast<void*>(&t));
  const auto body_bytes = static_cast<curl_off_t>(t.BodyBytes());
  if (r.method == "HEAD") {
    set(CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT") {
    set(CURLOPT_UPLOAD, 1L);
    set(CURLOPT_INFILESIZE_LARGE, body_bytes);
  } else if (r.method == "POST") {
    set(CURLOPT_POST, 1L);
    set(CURLOPT_POSTFIELDSIZE_LARGE, body_bytes);
  } else if (r.method != "GET") {
    set(CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (r.method == "PUT" || r.method == "POST") {
    set(CURLOPT_READFUNCTION, &Transfer::Read);
    set(CURLOPT_READDATA, static_cast<void*>(&t));
    set(CURLOPT_SEEKFUNCTION, &Transfer::Seek);
    set(CURLOPT_SEEKDATA, static_cast<void*>(&t));
  }
  return rc;
}

}  // namespace

absl::Status Client::Run(std::span<Request* const> requests, uint32_t in_flight) {
  size_t i = 0;
  return RunStream(
      [&]() -> absl::StatusOr<Request*> { return i < requests.size() ? requests[i++] : nullptr; },
      nullptr, in_flight);
}

// One RunStream: its requests in flight (`active_`), backing off (`waiting_`) and due
// (`ready_`), on one curl multi handle; the first failure for good ends it.
class Client::Stream {
 public:
  Stream(Client* client, CURLM* m, const std::function<absl::StatusOr<Request*>()>& next,
         const std::function<void(Request*)>& succeeded, uint32_t in_flight)
      : client_(client), m_(m), next_(next), succeeded_(succeeded), in_flight_(in_flight) {}

  // Runs until every request succeeded or one failed for good; then cancels what is in flight.
  absl::Status Run();
  // Whether the multi handle is unusable (a handle could not be removed from it).
  bool multi_broken() const { return multi_broken_; }

 private:
  size_t Outstanding() const { return active_.size() + waiting_.size() + ready_.size(); }
  // Moves the retries whose backoff ended to ready_; returns when the next one ends.
  absl::Time PromoteDue();
  // Takes new requests while fewer than in_flight are outstanding, and starts ready ones.
  void Admit();
  // One curl_multi_perform, and the attempts it finished.
  void Perform();
  void Remove(Transfer* t);
  absl::Status Start(Request* r);
  // The attempt `t` ended with `rc`: done, retried later, or the batch's failure.
  absl::Status Finish(Transfer* t, CURLcode rc);
  // Finish, once the transfer is removed: `detail` describes a curl failure.
  absl::Status Outcome(Request* r, CURLcode rc, const std::string& detail);

  Client* const client_;
  CURLM* const m_;
  const std::function<absl::StatusOr<Request*>()>& next_;
  const std::function<void(Request*)>& succeeded_;
  const uint32_t in_flight_;
  std::deque<Request*> ready_;                            // retries due
  std::vector<std::pair<absl::Time, Request*>> waiting_;  // backing off
  std::vector<std::unique_ptr<Transfer>> active_;
  bool exhausted_ = false;  // `next_` said there is no more
  absl::Status failure_;
  bool multi_broken_ = false;
};

void Client::Stream::Remove(Transfer* t) {
  if (curl_multi_remove_handle(m_, t->easy) != CURLM_OK) multi_broken_ = true;
  active_.erase(std::find_if(active_.begin(), active_.end(),
                             [t](const std::unique_ptr<Transfer>& a) { return a.get() == t; }));
}

absl::Status Client::Stream::Start(Request* r) {
  auto t = std::make_unique<Transfer>();
  t->r = r;
  r->http_status = 0;
  r->response.clear();
  r->etag.clear();
  r->received = 0;
  r->content_length = -1;
  r->error_code.clear();
  r->error_message.clear();
  ++r->attempts;
  t->easy = curl_easy_init();
  if (t->easy == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  if (CURLcode rc = Configure(*t, client_->options_, client_->credentials_, client_->sigv4_,
                              client_->Url(*r));
      rc != CURLE_OK) {
    return absl::InternalError(
        absl::StrCat(client_->What(*r), ": curl setup: ", curl_easy_strerror(rc)));
  }
  if (CURLMcode mc = curl_multi_add_handle(m_, t->easy); mc != CURLM_OK) {
    return absl::InternalError(absl::StrCat(client_->What(*r), ": ", curl_multi_strerror(mc)));
  }
  active_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Client::Stream::Finish(Transfer* t, CURLcode rc) {
  Request* r = t->r;
  if (curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &r->http_status) != CURLE_OK) {
    r->http_status = 0;
  }
  curl_off_t length = -1;
  if (curl_easy_getinfo(t->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK) {
    r->content_length = length;
  }
  const bool sink_overflow = t->sink_overflow;
  const bool body_overflow = t->body_overflow;
  const std::string detail = rc == CURLE_OK ? "" : CurlFailure(rc, t->error, client_->options_);
  Remove(t);
  if (sink_overflow) {
    return absl::DataLossError(absl::StrCat(client_->What(*r), ": the answer is longer than the ",
                                            r->sink_len, " bytes asked"));
  }
  if (body_overflow) {
    return absl::ResourceExhaustedError(absl::StrCat(client_->What(*r), ": the answer is over ",
                                                     s3_limits::kGetBytesMax, " bytes"));
  }
  return Outcome(r, rc, detail);
}

absl::Status Client::Stream::Outcome(Request* r, CURLcode rc, const std::string& detail) {
  std::string last;
  if (rc != CURLE_OK) {
    if (!RetryableCurl(rc))
      return absl::UnavailableError(absl::StrCat(client_->What(*r), ": ", detail));
    last = detail;
  } else {
    const bool ok2xx = r->http_status >= 200 && r->http_status < 300;
    if (!ok2xx || r->error_in_200) ParseError(r->response, &r->error_code, &r->error_message);
    // A missing bucket is never "absent is fine".
    const bool absent_ok =
        r->http_status == 404 && r->not_found_ok && r->error_code != "NoSuchBucket";
    if ((ok2xx && r->error_code.empty()) || absent_ok) {
      if (succeeded_) succeeded_(r);
      return absl::OkStatus();
    }
    if (!RetryableHttp(ok2xx ? 500 : r->http_status, r->error_code))
      return HttpStatus(client_->What(*r), *r);
    last = std::string(HttpStatus(client_->What(*r), *r).message());
  }
  if (r->attempts > client_->options_.retries_max) {
    return absl::UnavailableError(absl::StrCat(client_->What(*r), ": gave up after ", r->attempts,
                                               " attempts; last: ", last));
  }
  waiting_.emplace_back(absl::Now() + Backoff(client_->options_, r->attempts - 1), r);
  return absl::OkStatus();
}

absl::Time Client::Stream::PromoteDue() {
  const absl::Time now = absl::Now();
  absl::Time next_wake = absl::InfiniteFuture();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->first <= now) {
      ready_.push_back(it->second);
      it = waiting_.erase(it);
    } else {
      next_wake = std::min(next_wake, it->first);
      ++it;
    }
  }
  return next_wake;
}

void Client::Stream::Admit() {
  // New requests only while fewer than in_flight are outstanding (retries included): a request
  // holds its memory until it succeeds.
  while (failure_.ok() && !exhausted_ && Outstanding() < in_flight_) {
    absl::StatusOr<Request*> r = next_();
    if (!r.ok()) {
      failure_ = r.status();
    } else if (*r == nullptr) {
      exhausted_ = true;
    } else {
      ready_.push_back(*r);
    }
  }
  while (failure_.ok() && active_.size() < in_flight_ && !ready_.empty()) {
    failure_ = Start(ready_.front());
    ready_.pop_front();
  }
}

void Client::Stream::Perform() {
  int running = 0;
  if (CURLMcode mc = curl_multi_perform(m_, &running); mc != CURLM_OK) {
    failure_ = absl::InternalError(absl::StrCat("curl_multi_perform: ", curl_multi_strerror(mc)));
    return;
  }
  int queued = 0;
  while (CURLMsg* msg = curl_multi_info_read(m_, &queued)) {
    if (msg->msg != CURLMSG_DONE) continue;
    void* priv = nullptr;
    if (curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv) != CURLE_OK) {
      failure_ = absl::InternalError("curl: an easy handle lost its transfer");
      break;
    }
    absl::Status s = Finish(static_cast<Transfer*>(priv), msg->data.result);
    if (!s.ok() && failure_.ok()) failure_ = s;
  }
}

absl::Status Client::Stream::Run() {
  while (failure_.ok()) {
    const absl::Time next_wake = PromoteDue();
    Admit();
    if (!failure_.ok()) break;
    if (exhausted_ && Outstanding() == 0) break;
    if (active_.empty()) {
      absl::SleepFor(std::max(absl::ZeroDuration(), next_wake - absl::Now()));
      continue;
    }
    Perform();
    if (!failure_.ok() || (exhausted_ && Outstanding() == 0)) break;
    const int timeout_ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(next_wake - absl::Now()), 0, 100));
    if (CURLMcode mc = curl_multi_poll(m_, nullptr, 0, timeout_ms, nullptr); mc != CURLM_OK) {
      failure_ = absl::InternalError(absl::StrCat("curl_multi_poll: ", curl_multi_strerror(mc)));
    }
  }
  // Cancel what is still in flight: after this no callback touches a body or a sink.
  while (!active_.empty()) Remove(active_.back().get());
  return failure_;
}

absl::Status Client::RunStream(const std::function<absl::StatusOr<Request*>()>& next,
                               const std::function<void(Request*)>& succeeded, uint32_t in_flight) {
  in_flight = std::clamp<uint32_t>(in_flight, 1, s3_limits::kInFlightMax);
  std::unique_ptr<Multi> multi = TakeMulti();
  if (multi == nullptr) return absl::ResourceExhaustedError("curl_multi_init failed");
  Stream stream(this, multi->handle, next, succeeded, in_flight);
  absl::Status failure = stream.Run();
  if (!stream.multi_broken()) GiveBackMulti(std::move(multi));
  return failure;
}

}  // namespace ckptd::s3
