#include "rpc/grpc_service.h"

#include "absl/strings/str_cat.h"
#include "ckptd/error_reason.h"
#include "common/limits.h"
#include "common/log.h"
#include "spdlog/spdlog.h"

namespace ckptd {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering. A reason for the client
  // to decide on travels as the status details (proto: ErrorDetail).
  const auto code = static_cast<grpc::StatusCode>(s.code());
  if (const int reason = ReasonOf(s); reason != 0 && v1::ErrorReason_IsValid(reason)) {
    v1::ErrorDetail detail;
    detail.set_reason(static_cast<v1::ErrorReason>(reason));
    return grpc::Status(code, std::string(s.message()), detail.SerializeAsString());
  }
  return grpc::Status(code, std::string(s.message()));
}

// One session's Attach stream. Lifecycle: constructed by Attach (binds the session, writes the
// "attached" event) → open, with no operation pending, until OnCancel (client cancelled, its
// connection closed, or server shutdown) or Close (daemon stopping) → Finish once → OnDone
// deletes it. Ending the stream ends the session.
class AttachReactor : public grpc::ServerWriteReactor<v1::SessionEvent> {
 public:
  AttachReactor(GrpcCheckpointService* owner, std::string session)
      : owner_(owner), session_(std::move(session)) {
    event_.set_attached(true);
    StartWrite(&event_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) End(grpc::Status(grpc::StatusCode::CANCELLED, "attach stream broken"));
  }
  void OnCancel() override { End(grpc::Status(grpc::StatusCode::CANCELLED, "session ended")); }
  void OnDone() override {
    owner_->Forget(this);
    delete this;
  }
  // The one caller that claims the reactor finishes it; nothing can delete it before then
  // (OnDone follows Finish).
  bool Claim() {
    absl::MutexLock lock(&mu_);
    if (finished_) return false;
    finished_ = true;
    return true;
  }
  void FinishClaimed(const grpc::Status& status) {
    owner_->svc_->EndSession(session_);
    Finish(status);
  }

 private:
  void End(const grpc::Status& status) {
    if (Claim()) FinishClaimed(status);
  }
  GrpcCheckpointService* owner_;
  const std::string session_;
  v1::SessionEvent event_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

GrpcCheckpointService::~GrpcCheckpointService() { CloseSessions(); }

void GrpcCheckpointService::CloseSessions() {
  std::vector<AttachReactor*> claimed;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (AttachReactor* r : attached_) {
      if (r->Claim()) claimed.push_back(r);
    }
  }
  for (AttachReactor* r : claimed) {
    r->FinishClaimed(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"));
  }
}

bool GrpcCheckpointService::WaitIdle(absl::Duration timeout) { return inflight_.WaitIdle(timeout); }

void GrpcCheckpointService::Forget(AttachReactor* r) {
  absl::MutexLock lock(&mu_);
  attached_.erase(r);
}

grpc::ServerWriteReactor<v1::SessionEvent>* GrpcCheckpointService::Attach(
    grpc::CallbackServerContext* ctx, const v1::AttachRequest* req) {
  absl::StatusOr<Caller> caller = peers_->Lookup(ctx->peer());
  absl::Status st = caller.ok() ? svc_->Attach(*caller, req->session_id()) : caller.status();
  absl::MutexLock lock(&mu_);
  if (st.ok() && closing_) {
    svc_->EndSession(req->session_id());
    st = absl::UnavailableError("the daemon is stopping");
  }
  if (!st.ok()) {
    // A reactor that only reports the error.
    class Refuse : public grpc::ServerWriteReactor<v1::SessionEvent> {
     public:
      explicit Refuse(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Refuse(st);
  }
  auto* r = new AttachReactor(this, req->session_id());
  attached_.insert(r);
  return r;
}

template <typename Fn>
grpc::ServerUnaryReactor* GrpcCheckpointService::Dispatch(grpc::CallbackServerContext* ctx,
                                                          FairExecutor* pool, const char* method,
                                                          Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time received = absl::Now();
  // Every log line of the call carries its id: "d" and this daemon's call number, in hex.
  std::string request_id =
      absl::StrCat("d", absl::Hex(calls_.fetch_add(1, std::memory_order_relaxed) + 1));
  inflight_.Begin();
  auto finish = [this, reactor, method, received](const absl::Status& st) {
    if (metrics_ != nullptr) {
      metrics_->Rpc(method, st.code(), absl::ToDoubleSeconds(absl::Now() - received));
    }
    reactor->Finish(ToGrpcStatus(st));
    inflight_.End();
  };
  absl::StatusOr<Caller> caller = peers_->Lookup(ctx->peer());
  if (!caller.ok()) {
    finish(caller.status());
    return reactor;
  }
  const uint32_t uid = caller->uid;
  absl::Status posted =
      pool->Post(uid, [finish, fn, method, c = *caller, id = std::move(request_id)]() mutable {
        LogScope fields;
        fields.Str("request_id", id).Str("method", method).Num("uid", c.uid);
        absl::Status st = fn(c);
        if (!st.ok()) spdlog::debug("{}: {}", method, st.ToString());
        finish(st);
      });
  if (!posted.ok()) {
    spdlog::debug("{}: refused: {}", method, posted.ToString());
    finish(absl::Status(posted.code(), absl::StrCat(method, ": ", posted.message())));
  }
  return reactor;
}

namespace {

// The checkpoint a call names, as log fields (job, step, rank where the request has them).
template <typename Req>
void AddRequestFields(LogScope& fields, const Req& req) {
  if constexpr (requires { req.job(); }) {
    if (!req.job().empty()) fields.Str("job", req.job());
  }
  if constexpr (requires { req.step(); }) {
    if (req.step() != 0) fields.Num("step", req.step());
  }
  if constexpr (requires { req.rank(); }) fields.Num("rank", req.rank());
}

// Per-job metrics of the calls that have them (Save, Load); nothing for the others.
template <typename Req, typename Resp>
void RecordCall(Metrics*, const Req&, const Resp&, const absl::Status&, absl::Duration) {}

void RecordCall(Metrics* m, const v1::SaveRequest& req, const v1::SaveResponse& resp,
                const absl::Status& st, absl::Duration took) {
  if (m != nullptr) m->Save(req.job(), st.code(), resp.bytes_staged(), absl::ToDoubleSeconds(took));
}

void RecordCall(Metrics* m, const v1::LoadRequest& req, const v1::LoadResponse& resp,
                const absl::Status& st, absl::Duration took) {
  if (m == nullptr) return;
  const uint64_t remote = resp.bytes_read_remote();
  const uint64_t peer = resp.bytes_read_peer();
  m->Load(
      req.job(), st.code(),
      Metrics::LoadBytes{.local = resp.bytes_read() - std::min(remote + peer, resp.bytes_read()),
                         .remote = remote,
                         .peer = peer,
                         .ram = resp.bytes_from_ram(),
                         .prefetched = resp.bytes_prefetched()},
      absl::ToDoubleSeconds(took));
}

}  // namespace

#define CKPTD_RPC(Name, Req, Resp, pool, call)                                                \
  grpc::ServerUnaryReactor* GrpcCheckpointService::Name(grpc::CallbackServerContext* ctx,     \
                                                        const v1::Req* req, v1::Resp* resp) { \
    return Dispatch(ctx, pool, #Name, [this, ctx, req, resp](const Caller& caller) {          \
      (void)ctx;  /* the calls that watch for their caller going away (Verify) use it */      \
      (void)resp; /* calls without a response body (Goodbye, Delete, ...) do not use it */    \
      LogScope fields;                                                                        \
      AddRequestFields(fields, *req);                                                         \
      const absl::Time started = absl::Now();                                                 \
      absl::Status st = call;                                                                 \
      RecordCall(metrics_, *req, *resp, st, absl::Now() - started);                           \
      return st;                                                                              \
    });                                                                                       \
  }

CKPTD_RPC(Hello, HelloRequest, HelloResponse, pools_.quick, svc_->Hello(caller, *req, resp))
CKPTD_RPC(Goodbye, GoodbyeRequest, GoodbyeResponse, pools_.quick, svc_->Goodbye(caller, *req))
CKPTD_RPC(ReserveExtents, ReserveExtentsRequest, ReserveExtentsResponse, pools_.reserves,
          svc_->ReserveExtents(caller, *req, resp))
CKPTD_RPC(ReleaseExtents, ReleaseExtentsRequest, ReleaseExtentsResponse, pools_.quick,
          svc_->ReleaseExtents(caller, *req))
CKPTD_RPC(RegisterRegion, RegisterRegionRequest, RegisterRegionResponse, pools_.reserves,
          svc_->RegisterRegion(caller, *req, resp))
CKPTD_RPC(UnregisterRegion, UnregisterRegionRequest, UnregisterRegionResponse, pools_.reserves,
          svc_->UnregisterRegion(caller, *req))
// A Save of many shards validates and journals on its own pool (seconds for 100,000 items).
CKPTD_RPC(Save, SaveRequest, SaveResponse,
          static_cast<uint64_t>(req->shards_size()) > limits::kLargeSaveShardsMin
              ? pools_.large_saves
              : pools_.quick,
          svc_->Save(caller, *req, resp))
CKPTD_RPC(Wait, WaitRequest, CheckpointStatus, pools_.waiters, svc_->Wait(caller, *req, resp))
CKPTD_RPC(Commit, CommitRequest, CheckpointStatus, pools_.quick, svc_->Commit(caller, *req, resp))
CKPTD_RPC(Abort, AbortRequest, CheckpointStatus, pools_.quick, svc_->Abort(caller, *req, resp))
CKPTD_RPC(Load, LoadRequest, LoadResponse, pools_.loads, svc_->Load(caller, *req, resp))
CKPTD_RPC(ListJobs, ListJobsRequest, ListJobsResponse, pools_.quick,
          svc_->ListJobs(caller, *req, resp))
CKPTD_RPC(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse, pools_.quick,
          svc_->ListCheckpoints(caller, *req, resp))
CKPTD_RPC(GetStatus, GetStatusRequest, CheckpointStatus, pools_.quick,
          svc_->GetStatus(caller, *req, resp))
CKPTD_RPC(Inspect, InspectRequest, InspectResponse, pools_.quick, svc_->Inspect(caller, *req, resp))
CKPTD_RPC(Delete, DeleteRequest, DeleteResponse, pools_.quick, svc_->Delete(caller, *req))
CKPTD_RPC(Latest, LatestRequest, LatestResponse, pools_.quick, svc_->Latest(caller, *req, resp))
CKPTD_RPC(Reshard, ReshardRequest, CheckpointStatus, pools_.quick,
          svc_->Reshard(caller, *req, resp))
CKPTD_RPC(CollectGarbage, GcRequest, GcResponse, pools_.waiters,
          svc_->CollectGarbage(caller, *req, resp))
CKPTD_RPC(Prefetch, PrefetchRequest, PrefetchResponse, pools_.loads,
          svc_->Prefetch(caller, *req, resp))
// Reads the whole checkpoint (or a sample): a data-moving call, on the load pool.
// Reading stops once the caller went away (interrupted, or past its deadline).
CKPTD_RPC(Verify, VerifyRequest, VerifyResponse, pools_.loads,
          svc_->Verify(caller, *req, resp, [ctx] { return ctx->IsCancelled(); }))

#undef CKPTD_RPC

}  // namespace ckptd
