// Tiers of CheckpointService: the lifecycle's and the catalog's side of the tiers — the policy a
// Save asks for, which tiers a COMMITTED checkpoint is read from, its remote tier in a status,
// and Wait(WAIT_FOR_REMOTE). The uploads themselves are tier/remote_tier.h's.
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

Storage* CheckpointService::BlobTier(v1::TierPolicy policy) const {
  return policy == v1::TIER_REMOTE ? remote_.remote() : deps_.storage;
}

absl::StatusOr<v1::TierPolicy> CheckpointService::ResolveTierPolicy(
    const v1::SaveRequest& req) const {
  v1::TierPolicy policy = req.tier_policy();
  if (policy == v1::TIER_POLICY_DEFAULT) {
    const std::string& dflt = deps_.options->tier_policy;
    policy = dflt == "local+remote" ? v1::TIER_LOCAL_AND_REMOTE
             : dflt == "remote"     ? v1::TIER_REMOTE
             : dflt == "local+peer" ? v1::TIER_LOCAL_AND_PEER
                                    : v1::TIER_LOCAL;
  }
  const std::string what = CkptName(req.job(), req.step());
  if (!v1::TierPolicy_IsValid(policy)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": tier policy ", static_cast<int>(policy),
                                                   " is not one this daemon knows"));
  }
  const bool spans_nodes = req.local_world_size() != 0 && req.local_world_size() < req.world_size();
  if (spans_nodes && !UsesStore(policy)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " spans nodes (local_world_size ", req.local_world_size(),
                     " of world_size ", req.world_size(),
                     "): its nodes commit it through the shared tier, so it needs the tier "
                     "policy local+remote, remote or local+peer (it has ",
                     v1::TierPolicy_Name(policy), ")"));
  }
  if (policy == v1::TIER_LOCAL_AND_PEER) {
    // The peer tier holds copies of node parts; a checkpoint one daemon saves whole has none.
    if (!spans_nodes) {
      return absl::FailedPreconditionError(
          absl::StrCat(what,
                       ": tier policy TIER_LOCAL_AND_PEER commits checkpoints that span nodes "
                       "(local_world_size < world_size), and this one is saved through one daemon "
                       "(local_world_size ",
                       req.local_world_size(), " of world_size ", req.world_size(),
                       "); use local or local+remote"));
    }
    if (deps_.peers == nullptr || deps_.options->peer_replicas == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(what,
                       ": tier policy TIER_LOCAL_AND_PEER, but this daemon has no peer "
                       "tier (start it with --peer_listen_addr, its TLS files, a remote "
                       "tier and --peer_replicas of at least 1)"));
    }
  }
  if (UsesStore(policy) && !remote_.enabled()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": tier policy ", v1::TierPolicy_Name(policy),
                     ", but this daemon has no remote tier (start it with --remote_dir or "
                     "--remote_s3_bucket)"));
  }
  return policy;
}

absl::StatusOr<std::vector<Storage*>> CheckpointService::ReadTiers(
    const v1::CheckpointRecord& rec) {
  std::vector<Storage*> tiers;
  const v1::CheckpointSummary& s = rec.summary();
  if (s.tiers().local() || s.tiers().local_part()) {
    tiers.push_back(deps_.load_storage != nullptr ? deps_.load_storage : deps_.storage);
  }
  if (remote_.enabled() && HasRemoteTier(s.tier_policy())) {
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::UploadRecord> row, remote_.ReadRow(s.job(), s.step()));
    if (row && row->upload().state() == v1::UPLOAD_DURABLE) tiers.push_back(remote_.remote());
  }
  if (remote_.enabled() && s.tier_policy() == v1::TIER_LOCAL_AND_PEER) {
    // The manifest is there (its control files); the blobs are on their nodes and peers
    // (WithPeers), and this node's own on local storage (local_part).
    tiers.push_back(remote_.remote());
  }
  if (tiers.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        CkptName(s.job(), s.step()), " is on no tier this daemon can read (",
        s.tiers().remote() ? "its copy is on a remote tier this daemon is not configured with"
                           : "no local or remote copy",
        ")"));
  }
  return tiers;
}

std::vector<Storage*> CheckpointService::WithPeers(const v1::CheckpointRecord& rec,
                                                   std::vector<Storage*> tiers) const {
  if (deps_.peers == nullptr || !UsesStore(rec.summary().tier_policy())) return tiers;
  // Before the remote store (the last tier when it is there), after this node's own.
  auto at = std::find(tiers.begin(), tiers.end(), remote_.remote());
  tiers.insert(at, deps_.peers->reader());
  return tiers;
}

void CheckpointService::FillPeerTier(const v1::ManifestHeader& h, v1::Tiers* out) {
  std::set<std::string> nodes;
  uint32_t without = 0;
  for (const v1::BlobInfo& b : h.blobs()) {
    nodes.insert(b.peers().begin(), b.peers().end());
    without += b.peers().empty() && b.size_bytes() > 0 ? 1 : 0;
  }
  if (nodes.empty()) return;  // one node's checkpoint, or the peer tier was off for it
  out->mutable_peer_nodes()->Assign(nodes.begin(), nodes.end());
  out->set_blobs_without_peer_copy(without);
}

void CheckpointService::WatchOwnPart(const v1::ManifestHeader& h, const std::string& dir) {
  if (deps_.peers == nullptr || deps_.options->peer_replicas == 0) return;
  PeerTier::Part part{.job = h.job(),
                      .step = h.step(),
                      .dir = dir,
                      .replicas = static_cast<uint32_t>(deps_.options->peer_replicas)};
  for (const v1::BlobInfo& b : h.blobs()) {
    if (b.node() != deps_.options->node_id) continue;
    part.blobs.emplace_back(b.name(), b.size_bytes());
    if (part.holders.empty()) part.holders.assign(b.peers().begin(), b.peers().end());
  }
  if (!part.blobs.empty()) deps_.peers->Watch(std::move(part));
}

void CheckpointService::WatchOwnParts() {
  if (deps_.peers == nullptr) return;
  std::map<std::string, std::pair<uint64_t, std::string>> newest;  // job -> (step, dir)
  absl::Status st = deps_.meta->Scan(
      keys::AllCheckpointsPrefix(), "", 0, [&](std::string_view, std::string_view value) {
        v1::CheckpointRecord rec;
        if (rec.ParseFromArray(value.data(), static_cast<int>(value.size())) &&
            rec.summary().state() == v1::COMMITTED && rec.summary().tiers().local_part()) {
          newest[rec.summary().job()] = {rec.summary().step(), rec.dir()};  // in step order
        }
        return true;
      });
  if (!st.ok())
    spdlog::warn("peer tier: the parts to keep copied could not be read: {}", st.ToString());
  for (const auto& [job, at] : newest) {
    absl::StatusOr<std::shared_ptr<const Manifest>> m = GetManifest(job, at.first);
    if (!m.ok()) {
      spdlog::warn("peer tier: {} is not kept copied: {}", CkptName(job, at.first),
                   m.status().ToString());
      continue;
    }
    WatchOwnPart((*m)->header, at.second);
  }
}

void CheckpointService::FillPeerCopies(v1::CheckpointSummary* summary) const {
  if (deps_.peers == nullptr || !summary->tiers().local_part()) return;
  std::optional<PeerTier::Copies> c = deps_.peers->CopiesOf(summary->job(), summary->step());
  if (!c.has_value()) return;
  v1::Tiers* t = summary->mutable_tiers();
  t->mutable_part_peers()->Assign(c->holders.begin(), c->holders.end());
  t->set_peer_degraded(c->degraded);
}

void CheckpointService::FillRemoteTier(v1::CheckpointSummary* summary) {
  if (!remote_.enabled() || !UsesStore(summary->tier_policy())) return;
  absl::StatusOr<std::optional<v1::UploadRecord>> row =
      remote_.ReadRow(summary->job(), summary->step());
  if (!row.ok()) {
    summary->mutable_tiers()->mutable_upload()->set_error(std::string(row.status().message()));
    return;
  }
  remote_.Fill(summary->job(), summary->step(), *row, summary->mutable_tiers());
  if (summary->tier_policy() == v1::TIER_LOCAL_AND_PEER && summary->tiers().has_upload()) {
    summary->mutable_tiers()->mutable_upload()->set_node_part(true);
  }
}

void CheckpointService::FillRamTier(v1::CheckpointSummary* summary) const {
  std::optional<uint64_t> bytes = ram_tier_.HotBytes(Key{summary->job(), summary->step()});
  summary->mutable_tiers()->set_ram(bytes.has_value());
  summary->mutable_tiers()->set_ram_bytes(bytes.value_or(0));
}

absl::Status CheckpointService::WaitRemoteLocked(const std::string& job, uint64_t step,
                                                 absl::Time deadline, v1::CheckpointStatus* resp) {
  mu_.Unlock();
  absl::Status st = remote_.WaitDurable(job, step, deadline);
  FillRemoteTier(resp->mutable_summary());
  mu_.Lock();
  return st;
}

}  // namespace ckptd
