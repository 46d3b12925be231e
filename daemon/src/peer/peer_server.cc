#include "peer/peer_server.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ckptd/sync_point.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/inflight.h"
#include "common/limits.h"
#include "format/names.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/server_credentials.h"
#include "metrics/metrics.h"
#include "spdlog/spdlog.h"

namespace ckptd::peer {
namespace {

constexpr uint32_t kProtocolVersion = 1;
// A connection to the listener: its TLS handshake (a certificate the peer CA signed) must complete
// within this; one with no call for kConnectionIdleMs is closed. (They bound only this listener;
// they belong in common/limits.h and move there with its next change, which rebuilds the tree.)
constexpr int kHandshakeTimeoutMs = 10'000;
constexpr int kConnectionIdleMs = 300'000;

grpc::Status ToGrpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

BlobHeader FromProto(const v1::PeerPutHeader& p) {
  BlobHeader h;
  h.key = BlobKey{p.node_id(), p.job(), p.step(), p.blob()};
  h.total_bytes = p.total_bytes();
  h.block_bytes = p.checksum_block_bytes();
  h.spans.reserve(p.spans_size());
  for (const v1::PeerSpan& s : p.spans()) {
    h.spans.push_back(
        Span{s.offset(), s.length(), {s.block_crc32c().begin(), s.block_crc32c().end()}});
  }
  return h;
}

class Service final : public v1::Peer::Service {
 public:
  // The calls in flight (Server::Stop waits for them, not for idle connections).
  bool WaitIdle(absl::Duration timeout) { return inflight_.WaitIdle(timeout); }

  Service(std::string node_id, Store* store, ckptd::Storage* local, Metrics* metrics)
      : node_id_(std::move(node_id)), store_(store), local_(local), metrics_(metrics) {}

  grpc::Status Hello(grpc::ServerContext* ctx, const v1::PeerHelloRequest* req,
                     v1::PeerHelloResponse* resp) override {
    const InFlight::Scope counted(&inflight_);
    if (absl::Status st = Authenticate(ctx, req->node_id()); !st.ok()) return ToGrpc(st);
    const Store::Usage u = store_->usage();
    const Store::Limits& l = store_->limits();
    resp->set_node_id(node_id_);
    resp->set_protocol_version(kProtocolVersion);
    resp->set_peer_bytes_max(u.bytes_max);
    resp->set_peer_bytes_used(u.bytes_used);
    resp->set_peer_bytes_reserved(u.bytes_reserved);
    resp->set_blobs_held(u.blobs);
    resp->set_chunk_bytes_max(limits::kPeerChunkBytesMax);
    resp->set_streams_per_node_max(static_cast<uint32_t>(l.streams_per_node_max));
    resp->set_inflight_bytes_per_node_max(l.inflight_bytes_per_node_max);
    resp->set_connections_per_node_max(static_cast<uint32_t>(l.connections_per_node_max));
    return grpc::Status::OK;
  }

  grpc::Status PutBlob(grpc::ServerContext* ctx, grpc::ServerReader<v1::PeerPutRequest>* reader,
                       v1::PeerPutResponse* resp) override {
    const InFlight::Scope counted(&inflight_);
    v1::PeerPutRequest req;
    if (!reader->Read(&req) || !req.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "PutBlob: the first message must be the header");
    }
    const std::string node = req.header().node_id();
    if (absl::Status st = Authenticate(ctx, node); !st.ok()) return ToGrpc(st);
    absl::StatusOr<std::unique_ptr<Store::Stream>> stream = store_->OpenStream(node, ctx->peer());
    if (!stream.ok()) return ToGrpc(stream.status());
    absl::StatusOr<std::unique_ptr<Store::Put>> put =
        store_->BeginPut(**stream, FromProto(req.header()));
    if (!put.ok()) return ToGrpc(put.status());
    if (*put == nullptr) {
      resp->set_deduplicated(true);
      resp->set_bytes_stored(req.header().total_bytes());
      return grpc::Status::OK;
    }
    while (reader->Read(&req)) {
      if (req.part_case() != v1::PeerPutRequest::kChunk) {
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat((*put)->header().key.ToString(), ": a second header in one PutBlob"));
      }
      const std::string& chunk = req.chunk();
      if (metrics_ != nullptr) metrics_->PeerBytes(node, "received", chunk.size());
      if (absl::Status st = (*put)->Append(chunk); !st.ok()) {
        spdlog::warn("peer put refused: {}", st.ToString());
        return ToGrpc(st);
      }
    }
    if (ctx->IsCancelled()) {
      spdlog::warn("peer put of {} cancelled after {} bytes (the sender is gone): dropped",
                   (*put)->header().key.ToString(), (*put)->received());
      return grpc::Status(grpc::StatusCode::CANCELLED, "the sender hung up");
    }
    if (absl::Status st = (*put)->Finish(); !st.ok()) return ToGrpc(st);
    CKPTD_SYNC_POINT("peer.copy_stored");
    resp->set_bytes_stored((*put)->header().total_bytes);
    return grpc::Status::OK;
  }

  grpc::Status GetBlob(grpc::ServerContext* ctx, const v1::PeerGetRequest* req,
                       grpc::ServerWriter<v1::PeerGetChunk>* writer) override {
    const InFlight::Scope counted(&inflight_);
    if (absl::Status st = Authenticate(ctx, req->node_id()); !st.ok()) return ToGrpc(st);
    absl::StatusOr<std::unique_ptr<Store::Stream>> stream =
        store_->OpenStream(req->node_id(), ctx->peer());
    if (!stream.ok()) return ToGrpc(stream.status());
    const BlobKey key{req->origin_node(), req->job(), req->step(), req->blob()};
    absl::StatusOr<std::shared_ptr<const StoredBlob>> blob = store_->Find(key);
    if (absl::IsNotFound(blob.status()) && local_ != nullptr && key.origin_node == node_id_) {
      return ServeOwn(*req, key, writer);
    }
    if (!blob.ok()) return ToGrpc(blob.status());
    const uint64_t size = (*blob)->header.total_bytes;
    absl::StatusOr<std::pair<uint64_t, uint64_t>> range = RangeOf(*req, key, size);
    if (!range.ok()) return ToGrpc(range.status());
    const char* const data = (*blob)->data.get();
    return Stream(*req, *range, writer, [&](uint64_t at, uint64_t n, std::string* out) {
      out->assign(data + at, n);
      return absl::OkStatus();
    });
  }

  grpc::Status DropBlobs(grpc::ServerContext* ctx, const v1::PeerDropRequest* req,
                         v1::PeerDropResponse* resp) override {
    const InFlight::Scope counted(&inflight_);
    if (absl::Status st = Authenticate(ctx, req->node_id()); !st.ok()) return ToGrpc(st);
    const Store::DropResult r = store_->Drop(req->node_id(), req->job(), req->step());
    resp->set_blobs_dropped(r.blobs);
    resp->set_bytes_freed(r.bytes);
    return grpc::Status::OK;
  }

  grpc::Status HeldBlobs(grpc::ServerContext* ctx, const v1::PeerHeldRequest* req,
                         v1::PeerHeldResponse* resp) override {
    const InFlight::Scope counted(&inflight_);
    if (absl::Status st = Authenticate(ctx, req->node_id()); !st.ok()) return ToGrpc(st);
    for (const auto& [blob, bytes] : store_->Held(req->node_id(), req->job(), req->step())) {
      v1::PeerHeldBlob* b = resp->add_blobs();
      b->set_blob(blob);
      b->set_total_bytes(bytes);
    }
    return grpc::Status::OK;
  }

 private:
  // [offset, end) of a GetBlob of a blob of `size` bytes (length 0: to its end).
  static absl::StatusOr<std::pair<uint64_t, uint64_t>> RangeOf(const v1::PeerGetRequest& req,
                                                               const BlobKey& key, uint64_t size) {
    const uint64_t offset = req.offset();
    if (offset > size || req.length() > size - offset) {
      return absl::OutOfRangeError(absl::StrCat(key.ToString(), ": bytes [", offset, ", +",
                                                req.length(), ") are not inside its ", size,
                                                " bytes"));
    }
    return std::make_pair(offset, req.length() == 0 ? size : offset + req.length());
  }

  // A blob of this node's own, from its checkpoint directory on local storage (the names are
  // checked first: no path outside that directory is ever opened). NOT_FOUND when it is not
  // there (a checkpoint this node no longer holds).
  grpc::Status ServeOwn(const v1::PeerGetRequest& req, const BlobKey& key,
                        grpc::ServerWriter<v1::PeerGetChunk>* writer) {
    if (absl::Status st = ValidateJobName(key.job); !st.ok()) return ToGrpc(st);
    if (!IsBlobFileName(key.blob)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(key.ToString(), ": not a blob's file name"));
    }
    absl::StatusOr<std::unique_ptr<BlobReader>> reader =
        local_->OpenBlob(absl::StrCat(CheckpointDir(key.job, key.step), "/", key.blob));
    if (!reader.ok()) {
      return ToGrpc(absl::IsNotFound(reader.status())
                        ? absl::NotFoundError(absl::StrCat(key.ToString(), ": not held here"))
                        : reader.status());
    }
    absl::StatusOr<std::pair<uint64_t, uint64_t>> range =
        RangeOf(req, key, (*reader)->size_bytes());
    if (!range.ok()) return ToGrpc(range.status());
    return Stream(req, *range, writer, [&](uint64_t at, uint64_t n, std::string* out) {
      out->resize(n);
      const IoSlice slice{.buf = out->data(), .len = n, .offset = at};
      return (*reader)->Read({&slice, 1});
    });
  }

  // Streams bytes [range.first, range.second) in chunks of kPeerChunkBytes, each filled by
  // `fill(offset, length, out)` (into the chunk's own buffer, reused from chunk to chunk).
  grpc::Status Stream(const v1::PeerGetRequest& req, std::pair<uint64_t, uint64_t> range,
                      grpc::ServerWriter<v1::PeerGetChunk>* writer,
                      const std::function<absl::Status(uint64_t, uint64_t, std::string*)>& fill) {
    v1::PeerGetChunk chunk;
    for (uint64_t at = range.first; at < range.second;) {
      const uint64_t n = std::min<uint64_t>(limits::kPeerChunkBytes, range.second - at);
      if (absl::Status st = fill(at, n, chunk.mutable_data()); !st.ok()) return ToGrpc(st);
      chunk.set_offset(at);
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the reader hung up");
      }
      if (metrics_ != nullptr) metrics_->PeerBytes(req.node_id(), "served", n);
      at += n;
    }
    return grpc::Status::OK;
  }

  absl::Status Authenticate(grpc::ServerContext* ctx, const std::string& claimed) {
    if (absl::Status st = ValidateNodeId(claimed); !st.ok()) return st;
    std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
    if (auth == nullptr) {
      return absl::UnauthenticatedError("the connection carries no authentication context");
    }
    absl::Status st = CheckPeerIdentity(*auth, claimed);
    if (!st.ok()) spdlog::warn("peer refused from {}: {}", ctx->peer(), st.ToString());
    return st;
  }

  const std::string node_id_;
  Store* const store_;
  ckptd::Storage* const local_;
  Metrics* const metrics_;
  InFlight inflight_;
};

}  // namespace

class Server::Impl {
 public:
  Impl(const ServerOptions& o, Metrics* metrics)
      : store(o.store, metrics), service(o.node_id, &store, o.local, metrics) {}
  Store store;
  Service service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool stopped = false;
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& o, Metrics* metrics) {
  absl::StatusOr<TlsMaterial> tls = LoadTls(o.tls, absl::Now());
  if (!tls.ok()) return tls.status();
  if (absl::Status st = CheckOwnIdentity(o.tls, *tls, o.node_id); !st.ok()) return st;
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls->ca_pem;
  ssl.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  auto impl = std::make_unique<Impl>(o, metrics);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen_addr, grpc::SslServerCredentials(ssl), &impl->port);
  builder.RegisterService(&impl->service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(limits::kPeerMessageBytesMax));
  builder.SetMaxSendMessageSize(static_cast<int>(limits::kPeerMessageBytesMax));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(limits::kPeerStreamsPerConnectionMax));
  // Bulk transfer: a wide HTTP/2 window and large socket reads (gRPC's defaults suit small
  // messages; bench/peer_bench.cc measures the difference).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(limits::kPeerMessageBytesMax));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 * 1024 * 1024 - 1);
  builder.AddChannelArgument(GRPC_ARG_TCP_READ_CHUNK_SIZE,
                             static_cast<int>(limits::kPeerChunkBytes));
  builder.AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE,
                             static_cast<int>(limits::kPeerChunkBytesMax));
  // gRPC 1.51 cannot cap the connections of a listener: a connection that does not complete
  // the TLS handshake (a client certificate the CA signed) in time is closed, and an idle one
  // after a while, so only working peers hold connections.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kHandshakeTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kConnectionIdleMs);
  // A link that stalls without closing: the pings of a connection with calls in flight go
  // unanswered, and the connection is closed (ServerOptions::stall_timeout_ms).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(o.stall_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(o.stall_timeout_ms));
  grpc::ResourceQuota quota("ckptd-peer");
  quota.SetMaxThreads(static_cast<int>(limits::kPeerServerThreadsMax));
  builder.SetResourceQuota(quota);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    return absl::UnavailableError(
        absl::StrCat("option peer_listen_addr = \"", o.listen_addr, "\": cannot listen there"));
  }
  spdlog::info("peer channel on {} (port {}, mutual TLS, node {}, peer_bytes_max {})",
               o.listen_addr, impl->port, o.node_id, o.store.bytes_max);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

void Server::Stop(uint64_t grace_ms) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  // Calls in flight get the grace; the other daemons' idle connections are then closed at once
  // (gRPC's Shutdown would otherwise wait for them until its deadline).
  if (!impl_->service.WaitIdle(absl::Milliseconds(grace_ms))) {
    spdlog::warn("peer channel: stopping with calls still in flight");
  }
  impl_->server->Shutdown(std::chrono::system_clock::now());
  impl_->server->Wait();
}

int Server::port() const { return impl_->port; }

Store& Server::store() { return impl_->store; }

}  // namespace ckptd::peer
