// The peer listener (docs/PEERS.md): the Peer service of proto/ckptd/v1/peer.proto on its own TCP
// address (option peer_listen_addr), gRPC over mutual TLS only - never the client API, which is
// served on the Unix socket alone. Every connection must present a certificate the peer CA
// signed; every request's node id must be a name of that certificate (peer/peer_tls.h), else
// PERMISSION_DENIED naming both. Copies land in the PeerStore it owns (peer/peer_store.h).
//
// Bounds: the store's per-node limits (streams, bytes in flight, connections with a call in
// flight), kPeerStreamsPerConnectionMax HTTP/2 streams per connection, kPeerServerThreadsMax
// handler threads, kPeerMessageBytesMax per message.
//
// Threads: gRPC's synchronous server runs each call on one of its threads; a PutBlob verifies its
// chunks' blocks on that thread as they arrive (the checksum work is bounded by the streams).
// Start() and Stop() from one thread; the server must be stopped before it is destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckptd/storage.h"
#include "common/limits.h"
#include "peer/peer_store.h"
#include "peer/peer_tls.h"

namespace ckptd {
class Metrics;
}

namespace ckptd::peer {

struct ServerOptions {
  std::string listen_addr;  // host:port (port 0: any; Server::port() tells)
  std::string node_id;      // this daemon's; a name of its certificate
  TlsFiles tls;
  Store::Limits store;
  // This node's local storage (null: none): a blob this node wrote itself (origin_node is this
  // node) and holds no peer copy of is served from its checkpoint directory there — a checkpoint
  // committed at the peer tier keeps each node's own blobs on that node (docs/PEERS.md). Any
  // authenticated peer may read it, as it may read the copies the store holds; the reader
  // verifies every block against the manifest. Outlives the Server.
  ckptd::Storage* local = nullptr;
  // A connection with calls in flight is pinged this often, and closed when a ping is not
  // answered within it (its calls end, their puts store nothing): a sender whose link stalls
  // without closing holds its stream slot and reservation about twice this long, not until its
  // deadline (option peer_stall_timeout_ms).
  uint64_t stall_timeout_ms = limits::kPeerStallTimeoutMs;
};

class Server {
 public:
  // Checks the certificate files (LoadTls, CheckOwnIdentity) and starts listening.
  // INVALID_ARGUMENT naming the option and file, UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       Metrics* metrics);
  ~Server();  // Stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Refuses new calls and ends those in flight within `grace_ms` (their puts store nothing).
  void Stop(uint64_t grace_ms = 2000);
  int port() const;
  Store& store();

 private:
  class Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::peer
