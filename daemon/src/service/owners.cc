// Ownership of jobs (docs/SECURITY.md "Ownership"). A job's owner is its JobRecord ('J' row),
// written once, when the job is claimed, and never changed afterwards:
//   - by the first Save of the job on this node (save.cc, FindOrOpenLocked) — after the job's
//     checkpoints on the store, if any, were adopted (so a job another node's owner saved there
//     is theirs here too) — or by the first Reshard into it (reshard.cc);
//   - by adoption (the store's catalog, recovery from a manifest after the index is lost), for
//     the owner the manifest records, mapped to a uid here (common/owner_map.h).
// The claim is atomic: one claim per job at a time (owner_claims_, under the lifecycle lock), and
// its row is durable (a synced write) before the claimer opens anything, so two uids racing the
// first save of a job name cannot both own it: the second sees the first's row (or waits for its
// claim to land) and is refused. Every row of a job's checkpoints is written after its owner row,
// which is why a read that observed a checkpoint and then checks the job's owner (CheckAccess)
// cannot pass for another uid's checkpoint.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

v1::Owner CheckpointService::OwnerRecordOf(uint32_t uid) const {
  return deps_.options->owners.Record(uid);
}

absl::StatusOr<uint32_t> CheckpointService::ClaimJobOwnerLocked(const std::string& job,
                                                                uint32_t uid) {
  while (true) {
    if (owner_claims_.contains(job)) {  // another claim's write is in flight: its row decides
      changed_.Wait(&mu_);
      continue;
    }
    const uint64_t claims_done = owner_claims_done_;
    mu_.Unlock();
    absl::StatusOr<std::optional<uint32_t>> owner = JobOwner(job);
    mu_.Lock();
    // A claim that landed meanwhile may have written the row after it was read: read again.
    if (owner_claims_done_ != claims_done || owner_claims_.contains(job)) continue;
    if (!owner.ok()) return owner.status();
    if (owner->has_value()) return **owner;
    owner_claims_.insert(job);
    v1::JobRecord rec;
    rec.set_owner_uid(uid);
    rec.set_created_unix_ms(NowMs());
    std::vector<MetaStore::Write> writes{{keys::Job(job), rec.SerializeAsString()}};
    mu_.Unlock();
    absl::Status st = committer_.Commit(keys::Job(job), std::move(writes));
    mu_.Lock();
    owner_claims_.erase(job);
    ++owner_claims_done_;
    changed_.SignalAll();
    if (!st.ok()) return Annotate(st, absl::StrCat("recording the owner of job ", job));
    spdlog::info("job {} claimed by uid {}", job, uid);
    return uid;
  }
}

absl::StatusOr<uint32_t> CheckpointService::ClaimJobOwner(const std::string& job, uint32_t uid) {
  absl::MutexLock lock(&mu_);
  return ClaimJobOwnerLocked(job, uid);
}

absl::Status CheckpointService::ClaimStoreOwnerToOpen(const Caller& caller,
                                                      const v1::SaveRequest& req) {
  {
    absl::MutexLock lock(&mu_);
    // Its first rank claimed it already (the later ranks read nothing here).
    if (pending_.contains(Key{req.job(), req.step()})) return absl::OkStatus();
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(req.job()));
  return remote_.ClaimStoreOwner(req.job(), OwnerRecordOf(owner.value_or(caller.uid)));
}

absl::Status CheckpointService::AdoptOwner(const Manifest& m) {
  const std::string& job = m.header.job();
  const std::string what = CkptName(job, m.header.step());
  if (!m.header.has_owner()) {
    // A manifest written before owners were recorded: the job's owner here, or this daemon's
    // uid (docs/SECURITY.md says so).
    return ClaimJobOwner(job, getuid()).status();
  }
  absl::StatusOr<uint32_t> uid = deps_.options->owners.LocalUid(m.header.owner());
  if (!uid.ok()) return Annotate(uid.status(), absl::StrCat(what, " not adopted"));
  CKPTD_ASSIGN_OR_RETURN(uint32_t owner, ClaimJobOwner(job, *uid));
  if (owner != *uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " not adopted: its manifest records the owner ", OwnerMap::Describe(m.header.owner()),
        ", uid ", *uid, " here, but job ", job, " here belongs to uid ", owner));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
