#include "peer/peer_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/status.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/align.h"
#include "format/crc32c.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"

namespace ckptd::peer {
namespace {

absl::Status FromGrpc(const grpc::Status& st, const ClientOptions& o) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(st.error_code()),
      absl::StrCat("peer ", o.peer_node_id, " at ", o.address, ": ", st.error_message()));
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

}  // namespace

// The calls of one Client in flight, and the thread that cancels those without progress for the
// stall timeout (it sleeps until the earliest can stall; ends with the Client).
class Client::StallWatch {
 public:
  explicit StallWatch(absl::Duration stall) : stall_(stall), thread_([this] { Loop(); }) {}
  ~StallWatch() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  uint64_t Add(grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    calls_[next_id_] = Call{ctx, absl::Now(), false};
    return next_id_++;
  }
  void Progress(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    calls_.at(id).last = absl::Now();
  }
  bool Stalled(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return calls_.at(id).stalled;
  }
  void Remove(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    calls_.erase(id);
  }
  absl::Duration stall() const { return stall_; }

 private:
  struct Call {
    grpc::ClientContext* ctx;
    absl::Time last;  // the call's last progress
    bool stalled;     // cancelled by the watch
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      const absl::Time now = absl::Now();
      absl::Time next = now + stall_;
      for (auto& [id, c] : calls_) {
        if (c.stalled) continue;
        if (now - c.last >= stall_) {
          c.stalled = true;
          c.ctx->TryCancel();  // thread-safe; the call's own thread sees it end
        } else {
          next = std::min(next, c.last + stall_);
        }
      }
      mu_.AwaitWithDeadline(absl::Condition(&stopping_), next);
    }
  }

  const absl::Duration stall_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Call> calls_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once every member it reads is built
};

// One call registered with the watch for its life (declared after its context, so it is
// forgotten before the context goes).
class Client::Watched {
 public:
  Watched(StallWatch* watch, grpc::ClientContext* ctx) : watch_(watch), id_(watch->Add(ctx)) {}
  ~Watched() { watch_->Remove(id_); }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
  void Progress() { watch_->Progress(id_); }
  bool stalled() const { return watch_->Stalled(id_); }

 private:
  StallWatch* const watch_;
  const uint64_t id_;
};

absl::Status Client::Outcome(const grpc::Status& st, const Watched& w) const {
  if (!st.ok() && w.stalled()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "peer ", options_.peer_node_id, " at ", options_.address, ": no progress for ",
        absl::ToInt64Milliseconds(watch_->stall()),
        " ms (peer_stall_timeout_ms): the link or the peer stalled; the call was cancelled"));
  }
  return FromGrpc(st, options_);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& o) {
  if (o.stall_timeout < absl::Milliseconds(limits::kPeerStallTimeoutMsMin)) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer client: stall_timeout = ", absl::FormatDuration(o.stall_timeout),
                     ": expected at least ", limits::kPeerStallTimeoutMsMin, " ms"));
  }
  if (o.chunk_bytes == 0 || o.chunk_bytes > limits::kPeerChunkBytesMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer client: chunk_bytes = ", o.chunk_bytes,
                     ": expected 1 to kPeerChunkBytesMax = ", limits::kPeerChunkBytesMax));
  }
  absl::StatusOr<TlsMaterial> tls = LoadTls(o.tls, absl::Now());
  if (!tls.ok()) return tls.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = tls->ca_pem;
  ssl.pem_private_key = tls->key_pem;
  ssl.pem_cert_chain = tls->cert_pem;
  grpc::ChannelArguments args;
  // The server's certificate must name the node we mean to reach.
  args.SetSslTargetNameOverride(o.peer_node_id);
  args.SetMaxReceiveMessageSize(static_cast<int>(limits::kPeerMessageBytesMax));
  args.SetMaxSendMessageSize(static_cast<int>(limits::kPeerMessageBytesMax));
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
              static_cast<int>(limits::kPeerMessageBytesMax));
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 * 1024 * 1024 - 1);
  args.SetInt(GRPC_ARG_TCP_READ_CHUNK_SIZE, static_cast<int>(limits::kPeerChunkBytes));
  args.SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, static_cast<int>(limits::kPeerChunkBytesMax));
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(o.address, grpc::SslCredentials(ssl), args);
  return std::unique_ptr<Client>(new Client(o, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      watch_(std::make_unique<StallWatch>(options_.stall_timeout)) {}

Client::~Client() = default;

absl::StatusOr<v1::PeerHelloResponse> Client::Hello() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  const Watched watched(watch_.get(), &ctx);
  v1::PeerHelloRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_protocol_version(1);
  v1::PeerHelloResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  if (absl::Status st = Outcome(stub->Hello(&ctx, req, &resp), watched); !st.ok()) return st;
  if (resp.node_id() != options_.peer_node_id) {
    return absl::PermissionDeniedError(absl::StrCat("peer at ", options_.address,
                                                    " says it is node \"", resp.node_id(),
                                                    "\", not \"", options_.peer_node_id, "\""));
  }
  return resp;
}

absl::StatusOr<PutResult> Client::PutBlob(const std::string& job, uint64_t step,
                                          const std::string& blob, std::span<const char> data,
                                          uint32_t block_bytes, std::vector<Span> spans) {
  if (spans.empty() && !data.empty() && block_bytes > 0) {
    spans.push_back(Span{0, data.size(), BlockCrcs(data.data(), data.size(), block_bytes)});
  }
  return Put(job, step, blob, data.size(), block_bytes, spans,
             [data](uint64_t at, uint64_t n) -> absl::StatusOr<std::span<const char>> {
               return data.subspan(at, n);
             });
}

absl::StatusOr<PutResult> Client::PutBlobFrom(const std::string& job, uint64_t step,
                                              const std::string& blob, BlobReader& source,
                                              uint64_t size, uint32_t block_bytes,
                                              bool* source_failed) {
  *source_failed = false;
  // Whole checksum blocks per chunk, so that each chunk's crcs are the blob's.
  const uint64_t chunk = std::max<uint64_t>(
      block_bytes,
      options_.chunk_bytes - options_.chunk_bytes % std::max<uint32_t>(block_bytes, 1));
  AlignedBuffer buf = AllocateAligned(RoundUp(std::min(chunk, std::max<uint64_t>(size, 1)), 4096));
  if (buf == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("peer put of ", blob, ": no memory for a ", chunk, "-byte chunk"));
  }
  char* const mem = reinterpret_cast<char*>(buf.get());
  auto read = [&](uint64_t at, uint64_t n) -> absl::StatusOr<std::span<const char>> {
    const IoSlice slice{mem, n, at};
    if (absl::Status st = source.Read({&slice, 1}); !st.ok()) {
      *source_failed = true;
      return st;
    }
    return std::span<const char>(mem, n);
  };
  std::vector<Span> spans;
  if (size > 0 && block_bytes > 0) {
    Span whole{0, size, {}};
    for (uint64_t at = 0; at < size; at += chunk) {
      CKPTD_ASSIGN_OR_RETURN(std::span<const char> c, read(at, std::min(chunk, size - at)));
      std::vector<uint32_t> crcs = BlockCrcs(c.data(), c.size(), block_bytes);
      whole.crcs.insert(whole.crcs.end(), crcs.begin(), crcs.end());
    }
    spans.push_back(std::move(whole));
  }
  // Sent in chunks of `chunk` too: each read fills the one buffer gRPC has copied from by then.
  return Put(job, step, blob, size, block_bytes, spans,
             [&](uint64_t at, uint64_t n) { return read(at, std::min(n, chunk)); });
}

absl::StatusOr<PutResult> Client::Put(const std::string& job, uint64_t step,
                                      const std::string& blob, uint64_t total_bytes,
                                      uint32_t block_bytes, const std::vector<Span>& spans,
                                      const NextChunk& next) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  Watched watched(watch_.get(), &ctx);
  v1::PeerPutResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  std::unique_ptr<grpc::ClientWriter<v1::PeerPutRequest>> writer = stub->PutBlob(&ctx, &resp);
  v1::PeerPutRequest req;
  v1::PeerPutHeader* h = req.mutable_header();
  h->set_node_id(options_.self_node_id);
  h->set_job(job);
  h->set_step(step);
  h->set_blob(blob);
  h->set_total_bytes(total_bytes);
  h->set_checksum_block_bytes(block_bytes);
  for (const Span& s : spans) {
    v1::PeerSpan* p = h->add_spans();
    p->set_offset(s.offset);
    p->set_length(s.length);
    p->mutable_block_crc32c()->Add(s.crcs.begin(), s.crcs.end());
  }
  bool open = writer->Write(req);
  // A stream the server ended early (refused, or deduplicated) stops taking writes: Finish()
  // then says why.
  for (uint64_t at = 0; open && at < total_bytes;) {
    absl::StatusOr<std::span<const char>> c =
        next(at, std::min<uint64_t>(options_.chunk_bytes, total_bytes - at));
    if (!c.ok()) {
      ctx.TryCancel();   // the peer drops what it received
      writer->Finish();  // CANCELLED: the error is the source's
      return c.status();
    }
    req.set_chunk(c->data(), c->size());
    // buffer_hint lets gRPC coalesce chunks into fewer TLS records and socket writes (about 2x
    // on loopback, bench/RESULTS.md); WritesDone() flushes. The chunk is serialized (copied) by
    // Write, so the caller's buffer may be refilled once it returns.
    open = writer->Write(req, grpc::WriteOptions().set_buffer_hint());
    watched.Progress();
    at += c->size();
    if (options_.after_chunk) options_.after_chunk(at);
  }
  if (open) writer->WritesDone();
  if (absl::Status st = Outcome(writer->Finish(), watched); !st.ok()) return st;
  return PutResult{resp.bytes_stored(), resp.deduplicated()};
}

absl::Status Client::GetBlob(const std::string& origin_node, const std::string& job, uint64_t step,
                             const std::string& blob, uint64_t offset, std::span<char> out) {
  if (out.empty()) return absl::OkStatus();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  Watched watched(watch_.get(), &ctx);
  v1::PeerGetRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_origin_node(origin_node);
  req.set_job(job);
  req.set_step(step);
  req.set_blob(blob);
  req.set_offset(offset);
  req.set_length(out.size());
  auto stub = v1::Peer::NewStub(channel_);
  std::unique_ptr<grpc::ClientReader<v1::PeerGetChunk>> reader = stub->GetBlob(&ctx, req);
  v1::PeerGetChunk chunk;
  uint64_t got = 0;
  absl::Status bad;
  while (reader->Read(&chunk)) {
    watched.Progress();
    if (!bad.ok()) continue;
    if (chunk.offset() != offset + got || chunk.data().size() > out.size() - got) {
      bad = absl::DataLossError(absl::StrCat("peer ", options_.peer_node_id, ": GetBlob of ", blob,
                                             " sent bytes at ", chunk.offset(),
                                             " out of order or past the range asked"));
      ctx.TryCancel();
      continue;
    }
    std::memcpy(out.data() + got, chunk.data().data(), chunk.data().size());
    got += chunk.data().size();
  }
  absl::Status st = Outcome(reader->Finish(), watched);
  if (!bad.ok()) return bad;
  if (!st.ok()) return st;
  if (got != out.size()) {
    return absl::DataLossError(absl::StrCat("peer ", options_.peer_node_id, ": GetBlob of ", blob,
                                            " ended after ", got, " of ", out.size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PeerDropResponse> Client::DropBlobs(const std::string& job, uint64_t step) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  const Watched watched(watch_.get(), &ctx);
  v1::PeerDropRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_job(job);
  req.set_step(step);
  v1::PeerDropResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  if (absl::Status st = Outcome(stub->DropBlobs(&ctx, req, &resp), watched); !st.ok()) {
    return st;
  }
  return resp;
}

absl::StatusOr<std::map<std::string, uint64_t>> Client::HeldBlobs(const std::string& job,
                                                                  uint64_t step) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx,
              std::min(options_.call_timeout, absl::Milliseconds(limits::kPeerCheckTimeoutMs)));
  const Watched watched(watch_.get(), &ctx);
  v1::PeerHeldRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_job(job);
  req.set_step(step);
  v1::PeerHeldResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  if (absl::Status st = Outcome(stub->HeldBlobs(&ctx, req, &resp), watched); !st.ok()) {
    return st;
  }
  std::map<std::string, uint64_t> held;
  for (const v1::PeerHeldBlob& b : resp.blobs()) held[b.blob()] = b.total_bytes();
  return held;
}

}  // namespace ckptd::peer
