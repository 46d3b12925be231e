#include "peer/peer_client.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/peer.grpc.pb.h"
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

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& o) {
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
    : options_(std::move(options)), channel_(std::move(channel)) {}

Client::~Client() = default;

absl::StatusOr<v1::PeerHelloResponse> Client::Hello() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  v1::PeerHelloRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_protocol_version(1);
  v1::PeerHelloResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  if (absl::Status st = FromGrpc(stub->Hello(&ctx, req, &resp), options_); !st.ok()) return st;
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
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
  v1::PeerPutResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  std::unique_ptr<grpc::ClientWriter<v1::PeerPutRequest>> writer = stub->PutBlob(&ctx, &resp);
  v1::PeerPutRequest req;
  v1::PeerPutHeader* h = req.mutable_header();
  h->set_node_id(options_.self_node_id);
  h->set_job(job);
  h->set_step(step);
  h->set_blob(blob);
  h->set_total_bytes(data.size());
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
  for (uint64_t at = 0; open && at < data.size();) {
    const uint64_t n = std::min<uint64_t>(options_.chunk_bytes, data.size() - at);
    req.set_chunk(data.data() + at, n);
    // buffer_hint lets gRPC coalesce chunks into fewer TLS records and socket writes (about 2x
    // on loopback, bench/RESULTS.md); WritesDone() flushes.
    open = writer->Write(req, grpc::WriteOptions().set_buffer_hint());
    at += n;
    if (options_.after_chunk) options_.after_chunk(at);
  }
  if (open) writer->WritesDone();
  if (absl::Status st = FromGrpc(writer->Finish(), options_); !st.ok()) return st;
  return PutResult{resp.bytes_stored(), resp.deduplicated()};
}

absl::Status Client::GetBlob(const std::string& origin_node, const std::string& job, uint64_t step,
                             const std::string& blob, uint64_t offset, std::span<char> out) {
  if (out.empty()) return absl::OkStatus();
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.call_timeout);
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
  absl::Status st = FromGrpc(reader->Finish(), options_);
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
  v1::PeerDropRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_job(job);
  req.set_step(step);
  v1::PeerDropResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  if (absl::Status st = FromGrpc(stub->DropBlobs(&ctx, req, &resp), options_); !st.ok()) {
    return st;
  }
  return resp;
}

absl::StatusOr<std::map<std::string, uint64_t>> Client::HeldBlobs(const std::string& job,
                                                                  uint64_t step) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx,
              std::min(options_.call_timeout, absl::Milliseconds(limits::kPeerCheckTimeoutMs)));
  v1::PeerHeldRequest req;
  req.set_node_id(options_.self_node_id);
  req.set_job(job);
  req.set_step(step);
  v1::PeerHeldResponse resp;
  auto stub = v1::Peer::NewStub(channel_);
  if (absl::Status st = FromGrpc(stub->HeldBlobs(&ctx, req, &resp), options_); !st.ok()) {
    return st;
  }
  std::map<std::string, uint64_t> held;
  for (const v1::PeerHeldBlob& b : resp.blobs()) held[b.blob()] = b.total_bytes();
  return held;
}

}  // namespace ckptd::peer
