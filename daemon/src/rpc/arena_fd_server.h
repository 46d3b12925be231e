// ArenaFdServer: hands each client the descriptor of its own uid's staging arena segment
// (dataplane/arena.h), over a unix socket beside the daemon's gRPC socket (its path with
// ".arena" appended, same mode and group), with SCM_RIGHTS. gRPC cannot carry descriptors, and a
// descriptor — not a name — is what keeps one uid out of another's staged bytes: the segments
// are mode 0600, owned by the daemon, and no client can open them by name. It also works where
// the client does not share the daemon's /dev/shm (another mount namespace: a sidecar).
//
// Protocol (proto/ckptd/v1/ckptd.proto, above HelloResponse): the client connects, sends its
// session id (at most kSessionIdBytesMax bytes) and shuts down its writing side; the server
// answers one status byte (0: OK, else the absl::StatusCode) and a message — on OK
// "<segment name> <generation> <1 if every page is resident, else 0>" — with the descriptor
// attached when OK, and closes. The kernel names the peer (SO_PEERCRED): the session must belong
// to that uid, so a leaked session id yields nothing to another uid.
//
// Ownership: owns the listening socket (removed at Stop), its thread and the connections it
// accepted, each of which lives only for its one exchange. The descriptors handed out are
// borrowed from the arena (the kernel duplicates them into the client). Bounds: at most
// kConnectionsMax connections at once (more wait in the listen backlog), each given kIoTimeoutMs
// to send its request (then DEADLINE_EXCEEDED and closed); one thread polls them all without
// blocking, so a client that stalls delays nobody and holds one slot for at most that long. One
// uid holds at most `uid_connections_max` of the slots (its share, docs/SECURITY.md): a
// connection of a uid past it is answered RESOURCE_EXHAUSTED naming the limit and the uid at
// once and closed, so a uid flooding the socket never keeps another uid's exchange waiting in
// the backlog. The reply (a few hundred bytes) always fits the socket's buffer.
// Thread safety: Start/Stop from one thread; the lookup callback runs on the server's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "dataplane/arena.h"

namespace ckptd {

class ArenaFdServer {
 public:
  static constexpr size_t kSessionIdBytesMax = 128;
  static constexpr int kIoTimeoutMs = 1000;
  static constexpr size_t kConnectionsMax = 64;
  static constexpr const char* kPathSuffix = ".arena";

  // What a client of `uid` gets for its session (sent as "<name> <generation> <0|1>").
  using LookupFn =
      std::function<absl::StatusOr<ArenaGrant>(uint32_t uid, const std::string& session)>;

  // Listens at `path` (see ListenUnix in peer_listener.h for mode, gid and errors).
  // `uid_connections_max`: one uid's share of the kConnectionsMax slots (at least 1).
  static absl::StatusOr<std::unique_ptr<ArenaFdServer>> Listen(
      const std::string& path, uint32_t mode, int64_t gid, LookupFn lookup,
      size_t uid_connections_max = kConnectionsMax);
  ~ArenaFdServer();

  void Start();
  // Stops serving, joins the thread, removes the socket file. Idempotent.
  void Stop();

 private:
  struct Conn {
    int fd = -1;
    uint32_t uid = 0;     // the peer, as the kernel says
    std::string request;  // the session id so far
    std::chrono::steady_clock::time_point deadline;
  };
  ArenaFdServer() = default;
  void Loop();
  void Accept(std::vector<Conn>* conns);
  // Reads what the client sent; false when the connection is done (answered, or gone).
  bool ReadMore(Conn& c);
  // Answers a connection past its deadline; true (it is done).
  bool Expire(Conn& c);
  void Answer(const Conn& c);

  std::string path_;
  LookupFn lookup_;
  size_t uid_connections_max_ = kConnectionsMax;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
};

}  // namespace ckptd
