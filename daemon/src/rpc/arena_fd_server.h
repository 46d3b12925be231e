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
// Ownership: owns the listening socket (removed at Stop) and its thread; each accepted
// connection lives only for its one exchange. The descriptors handed out are borrowed from the
// arena (the kernel duplicates them into the client). Bounds: one connection at a time, each
// given at most kIoTimeoutMs to send and to receive, so a client that stalls delays others by at
// most that long and holds nothing.
// Thread safety: Start/Stop from one thread; the lookup callback runs on the server's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "dataplane/arena.h"

namespace ckptd {

class ArenaFdServer {
 public:
  static constexpr size_t kSessionIdBytesMax = 128;
  static constexpr int kIoTimeoutMs = 1000;
  static constexpr const char* kPathSuffix = ".arena";

  // What a client of `uid` gets for its session (sent as "<name> <generation> <0|1>").
  using LookupFn =
      std::function<absl::StatusOr<ArenaGrant>(uint32_t uid, const std::string& session)>;

  // Listens at `path` (see ListenUnix in peer_listener.h for mode, gid and errors).
  static absl::StatusOr<std::unique_ptr<ArenaFdServer>> Listen(const std::string& path,
                                                               uint32_t mode, int64_t gid,
                                                               LookupFn lookup);
  ~ArenaFdServer();

  void Start();
  // Stops serving, joins the thread, removes the socket file. Idempotent.
  void Stop();

 private:
  ArenaFdServer() = default;
  void Loop();
  void Serve(int fd);

  std::string path_;
  LookupFn lookup_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
};

}  // namespace ckptd
