// The Connection a FakeDaemon hands the client (fake_daemon.h), and its Attach streams: each call
// forwarded to the daemon as it is.
#include "fake_daemon.h"

namespace ckptd::testing {

namespace {

class FakeStream final : public internal::SessionStream {
 public:
  explicit FakeStream(std::shared_ptr<StreamState> s) : s_(std::move(s)) {}
  bool Read(v1::SessionEvent* event) override {
    absl::MutexLock l(&s_->mu);
    if (!s_->ended && !s_->sent_attached) {
      s_->sent_attached = true;
      event->set_attached(true);
      return true;
    }
    s_->mu.Await(absl::Condition(&s_->ended));
    return false;
  }
  void Cancel() override { s_->End(grpc::Status(grpc::StatusCode::CANCELLED, "Cancelled")); }
  grpc::Status Finish() override {
    absl::MutexLock l(&s_->mu);
    return s_->status;
  }

 private:
  std::shared_ptr<StreamState> s_;
};

class FakeConnection final : public internal::Connection {
 public:
  explicit FakeConnection(std::shared_ptr<FakeDaemon> d) : d_(std::move(d)) {}
  const std::string& target() const override { return target_; }
  grpc::Status Hello(const CallOptions& o, const v1::HelloRequest& req,
                     v1::HelloResponse* resp) override {
    return d_->Hello(o, req, resp);
  }
  std::unique_ptr<internal::SessionStream> Attach(const v1::AttachRequest& req) override {
    return d_->Attach(req);
  }
  grpc::Status Goodbye(const CallOptions& o, const v1::GoodbyeRequest& req,
                       v1::GoodbyeResponse* resp) override {
    return d_->Goodbye(o, req, resp);
  }
  grpc::Status ReserveExtents(const CallOptions& o, const v1::ReserveExtentsRequest& req,
                              v1::ReserveExtentsResponse* resp) override {
    return d_->ReserveExtents(o, req, resp);
  }
  grpc::Status ReleaseExtents(const CallOptions& o, const v1::ReleaseExtentsRequest& req,
                              v1::ReleaseExtentsResponse* resp) override {
    return d_->ReleaseExtents(o, req, resp);
  }
  grpc::Status RegisterRegion(const CallOptions& o, const v1::RegisterRegionRequest& req,
                              v1::RegisterRegionResponse* resp) override {
    return d_->RegisterRegion(o, req, resp);
  }
  grpc::Status UnregisterRegion(const CallOptions& o, const v1::UnregisterRegionRequest& req,
                                v1::UnregisterRegionResponse* resp) override {
    return d_->UnregisterRegion(o, req, resp);
  }
  grpc::Status Save(const CallOptions& o, const v1::SaveRequest& req,
                    v1::SaveResponse* resp) override {
    return d_->Save(o, req, resp);
  }
  grpc::Status Wait(const CallOptions& o, const v1::WaitRequest& req,
                    v1::CheckpointStatus* resp) override {
    return d_->StatusCall("Wait", o, req.job(), req.step(), resp);
  }
  grpc::Status Commit(const CallOptions& o, const v1::CommitRequest& req,
                      v1::CheckpointStatus* resp) override {
    return d_->StatusCall("Commit", o, req.job(), req.step(), resp);
  }
  grpc::Status Abort(const CallOptions& o, const v1::AbortRequest& req,
                     v1::CheckpointStatus* resp) override {
    return d_->StatusCall("Abort", o, req.job(), req.step(), resp);
  }
  grpc::Status ListJobs(const CallOptions& o, const v1::ListJobsRequest& req,
                        v1::ListJobsResponse* resp) override {
    return d_->ListJobs(o, req, resp);
  }
  grpc::Status ListCheckpoints(const CallOptions& o, const v1::ListCheckpointsRequest& req,
                               v1::ListCheckpointsResponse* resp) override {
    return d_->ListCheckpoints(o, req, resp);
  }
  grpc::Status GetStatus(const CallOptions& o, const v1::GetStatusRequest& req,
                         v1::CheckpointStatus* resp) override {
    return d_->StatusCall("GetStatus", o, req.job(), req.step(), resp);
  }
  grpc::Status Inspect(const CallOptions& o, const v1::InspectRequest& req,
                       v1::InspectResponse* resp) override {
    return d_->Inspect(o, req, resp);
  }
  grpc::Status Delete(const CallOptions& o, const v1::DeleteRequest& req,
                      v1::DeleteResponse* resp) override {
    return d_->Delete(o, req, resp);
  }
  grpc::Status Latest(const CallOptions& o, const v1::LatestRequest& req,
                      v1::LatestResponse* resp) override {
    return d_->Latest(o, req, resp);
  }
  // Answered before it returns: the client's second batch is then always sent before the first
  // is copied out, so the order of calls the fake records is the same in every run.
  std::unique_ptr<internal::PendingCall> LoadAsync(
      const CallOptions& o, const v1::LoadRequest* req, v1::LoadResponse* resp,
      std::function<void(grpc::Status)> done) override {
    done(d_->Load(o, *req, resp));
    return std::make_unique<internal::PendingCall>();
  }
  absl::StatusOr<std::shared_ptr<internal::ArenaMapping>> MapArena(const std::string& session_id,
                                                                   uint64_t bytes,
                                                                   bool /*pin*/) override {
    return d_->MapArena(session_id, bytes);
  }

 private:
  std::shared_ptr<FakeDaemon> d_;
  const std::string target_ = FakeDaemon::kTarget;
};

}  // namespace

std::unique_ptr<internal::SessionStream> MakeStream(std::shared_ptr<StreamState> state) {
  return std::make_unique<FakeStream>(std::move(state));
}

std::unique_ptr<internal::Connection> FakeDaemon::Connect() {
  return std::make_unique<FakeConnection>(shared_from_this());
}

}  // namespace ckptd::testing
