// Load of CheckpointService: the catalog's side (access, "latest", the row must be COMMITTED,
// the verified manifest from the cache or storage); the loader (loader.h) does the rest.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/names.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<std::shared_ptr<const Manifest>> CheckpointService::GetManifest(
    const std::string& job, uint64_t step, std::optional<std::vector<Storage*>> known_tiers) {
  if (std::shared_ptr<const Manifest> cached = manifest_cache_.Get(Key{job, step})) {
    return cached;
  }
  // From the fastest tier that has a manifest that verifies (one a tier lacks, or that does not
  // verify there, is read from the next).
  std::vector<Storage*> tiers = {deps_.storage};
  if (known_tiers) {
    tiers = *std::move(known_tiers);
  } else {
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, ReadRecord(job, step));
    if (rec) {
      CKPTD_ASSIGN_OR_RETURN(tiers, ReadTiers(*rec));
    }
  }
  absl::StatusOr<Manifest> m;
  for (size_t t = 0; t < tiers.size(); ++t) {
    m = ReadManifest(*tiers[t], job, step);
    if (m.ok() || !(absl::IsNotFound(m.status()) || absl::IsDataLoss(m.status()))) break;
    if (t + 1 < tiers.size()) {
      spdlog::warn("{}: {} ({}); reading it from {}", CkptName(job, step), tiers[t]->Describe(),
                   m.status().ToString(), tiers[t + 1]->Describe());
    }
  }
  if (!m.ok()) {
    // A committed checkpoint whose manifest does not verify is CORRUPT from here on: never
    // latest, DATA_LOSS on load (MarkCorrupt leaves checkpoints in flight alone).
    if (absl::IsDataLoss(m.status())) {
      absl::Status marked = MarkCorrupt(job, step, m.status());
      if (!marked.ok()) spdlog::error("{}", marked.ToString());
    }
    return m.status();
  }
  auto shared = std::make_shared<const Manifest>(*std::move(m));
  manifest_cache_.Put(Key{job, step}, shared);
  return shared;
}

absl::Status CheckpointService::Load(const Caller& caller, const v1::LoadRequest& req,
                                     v1::LoadResponse* resp) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (static_cast<uint64_t>(req.items_size()) > limits::kLoadRequestsMax) {
    return absl::InvalidArgumentError(absl::StrCat("load of ", req.items_size(),
                                                   " items in one call; the limit is ",
                                                   limits::kLoadRequestsMax));
  }
  uint64_t step = req.step();
  if (req.which_case() != v1::LoadRequest::kStep) {
    CKPTD_ASSIGN_OR_RETURN(step, LatestReadable(caller, req.job()));
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         ReadRecordOrAdopt(req.job(), step, /*corrupt_is_error=*/true));
  // Again, now that the job is adopted (if it came from the store): the check above passes for a
  // job this node had no owner of (owners.cc). Before NOT_FOUND, which would tell another uid
  // which steps the job has.
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (!rec) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", req.job(), "/", step, " does not exist"));
  }
  if (rec->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", req.job(), "/", step, " is ",
        v1::CheckpointState_Name(rec->summary().state()), "; only COMMITTED checkpoints load"));
  }
  // The row and its tiers are read once here; GetManifest reads neither again.
  CKPTD_ASSIGN_OR_RETURN(std::vector<Storage*> tiers, ReadTiers(*rec));
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> m, GetManifest(req.job(), step, tiers));
  tiers = WithPeers(*rec, std::move(tiers));  // the blobs: from peers too, before the store
  resp->set_step(step);
  const Key key{req.job(), step};
  // Pinned for the whole load: an eviction meanwhile frees its bytes only after this load.
  std::shared_ptr<const HotCopy> hot = ram_tier_.Pin(key);
  if (hot == nullptr && ram_tier_.enabled()) {
    uint64_t prefetched = 0;
    hot = HotAfterPrefetch(key, req.prefetch(), caller.uid, tiers, *m, &prefetched);
    resp->set_bytes_prefetched(prefetched);
  }
  // Items the client may copy out of the hot copy itself: a lease keeps it pinned until the
  // client is done (hot_leases.h), taken first so that a session at its limit hears so before
  // any work.
  uint64_t lease = 0;
  if (hot != nullptr && std::any_of(req.items().begin(), req.items().end(),
                                    [](const v1::LoadItemRequest& i) { return i.hot_direct(); })) {
    CKPTD_ASSIGN_OR_RETURN(lease, hot_leases_.Grant(session, key, hot));
  }
  bool hot_failed = false;
  absl::Status st = loader_.Load(session, caller.uid, *m, req, tiers, remote_.remote(),
                                 deps_.peers != nullptr ? deps_.peers->reader() : nullptr,
                                 hot.get(), &hot_failed, resp);
  if (lease != 0 && (!st.ok() || resp->hot_spans_size() == 0)) {
    (void)hot_leases_.Release(session, lease);  // nothing for the client to copy
    resp->clear_hot_spans();
  } else if (lease != 0) {
    resp->set_hot_lease_id(lease);
  }
  if (hot_failed) ram_tier_.Drop(key);  // a hot block that did not verify: never used again
  if (deps_.metrics != nullptr) {
    if (hot_failed) deps_.metrics->ChecksumFailure("ram");
    if (absl::IsDataLoss(st)) deps_.metrics->ChecksumFailure("storage");
  }
  return st;
}

std::shared_ptr<const HotCopy> CheckpointService::HotAfterPrefetch(
    const Key& key, bool hint, uint32_t caller_uid, const std::vector<Storage*>& tiers,
    const Manifest& m, uint64_t* prefetched) {
  std::optional<absl::Status> prefetch;
  if (hint) {
    prefetch =
        prefetches_.Do(key, [&] { return PrefetchInto(key, caller_uid, tiers, m, prefetched); })
            .status;
  } else {
    prefetch = prefetches_.Await(key);
  }
  if (!prefetch) return nullptr;  // no hint and none in flight
  if (!prefetch->ok()) {
    spdlog::info("load of {}: its prefetch into the RAM tier failed ({}); reading storage",
                 CkptName(key.first, key.second), prefetch->ToString());
    return nullptr;
  }
  return ram_tier_.Pin(key);  // null again if evicted meanwhile: the load reads storage
}

}  // namespace ckptd
