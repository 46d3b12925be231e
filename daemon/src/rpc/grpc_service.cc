#include "rpc/grpc_service.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ckptd {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

template <typename Fn>
grpc::ServerUnaryReactor* GrpcCheckpointService::Dispatch(grpc::CallbackServerContext* ctx,
                                                          Executor* pool, const char* method,
                                                          Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  bool posted = pool->Post([reactor, fn, method]() mutable {
    absl::Status st = fn();
    if (!st.ok()) spdlog::debug("{}: {}", method, st.ToString());
    reactor->Finish(ToGrpcStatus(st));
  });
  if (!posted) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 absl::StrCat(method, ": the daemon is overloaded (",
                                              pool->queued(), " calls queued); retry later")));
  }
  return reactor;
}

#define CKPTD_RPC(Name, Req, Resp, pool, call)                                              \
  grpc::ServerUnaryReactor* GrpcCheckpointService::Name(grpc::CallbackServerContext* ctx,  \
                                                        const v1::Req* req, v1::Resp* resp) { \
    (void)resp;                                                                             \
    return Dispatch(ctx, pools_.pool, #Name, [this, req, resp] { return call; });          \
  }

CKPTD_RPC(Hello, HelloRequest, HelloResponse, quick, svc_->Hello(*req, resp))
CKPTD_RPC(Goodbye, GoodbyeRequest, GoodbyeResponse, quick, svc_->Goodbye(*req))
CKPTD_RPC(ReserveExtents, ReserveExtentsRequest, ReserveExtentsResponse, waiters,
          svc_->ReserveExtents(*req, resp))
CKPTD_RPC(ReleaseExtents, ReleaseExtentsRequest, ReleaseExtentsResponse, quick,
          svc_->ReleaseExtents(*req))
CKPTD_RPC(RegisterRegion, RegisterRegionRequest, RegisterRegionResponse, quick,
          svc_->RegisterRegion(*req, resp))
CKPTD_RPC(UnregisterRegion, UnregisterRegionRequest, UnregisterRegionResponse, waiters,
          svc_->UnregisterRegion(*req))
CKPTD_RPC(Save, SaveRequest, SaveResponse, quick, svc_->Save(*req, resp))
CKPTD_RPC(Wait, WaitRequest, CheckpointStatus, waiters, svc_->Wait(*req, resp))
CKPTD_RPC(Commit, CommitRequest, CheckpointStatus, quick, svc_->Commit(*req, resp))
CKPTD_RPC(Abort, AbortRequest, CheckpointStatus, quick, svc_->Abort(*req, resp))
CKPTD_RPC(Load, LoadRequest, LoadResponse, loads, svc_->Load(*req, resp))
CKPTD_RPC(ListJobs, ListJobsRequest, ListJobsResponse, quick, svc_->ListJobs(*req, resp))
CKPTD_RPC(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse, quick,
          svc_->ListCheckpoints(*req, resp))
CKPTD_RPC(GetStatus, GetStatusRequest, CheckpointStatus, quick, svc_->GetStatus(*req, resp))
CKPTD_RPC(Inspect, InspectRequest, InspectResponse, quick, svc_->Inspect(*req, resp))
CKPTD_RPC(Delete, DeleteRequest, DeleteResponse, quick, svc_->Delete(*req))
CKPTD_RPC(Latest, LatestRequest, LatestResponse, quick, svc_->Latest(*req, resp))
CKPTD_RPC(Reshard, ReshardRequest, CheckpointStatus, quick, svc_->Reshard(*req, resp))

#undef CKPTD_RPC

}  // namespace ckptd
