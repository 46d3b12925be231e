// A scripted daemon behind libckptd-client's Connection seam (client/cpp/src/connection.h), so the
// client's logic — batching, re-connection, deadlines, the mapping of errors — is tested without a
// ckptd process. It is a small model of the daemon's client API, not a copy of it: sessions bound
// to an Attach stream, a staging arena (a memfd both sides map, so the bytes a save copies and a
// load returns are real), extents, registered regions, and a store of checkpoint items that
// Save fills and Load, Inspect and Latest read. Every call is recorded (method, deadline,
// session, request) and any call can be scripted to fail (FailNext), as can the daemon as a
// whole (SetDown, Restart, DropSessions, ForgetSessions); a save can be held in flight (OnSave).
//
// Ownership: tests hold a shared_ptr<FakeDaemon> and hand the client Connect()'s Connection, which
// keeps the daemon alive. Threads: every method is thread-safe (mu_); Attach streams block in Read
// on the stream's own lock, never on mu_.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/client.h"
#include "connection.h"

namespace ckptd::testing {

namespace v1 = ::ckptd::v1;
using internal::CallOptions;

// One Attach stream's state, shared by the daemon (which ends it) and the client's stream
// (MakeStream: it sends `attached`, then blocks in Read until the daemon or the client ends it).
struct StreamState {
  absl::Mutex mu;
  bool sent_attached ABSL_GUARDED_BY(mu) = false;
  bool ended ABSL_GUARDED_BY(mu) = false;
  grpc::Status status ABSL_GUARDED_BY(mu);

  void End(grpc::Status why) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    if (ended) return;
    ended = true;
    status = std::move(why);
  }
  bool Ended() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock l(&mu);
    return ended;
  }
};
std::unique_ptr<internal::SessionStream> MakeStream(std::shared_ptr<StreamState> state);

// One call as the daemon received it.
struct Received {
  std::string method;
  int64_t timeout_ms = 0;
  bool wait_for_ready = false;
  std::string session_id;  // the request's, where it has one
};

class FakeDaemon : public std::enable_shared_from_this<FakeDaemon> {
 public:
  static constexpr const char* kTarget = "unix:/fake/ckptd.sock";

  explicit FakeDaemon(uint64_t arena_bytes = 1 << 20);
  ~FakeDaemon();

  // A connection to this daemon, for ClientFactory::Create.
  std::unique_ptr<internal::Connection> Connect();

  // --- scripting ---------------------------------------------------------------------------------
  // The next `times` calls of `method` ("Save", "Hello", "Load", "MapArena", ...) answer `status`
  // without doing anything; queued after what is scripted already. An OK status in the script
  // serves that call normally (to fail the second call: FailNext(m, OK), then FailNext(m, error)).
  void FailNext(const std::string& method, grpc::Status status, int times = 1);
  // Every call answers UNAVAILABLE as gRPC does when nothing listens on the socket; Hello, which
  // waits for the socket (wait_for_ready), answers DEADLINE_EXCEEDED as gRPC does at its deadline.
  void SetDown(bool down);
  // A new daemon instance: sessions, extents and regions forgotten, a new arena segment, every
  // Attach stream ended (UNAVAILABLE).
  void Restart();
  // Same instance, every session ended (its Attach stream too): a dropped connection.
  void DropSessions();
  // A restart nobody noticed yet: sessions unknown (calls naming one answer FAILED_PRECONDITION
  // with reason UNKNOWN_SESSION), their streams left open.
  void ForgetSessions();
  // Races at a chosen moment: `hook` runs at the start of every Save call, before the daemon
  // serves it and outside its lock, with the call's number (0, 1, ... in order of arrival) and its
  // request; a hook that blocks holds that save in flight (e.g. until the test has called
  // Restart). Set it before the calls it is for; nullptr clears it.
  using SaveHook = std::function<void(int call, const v1::SaveRequest& req)>;
  void OnSave(SaveHook hook);
  // The same at the start of every ReserveExtents call (before the client copies into what it
  // reserves): a hook that blocks holds a save before its copy.
  using ReserveHook = std::function<void(int call)>;
  void OnReserve(ReserveHook hook);
  // The limits Hello announces (extent alignment 4096 when 0).
  void SetLimits(const v1::Limits& limits);

  // --- the store ---------------------------------------------------------------------------------
  // A committed tensor item (row-major `bytes`) or replicated object of job/step.
  void AddTensor(const std::string& job, uint64_t step, const std::string& item, DType dtype,
                 std::vector<uint64_t> shape, std::string bytes);
  void AddObject(const std::string& job, uint64_t step, const std::string& item, std::string bytes);
  // What Wait, Commit, Abort and GetStatus answer for job/step (NOT_FOUND without one).
  void SetStatus(const std::string& job, uint64_t step, v1::CheckpointStatus status);
  // The bytes of an item (saved or added); "" when there is none.
  std::string Stored(const std::string& job, uint64_t step, const std::string& item);
  // Entries per page of ListJobs / ListCheckpoints / Inspect. Default: 1000
  void SetPageSize(size_t page_size);

  // --- what happened -----------------------------------------------------------------------------
  std::vector<Received> calls();
  // Methods in the order received.
  std::vector<std::string> methods();
  int count(const std::string& method);
  std::vector<v1::SaveRequest> saves();
  std::vector<v1::LoadRequest> loads();
  std::vector<v1::ReserveExtentsRequest> reserves();
  std::vector<v1::ReleaseExtentsRequest> releases();
  std::vector<v1::RegisterRegionRequest> registrations();
  // Extents reserved and not yet released or saved, now and at most at once.
  size_t extents_held();
  size_t extents_held_max();
  int arena_maps();          // MapArena calls that succeeded
  std::string session_id();  // the newest session ("" before the first Hello)
  int open_streams();        // Attach streams not ended

  // --- the Connection's calls (FakeConnection forwards here)
  // ---------------------------------------
  grpc::Status Hello(const CallOptions& o, const v1::HelloRequest& req, v1::HelloResponse* resp);
  std::unique_ptr<internal::SessionStream> Attach(const v1::AttachRequest& req);
  grpc::Status Goodbye(const CallOptions& o, const v1::GoodbyeRequest& req,
                       v1::GoodbyeResponse* resp);
  grpc::Status ReserveExtents(const CallOptions& o, const v1::ReserveExtentsRequest& req,
                              v1::ReserveExtentsResponse* resp);
  grpc::Status ReleaseExtents(const CallOptions& o, const v1::ReleaseExtentsRequest& req,
                              v1::ReleaseExtentsResponse* resp);
  grpc::Status RegisterRegion(const CallOptions& o, const v1::RegisterRegionRequest& req,
                              v1::RegisterRegionResponse* resp);
  grpc::Status UnregisterRegion(const CallOptions& o, const v1::UnregisterRegionRequest& req,
                                v1::UnregisterRegionResponse* resp);
  grpc::Status Save(const CallOptions& o, const v1::SaveRequest& req, v1::SaveResponse* resp);
  grpc::Status Load(const CallOptions& o, const v1::LoadRequest& req, v1::LoadResponse* resp);
  grpc::Status StatusCall(const std::string& method, const CallOptions& o, const std::string& job,
                          uint64_t step, v1::CheckpointStatus* resp);
  grpc::Status ListJobs(const CallOptions& o, const v1::ListJobsRequest& req,
                        v1::ListJobsResponse* resp);
  grpc::Status ListCheckpoints(const CallOptions& o, const v1::ListCheckpointsRequest& req,
                               v1::ListCheckpointsResponse* resp);
  grpc::Status Inspect(const CallOptions& o, const v1::InspectRequest& req,
                       v1::InspectResponse* resp);
  grpc::Status Delete(const CallOptions& o, const v1::DeleteRequest& req, v1::DeleteResponse* resp);
  grpc::Status Latest(const CallOptions& o, const v1::LatestRequest& req, v1::LatestResponse* resp);
  absl::StatusOr<std::shared_ptr<internal::ArenaMapping>> MapArena(const std::string& session_id,
                                                                   uint64_t bytes);

 private:
  struct Item {
    bool tensor = true;
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    std::vector<uint64_t> shape;
    uint64_t element_bytes = 1;
    std::string bytes;
  };
  using Key = std::pair<std::string, uint64_t>;  // job, step
  struct Extent {
    uint64_t offset = 0;
    uint64_t length = 0;
    std::string session;
  };
  // Records the call and answers what the script or the daemon's state says before it is served:
  // down, a scripted failure, an unknown session (session != nullptr). OK: serve it.
  grpc::Status Enter(const std::string& method, const CallOptions& o, const std::string* session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndStreams(grpc::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NewArena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes [offset, +length) of extent `id` of `session` in the daemon's view of the arena.
  absl::StatusOr<uint8_t*> ExtentBytes(const std::string& session, const v1::MemRef& ref)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  grpc::Status LoadItem(const std::string& session, const Key& key, const v1::LoadItemRequest& r,
                        v1::LoadedItem* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  const uint64_t arena_bytes_;
  int instance_ ABSL_GUARDED_BY(mu_) = 1;
  int next_session_ ABSL_GUARDED_BY(mu_) = 1;
  std::set<std::string> sessions_ ABSL_GUARDED_BY(mu_);  // live sessions
  std::string last_session_ ABSL_GUARDED_BY(mu_);        // the newest Hello's
  bool down_ ABSL_GUARDED_BY(mu_) = false;
  v1::Limits limits_ ABSL_GUARDED_BY(mu_);
  size_t page_size_ ABSL_GUARDED_BY(mu_) = 1000;
  int arena_fd_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<internal::ArenaMapping> arena_ ABSL_GUARDED_BY(mu_);  // the daemon's view
  int arena_maps_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_extent_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Extent> extents_ ABSL_GUARDED_BY(mu_);
  size_t extents_held_max_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::string> regions_ ABSL_GUARDED_BY(mu_);  // id -> session
  std::map<Key, std::map<std::string, Item>> store_ ABSL_GUARDED_BY(mu_);
  std::map<Key, v1::CheckpointStatus> statuses_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<grpc::Status>> fail_next_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<StreamState>> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::SaveRequest> saves_ ABSL_GUARDED_BY(mu_);
  SaveHook save_hook_ ABSL_GUARDED_BY(mu_);
  ReserveHook reserve_hook_ ABSL_GUARDED_BY(mu_);
  int reserve_calls_ ABSL_GUARDED_BY(mu_) = 0;
  int save_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::LoadRequest> loads_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReserveExtentsRequest> reserves_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReleaseExtentsRequest> releases_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterRegionRequest> registrations_ ABSL_GUARDED_BY(mu_);
};

// The status gRPC gives a call whose deadline passed.
grpc::Status GrpcDeadline();
// What the daemon answers for a session it does not know (code and reason as
// daemon/src/service/sessions.cc).
grpc::Status UnknownSession(const std::string& session_id);

}  // namespace ckptd::testing
