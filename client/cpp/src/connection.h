// Internal to libckptd-client: the seam between the client's logic and the daemon, as
// google-cloud-cpp's Client sits over a Connection. ClientCore and the save/load paths decide
// what to send, when (batches, re-connection, deadlines) and what an answer means (the gRPC
// status mapped onto an absl one, ClientCore::Convert); a Connection only carries one request to
// the daemon and its answer back. The production Connection (MakeUnixConnection) is the gRPC
// stub over the daemon's unix socket plus its arena socket; tests put a scripted daemon behind
// the same interface (tests/unit/client/fake_daemon.h) and build a Client over it with
// ClientFactory (client_factory.h).
//
// Answers are grpc::Status, exactly as the daemon (or gRPC itself: UNAVAILABLE, DEADLINE_EXCEEDED)
// produced them, so that the mapping onto the client's errors stays on the client's side of the
// seam and is tested there.
//
// Threads: every method may be called from several threads at once (the data-path RPCs run
// concurrently); LoadAsync's `done` runs on a thread of the connection's own.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "arena_mapping.h"
#include "ckptd/client.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd::internal {

namespace v1 = ::ckptd::v1;

// How one call is to be made: what the client decided, applied by the connection.
struct CallOptions {
  // The call's deadline, from when the connection sends it.
  int64_t timeout_ms = 0;
  // Wait for the socket to accept within the deadline instead of failing at once when it does not
  // (Hello only: it rides out a daemon restart).
  bool wait_for_ready = false;
};

// The session's Attach stream (the daemon ends it when the session ends).
class SessionStream {
 public:
  virtual ~SessionStream() = default;
  // Blocks for the next event; false once the stream ended (or was cancelled).
  virtual bool Read(v1::SessionEvent* event) = 0;
  // From any thread: a Read in progress or to come returns false.
  virtual void Cancel() = 0;
  // Once Read returned false: why the stream ended.
  virtual grpc::Status Finish() = 0;
};

// What an asynchronous call needs kept alive until its `done` ran (the gRPC context). The caller
// destroys it only after `done` was called.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
};

// One daemon, seen from the client. Unary calls block until the answer or the deadline.
class Connection {
 public:
  virtual ~Connection() = default;

  // "unix:<path>": how errors name the daemon.
  virtual const std::string& target() const = 0;

  virtual grpc::Status Hello(const CallOptions& o, const v1::HelloRequest& req,
                             v1::HelloResponse* resp) = 0;
  // Opens the session's event stream (no deadline: it lives as long as the session).
  virtual std::unique_ptr<SessionStream> Attach(const v1::AttachRequest& req) = 0;
  virtual grpc::Status Goodbye(const CallOptions& o, const v1::GoodbyeRequest& req,
                               v1::GoodbyeResponse* resp) = 0;
  virtual grpc::Status ReserveExtents(const CallOptions& o, const v1::ReserveExtentsRequest& req,
                                      v1::ReserveExtentsResponse* resp) = 0;
  virtual grpc::Status ReleaseExtents(const CallOptions& o, const v1::ReleaseExtentsRequest& req,
                                      v1::ReleaseExtentsResponse* resp) = 0;
  virtual grpc::Status RegisterRegion(const CallOptions& o, const v1::RegisterRegionRequest& req,
                                      v1::RegisterRegionResponse* resp) = 0;
  virtual grpc::Status UnregisterRegion(const CallOptions& o,
                                        const v1::UnregisterRegionRequest& req,
                                        v1::UnregisterRegionResponse* resp) = 0;
  virtual grpc::Status Save(const CallOptions& o, const v1::SaveRequest& req,
                            v1::SaveResponse* resp) = 0;
  virtual grpc::Status Wait(const CallOptions& o, const v1::WaitRequest& req,
                            v1::CheckpointStatus* resp) = 0;
  virtual grpc::Status Commit(const CallOptions& o, const v1::CommitRequest& req,
                              v1::CheckpointStatus* resp) = 0;
  virtual grpc::Status Abort(const CallOptions& o, const v1::AbortRequest& req,
                             v1::CheckpointStatus* resp) = 0;
  virtual grpc::Status ListJobs(const CallOptions& o, const v1::ListJobsRequest& req,
                                v1::ListJobsResponse* resp) = 0;
  virtual grpc::Status ListCheckpoints(const CallOptions& o, const v1::ListCheckpointsRequest& req,
                                       v1::ListCheckpointsResponse* resp) = 0;
  virtual grpc::Status GetStatus(const CallOptions& o, const v1::GetStatusRequest& req,
                                 v1::CheckpointStatus* resp) = 0;
  virtual grpc::Status Inspect(const CallOptions& o, const v1::InspectRequest& req,
                               v1::InspectResponse* resp) = 0;
  virtual grpc::Status Delete(const CallOptions& o, const v1::DeleteRequest& req,
                              v1::DeleteResponse* resp) = 0;
  virtual grpc::Status Latest(const CallOptions& o, const v1::LatestRequest& req,
                              v1::LatestResponse* resp) = 0;
  // Sends a Load and returns at once; `done` gets its status once `resp` is filled. `req` and
  // `resp` must outlive the call, as must the returned PendingCall (until `done` ran).
  virtual std::unique_ptr<PendingCall> LoadAsync(const CallOptions& o, const v1::LoadRequest* req,
                                                 v1::LoadResponse* resp,
                                                 std::function<void(grpc::Status)> done) = 0;

  // Maps the staging arena of session `session_id` (`bytes`, as Hello announced): the production
  // connection fetches the segment's descriptor from the daemon's arena socket
  // (ArenaMapping::Map); errors as ArenaMapping::Map's.
  virtual absl::StatusOr<std::shared_ptr<ArenaMapping>> MapArena(const std::string& session_id,
                                                                 uint64_t bytes,
                                                                 bool pin_for_cuda) = 0;
};

// The production connection: gRPC over the unix socket options.socket_path ($CKPTD_SOCKET, else
// the default), one connection per Client, the arena socket beside it. Creating it contacts
// nothing (the first Hello does).
std::unique_ptr<Connection> MakeUnixConnection(const ClientOptions& options);

}  // namespace ckptd::internal
