// ckptctl's commands. Each talks to the daemon through the generated stub, prints a table (or one
// JSON document with --json) to stdout, and returns the daemon's status; main() turns a failure
// into "ckptctl: <CODE>: <message>" and exit code 1.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/ckptd.grpc.pb.h"

namespace ckptctl {

struct Context {
  std::string target;  // "unix:<path>"
  std::unique_ptr<ckptd::v1::Checkpoint::Stub> stub;
  bool json = false;
  int rpc_timeout_ms = 30000;
};

// The daemon's answer as a status (UNAVAILABLE names the socket).
absl::Status DaemonStatus(const Context& ctx, const grpc::Status& s);
// One call with a deadline of timeout_ms: fn(client_context) returns the call's grpc::Status.
template <typename Fn>
absl::Status Call(Context& ctx, int64_t timeout_ms, Fn&& fn) {
  grpc::ClientContext cc;
  cc.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  return DaemonStatus(ctx, fn(&cc));
}
// Every page of ListJobs / ListCheckpoints, merged.
absl::StatusOr<ckptd::v1::ListJobsResponse> AllJobs(Context& ctx);
absl::StatusOr<ckptd::v1::ListCheckpointsResponse> AllCheckpoints(Context& ctx,
                                                                  const std::string& job);

absl::Status ListJobs(Context& ctx);
absl::Status ListCheckpoints(Context& ctx, const std::string& job);
// Bytes per job (every job the daemon lists, or `job`) and tier: checkpoints, the bytes of those
// on local storage and on the remote tier (manifest sizes: the files add at most 4 KiB of padding
// per blob), and the RAM tier's bytes. A "total" row when no job is named.
absl::Status DiskUsage(Context& ctx, const std::string& job);
absl::Status Status(Context& ctx, const std::string& job, uint64_t step);
absl::Status Inspect(Context& ctx, const std::string& job, uint64_t step);
absl::Status Remove(Context& ctx, const std::string& job, uint64_t step);
// `durable`: "committed", "peer" or "store" (LatestRequest.durable).
absl::Status Latest(Context& ctx, const std::string& job, const std::string& durable);
// FAILED until the checkpoint reached `until`: ABORTED, or DEADLINE_EXCEEDED naming the ranks
// still missing.
// until: "committed", "staged" (every rank staged) or "remote" (committed and durable on the
// remote tier).
absl::Status Wait(Context& ctx, const std::string& job, uint64_t step, uint32_t timeout_ms,
                  const std::string& until);
// Starts an offline reshard of job/step into target_job (empty: job)/target_step.
absl::Status Reshard(Context& ctx, const std::string& job, uint64_t step,
                     const std::string& target_job, uint64_t target_step, const std::string& spec);
// Applies retention now (job empty: every job the caller may delete). Prints every action; when
// one failed, returns ABORTED naming the first failure.
absl::Status CollectGarbage(Context& ctx, const std::string& job, bool dry_run);
// Prefetch: brings JOB/STEP (the latest when none) into the daemon's RAM tier.
absl::Status Prefetch(Context& ctx, const std::string& job, std::optional<uint64_t> step);
// Aborts a checkpoint being saved, or cancels a reshard writing it.
absl::Status Abort(Context& ctx, const std::string& job, uint64_t step, const std::string& reason);

}  // namespace ckptctl
