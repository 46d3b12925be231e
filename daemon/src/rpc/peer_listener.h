// PeerListener: the daemon's own accept loop on its unix socket, so the kernel — not the client —
// says who is calling. For each accepted connection it reads SO_PEERCRED (uid, gid, pid as seen
// from the daemon's pid namespace) and SO_PEERGROUPS, records them, and hands the socket to gRPC
// (grpc::AddInsecureChannelFromFd), which names that connection "fd:N" in
// ServerContext::peer(). RPC handlers turn the peer string into a Caller with Lookup().
//
// Why "fd:N" is a sound key: gRPC closes a connection's socket only when its transport is
// destroyed, which waits for every call on that connection to end; so while a handler runs,
// fd N is still the connection the call arrived on. A number reused by a later accept replaces
// the entry of the closed connection that had it (no call of that one is left).
//
// Ownership: owns the listening socket (removed at Stop) and the accept thread; accepted sockets
// belong to gRPC once handed over. Resource bounds: at most `connections_max` connections at
// once, and at most `uid_connections_max` of one uid (its share, docs/SECURITY.md): a connection
// past either is closed at once (the client sees UNAVAILABLE) and the refusal is logged as
// RESOURCE_EXHAUSTED naming the limit and the uid, so one uid can never take the descriptors
// another uid's connection needs. A connection counts until gRPC closes its socket (checked by
// the socket's inode when the count nears a limit). When accept fails for lack of descriptors the
// loop backs off instead of spinning.
// Thread safety: Lookup may be called from any thread, concurrently with the accept loop.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "service/sessions.h"

namespace ckptd {

struct ListenOptions {
  std::string path;                        // at most 107 bytes
  uint32_t mode = 0600;                    // permission bits of the socket file
  int64_t gid = -1;                        // group of the socket file; -1 keeps the daemon's
  int64_t admin_gid = -1;                  // members (and uid 0) are admin callers; -1: uid 0 only
  uint64_t connections_max = 1 << 20;      // connections at once, all uids
  uint64_t uid_connections_max = 1 << 20;  // connections at once of one uid
};

// Binds and listens on a unix socket at `path` with permission bits `mode` and group `gid` (-1:
// the daemon's), set before listen(). A stale socket file there is replaced; any other kind of
// file is FAILED_PRECONDITION (never removed). Returns the listening descriptor (non-blocking,
// close-on-exec; the caller owns it). Errors name the path.
absl::StatusOr<int> ListenUnix(const std::string& path, uint32_t mode, int64_t gid);
// The uid of the process on the other end of the connected unix socket `fd`, as the kernel says.
absl::StatusOr<uint32_t> PeerUid(int fd);

class PeerListener {
 public:
  // Binds and listens. A stale socket file at `path` is replaced; any other kind of file there
  // is FAILED_PRECONDITION (never removed). Errors name the path.
  static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(const ListenOptions& options);
  ~PeerListener();

  // Starts accepting; each connection is added to `server` (already started).
  void Start(grpc::Server* server);
  // Stops accepting, joins the thread and removes the socket file. Idempotent.
  void Stop();

  // The caller behind gRPC peer string "fd:N"; PERMISSION_DENIED for an unknown connection.
  absl::StatusOr<Caller> Lookup(const std::string& peer) const;

  uint64_t connections_accepted() const { return next_connection_.load() - 1; }

 private:
  PeerListener() = default;
  struct Conn {
    Caller caller;
    uint64_t ino = 0;  // the socket's inode: a descriptor number reused for anything else differs
  };
  void AcceptLoop(grpc::Server* server);
  Caller Identify(int fd);
  // Records the accepted connection `fd` of `c`; RESOURCE_EXHAUSTED (naming the limit and the
  // uid) when it would pass connections_max or c's share, and then it must be closed.
  absl::Status Admit(int fd, const Caller& c);
  // Forgets connections gRPC has closed.
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ListenOptions options_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the accept loop at Stop
  std::thread thread_;
  std::atomic<uint64_t> next_connection_{1};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, Conn> by_fd_ ABSL_GUARDED_BY(mu_);
  int64_t last_refusal_log_s_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refusals_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd
