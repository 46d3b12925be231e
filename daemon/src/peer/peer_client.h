// The sender side of the peer channel (docs/PEERS.md): one daemon's connection to another's peer
// listener (peer/peer_server.h), over mutual TLS with this daemon's certificate. PutBlob takes any
// memory it is given and never copies it whole (it sends bounded chunks).
//
// The server is checked to be the node the caller expects: its certificate must name
// `peer_node_id` (gRPC's hostname check, with the target name set to it), and Hello's answer must
// say the same.
//
// Stalls: a link or a peer that stops without closing (no RST, no FIN: a hung host, a black-holed
// route) would hold a call until `call_timeout`. Every call is watched instead: one that makes no
// progress for `stall_timeout` (no chunk written or read, no answer) is cancelled by the Client's
// watch thread and fails DEADLINE_EXCEEDED naming peer_stall_timeout_ms. A chunk written counts as
// progress once gRPC took it, so a link slower than the bytes gRPC buffers (the receiver's window,
// kPeerMessageBytesMax) per stall_timeout also counts as stalled.
//
// Who owns what: the Client owns its channel and its watch thread (joined by the destructor, after
// the calls: a Client must outlive its calls). A call's context lives on its caller's stack; the
// watch only cancels it (TryCancel, thread-safe) while the call is registered.
//
// Thread safety: a Client may be used from several threads at once (one gRPC channel; each call
// its own stream). Status codes: those of the Peer service (peer.proto), UNAVAILABLE when the
// peer cannot be reached, DEADLINE_EXCEEDED past `call_timeout` or after `stall_timeout` without
// progress.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/storage.h"
#include "ckptd/v1/peer.pb.h"
#include "common/limits.h"
#include "peer/peer_store.h"
#include "peer/peer_tls.h"

namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc

namespace ckptd::peer {

struct ClientOptions {
  std::string address;       // the peer's peer_listen_addr (host:port)
  std::string self_node_id;  // this daemon's node id (a name of its certificate)
  std::string peer_node_id;  // the node expected to answer
  TlsFiles tls;
  uint64_t chunk_bytes = limits::kPeerChunkBytes;  // <= kPeerChunkBytesMax
  absl::Duration call_timeout = absl::Minutes(10);
  // A call with no progress for this long is cancelled (option peer_stall_timeout_ms).
  absl::Duration stall_timeout = absl::Milliseconds(limits::kPeerStallTimeoutMs);
  // Testing and benchmarks: called after each PutBlob chunk is written, with the bytes sent so
  // far (tests/integration/peer_test.cc kills or stalls a sender mid-stream with it).
  std::function<void(uint64_t bytes_sent)> after_chunk;
};

struct PutResult {
  uint64_t bytes_stored = 0;
  bool deduplicated = false;
};

class Client {
 public:
  // Reads and checks the certificate files (LoadTls; INVALID_ARGUMENT naming the file) and sets up
  // the channel; nothing is sent until the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  absl::StatusOr<v1::PeerHelloResponse> Hello();
  // Copies `data` as blob `blob` of (job, step). `spans` as the manifest records the blob's shards
  // (block crcs with `block_bytes`); empty: one span over the whole blob, its crcs computed here.
  absl::StatusOr<PutResult> PutBlob(const std::string& job, uint64_t step, const std::string& blob,
                                    std::span<const char> data, uint32_t block_bytes,
                                    std::vector<Span> spans = {});
  // Copies `size` bytes read from `source` as blob `blob` of (job, step), never holding more than
  // one chunk of it: a first pass reads it chunk by chunk for the block checksums of the header
  // (one span over the whole blob), a second sends it. A read of `source` that fails ends the put
  // (the peer stores nothing) with that error and sets *source_failed.
  absl::StatusOr<PutResult> PutBlobFrom(const std::string& job, uint64_t step,
                                        const std::string& blob, BlobReader& source, uint64_t size,
                                        uint32_t block_bytes, bool* source_failed);
  // Reads bytes [offset, offset + out.size()) of a copy `origin_node` placed on the peer into out.
  absl::Status GetBlob(const std::string& origin_node, const std::string& job, uint64_t step,
                       const std::string& blob, uint64_t offset, std::span<char> out);
  absl::StatusOr<v1::PeerDropResponse> DropBlobs(const std::string& job, uint64_t step);
  // The copies of (job, step) this daemon placed on the peer that it holds whole: blob -> bytes
  // (within kPeerCheckTimeoutMs: a holder that does not answer in time lost them, for repair).
  absl::StatusOr<std::map<std::string, uint64_t>> HeldBlobs(const std::string& job, uint64_t step);

  const ClientOptions& options() const { return options_; }

 private:
  class StallWatch;
  class Watched;
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);
  // The error of a call that ended with `st` (DEADLINE_EXCEEDED naming the stall when the watch
  // cancelled it).
  absl::Status Outcome(const grpc::Status& st, const Watched& w) const;
  // The chunk of bytes [at, at + n) of the blob being put, or why it cannot be had.
  using NextChunk = std::function<absl::StatusOr<std::span<const char>>(uint64_t at, uint64_t n)>;
  // PutBlob's body: the header, then chunks of chunk_bytes from `next` (its error ends the put,
  // cancelled, and is returned as is).
  absl::StatusOr<PutResult> Put(const std::string& job, uint64_t step, const std::string& blob,
                                uint64_t total_bytes, uint32_t block_bytes,
                                const std::vector<Span>& spans, const NextChunk& next);
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<StallWatch> watch_;
};

}  // namespace ckptd::peer
