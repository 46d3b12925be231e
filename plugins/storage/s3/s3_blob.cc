// Multipart writes and ranged reads. The writer keeps at most one part's worth of the caller's
// bytes (the carry: what did not fill a part by the end of a Write); every full part is sent
// from the caller's own slices while Write runs, which Client::Run guarantees is over when it
// returns.
#include "storage/s3/s3_blob.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/status.h"
#include "pugixml.hpp"
#include "spdlog/spdlog.h"

namespace ckptd::s3 {
namespace {

// CopyBlobs' part buffers: 4 KiB aligned and sized, so a local source reads them with O_DIRECT.
struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using PartBuffer = std::unique_ptr<char, FreeDeleter>;
PartBuffer AllocatePart(uint64_t bytes) {
  constexpr uint64_t kAlign = 4096;
  const uint64_t rounded = std::max<uint64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  return PartBuffer(static_cast<char*>(std::aligned_alloc(kAlign, rounded)));
}

std::string UploadQuery(const std::string& upload_id) {
  return QueryParams({{"uploadId", upload_id}});
}

// The CompleteMultipartUpload document for parts 1..n with their ETags.
std::string CompleteBody(const std::vector<std::string>& etags) {
  pugi::xml_document doc;
  pugi::xml_node root = doc.append_child("CompleteMultipartUpload");
  for (size_t i = 0; i < etags.size(); ++i) {
    pugi::xml_node part = root.append_child("Part");
    const unsigned long long number = i + 1;
    part.append_child("PartNumber").text().set(number);
    part.append_child("ETag").text().set(etags[i].c_str());
  }
  std::ostringstream out;
  doc.save(out, "", pugi::format_raw);
  return out.str();
}

class S3BlobWriter : public BlobWriter {
 public:
  S3BlobWriter(Client* client, std::string key) : client_(client), key_(std::move(key)) {}

  ~S3BlobWriter() override {
    if (state_ == State::kOpen && !upload_id_.empty()) {
      spdlog::info("S3 blob {} dropped before Sync: aborting its multipart upload", key_);
      AbortQuietly();
    }
  }

  absl::Status Write(std::span<const IoSlice> slices) override {
    CKPTD_RETURN_IF_ERROR(CheckOpen());
    absl::Status s = WriteParts(slices);
    if (!s.ok()) Fail();
    return s;
  }

  absl::Status Sync() override {
    CKPTD_RETURN_IF_ERROR(CheckOpen());
    absl::Status s = Finish();
    if (!s.ok()) {
      Fail();
      return s;
    }
    state_ = State::kSynced;
    return absl::OkStatus();
  }

  // ---- CopyBlobs (below) drives a fresh writer through these instead of Write ----
  const std::string& key() const { return key_; }
  // Starts the multipart upload (one request).
  absl::Status BeginParts() { return StartUpload(); }
  // The PUT of part `number` (1-based) with `body`.
  Request PartRequest(uint64_t number, std::string_view body) const {
    Request r;
    r.method = "PUT";
    r.key = key_;
    r.query = QueryParams({{"partNumber", std::to_string(number)}, {"uploadId", upload_id_}});
    r.body.emplace_back(body);
    return r;
  }
  // Every part was sent (their ETags in order); Sync completes the upload.
  absl::Status PartsSent(std::vector<std::string> etags, uint64_t size) {
    for (const std::string& e : etags) {
      if (e.empty()) {
        return absl::InternalError(absl::StrCat("S3 blob ", key_, ": a part's answer has no ETag"));
      }
    }
    etags_ = std::move(etags);
    next_offset_ = size;
    return absl::OkStatus();
  }
  // The whole blob, under one part: Sync PUTs it.
  void Whole(std::string data) {
    next_offset_ = data.size();
    carry_ = std::move(data);
  }
  // Aborts the upload (the writer refuses everything after).
  void Abandon() { Fail(); }

 private:
  enum class State { kOpen, kSynced, kFailed };

  absl::Status CheckOpen() const {
    if (state_ == State::kSynced)
      return absl::FailedPreconditionError("blob writer already synced");
    if (state_ == State::kFailed) {
      return absl::FailedPreconditionError(
          absl::StrCat("S3 blob ", key_, ": the writer failed earlier and was aborted"));
    }
    return absl::OkStatus();
  }

  void Fail() {
    state_ = State::kFailed;
    if (!upload_id_.empty()) AbortQuietly();
    carry_.clear();
    carry_.shrink_to_fit();
  }

  void AbortQuietly() {
    absl::Status s = AbortUpload(client_, key_, upload_id_);
    if (!s.ok()) spdlog::warn("aborting S3 multipart upload of {}: {}", key_, s.ToString());
    upload_id_.clear();
  }

  absl::Status CheckContiguous(std::span<const IoSlice> slices, uint64_t* end) const {
    *end = next_offset_;
    for (const IoSlice& s : slices) {
      if (s.len == 0) continue;
      if (s.offset != *end) {
        return absl::InvalidArgumentError(absl::StrCat(
            "S3 blob ", key_, ": write at offset ", s.offset, " but the blob is written up to ",
            *end, " (writes must cover it contiguously from 0, in increasing offset order)"));
      }
      if (s.len > UINT64_MAX - *end) {
        return absl::InvalidArgumentError(absl::StrCat("S3 blob ", key_, ": slice overflows"));
      }
      *end += s.len;
    }
    return absl::OkStatus();
  }

  absl::Status WriteParts(std::span<const IoSlice> slices) {
    uint64_t end = 0;
    CKPTD_RETURN_IF_ERROR(CheckContiguous(slices, &end));
    const uint64_t part = client_->options().part_size_bytes;
    const uint64_t total = carry_.size() + (end - next_offset_);
    const uint64_t full = total / part;
    if (etags_.size() + full + 1 > s3_limits::kPartsMax) {
      return absl::ResourceExhaustedError(absl::StrCat("S3 blob ", key_, ": over ",
                                                       s3_limits::kPartsMax, " parts of ", part,
                                                       " bytes (raise part_size_bytes)"));
    }
    if (full == 0) {  // everything fits in the carry
      for (const IoSlice& s : slices) carry_.append(static_cast<const char*>(s.buf), s.len);
      next_offset_ = end;
      return absl::OkStatus();
    }
    // Cut carry + slices into `full` parts (views) and a tail (views into the slices only).
    std::vector<std::string_view> views;
    if (!carry_.empty()) views.emplace_back(carry_);
    for (const IoSlice& s : slices) {
      if (s.len > 0) views.emplace_back(static_cast<const char*>(s.buf), s.len);
    }
    std::vector<Request> reqs(full);
    size_t v = 0;
    uint64_t used = 0;  // of views[v]
    for (Request& r : reqs) {
      uint64_t need = part;
      while (need > 0) {
        uint64_t take = std::min<uint64_t>(need, views[v].size() - used);
        r.body.push_back(views[v].substr(used, take));
        need -= take;
        used += take;
        if (used == views[v].size()) {
          ++v;
          used = 0;
        }
      }
    }
    CKPTD_RETURN_IF_ERROR(SendParts(reqs));
    std::string tail;
    for (; v < views.size(); ++v, used = 0) tail.append(views[v].substr(used));
    carry_ = std::move(tail);
    next_offset_ = end;
    return absl::OkStatus();
  }

  // Sends `reqs` (bodies set) as the next parts, starting the upload if needed.
  absl::Status SendParts(std::vector<Request>& reqs) {
    CKPTD_RETURN_IF_ERROR(StartUpload());
    std::vector<Request*> ptrs;
    for (Request& r : reqs) {
      r.method = "PUT";
      r.key = key_;
      r.query = QueryParams({{"partNumber", std::to_string(etags_.size() + ptrs.size() + 1)},
                             {"uploadId", upload_id_}});
      ptrs.push_back(&r);
    }
    CKPTD_RETURN_IF_ERROR(client_->Run(ptrs, client_->options().parts_in_flight));
    for (const Request& r : reqs) {
      if (r.etag.empty()) {
        return absl::InternalError(
            absl::StrCat(client_->What(r), " (", r.query, "): the answer has no ETag"));
      }
      etags_.push_back(r.etag);
    }
    return absl::OkStatus();
  }

  absl::Status StartUpload() {
    if (!upload_id_.empty()) return absl::OkStatus();
    Request r;
    r.method = "POST";
    r.key = key_;
    r.query = QueryParams({{"uploads", ""}});
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    pugi::xml_document doc;
    if (doc.load_buffer(r.response.data(), r.response.size())) {
      upload_id_ = doc.child("InitiateMultipartUploadResult").child_value("UploadId");
    }
    if (upload_id_.empty()) {
      return absl::InternalError(
          absl::StrCat(client_->What(r), " (CreateMultipartUpload): no UploadId in the answer"));
    }
    return absl::OkStatus();
  }

  absl::Status Finish() {
    if (upload_id_.empty()) {  // under one part: one PUT
      Request r;
      r.method = "PUT";
      r.key = key_;
      r.body.emplace_back(carry_);
      CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
      carry_.clear();
      return absl::OkStatus();
    }
    if (!carry_.empty()) {
      std::vector<Request> last(1);
      last[0].body.emplace_back(carry_);
      CKPTD_RETURN_IF_ERROR(SendParts(last));
      carry_.clear();
    }
    Request r;
    r.method = "POST";
    r.key = key_;
    r.query = UploadQuery(upload_id_);
    r.headers.push_back("Content-Type: application/xml");
    r.error_in_200 = true;  // S3 may answer 200 and fail in the body
    std::string body = CompleteBody(etags_);
    r.body.emplace_back(body);
    CKPTD_RETURN_IF_ERROR(client_->RunOne(r));
    upload_id_.clear();
    return absl::OkStatus();
  }

  Client* client_;
  const std::string key_;
  State state_ = State::kOpen;
  uint64_t next_offset_ = 0;        // bytes written so far (carry included)
  std::string carry_;               // < part_size_bytes not yet sent
  std::string upload_id_;           // empty: no multipart upload started (or it ended)
  std::vector<std::string> etags_;  // of parts 1..n
};

class S3BlobReader : public BlobReader {
 public:
  S3BlobReader(Client* client, std::string key, uint64_t size_bytes)
      : client_(client), key_(std::move(key)), size_bytes_(size_bytes) {}

  absl::Status Read(std::span<const IoSlice> slices) override {
    std::vector<IoSlice> ranges;
    for (const IoSlice& s : slices) {
      if (s.len == 0) continue;
      if (s.offset > size_bytes_ || size_bytes_ - s.offset < s.len) {
        return absl::DataLossError(absl::StrCat("S3 blob ", key_, " is ", size_bytes_,
                                                " bytes; a read of ", s.len, " at offset ",
                                                s.offset, " runs past its end"));
      }
      IoSlice* prev = ranges.empty() ? nullptr : &ranges.back();
      if (prev != nullptr && prev->offset + prev->len == s.offset &&
          static_cast<char*>(prev->buf) + prev->len == s.buf) {
        prev->len += s.len;  // adjacent in the blob and in memory: one GET
      } else {
        ranges.push_back(s);
      }
    }
    const uint64_t chunk = client_->options().part_size_bytes;
    std::vector<Request> reqs;
    for (const IoSlice& s : ranges) {
      for (uint64_t at = 0; at < s.len; at += chunk) {
        Request& r = reqs.emplace_back();
        r.method = "GET";
        r.key = key_;
        r.sink = static_cast<char*>(s.buf) + at;
        r.sink_len = std::min(chunk, s.len - at);
        const uint64_t first = s.offset + at;
        r.headers.push_back(absl::StrCat("Range: bytes=", first, "-", first + r.sink_len - 1));
      }
    }
    std::vector<Request*> ptrs;
    ptrs.reserve(reqs.size());
    for (Request& r : reqs) ptrs.push_back(&r);
    CKPTD_RETURN_IF_ERROR(client_->Run(ptrs, client_->options().get_in_flight));
    for (const Request& r : reqs) {
      if (r.received != r.sink_len) {
        return absl::DataLossError(absl::StrCat(client_->What(r), " (", r.headers[0],
                                                "): the answer has ", r.received, " of ",
                                                r.sink_len, " bytes"));
      }
    }
    return absl::OkStatus();
  }

  uint64_t size_bytes() const override { return size_bytes_; }

 private:
  Client* client_;
  const std::string key_;
  const uint64_t size_bytes_;
};

}  // namespace

absl::Status AbortUpload(Client* client, const std::string& key, const std::string& upload_id) {
  Request r;
  r.method = "DELETE";
  r.key = key;
  r.query = UploadQuery(upload_id);
  r.not_found_ok = true;  // NoSuchUpload: already gone
  return client->RunOne(r);
}

std::unique_ptr<BlobWriter> NewBlobWriter(Client* client, std::string key) {
  return std::make_unique<S3BlobWriter>(client, std::move(key));
}

std::unique_ptr<BlobReader> NewBlobReader(Client* client, std::string key, uint64_t size_bytes) {
  return std::make_unique<S3BlobReader>(client, std::move(key), size_bytes);
}

namespace {

// One blob of a CopyBlobs batch.
struct CopyPlan {
  std::unique_ptr<S3BlobWriter> writer;
  BlobReader* source;
  uint64_t size;
  uint64_t parts;  // 0: under one part, read whole and PUT at Sync
  size_t first;    // its first part's index among the batch's parts
};

// CopyBlobs' reads, on a thread of their own ("s3-read"): every part of every blob in order, each
// into a free part buffer, a few parts ahead of the sends — so the curl loop never blocks on a
// read while parts are in flight (a read of a part there stalled every transfer meanwhile).
// Owns the buffers; the destructor stops the thread and joins it before they go.
class PartReader {
 public:
  struct Part {
    size_t blob;
    uint64_t index;  // part index within the blob (0 for a blob read whole)
    char* buf;
    uint64_t len;
  };

  PartReader(const std::vector<CopyPlan>& plan, uint64_t part, size_t buffers)
      : plan_(plan), part_(part), buffers_(buffers) {}
  ~PartReader() {
    {
      absl::MutexLock lock(&mu_);
      quit_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  absl::Status Start() {
    for (size_t i = 0; i < buffers_; ++i) {
      PartBuffer b = AllocatePart(part_);
      if (b == nullptr) return absl::ResourceExhaustedError("no memory for a part buffer");
      absl::MutexLock lock(&mu_);
      free_.push_back(b.get());
      owned_.push_back(std::move(b));
    }
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "s3-read");
      Loop();
    });
    return absl::OkStatus();
  }

  // The next part read (waits for it); nullopt after the last; the first read's error.
  absl::StatusOr<std::optional<Part>> Next() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &PartReader::HasNextLocked));
    if (!ready_.empty()) {
      Part p = ready_.front();
      ready_.pop_front();
      return p;
    }
    if (!status_.ok()) return status_;
    return std::nullopt;
  }

  // `buf` (of a part sent) may be filled again.
  void Release(char* buf) {
    absl::MutexLock lock(&mu_);
    free_.push_back(buf);
  }

 private:
  bool HasNextLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !ready_.empty() || done_; }
  bool CanReadLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty() || quit_; }

  void Loop() {
    for (size_t b = 0; b < plan_.size(); ++b) {
      const CopyPlan& blob = plan_[b];
      const uint64_t reads = blob.parts == 0 ? 1 : blob.parts;
      for (uint64_t k = 0; k < reads; ++k) {
        char* buf = nullptr;
        {
          absl::MutexLock lock(&mu_);
          mu_.Await(absl::Condition(this, &PartReader::CanReadLocked));
          if (quit_) return;
          buf = free_.back();
          free_.pop_back();
        }
        const uint64_t off = k * part_;
        const uint64_t len = blob.parts == 0 ? blob.size : std::min(part_, blob.size - off);
        IoSlice slice{buf, len, off};
        absl::Status st =
            len == 0 ? absl::OkStatus() : blob.source->Read(std::span<const IoSlice>(&slice, 1));
        absl::MutexLock lock(&mu_);
        if (!st.ok()) {
          status_ = st;
          done_ = true;
          return;
        }
        ready_.push_back({b, k, buf, len});
      }
    }
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

  const std::vector<CopyPlan>& plan_;
  const uint64_t part_;
  const size_t buffers_;
  std::vector<PartBuffer> owned_;
  absl::Mutex mu_;
  std::vector<char*> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Part> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool quit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// CopyBlobs' plan: a writer per blob and its parts of `part` bytes (none for a blob of at most
// one part), numbered across blobs (*total_parts); *reads: the reads of them all.
absl::Status PlanCopies(Client* client, std::span<const KeyedSource> blobs, uint64_t part,
                        std::vector<CopyPlan>* plan, size_t* total_parts, size_t* reads) {
  for (const KeyedSource& b : blobs) {
    const uint64_t size = b.source->size_bytes();
    const uint64_t parts = size <= part ? 0 : (size + part - 1) / part;
    if (parts > s3_limits::kPartsMax) {
      return absl::ResourceExhaustedError(absl::StrCat("S3 blob ", b.key, ": over ",
                                                       s3_limits::kPartsMax, " parts of ", part,
                                                       " bytes (raise part_size_bytes)"));
    }
    plan->push_back(
        {std::make_unique<S3BlobWriter>(client, b.key), b.source, size, parts, *total_parts});
    *total_parts += parts;
    *reads += parts == 0 ? 1 : parts;
  }
  return absl::OkStatus();
}

// Completes every multipart upload of `plan` (the etags of its parts in `reqs`), then syncs
// every writer.
absl::Status FinishCopies(std::vector<CopyPlan>& plan, const std::vector<Request>& reqs) {
  for (CopyPlan& b : plan) {
    if (b.parts == 0) continue;
    std::vector<std::string> etags;
    for (uint64_t i = 0; i < b.parts; ++i) etags.push_back(reqs[b.first + i].etag);
    CKPTD_RETURN_IF_ERROR(b.writer->PartsSent(std::move(etags), b.size));
  }
  for (CopyPlan& b : plan) CKPTD_RETURN_IF_ERROR(b.writer->Sync());
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyBlobs(Client* client, std::span<const KeyedSource> blobs,
                       std::atomic<uint64_t>* progress, const std::function<bool()>& stop) {
  const uint64_t part = client->options().part_size_bytes;
  const uint32_t in_flight = client->options().parts_in_flight;
  std::vector<CopyPlan> plan;
  size_t total_parts = 0;
  size_t reads = 0;
  CKPTD_RETURN_IF_ERROR(PlanCopies(client, blobs, part, &plan, &total_parts, &reads));
  // On any failure every writer not synced yet aborts its upload (nothing is left of it).
  auto fail = [&](absl::Status st) {
    for (CopyPlan& b : plan) b.writer->Abandon();
    return st;
  };
  // in_flight buffers in flight, two more read ahead.
  PartReader reader(plan, part, std::min<size_t>(reads, in_flight + 2));
  if (absl::Status st = reader.Start(); !st.ok()) return fail(st);
  std::vector<Request> reqs(total_parts);  // every part of every blob, in order
  std::vector<char*> buf_of(total_parts, nullptr);
  // The next part to send, across blob boundaries; a blob under one part goes whole into its
  // writer and needs no request here.
  auto next = [&]() -> absl::StatusOr<Request*> {
    while (true) {
      if (stop && stop()) return absl::CancelledError("the copy was stopped");
      CKPTD_ASSIGN_OR_RETURN(std::optional<PartReader::Part> p, reader.Next());
      if (!p) return nullptr;
      CopyPlan& b = plan[p->blob];
      if (b.parts == 0) {
        b.writer->Whole(std::string(p->buf, p->len));
        reader.Release(p->buf);
        *progress += p->len;
        continue;
      }
      const size_t i = b.first + p->index;
      buf_of[i] = p->buf;
      if (p->index == 0) {
        if (absl::Status st = b.writer->BeginParts(); !st.ok()) {
          reader.Release(p->buf);
          return st;
        }
      }
      reqs[i] = b.writer->PartRequest(p->index + 1, std::string_view(p->buf, p->len));
      return &reqs[i];
    }
  };
  auto succeeded = [&](Request* r) {
    reader.Release(buf_of[static_cast<size_t>(r - reqs.data())]);
    *progress += r->body.front().size();
  };
  if (absl::Status st = client->RunStream(next, succeeded, in_flight); !st.ok()) return fail(st);
  if (absl::Status st = FinishCopies(plan, reqs); !st.ok()) return fail(st);
  return absl::OkStatus();
}

}  // namespace ckptd::s3
