// Client: connection, regions, commit control and the catalog (list, status, inspect, delete).
#include "ckptd/client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "async_saves.h"
#include "client_core.h"
#include "client_factory.h"
#include "convert.h"

namespace ckptd {

using internal::ClientCore;
using internal::Session;

namespace {

constexpr uint32_t kWaitTimeoutMsMax = 24 * 3600 * 1000;  // daemon's limits::kWaitTimeoutMsMax
// A Wait RPC's deadline is its own timeout plus this (at most rpc_timeout_ms).
constexpr int64_t kWaitMarginMs = 10000;

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  std::unique_ptr<internal::Connection> connection = internal::MakeUnixConnection(options);
  return internal::ClientFactory::Create(std::move(options), std::move(connection));
}

absl::StatusOr<std::unique_ptr<Client>> internal::ClientFactory::Create(
    ClientOptions options, std::unique_ptr<Connection> connection) {
  absl::StatusOr<std::unique_ptr<ClientCore>> core =
      ClientCore::Create(std::move(options), std::move(connection));
  if (!core.ok()) return core.status();
  return std::unique_ptr<Client>(new Client(*std::move(core)));
}

Client::Client(std::unique_ptr<ClientCore> core) : core_(std::move(core)) {}
Client::~Client() = default;

void Client::Close() { core_->Close(); }

uint64_t Client::reconnect_count() const { return core_->reconnect_count(); }
const std::string& Client::target() const { return core_->target(); }

uint64_t Client::arena_bytes() const {
  absl::StatusOr<Session> session = core_->EnsureSession();
  return session.ok() && session->arena != nullptr ? session->arena->size() : 0;
}

uint64_t Client::extent_alignment_bytes() const {
  absl::StatusOr<Session> session = core_->EnsureSession();
  return session.ok() ? session->limits.extent_alignment_bytes() : 0;
}

bool Client::arena_pinned_for_cuda() const {
  absl::StatusOr<Session> session = core_->EnsureSession();
  return session.ok() && session->arena != nullptr && session->arena->pinned_for_cuda();
}

absl::StatusOr<uint64_t> Client::RegisterShm(const std::string& shm_name, uint64_t size_bytes,
                                             const void* mapped_at) {
  return core_->RegisterShm(shm_name, size_bytes, mapped_at);
}

std::optional<BufferRef> Client::Locate(const void* data, uint64_t bytes) {
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return std::nullopt;
  return core_->Locate(*session, data, bytes);
}

absl::Status Client::Unregister(uint64_t handle) { return core_->Unregister(handle); }

// --- commit control ------------------------------------------------------------------------------

absl::StatusOr<CheckpointInfo> Client::Wait(const std::string& job, uint64_t step, WaitFor until,
                                            uint32_t timeout_ms) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  v1::WaitRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_until(until == WaitFor::kAllStaged ? v1::WAIT_FOR_ALL_STAGED
                : until == WaitFor::kRemote  ? v1::WAIT_FOR_REMOTE
                                             : v1::WAIT_FOR_COMMITTED);
  req.set_timeout_ms(std::min(timeout_ms, kWaitTimeoutMsMax));
  v1::CheckpointStatus resp;
  int64_t deadline_ms =
      int64_t{req.timeout_ms()} + std::min<int64_t>(core_->rpc_timeout_ms(), kWaitMarginMs);
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_->Call("Wait", deadline_ms, &internal::Connection::Wait, req, &resp));
  return internal::FromProto(resp);
}

absl::Status Client::WaitCommitted(const std::string& job, uint64_t step, uint32_t timeout_ms) {
  absl::StatusOr<CheckpointInfo> info = Wait(job, step, WaitFor::kCommitted, timeout_ms);
  if (!info.ok()) return info.status();
  const std::string name = absl::StrCat("checkpoint ", job, "/", step);
  switch (info->state) {
    case CheckpointState::kCommitted:
      return absl::OkStatus();
    case CheckpointState::kAborted:
      return absl::AbortedError(absl::StrCat(name, " was aborted: ", info->error));
    default:
      break;
  }
  std::string missing;
  if (!info->missing_ranks.empty()) {
    missing = absl::StrCat("; ranks missing: ", absl::StrJoin(info->missing_ranks, ","));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      name, " is still ", CheckpointStateName(info->state), " after ", timeout_ms, " ms", missing));
}

absl::StatusOr<CheckpointInfo> Client::Commit(const std::string& job, uint64_t step, bool partial) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  v1::CommitRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_partial(partial);
  v1::CheckpointStatus resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_->Call("Commit", core_->rpc_timeout_ms(), &internal::Connection::Commit, req, &resp));
  return internal::FromProto(resp);
}

absl::StatusOr<CheckpointInfo> Client::Abort(const std::string& job, uint64_t step,
                                             const std::string& reason) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  v1::AbortRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_reason(reason);
  v1::CheckpointStatus resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_->Call("Abort", core_->rpc_timeout_ms(), &internal::Connection::Abort, req, &resp));
  return internal::FromProto(resp);
}

// --- catalog -------------------------------------------------------------------------------------

absl::StatusOr<std::vector<JobInfo>> Client::ListJobs() {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  std::vector<JobInfo> jobs;
  v1::ListJobsRequest req;
  do {
    v1::ListJobsResponse resp;
    CKPTD_CLIENT_RETURN_IF_ERROR(core_->Call("ListJobs", core_->rpc_timeout_ms(),
                                             &internal::Connection::ListJobs, req, &resp));
    for (const v1::JobSummary& j : resp.jobs()) jobs.push_back(internal::FromProto(j));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return jobs;
}

absl::StatusOr<std::vector<CheckpointInfo>> Client::ListCheckpoints(const std::string& job) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  std::vector<CheckpointInfo> out;
  v1::ListCheckpointsRequest req;
  req.set_job(job);
  do {
    v1::ListCheckpointsResponse resp;
    CKPTD_CLIENT_RETURN_IF_ERROR(core_->Call("ListCheckpoints", core_->rpc_timeout_ms(),
                                             &internal::Connection::ListCheckpoints, req, &resp));
    for (const v1::CheckpointSummary& s : resp.checkpoints()) {
      out.push_back(internal::FromProto(s));
    }
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return out;
}

absl::StatusOr<CheckpointInfo> Client::GetStatus(const std::string& job, uint64_t step) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  v1::GetStatusRequest req;
  req.set_job(job);
  req.set_step(step);
  v1::CheckpointStatus resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->Call("GetStatus", core_->rpc_timeout_ms(),
                                           &internal::Connection::GetStatus, req, &resp));
  return internal::FromProto(resp);
}

absl::StatusOr<std::vector<ItemInfo>> Client::Inspect(const std::string& job, uint64_t step) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  std::vector<ItemInfo> items;
  v1::InspectRequest req;
  req.set_job(job);
  req.set_step(step);
  do {
    v1::InspectResponse resp;
    CKPTD_CLIENT_RETURN_IF_ERROR(core_->Call("Inspect", core_->rpc_timeout_ms(),
                                             &internal::Connection::Inspect, req, &resp));
    for (const v1::ItemInfo& i : resp.items()) items.push_back(internal::FromProto(i));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return items;
}

absl::StatusOr<uint64_t> Client::Latest(const std::string& job, Durability durable) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  v1::LatestRequest req;
  req.set_job(job);
  req.set_durable(durable == Durability::kStore  ? v1::DURABLE_STORE
                  : durable == Durability::kPeer ? v1::DURABLE_PEER
                                                 : v1::DURABLE_COMMITTED);
  v1::LatestResponse resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_->Call("Latest", core_->rpc_timeout_ms(), &internal::Connection::Latest, req, &resp));
  return resp.step();
}

absl::Status Client::Delete(const std::string& job, uint64_t step) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  v1::DeleteRequest req;
  req.set_job(job);
  req.set_step(step);
  v1::DeleteResponse resp;
  return core_->Call("Delete", core_->rpc_timeout_ms(), &internal::Connection::Delete, req, &resp);
}

}  // namespace ckptd
