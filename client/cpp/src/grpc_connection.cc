// The production Connection (connection.h): the gRPC stub over the daemon's unix socket, and the
// arena socket beside it. Nothing here decides anything: deadlines, re-connection and the mapping
// of errors are the client's (client_core.cc).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "connection.h"

namespace ckptd::internal {

namespace {

constexpr const char* kDefaultSocket = "/var/lib/ckptd/ckptd.sock";
constexpr int kRpcMessageBytesMax = 64 * 1024 * 1024;  // daemon's limits::kRpcMessageBytesMax

std::string ResolveSocket(const ClientOptions& options) {
  if (!options.socket_path.empty()) return options.socket_path;
  const char* env = std::getenv("CKPTD_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultSocket;
}

void Apply(const CallOptions& o, grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms));
  if (o.wait_for_ready) ctx->set_wait_for_ready(true);
}

class GrpcSessionStream final : public SessionStream {
 public:
  GrpcSessionStream(v1::Checkpoint::Stub& stub, const v1::AttachRequest& req)
      : reader_(stub.Attach(&ctx_, req)) {}
  bool Read(v1::SessionEvent* event) override { return reader_->Read(event); }
  void Cancel() override { ctx_.TryCancel(); }
  grpc::Status Finish() override { return reader_->Finish(); }

 private:
  grpc::ClientContext ctx_;  // declared first: the reader uses it
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> reader_;
};

class GrpcPendingCall final : public PendingCall {
 public:
  grpc::ClientContext ctx;
};

class GrpcConnection final : public Connection {
 public:
  GrpcConnection(std::string target, std::shared_ptr<grpc::Channel> channel)
      : target_(std::move(target)),
        // The arena socket lies beside the daemon's socket (proto: above HelloResponse); named
        // from this client's view of the path, which may differ from the daemon's (a sidecar).
        arena_socket_(target_.substr(5) + ".arena"),
        channel_(std::move(channel)),
        stub_(v1::Checkpoint::NewStub(channel_)) {}

  const std::string& target() const override { return target_; }

#define CKPTD_UNARY(Method, Request, Response)                                                     \
  grpc::Status Method(const CallOptions& o, const v1::Request& req, v1::Response* resp) override { \
    grpc::ClientContext ctx;                                                                       \
    Apply(o, &ctx);                                                                                \
    return stub_->Method(&ctx, req, resp);                                                         \
  }
  CKPTD_UNARY(Hello, HelloRequest, HelloResponse)
  CKPTD_UNARY(Goodbye, GoodbyeRequest, GoodbyeResponse)
  CKPTD_UNARY(ReserveExtents, ReserveExtentsRequest, ReserveExtentsResponse)
  CKPTD_UNARY(ReleaseExtents, ReleaseExtentsRequest, ReleaseExtentsResponse)
  CKPTD_UNARY(RegisterRegion, RegisterRegionRequest, RegisterRegionResponse)
  CKPTD_UNARY(UnregisterRegion, UnregisterRegionRequest, UnregisterRegionResponse)
  CKPTD_UNARY(Save, SaveRequest, SaveResponse)
  CKPTD_UNARY(Wait, WaitRequest, CheckpointStatus)
  CKPTD_UNARY(Commit, CommitRequest, CheckpointStatus)
  CKPTD_UNARY(Abort, AbortRequest, CheckpointStatus)
  CKPTD_UNARY(ListJobs, ListJobsRequest, ListJobsResponse)
  CKPTD_UNARY(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse)
  CKPTD_UNARY(GetStatus, GetStatusRequest, CheckpointStatus)
  CKPTD_UNARY(Inspect, InspectRequest, InspectResponse)
  CKPTD_UNARY(Delete, DeleteRequest, DeleteResponse)
  CKPTD_UNARY(Latest, LatestRequest, LatestResponse)
#undef CKPTD_UNARY

  std::unique_ptr<SessionStream> Attach(const v1::AttachRequest& req) override {
    return std::make_unique<GrpcSessionStream>(*stub_, req);
  }

  std::unique_ptr<PendingCall> LoadAsync(const CallOptions& o, const v1::LoadRequest* req,
                                         v1::LoadResponse* resp,
                                         std::function<void(grpc::Status)> done) override {
    auto call = std::make_unique<GrpcPendingCall>();
    Apply(o, &call->ctx);
    stub_->async()->Load(&call->ctx, req, resp, std::move(done));
    return call;
  }

  absl::StatusOr<std::shared_ptr<ArenaMapping>> MapArena(const std::string& session_id,
                                                         uint64_t bytes,
                                                         bool pin_for_cuda) override {
    return ArenaMapping::Map(arena_socket_, session_id, bytes, pin_for_cuda);
  }

 private:
  const std::string target_;
  const std::string arena_socket_;  // the daemon's socket path + ".arena"
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Checkpoint::Stub> stub_;
};

}  // namespace

std::unique_ptr<Connection> MakeUnixConnection(const ClientOptions& options) {
  std::string path = ResolveSocket(options);
  std::string target = path.rfind("unix:", 0) == 0 ? path : absl::StrCat("unix:", path);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kRpcMessageBytesMax);
  args.SetMaxSendMessageSize(kRpcMessageBytesMax);
  // A restarted daemon must be found again quickly, not after gRPC's default 1..120 s backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // One Client, one connection: gRPC would otherwise share one connection among every channel
  // of the process to the same socket, and the daemon binds sessions to connections (its peer
  // credentials are read per connection), so a Client's lifetime is its connection's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  return std::make_unique<GrpcConnection>(std::move(target), std::move(channel));
}

}  // namespace ckptd::internal
