// Internal to libckptd-client: the session with one daemon (Hello + Attach, arena mapping,
// re-connection after a daemon restart or a dropped connection, registered regions, outstanding
// arena buffers) and the RPC helper that puts a deadline on every call and maps gRPC statuses
// onto absl ones. Every call goes through a Connection (connection.h): the gRPC stub in
// production, a scripted daemon in tests/unit/client.
//
// Session lifetime: the daemon binds a session to the connection and to our Attach stream (see
// the proto). A thread reads that stream; when it ends (connection dropped, daemon stopped) the
// session is over on the daemon's side — its extents and regions released — so the next call
// opens a new session (a new generation: buffers of the old one are refused with
// FAILED_PRECONDITION) and registers the regions again.
//
// Threads: every method is thread-safe. mu_ guards the session state and is held across the
// re-connection sequence (Hello, Attach, map, re-register), never across the data-path RPCs.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "arena_mapping.h"
#include "ckptd/client.h"
#include "ckptd/v1/ckptd.pb.h"
#include "connection.h"
#include "gpu_regions.h"

#define CKPTD_CLIENT_RETURN_IF_ERROR(expr)         \
  do {                                             \
    ::absl::Status ckptd_status_ = (expr);         \
    if (!ckptd_status_.ok()) return ckptd_status_; \
  } while (0)

#include "ckptd/status.h"

namespace ckptd::internal {

namespace v1 = ::ckptd::v1;

// Errors of syscalls: ckptd::ErrnoStatus (daemon/include/ckptd/status.h), the one errno mapping
// of the daemon and the client.
using ::ckptd::ErrnoStatus;

// A consistent view of the session for one call.
struct Session {
  std::string session_id;
  std::shared_ptr<ArenaMapping> arena;
  uint64_t generation = 0;  // bumps on every new daemon instance
  v1::Limits limits;
};

// An extent reserved for one call, mapped.
struct MappedExtent {
  uint64_t id = 0;
  uint8_t* data = nullptr;
  uint64_t length = 0;
};

class ClientCore {
 public:
  // Checks `options`, then says Hello over `connection` (MakeUnixConnection in production).
  static absl::StatusOr<std::unique_ptr<ClientCore>> Create(ClientOptions options,
                                                            std::unique_ptr<Connection> connection);
  ~ClientCore();

  const std::string& target() const { return connection_->target(); }
  const ClientOptions& options() const { return options_; }
  Connection& connection() { return *connection_; }
  uint64_t reconnect_count() const { return reconnects_.load(); }

  // The current session, saying Hello first when the daemon may have changed.
  // FAILED_PRECONDITION once Close() was called.
  absl::StatusOr<Session> EnsureSession();
  // Client::Close.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // Runs one RPC `name` (the Connection method `rpc`) with a deadline of timeout_ms and maps its
  // answer (Convert). Sent once: a failed call is never repeated here (a Save or Reserve may have
  // taken effect); after UNAVAILABLE or UNKNOWN_SESSION the *next* call says Hello again.
  template <typename Req, typename Resp>
  absl::Status Call(const char* name, int64_t timeout_ms,
                    grpc::Status (Connection::*rpc)(const CallOptions&, const Req&, Resp*),
                    const Req& req, Resp* resp) {
    CallOptions o;
    o.timeout_ms = timeout_ms;
    return Convert(name, timeout_ms, (connection_.get()->*rpc)(o, req, resp));
  }
  // The one mapping of an answer onto the client's errors: the code 1:1 with the daemon's
  // message; UNAVAILABLE names the socket ("ckptd at unix:<path> is unavailable: ...") and marks
  // the session for a Hello; FAILED_PRECONDITION with reason UNKNOWN_SESSION marks it too; gRPC's
  // own deadline ("Deadline Exceeded") names the call and its deadline.
  absl::Status Convert(const char* name, int64_t timeout_ms, const grpc::Status& status);

  // Reserves extents of `sizes` (all non-zero) in as few ReserveExtents calls as the daemon's
  // limit allows; all or none.
  absl::StatusOr<std::vector<MappedExtent>> Reserve(const Session& session,
                                                    const std::vector<uint64_t>& sizes);
  // Best effort (the caller is already failing, or the extents are only scratch).
  void ReleaseQuietly(const Session& session, const std::vector<uint64_t>& extent_ids);

  // Zero-copy buffers handed to the caller (Allocate); consumed by a save or Release.
  void AddOutstanding(uint64_t generation, const MappedExtent& extent);
  // Forgets it; FAILED_PRECONDITION if it was not outstanding in the current session.
  absl::Status TakeOutstanding(uint64_t generation, uint64_t extent_id);
  // The extent ids of the outstanding buffers holding these addresses (each at most once).
  std::vector<uint64_t> OutstandingAt(std::span<const void* const> addresses);

  // Daemon-visible memory holding all of [data, data + bytes) in this process: an outstanding
  // arena buffer of `session`, or a registered region whose mapping the caller named. nullopt for
  // anything else (caller memory), for bytes == 0, and for ranges that straddle a buffer's end.
  std::optional<BufferRef> Locate(const Session& session, const void* data, uint64_t bytes);

  // Registered shm regions, by stable client handle. mapped_at: where this process maps the
  // region (nullptr: unknown), so Locate() recognises memory in it.
  absl::StatusOr<uint64_t> RegisterShm(const std::string& shm_name, uint64_t size_bytes,
                                       const void* mapped_at);
  absl::Status Unregister(uint64_t handle);
  // The daemon's id for [offset, offset + length) of region `handle` in the current session.
  absl::StatusOr<uint64_t> RegionId(uint64_t handle, uint64_t offset, uint64_t length);

  // Translates a BufferRef into a MemRef of the current session (bounds-checked locally).
  absl::Status ToMemRef(const Session& session, const BufferRef& ref, uint64_t length,
                        v1::MemRef* out);

  // The current session's generation (0 before the first Hello).
  uint64_t generation() {
    absl::MutexLock l(&mu_);
    return session_.generation;
  }

  int64_t rpc_timeout_ms() const { return options_.rpc_timeout_ms; }

  // GPU memory of this client's saves and loads (CUDA IPC regions, or the library's own copies).
  GpuRegions& gpu() { return gpu_; }

 private:
  struct ShmRegion {
    std::string shm_name;
    uint64_t size_bytes = 0;
    uint64_t server_id = 0;   // 0: not registered with the current instance
    std::string error;        // why re-registration failed
    uintptr_t mapped_at = 0;  // this process's mapping (0: not told)
  };
  struct Outstanding {
    uintptr_t data = 0;
    uint64_t bytes = 0;
  };

  ClientCore(ClientOptions options, std::unique_ptr<Connection> connection);
  absl::Status HelloLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the Attach stream of `session_id` and waits for its first event; the reader thread
  // then watches it end.
  absl::Status AttachLocked(const std::string& session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the current Attach stream (if any) and joins its reader.
  void DetachLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReregisterLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GoodbyeQuietly(const std::string& session_id);
  absl::StatusOr<Session> EnsureSessionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ArenaMemRef(const Session& session, const BufferRef& ref, uint64_t length,
                           v1::MemRef* out);

  const ClientOptions options_;
  const std::unique_ptr<Connection> connection_;
  std::atomic<uint64_t> reconnects_{0};
  GpuRegions gpu_;

  absl::Mutex mu_;
  // Set on UNAVAILABLE and when the connection drops; the next EnsureSession says Hello.
  std::atomic<bool> need_hello_{true};
  std::string daemon_instance_ ABSL_GUARDED_BY(mu_);
  Session session_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;  // Close() was called: no Hello ever again
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::unordered_map<uint64_t, ShmRegion> regions_ ABSL_GUARDED_BY(mu_);
  // Allocate()d extents of this session not yet consumed or released, by id and by address.
  std::unordered_map<uint64_t, Outstanding> outstanding_ ABSL_GUARDED_BY(mu_);
  std::map<uintptr_t, uint64_t> outstanding_at_ ABSL_GUARDED_BY(mu_);  // data -> extent id

  // The Attach stream of the current session and its reader thread.
  std::unique_ptr<SessionStream> attach_ ABSL_GUARDED_BY(mu_);
  std::thread attach_thread_ ABSL_GUARDED_BY(mu_);
  // Bumped whenever a stream is replaced, so an old reader ending does not flag the new session.
  std::atomic<uint64_t> attach_epoch_{0};
};

// The reason the daemon gave for a failed call (proto: ErrorDetail in the status details), the
// one thing besides the code the client decides on; ERROR_REASON_UNSPECIFIED when none.
v1::ErrorReason ReasonOf(const grpc::Status& status);

// Process-wide copy counters (Client::copy_stats), the only ones: every copy into or out of daemon
// memory, the library's (CountedCopy) and the strided ones (ckptd/strided_copy.h), counts here.
void CountedCopy(void* dst, const void* src, uint64_t bytes, bool is_load);
// Bytes the library copied to or from GPU memory itself (CUDA IPC could not be used).
void CountGpuFallback(uint64_t bytes);
void CountCopy(uint64_t bytes, bool is_load);

}  // namespace ckptd::internal
