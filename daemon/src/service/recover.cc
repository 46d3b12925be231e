// CheckpointService::Recover: recovery (recovery.h) run against the service through RecoveryHost,
// whose every operation is the service's own (see checkpoint_service.h for each).
#include "ckptd/status.h"
#include "service/checkpoint_service.h"
#include "service/recovery.h"

namespace ckptd {

class CheckpointService::RecoveryAccess final : public RecoveryHost {
 public:
  explicit RecoveryAccess(CheckpointService& svc) : svc_(svc) {}

  Stores stores() const override {
    return {svc_.deps_.meta, svc_.deps_.storage, svc_.remote_.remote(), svc_.deps_.arena,
            svc_.deps_.options->checksum_block_bytes};
  }
  absl::Status PutRecordSync(const v1::CheckpointRecord& rec) override {
    return svc_.PutRecordSync(rec);
  }
  absl::Status IndexCommitted(const Manifest& m, const std::string& dir,
                              CommittedTiers tiers) override {
    // Recovery indexes a manifest only to adopt it: the owner it records first (owners.cc).
    CKPTD_RETURN_IF_ERROR(svc_.AdoptOwner(m));
    return svc_.IndexCommitted(m, dir, tiers);
  }
  absl::StatusOr<std::optional<v1::CheckpointRecord>> ReadRecord(const std::string& job,
                                                                 uint64_t step) override {
    return svc_.ReadRecord(job, step);
  }
  absl::Status AdoptHot(const std::string& job, uint64_t step, const v1::HotRecord& rec) override {
    return svc_.AdoptHot(job, step, rec);
  }
  absl::StatusOr<std::optional<uint32_t>> JobOwner(const std::string& job) override {
    return svc_.JobOwner(job);
  }
  absl::StatusOr<std::vector<Storage*>> ReadTiers(const v1::CheckpointRecord& rec) override {
    return svc_.ReadTiers(rec);
  }
  absl::StatusOr<std::shared_ptr<const Manifest>> GetManifest(const std::string& job,
                                                              uint64_t step) override {
    return svc_.GetManifest(job, step);
  }
  absl::Status RemoveCheckpoint(const std::string& job, uint64_t step,
                                v1::CheckpointRecord rec) override {
    return svc_.RemoveCheckpoint(job, step, std::move(rec));
  }
  absl::Status ScanStore(const std::string& scope,
                         const std::function<void(std::string)>& problem) override {
    return svc_.ScanStore(scope, problem);
  }
  void Resume(std::unique_ptr<PendingCheckpoint> p) override {
    absl::MutexLock lock(&svc_.mu_);
    const Key key{p->job, p->step};
    auto [it, inserted] = svc_.pending_.emplace(key, std::move(p));
    CKPTD_CHECK(inserted);
    PendingCheckpoint& pending = *it->second;
    svc_.KeyChangedLocked(key);
    for (auto& [rank, pr] : pending.ranks) {
      if (!pr.persisted()) svc_.PostFlush(key, rank);
    }
    svc_.MaybeStartCommitLocked(pending);
  }

 private:
  CheckpointService& svc_;
};

absl::Status CheckpointService::Recover() {
  RecoveryAccess access(*this);
  return Recovery(access).Run();
}

}  // namespace ckptd
