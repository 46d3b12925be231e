#include "tier/retention.h"

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"

namespace ckptd {

std::vector<RetentionStep> PlanRetention(std::span<const RetainedCheckpoint> newest_first,
                                         uint32_t keep_local, uint32_t keep_remote,
                                         uint64_t keep_every) {
  std::vector<RetentionStep> plan;
  uint32_t local_rank = 0;
  uint32_t remote_rank = 0;
  for (size_t i = 0; i < newest_first.size(); ++i) {
    const RetainedCheckpoint& c = newest_first[i];
    const bool milestone = keep_every > 0 && c.step % keep_every == 0;
    const bool drop_local = c.local && keep_local > 0 && local_rank++ >= keep_local && !milestone;
    const bool drop_remote =
        c.remote && keep_remote > 0 && remote_rank++ >= keep_remote && !milestone;
    const bool keeps_local = c.local && !drop_local;
    const bool keeps_remote = c.remote && !drop_remote;
    std::string why;
    if (drop_local) absl::StrAppend(&why, "local copy ", local_rank, " of keep_local ", keep_local);
    if (drop_remote) {
      absl::StrAppend(&why, why.empty() ? "" : "; ", "remote copy ", remote_rank,
                      " of keep_remote ", keep_remote);
    }
    if (!drop_local && !drop_remote) continue;
    // Its upload still under way: the local copy is the only durable one until it is DURABLE.
    if (drop_local && c.upload_pending && !c.remote) continue;
    // The newest checkpoint is first on every tier it is on, so with keep >= 1 it keeps a copy.
    CKPTD_CHECK(i > 0 || keeps_local || keeps_remote);
    RetentionAction action = RetentionAction::kDelete;
    if (keeps_local) action = RetentionAction::kDropRemote;
    if (keeps_remote) action = RetentionAction::kDropLocal;
    plan.push_back(RetentionStep{c.step, action, std::move(why)});
  }
  return plan;
}

const char* RetentionActionName(RetentionAction a) {
  switch (a) {
    case RetentionAction::kDropLocal:
      return "drop local";
    case RetentionAction::kDropRemote:
      return "drop remote";
    case RetentionAction::kDelete:
      return "delete";
  }
  return "?";
}

}  // namespace ckptd
