// Callers and client sessions.
//
// Caller: who is calling, as the kernel says (SO_PEERCRED of the unix-socket connection the RPC
// arrived on, taken by rpc/peer_listener.h when the connection was accepted), never as the client
// says. `connection` identifies that connection for the daemon's lifetime.
//
// SessionTable owns the client sessions. A session is opened by Hello and belongs to the caller's
// uid and connection: every call naming it must come from that uid on that connection, so a
// leaked id is useless anywhere else. Its life is bound to the connection, not to a pid the client
// reports (pids mean nothing across pid namespaces, e.g. a sidecar): the client opens the Attach
// stream right after Hello and the session ends when that stream ends — Goodbye, the client
// cancelling it, the client process dying (the kernel closes its socket), or the daemon stopping.
// A session never attached ends kSessionAttachTimeoutMs after Hello, as the table's Clock counts
// (the daemon's housekeeping calls ExpireUnattached). Ending a session releases
// what it holds through the on_end callback (its reserved extents and regions; leases held by
// operations in flight keep their memory until those operations finish — see arena.h and
// region_registry.h).
//
// Limits: kSessionsPerUidMax per uid and kSessionsMax in all; a breach is RESOURCE_EXHAUSTED
// naming the limit.
//
// Thread safety: all methods may be called concurrently; on_end runs without the table's lock
// held, on the thread that ended the session.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace ckptd {

struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;          // as the kernel maps it into the daemon's pid namespace; 0 if it cannot
  uint64_t connection = 0;  // unique per accepted connection
  bool admin = false;       // root, or a member of the daemon's admin_group
};

// "uid 1000 (pid 42)" for messages and logs.
std::string DescribeCaller(const Caller& c);

class SessionTable {
 public:
  using EndFn = std::function<void(const std::string& session_id)>;
  // `clock` (borrowed, must outlive the table) stamps when each session was opened.
  explicit SessionTable(EndFn on_end, const Clock* clock = RealClock())
      : on_end_(std::move(on_end)), clock_(clock) {}

  // Opens a session for `caller`. RESOURCE_EXHAUSTED beyond the per-uid or total limit.
  absl::StatusOr<std::string> Open(const Caller& caller, std::string client_name);
  // Binds the session's life to the caller's Attach stream. FAILED_PRECONDITION for an unknown
  // session, one of another caller or connection, or one already attached.
  absl::Status Attach(const Caller& caller, const std::string& id);
  // OK when `id` is a live session of `caller` on its connection; FAILED_PRECONDITION naming the
  // session otherwise, with reason UNKNOWN_SESSION (ckptd/error_reason.h; proto ErrorReason),
  // on which clients decide to open a new session.
  absl::Status Check(const Caller& caller, const std::string& id) const;
  // OK when `id` is a live session of `uid` (from any connection: the arena socket's peer, which
  // is a connection of its own); FAILED_PRECONDITION naming the session otherwise.
  absl::Status CheckUid(uint32_t uid, const std::string& id) const;
  // The generation of the arena segment the session was handed (the arena socket), "" before.
  void SetArenaGeneration(const std::string& id, const std::string& generation);
  std::string ArenaGeneration(const std::string& id) const;
  // Ends the session (idempotent) and calls on_end for it.
  void End(const std::string& id);
  // Ends every session opened more than `timeout` ago (on the table's clock) and never attached.
  // Returns how many.
  size_t ExpireUnattached(absl::Duration timeout);
  // Ends every session (daemon shutdown).
  void EndAll();
  size_t size() const;

 private:
  struct Session {
    uint32_t uid = 0;
    uint64_t connection = 0;
    std::string client_name;
    absl::Time opened;
    bool attached = false;
    std::string arena_generation;  // of the segment the arena socket handed it
  };
  EndFn on_end_;
  const Clock* clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd
