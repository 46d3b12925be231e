// gRPC callback adapter for CheckpointService: each RPC is translated into a task posted to a
// bounded executor, never run on gRPC's threads. Calls that may block (Wait, ReserveExtents on a
// full arena) go to a separate, bounded waiter pool; the data-moving Load goes to the load pool.
// A full pool, or a uid past its share of one, answers RESOURCE_EXHAUSTED at once (backpressure,
// docs/DESIGN.md invariants 5 and 6; docs/SECURITY.md "Per-uid shares").
// absl status codes map 1:1 onto gRPC codes. Every call is attributed to the Caller the kernel
// named for its connection (rpc/peer_listener.h); calls on connections the listener did not
// accept are PERMISSION_DENIED. Attach streams are tracked so the daemon can close them at stop
// (they never end by themselves).
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>

#include "ckptd/v1/ckptd.grpc.pb.h"
#include "common/fair_executor.h"
#include "common/inflight.h"
#include "grpcpp/grpcpp.h"
#include "rpc/peer_listener.h"
#include "service/checkpoint_service.h"

namespace ckptd {

grpc::Status ToGrpcStatus(const absl::Status& s);

// Every pool is fair among uids (common/fair_executor.h): per-uid queues served in turn, and
// per-uid shares of its threads and of its calls in flight.
struct RpcPools {
  FairExecutor* quick = nullptr;
  FairExecutor* waiters = nullptr;  // Wait: may block up to its timeout
  // ReserveExtents / UnregisterRegion: may wait for space or leases.
  FairExecutor* reserves = nullptr;
  FairExecutor* loads = nullptr;
  // Saves of more than limits::kLargeSaveShardsMin shards: their validation and journaling take
  // long enough (up to seconds) to be kept off the pool that serves Hello and small Saves.
  FairExecutor* large_saves = nullptr;
};

class AttachReactor;

class GrpcCheckpointService final : public v1::Checkpoint::CallbackService {
 public:
  // `metrics` (may be null): every call's latency by method and code, and Save's and Load's
  // outcomes and bytes by job.
  GrpcCheckpointService(CheckpointService* svc, const PeerListener* peers, RpcPools pools,
                        Metrics* metrics = nullptr)
      : svc_(svc), peers_(peers), pools_(pools), metrics_(metrics) {}
  ~GrpcCheckpointService() override;

  // Ends every open Attach stream (UNAVAILABLE: the daemon is stopping) so server shutdown does
  // not wait for them.
  void CloseSessions();
  // Waits until no unary call is in flight (every one posted has finished), at most `timeout`;
  // true if none is. Shutdown then need not wait for idle connections: a client that keeps its
  // channel open (a live trainer, a closed Python client) holds a connection, and gRPC's Shutdown
  // waits for every connection to close until its deadline.
  bool WaitIdle(absl::Duration timeout);

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* ctx, const v1::HelloRequest* req,
                                  v1::HelloResponse* resp) override;
  grpc::ServerWriteReactor<v1::SessionEvent>* Attach(grpc::CallbackServerContext* ctx,
                                                     const v1::AttachRequest* req) override;
  grpc::ServerUnaryReactor* Goodbye(grpc::CallbackServerContext* ctx, const v1::GoodbyeRequest* req,
                                    v1::GoodbyeResponse* resp) override;
  grpc::ServerUnaryReactor* ReserveExtents(grpc::CallbackServerContext* ctx,
                                           const v1::ReserveExtentsRequest* req,
                                           v1::ReserveExtentsResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseExtents(grpc::CallbackServerContext* ctx,
                                           const v1::ReleaseExtentsRequest* req,
                                           v1::ReleaseExtentsResponse* resp) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterRegionRequest* req,
                                           v1::RegisterRegionResponse* resp) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx,
                                             const v1::UnregisterRegionRequest* req,
                                             v1::UnregisterRegionResponse* resp) override;
  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* ctx, const v1::SaveRequest* req,
                                 v1::SaveResponse* resp) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const v1::WaitRequest* req,
                                 v1::CheckpointStatus* resp) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx, const v1::CommitRequest* req,
                                   v1::CheckpointStatus* resp) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* req,
                                  v1::CheckpointStatus* resp) override;
  grpc::ServerUnaryReactor* Load(grpc::CallbackServerContext* ctx, const v1::LoadRequest* req,
                                 v1::LoadResponse* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* req,
                                            v1::ListCheckpointsResponse* resp) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* req,
                                      v1::CheckpointStatus* resp) override;
  grpc::ServerUnaryReactor* Inspect(grpc::CallbackServerContext* ctx, const v1::InspectRequest* req,
                                    v1::InspectResponse* resp) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const v1::DeleteRequest* req,
                                   v1::DeleteResponse* resp) override;
  grpc::ServerUnaryReactor* Latest(grpc::CallbackServerContext* ctx, const v1::LatestRequest* req,
                                   v1::LatestResponse* resp) override;
  grpc::ServerUnaryReactor* Reshard(grpc::CallbackServerContext* ctx, const v1::ReshardRequest* req,
                                    v1::CheckpointStatus* resp) override;
  grpc::ServerUnaryReactor* CollectGarbage(grpc::CallbackServerContext* ctx,
                                           const v1::GcRequest* req, v1::GcResponse* resp) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* ctx,
                                     const v1::PrefetchRequest* req,
                                     v1::PrefetchResponse* resp) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* ctx, const v1::VerifyRequest* req,
                                   v1::VerifyResponse* resp) override;

 private:
  template <typename Fn>
  grpc::ServerUnaryReactor* Dispatch(grpc::CallbackServerContext* ctx, FairExecutor* pool,
                                     const char* method, Fn fn);

  friend class AttachReactor;
  void Forget(AttachReactor* r);

  CheckpointService* svc_;
  const PeerListener* peers_;
  RpcPools pools_;
  Metrics* metrics_;
  std::atomic<uint64_t> calls_{0};  // calls received: their request ids (common/log.h)
  absl::Mutex mu_;
  InFlight inflight_;  // unary calls received and not finished
  std::set<AttachReactor*> attached_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ckptd
