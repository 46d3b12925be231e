// Checkpoints by name: checkpoints.h.
#include "service/checkpoints.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/names.h"

namespace ckptd {

bool HasRemoteTier(v1::TierPolicy policy) {
  return policy == v1::TIER_LOCAL_AND_REMOTE || policy == v1::TIER_REMOTE;
}

CommittedTiers StoreTiersOf(const Manifest& m) {
  if (m.header.blobs_on_nodes()) {
    return {.policy = v1::TIER_LOCAL_AND_PEER, .local = false, .remote_durable = false};
  }
  return {.policy = v1::TIER_LOCAL_AND_REMOTE, .local = false, .remote_durable = true};
}

bool UsesStore(v1::TierPolicy policy) {
  return HasRemoteTier(policy) || policy == v1::TIER_LOCAL_AND_PEER;
}

std::string CkptName(const std::string& job, uint64_t step) {
  return absl::StrCat("checkpoint ", job, "/", step);
}

absl::Status ValidateJobStep(const std::string& job, uint64_t step) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(job));
  if (step > limits::kStepMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step, " of job ", job, " exceeds the limit ", limits::kStepMax));
  }
  return absl::OkStatus();
}

std::string RanksList(const std::vector<uint32_t>& ranks) {
  if (ranks.size() > 32) {
    return absl::StrCat("[", absl::StrJoin(ranks.begin(), ranks.begin() + 32, ", "), ", ... (",
                        ranks.size(), " ranks)]");
  }
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

absl::StatusOr<Manifest> ReadManifest(Storage& storage, const std::string& job, uint64_t step) {
  const std::string path = absl::StrCat(CheckpointDir(job, step), "/", kManifestFileName);
  CKPTD_ASSIGN_OR_RETURN(std::string bytes, storage.Get(path));
  CKPTD_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(bytes, path));
  if (m.header.job() != job || m.header.step() != step) {
    return absl::DataLossError(
        absl::StrCat("manifest ", path, " names ", m.header.job(), "/", m.header.step()));
  }
  return m;
}

absl::Status ForEachCheckpointDir(
    Storage& storage, const std::string& scope, const std::function<void(std::string)>& problem,
    const std::function<absl::Status(const std::string&, uint64_t)>& fn) {
  const std::string root = storage.Describe();
  std::vector<std::string> jobs{scope};
  if (scope.empty()) {
    CKPTD_ASSIGN_OR_RETURN(jobs, Annotate(storage.List(""), absl::StrCat("listing ", root)));
  }
  for (const std::string& job : jobs) {
    if (job == kPeerRegistryDir) continue;  // the peer registry
    if (absl::Status valid = ValidateJobName(job); !valid.ok()) {
      problem(
          absl::StrCat(root, "/", job, " is not a job directory (", valid.message(), "); skipped"));
      continue;
    }
    absl::StatusOr<std::vector<std::string>> steps = storage.List(job);
    if (!steps.ok()) {
      if (!scope.empty()) {
        return Annotate(steps.status(), absl::StrCat("listing ", root, "/", job));
      }
      problem(absl::StrCat(root, "/", job, " is not a job directory (", steps.status().ToString(),
                           "); skipped"));
      continue;
    }
    for (const std::string& step_dir : *steps) {
      if (step_dir == kJobOwnerFileName) continue;  // the job's owner on the store
      absl::StatusOr<uint64_t> step = ParseStepDirName(step_dir);
      if (!step.ok()) {
        problem(absl::StrCat(root, "/", job, "/", step_dir, " is not a checkpoint directory (",
                             step.status().message(), "); skipped"));
        continue;
      }
      CKPTD_RETURN_IF_ERROR(fn(job, *step));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd
