#include "peer/peer_store.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/blob_layout.h"
#include "format/crc32c.h"
#include "format/names.h"
#include "metrics/metrics.h"

namespace ckptd::peer {

std::string BlobKey::ToString() const {
  return absl::StrCat("job ", job, " step ", step, " blob ", blob, " from node ", origin_node);
}

absl::Status ValidateNodeId(std::string_view node_id) {
  const bool ok =
      !node_id.empty() && node_id.size() <= 64 &&
      std::all_of(node_id.begin(), node_id.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
      });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "node id \"", std::string(node_id), "\": expected 1 to 64 letters, digits, '.', '-' or '_'"));
}

namespace {

absl::Status ValidateSpans(const BlobHeader& h) {
  if (h.spans.size() > limits::kShardsPerSaveMax) {
    return absl::InvalidArgumentError(
        absl::StrCat(h.key.ToString(), ": ", h.spans.size(),
                     " spans, more than kShardsPerSaveMax = ", limits::kShardsPerSaveMax));
  }
  uint64_t end = 0;
  uint64_t crcs = 0;
  for (size_t i = 0; i < h.spans.size(); ++i) {
    const Span& s = h.spans[i];
    if (s.offset < end || s.offset > h.total_bytes || s.length > h.total_bytes - s.offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: span %d [%d, +%d) overlaps the one before it or ends past total_bytes = %d",
          h.key.ToString(), i, s.offset, s.length, h.total_bytes));
    }
    end = s.offset + s.length;
    if (s.crcs.size() != BlockCount(s.length, h.block_bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: span %d of %d bytes carries %d crc32c values; blocks of %d bytes need %d",
          h.key.ToString(), i, s.length, s.crcs.size(), h.block_bytes,
          BlockCount(s.length, h.block_bytes)));
    }
    crcs += s.crcs.size();
  }
  if (crcs > limits::kPeerBlockCrcsPerBlobMax) {
    return absl::InvalidArgumentError(absl::StrCat(h.key.ToString(), ": ", crcs,
                                                   " checksums, more than kPeerBlockCrcsPerBlobMax",
                                                   " = ", limits::kPeerBlockCrcsPerBlobMax));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateHeader(const BlobHeader& h) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(h.key.origin_node));
  CKPTD_RETURN_IF_ERROR(ValidateJobName(h.key.job));
  const bool blob_ok = !h.key.blob.empty() && h.key.blob.size() <= limits::kPeerBlobNameBytesMax &&
                       std::all_of(h.key.blob.begin(), h.key.blob.end(), [](char c) {
                         return std::isgraph(static_cast<unsigned char>(c)) && c != '/';
                       });
  if (!blob_ok) {
    return absl::InvalidArgumentError(absl::StrCat("blob name \"", h.key.blob, "\": expected 1 to ",
                                                   limits::kPeerBlobNameBytesMax,
                                                   " printable characters without '/' or spaces"));
  }
  if (h.key.step > limits::kStepMax) {
    return absl::InvalidArgumentError(absl::StrCat(h.key.ToString(), ": step beyond kStepMax"));
  }
  if (h.total_bytes > limits::kPeerBlobBytesMax) {
    return absl::InvalidArgumentError(
        absl::StrCat(h.key.ToString(), ": total_bytes = ", h.total_bytes,
                     " is more than kPeerBlobBytesMax = ", limits::kPeerBlobBytesMax));
  }
  CKPTD_RETURN_IF_ERROR(Annotate(ValidateChecksumBlockBytes(h.block_bytes), h.key.ToString()));
  return ValidateSpans(h);
}

Store::Store(Limits limits, Metrics* metrics) : limits_(limits), metrics_(metrics) {}

Store::~Store() {
  absl::MutexLock lock(&mu_);
  CKPTD_CHECK(live_streams_ == 0 && arriving_.empty());
}

absl::StatusOr<std::unique_ptr<Store::Stream>> Store::OpenStream(const std::string& node,
                                                                 const std::string& connection) {
  CKPTD_RETURN_IF_ERROR(ValidateNodeId(node));
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) {
    if (nodes_.size() >= limits::kPeerNodesMax) {
      return absl::ResourceExhaustedError(
          absl::StrCat("node ", node, ": kPeerNodesMax = ", limits::kPeerNodesMax,
                       " nodes already have streams in flight here"));
    }
    it = nodes_.emplace(node, NodeAccount{}).first;
  }
  NodeAccount& acct = it->second;
  if (acct.streams >= limits_.streams_per_node_max) {
    return absl::ResourceExhaustedError(
        absl::StrCat("node ", node, ": peer_streams_per_node_max = ", limits_.streams_per_node_max,
                     " streams already in flight"));
  }
  const bool new_connection = !acct.connections.contains(connection);
  if (new_connection && acct.connections.size() >= limits_.connections_per_node_max) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "node ", node, ": kPeerConnectionsPerNodeMax = ", limits_.connections_per_node_max,
        " connections already have calls in flight"));
  }
  ++acct.streams;
  ++acct.connections[connection];
  ++live_streams_;
  return std::unique_ptr<Stream>(new Stream(this, node, connection));
}

void Store::CloseStream(const std::string& node, const std::string& connection) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  CKPTD_CHECK(it != nodes_.end() && it->second.streams > 0);
  NodeAccount& acct = it->second;
  --acct.streams;
  auto conn = acct.connections.find(connection);
  CKPTD_CHECK(conn != acct.connections.end());
  if (--conn->second == 0) acct.connections.erase(conn);
  if (acct.streams == 0) {
    CKPTD_CHECK(acct.inflight_bytes == 0);
    nodes_.erase(it);
  }
  --live_streams_;
}

Store::Stream::~Stream() { store_->CloseStream(node_, connection_); }

absl::StatusOr<std::unique_ptr<Store::Put>> Store::BeginPut(Stream& stream, BlobHeader header) {
  CKPTD_CHECK(stream.store_ == this && stream.node() == header.key.origin_node);
  CKPTD_RETURN_IF_ERROR(ValidateHeader(header));
  const std::string what = header.key.ToString();
  if (limits_.bytes_max == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this daemon holds no peer copies (peer_bytes_max = 0)"));
  }
  const uint64_t n = header.total_bytes;
  std::vector<std::shared_ptr<const StoredBlob>> evicted;  // freed after the lock
  {
    absl::MutexLock lock(&mu_);
    if (auto it = blobs_.find(header.key); it != blobs_.end()) {
      if (it->second->header == header) return std::unique_ptr<Put>();
      return absl::AlreadyExistsError(
          absl::StrCat(what, ": held here already with another size or checksums"));
    }
    if (arriving_.contains(header.key)) {
      return absl::AbortedError(absl::StrCat(what, ": another put of it is in flight"));
    }
    NodeAccount& acct = nodes_.at(stream.node());
    if (acct.inflight_bytes + n > limits_.inflight_bytes_per_node_max) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": node ", stream.node(),
                       ": peer_inflight_bytes_per_node_max = ", limits_.inflight_bytes_per_node_max,
                       " (", acct.inflight_bytes, " bytes in flight, ", n, " asked)"));
    }
    if (blobs_.size() + arriving_.size() >= limits::kPeerBlobsMax) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": kPeerBlobsMax = ", limits::kPeerBlobsMax, " copies held"));
    }
    // Registered first, so that its step counts among the protected ones while making room.
    arriving_[header.key] = Arriving{n, false};
    if (!MakeRoomLocked(n, &evicted)) {
      arriving_.erase(header.key);
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": peer_bytes_max = ", limits_.bytes_max, ": ", n, " bytes asked, ",
                       bytes_used_, " held and ", bytes_reserved_,
                       " arriving, and the copies of each job's newest steps are never evicted"));
    }
    bytes_reserved_ += n;
    acct.inflight_bytes += n;
  }
  return std::unique_ptr<Put>(new Put(this, std::move(header)));
}

bool Store::MakeRoomLocked(uint64_t bytes,
                           std::vector<std::shared_ptr<const StoredBlob>>* evicted) {
  auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return bytes <= limits_.bytes_max && bytes_used_ + bytes_reserved_ <= limits_.bytes_max - bytes;
  };
  if (fits()) return true;
  if (bytes > limits_.bytes_max) return false;
  // The protected steps: the kPeerProtectedStepsPerJob newest held or arriving, per job.
  std::map<std::string, std::set<uint64_t>> steps;
  for (const auto& [key, blob] : blobs_) steps[key.job].insert(key.step);
  for (const auto& [key, arriving] : arriving_) steps[key.job].insert(key.step);
  auto is_protected = [&](const BlobKey& key) {
    const std::set<uint64_t>& s = steps[key.job];
    uint64_t rank = 0;
    for (auto it = s.rbegin(); it != s.rend() && rank < limits::kPeerProtectedStepsPerJob;
         ++it, ++rank) {
      if (*it == key.step) return true;
    }
    return false;
  };
  std::vector<std::pair<uint64_t, BlobKey>> candidates;  // (seq, key)
  uint64_t evictable = 0;
  for (const auto& [key, blob] : blobs_) {
    if (is_protected(key)) continue;
    candidates.emplace_back(blob->seq, key);
    evictable += blob->header.total_bytes;
  }
  const uint64_t held = bytes_used_ + bytes_reserved_;
  if (held - evictable > limits_.bytes_max - bytes) return false;
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [seq, key] : candidates) {
    if (fits()) break;
    auto it = blobs_.find(key);
    bytes_used_ -= it->second->header.total_bytes;
    evicted->push_back(std::move(it->second));
    blobs_.erase(it);
    ++evictions_;
  }
  CKPTD_CHECK(fits());
  return true;
}

absl::Status Store::EndPut(const BlobHeader& header, std::unique_ptr<char[]>* data, bool store) {
  const uint64_t n = header.total_bytes;
  absl::MutexLock lock(&mu_);
  auto it = arriving_.find(header.key);
  CKPTD_CHECK(it != arriving_.end());
  const bool dropped = it->second.dropped;
  arriving_.erase(it);
  bytes_reserved_ -= n;
  nodes_.at(header.key.origin_node).inflight_bytes -= n;
  if (!store) return absl::OkStatus();
  if (dropped) {
    return absl::AbortedError(
        absl::StrCat(header.key.ToString(), ": its step was dropped while it arrived"));
  }
  auto blob = std::make_shared<StoredBlob>();
  blob->header = header;
  blob->data = std::move(*data);
  blob->seq = next_seq_++;
  bytes_used_ += n;
  blobs_.emplace(header.key, std::move(blob));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const StoredBlob>> Store::Find(const BlobKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = blobs_.find(key);
  if (it == blobs_.end()) {
    return absl::NotFoundError(absl::StrCat(key.ToString(), ": no such copy here"));
  }
  return it->second;
}

std::vector<std::pair<std::string, uint64_t>> Store::Held(const std::string& origin_node,
                                                          const std::string& job,
                                                          uint64_t step) const {
  std::vector<std::pair<std::string, uint64_t>> held;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [k, blob] : blobs_) {
      if (k.origin_node == origin_node && k.job == job && k.step == step) {
        held.emplace_back(k.blob, blob->header.total_bytes);
      }
    }
  }
  std::sort(held.begin(), held.end());
  return held;
}

Store::DropResult Store::Drop(const std::string& origin_node, const std::string& job,
                              uint64_t step) {
  DropResult result;
  std::vector<std::shared_ptr<const StoredBlob>> dropped;  // freed after the lock
  {
    absl::MutexLock lock(&mu_);
    for (auto it = blobs_.begin(); it != blobs_.end();) {
      const BlobKey& k = it->first;
      if (k.origin_node == origin_node && k.job == job && k.step == step) {
        result.bytes += it->second->header.total_bytes;
        ++result.blobs;
        dropped.push_back(std::move(it->second));
        blobs_.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto& [k, arriving] : arriving_) {
      if (k.origin_node == origin_node && k.job == job && k.step == step) arriving.dropped = true;
    }
    bytes_used_ -= result.bytes;
  }
  return result;
}

Store::Usage Store::usage() const {
  absl::MutexLock lock(&mu_);
  return Usage{limits_.bytes_max, bytes_used_, bytes_reserved_, blobs_.size(), evictions_};
}

Store::Put::Put(Store* store, BlobHeader header)
    : store_(store),
      header_(std::move(header)),
      data_(std::make_unique_for_overwrite<char[]>(header_.total_bytes)) {}

Store::Put::~Put() {
  if (!ended_) (void)store_->EndPut(header_, nullptr, false);
}

absl::Status Store::Put::Append(std::span<const char> bytes) {
  if (!failed_.ok()) return failed_;
  if (ended_ || bytes.size() > header_.total_bytes - received_) {
    failed_ = absl::InvalidArgumentError(absl::StrCat(
        header_.key.ToString(), ": the sender sent more than total_bytes = ", header_.total_bytes));
    return failed_;
  }
  std::memcpy(data_.get() + received_, bytes.data(), bytes.size());
  received_ += bytes.size();
  failed_ = VerifyCompleteBlocks();
  return failed_;
}

absl::Status Store::Put::VerifyCompleteBlocks() {
  const uint32_t b = header_.block_bytes;
  while (span_ < header_.spans.size()) {
    const Span& s = header_.spans[span_];
    if (block_ >= s.crcs.size()) {
      ++span_;
      block_ = 0;
      continue;
    }
    const uint64_t begin = s.offset + block_ * b;
    const uint64_t end = std::min(begin + b, s.offset + s.length);
    if (end > received_) break;
    const uint32_t got = Crc32c(data_.get() + begin, end - begin);
    if (got != s.crcs[block_]) {
      return absl::DataLossError(absl::StrFormat(
          "%s: span %d block %d (bytes [%d, %d) of the blob) crc32c mismatch: got %08x, the "
          "header says %08x; nothing of it is kept",
          header_.key.ToString(), span_, block_, begin, end, got, s.crcs[block_]));
    }
    ++block_;
  }
  return absl::OkStatus();
}

absl::Status Store::Put::Finish() {
  if (!failed_.ok()) return failed_;
  CKPTD_CHECK(!ended_);
  if (received_ != header_.total_bytes) {
    failed_ =
        absl::InvalidArgumentError(absl::StrCat(header_.key.ToString(), ": the sender ended after ",
                                                received_, " of ", header_.total_bytes, " bytes"));
    return failed_;
  }
  CKPTD_CHECK(span_ == header_.spans.size());  // every block verified as it completed
  ended_ = true;
  absl::Status st = store_->EndPut(header_, &data_, true);
  if (st.ok() && store_->metrics_ != nullptr) {
    store_->metrics_->PeerBytes(header_.key.origin_node, "stored", header_.total_bytes);
  }
  return st;
}

}  // namespace ckptd::peer
