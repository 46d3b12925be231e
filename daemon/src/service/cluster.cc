// Checkpoints that span nodes (docs/OPERATIONS.md "Checkpoints that span nodes"). The ranks of one
// checkpoint save through several daemons, one per node (SaveRequest.local_world_size <
// world_size), and the shared tier — the remote store, or a shared file system — is their only
// channel of control: the commit is decided there. (Blobs may also travel between daemons: with
// the peer tier, a node's part is copied to its peers first, step 0 below; docs/PEERS.md.) Each
// daemon stages, flushes and journals its own ranks as for any checkpoint; once its
// local_world_size ranks are persisted (kAwaitingCluster) the cluster thread, every
// cluster_poll_ms:
//   0. with the peer tier (PeerTier, tier/peer_tier.h): copies this node's part to its peers
//      (ReplicateOwnPart), once per checkpoint and start; the part records who took it;
//   1. publishes this node's part: its blobs copied to the store and synced, then
//      <dir>/cluster/<node_id>.part (PutIfAbsent; a part already there with the same ranks is
//      this node's from before a restart, another one is a second daemon with this node_id);
//   2. on the coordinator (the daemon holding rank 0): reads the parts until they cover ranks
//      0..world_size-1 (committed partial: the parts there are), merges them (node_parts.h),
//      builds and validates the manifest as a single-node commit does, writes the decision
//      <dir>/cluster/decision = commit (PutIfAbsent: one decision, ever), then the manifest, then
//      its COMMITTED row. An abort (Abort, the stage timeout, parts that do not merge) is the
//      decision abort, written the same way. Once a decision is on the store it is final;
//   3. on the others: reads the decision; commit → reads and verifies the manifest and records
//      COMMITTED; abort → aborts. They never decide: Abort and a partial Commit are refused
//      there, and one that hears nothing for twice stage_timeout_ms gives up locally (its part
//      stays on the store, for a coordinator that may still commit).
// A COMMITTED checkpoint spanning nodes is read from the store (tiers.local false): a node's
// local copy holds only its own blobs, and is removed once the COMMITTED row is durable.
//
// Crashes: every step can be repeated. A restarted daemon resumes the checkpoint from its journal
// (its ranks persisted: kAwaitingCluster), publishes its part again (accepted: the same ranks),
// and reads the decision before it decides anything; a commit decision whose manifest is missing
// (the coordinator died between the two) is completed by the coordinator. The coordinator moves
// to kCommitting before it writes a commit decision, so no Abort can race it (Abort refuses
// kCommitting, and asks the cluster thread for the abort decision in kAwaitingCluster).
// Ownership: the part, decision and manifest files are the checkpoint's (Delete removes its
// remote directory). The job's owner on the store (tier/remote_tier.h) is claimed before a part
// is written: a node whose job of that name is another owner's there aborts its part. Threads: the
// cluster thread only; store I/O with no lock held.
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "format/blob_layout.h"
#include "format/names.h"
#include "service/checkpoint_service.h"
#include "service/node_parts.h"
#include "spdlog/spdlog.h"

namespace ckptd {

struct CheckpointService::ClusterWork {
  Key key;
  std::string dir;
  CheckpointPhase phase = CheckpointPhase::kStaging;
  bool coordinator = false;
  bool part_durable = false;
  bool partial = false;
  v1::TierPolicy policy = v1::TIER_LOCAL_AND_REMOTE;
  uint32_t world_size = 0;
  uint64_t created_unix_ms = 0;
  uint32_t owner_uid = 0;  // the job's owner here (recorded in the part and the manifest)
  std::string abort_requested;
  v1::NodePart part;                                    // this node's (kAwaitingCluster)
  std::vector<std::pair<std::string, uint64_t>> blobs;  // its blobs and their sizes
  std::vector<uint32_t> own_ranks;
  bool replicated = false;  // this node's part is on its peers (ClusterState::replicated)
  std::string unpublished;  // why this node's part could not go to its peers this step
};

void CheckpointService::ClusterLoop() {
  while (true) {
    std::vector<ClusterWork> work;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + absl::Milliseconds(deps_.options->cluster_poll_ms);
      while (!stopping_ && !cluster_wake_) {
        if (changed_.WaitWithDeadline(&mu_, until)) break;
      }
      if (stopping_) return;
      cluster_wake_ = false;
      work = ClusterWorkLocked();
    }
    for (ClusterWork& w : work) ClusterStep(w);
  }
}

std::vector<CheckpointService::ClusterWork> CheckpointService::ClusterWorkLocked() {
  std::vector<ClusterWork> work;
  for (auto& [key, p] : pending_) {
    if (!p->multi_node() || p->aborting() || p->committing()) continue;
    ClusterWork& w = work.emplace_back();
    w.key = key;
    w.dir = CheckpointDir(key.first, key.second);
    w.phase = p->phase();
    w.coordinator = p->coordinator();
    w.part_durable = p->cluster.part_durable;
    w.partial = p->partial;
    w.policy = p->tier_policy;
    w.world_size = p->world_size;
    w.created_unix_ms = p->created_unix_ms;
    w.owner_uid = p->owner_uid;
    w.abort_requested = p->cluster.abort_requested;
    w.replicated = p->cluster.replicated;
    for (const auto& [r, pr] : p->ranks) w.own_ranks.push_back(r);
    if (w.phase != CheckpointPhase::kAwaitingCluster || w.part_durable) continue;
    v1::NodePart& part = w.part;
    part.set_format_version(kNodePartFormatVersion);
    part.set_job(p->job);
    part.set_step(p->step);
    part.set_world_size(p->world_size);
    part.set_node(deps_.options->node_id);
    part.set_checksum_block_bytes(p->checksum_block_bytes);
    part.set_created_unix_ms(p->created_unix_ms);
    for (const std::string& n : p->cluster.replica_nodes) part.add_replica_nodes(n);
    part.set_blobs_on_nodes(p->tier_policy == v1::TIER_LOCAL_AND_PEER);
    for (const auto& [r, pr] : p->ranks) {
      *part.add_ranks() = pr.rec;
      uint64_t size = 0;
      for (const v1::StagedShard& s : pr.rec.shards()) {
        if (!s.replica() && s.stored().blob_id() == r) {
          size = std::max(size, ShardEndInBlob(s.stored()));
        }
      }
      w.blobs.emplace_back(pr.rec.blob_name(), size);
      // Deltas: the earlier blobs its unchanged shards are referenced in, linked beside it.
      for (const v1::BlobInfo& b : pr.rec.linked_blobs())
        w.blobs.emplace_back(b.name(), b.size_bytes());
    }
  }
  return work;
}

bool CheckpointService::SetWaitingFor(const Key& key, const std::string& what) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(key);
  if (it == pending_.end()) return false;
  it->second->cluster.waiting_for = what;
  return true;
}

void CheckpointService::ClusterStep(ClusterWork& w) {
  if (w.phase == CheckpointPhase::kAwaitingCluster && !w.part_durable && !PublishOwnPart(w)) {
    // Its copies to peers missing (w.unpublished; the store answers): a decision taken meanwhile
    // (an abort, or a partial commit without this part) still ends it; so does the stage
    // timeout, on the coordinator too. (A store that fails is retried until it answers.)
    if (w.unpublished.empty() || FollowDecision(w)) return;
    AbortUnpublished(w);
    return;
  }
  if (FollowDecision(w)) return;  // the decision, if there is one, is final
  if (w.phase != CheckpointPhase::kAwaitingCluster) return;
  if (w.coordinator) {
    CoordinatorStep(w);
  } else {
    AwaitCoordinator(w);
  }
}

void CheckpointService::AbortUnpublished(const ClusterWork& w) {
  const uint64_t timeout = deps_.options->stage_timeout_ms;
  // The coordinator decides (its ranks' part is missing: the others wait for that decision);
  // the others give up locally as AwaitCoordinator does.
  const uint64_t after = w.coordinator ? timeout : 2 * timeout;
  if (NowMs() - w.created_unix_ms <= after) return;
  const std::string reason =
      absl::StrCat("stage timeout: this node's part (node ", deps_.options->node_id,
                   ") is not published after ", after, " ms: ", w.unpublished);
  if (w.coordinator) {
    DecideAbort(w, reason);
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(w.key);
  if (it == pending_.end() || it->second->aborting() || it->second->committing()) return;
  AbortLocked(*it->second, reason);
}

bool CheckpointService::PublishOwnPart(ClusterWork& w) {
  *w.part.mutable_owner() = OwnerRecordOf(w.owner_uid);  // named outside mu_
  if (!w.replicated && !ReplicateOwnPart(w)) return false;
  absl::Status st = PublishPart(w);
  if (absl::IsPermissionDenied(st)) {  // the job on the store is another owner's: never retried
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    if (it != pending_.end() && !it->second->aborting() && !it->second->committing()) {
      AbortLocked(*it->second, std::string(st.message()));
    }
    return false;
  }
  if (!st.ok()) {
    spdlog::warn("{}: publishing this node's part (retried): {}",
                 CkptName(w.key.first, w.key.second), st.ToString());
    SetWaitingFor(w.key, absl::StrCat("publishing this node's part (retried): ", st.message()));
    return false;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(w.key);
  if (it == pending_.end()) return false;
  it->second->cluster.part_durable = true;
  w.part_durable = true;
  return true;
}

bool CheckpointService::ReplicateOwnPart(ClusterWork& w) {
  const uint32_t replicas = static_cast<uint32_t>(deps_.options->peer_replicas);
  const bool at_peer = w.policy == v1::TIER_LOCAL_AND_PEER;  // the commit waits for the copies
  std::vector<std::string> took;
  absl::Status failed;
  // Under TIER_REMOTE the blobs went straight to the store: there is no local copy to send.
  if (deps_.peers != nullptr && replicas > 0 && w.policy != v1::TIER_REMOTE) {
    absl::StatusOr<std::vector<std::string>> r =
        deps_.peers->Replicate(w.key.first, w.key.second, w.dir, w.blobs, replicas);
    if (r.ok()) {
      took = *std::move(r);
    } else {
      failed = r.status();
    }
  }
  if (at_peer && (took.size() < replicas || !failed.ok())) {
    // Committed at the peer tier only with every copy acknowledged: copied again at the next
    // step (a peer already holding a blob deduplicates it), until the stage timeout.
    w.unpublished = absl::StrCat(
        "copying this node's part to ", replicas, " peers (retried): ",
        failed.ok()
            ? absl::StrCat(took.size(), " took it",
                           took.empty() ? "" : absl::StrCat(" (", absl::StrJoin(took, ", "), ")"))
            : std::string(failed.message()));
    SetWaitingFor(w.key, w.unpublished);
    return false;
  }
  if (!failed.ok()) {
    // The part still goes to the store (the commit does not wait for peers); its loads read
    // the store.
    spdlog::warn("{}: copying this node's part to its peers failed: {}",
                 CkptName(w.key.first, w.key.second), failed.ToString());
  }
  if (!took.empty()) CKPTD_SYNC_POINT("cluster.part_replicated");
  w.part.clear_replica_nodes();
  for (const std::string& n : took) w.part.add_replica_nodes(n);
  w.replicated = true;
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(w.key);
  if (it == pending_.end()) return false;
  it->second->cluster.replicated = true;
  it->second->cluster.replica_nodes = std::move(took);
  return true;
}

bool CheckpointService::FollowDecision(const ClusterWork& w) {
  Storage* const store = remote_.remote();
  absl::StatusOr<std::string> raw = store->Get(DecisionPath(w.dir));
  if (absl::IsNotFound(raw.status())) return false;
  if (!raw.ok()) {
    SetWaitingFor(w.key, absl::StrCat("reading the decision (retried): ", raw.status().message()));
    return true;
  }
  v1::ClusterDecision d;
  if (!d.ParseFromString(*raw)) {
    SetWaitingFor(w.key, absl::StrCat("the decision on ", store->Describe(),
                                      " does not parse: ", DecisionPath(w.dir)));
    return true;
  }
  if (d.commit()) {
    FinishClusterCommit(w);
    return true;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(w.key);
  if (it == pending_.end() || it->second->aborting() || it->second->committing()) return true;
  it->second->cluster.abort_requested.clear();
  it->second->cluster.waiting_for.clear();
  AbortLocked(*it->second,
              absl::StrCat("aborted by the coordinator (node ", d.node(), "): ", d.reason()));
  return true;
}

void CheckpointService::AwaitCoordinator(const ClusterWork& w) {
  const uint64_t timeout = deps_.options->stage_timeout_ms;
  if (NowMs() - w.created_unix_ms > 2 * timeout) {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    if (it == pending_.end() || it->second->aborting() || it->second->committing()) return;
    AbortLocked(*it->second, absl::StrCat("no decision from the coordinator (the daemon of rank "
                                          "0) within ",
                                          2 * timeout, " ms; this node's part stays on ",
                                          remote_.remote()->Describe()));
    return;
  }
  SetWaitingFor(w.key, "the coordinator's decision (the daemon of rank 0)");
}

void CheckpointService::CoordinatorStep(ClusterWork& w) {
  absl::StatusOr<std::map<std::string, v1::NodePart>> parts = ReadParts(w);
  if (!parts.ok()) {
    SetWaitingFor(w.key,
                  absl::StrCat("reading the node parts (retried): ", parts.status().message()));
    return;
  }
  std::set<uint32_t> covered;
  for (const auto& [node, part] : *parts) {
    for (const v1::RankRecord& r : part.ranks()) covered.insert(r.rank());
  }
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < w.world_size; ++r) {
    if (!covered.contains(r)) missing.push_back(r);
  }
  if (!w.abort_requested.empty()) {
    DecideAbort(w, w.abort_requested);
    return;
  }
  const uint64_t timeout = deps_.options->stage_timeout_ms;
  if (!w.partial && !missing.empty()) {
    if (NowMs() - w.created_unix_ms > timeout) {
      DecideAbort(w, absl::StrCat("stage timeout: ranks ", RanksList(missing), " of ", w.world_size,
                                  " are in no node's part on ", remote_.remote()->Describe(),
                                  " after ", timeout, " ms"));
      return;
    }
    SetWaitingFor(w.key, absl::StrCat("the node parts of ranks ", RanksList(missing)));
    return;
  }
  DecideCommit(w, *parts);
}

absl::Status CheckpointService::PublishPart(const ClusterWork& w) {
  Storage* const store = remote_.remote();
  // The job's owner on the store before anything of this part is written there (the flush under
  // TIER_REMOTE claimed it already, in Save).
  CKPTD_RETURN_IF_ERROR(remote_.ClaimStoreOwner(w.key.first, w.part.owner()));
  // Under TIER_REMOTE the flush wrote them there already; under TIER_LOCAL_AND_PEER they stay
  // on this node and its peers.
  if (w.policy != v1::TIER_REMOTE && w.policy != v1::TIER_LOCAL_AND_PEER) {
    CKPTD_RETURN_IF_ERROR(remote_.CopyBlobs(w.dir, w.blobs));
  }
  const std::string path = NodePartPath(w.dir, w.part.node());
  absl::Status put = store->PutIfAbsent(path, w.part.SerializeAsString());
  if (put.ok()) CKPTD_SYNC_POINT("cluster.part_published");
  if (!absl::IsAlreadyExists(put)) {
    return Annotate(put, absl::StrCat("writing ", path, " to ", store->Describe()));
  }
  // There already: ours from before a restart (the same ranks), or another daemon's.
  CKPTD_ASSIGN_OR_RETURN(std::string there, store->Get(path));
  v1::NodePart theirs;
  std::vector<uint32_t> ours, found;
  for (const v1::RankRecord& r : w.part.ranks()) ours.push_back(r.rank());
  if (theirs.ParseFromString(there)) {
    for (const v1::RankRecord& r : theirs.ranks()) found.push_back(r.rank());
  }
  if (found != ours) {
    return absl::AlreadyExistsError(absl::StrCat(
        path, " on ", store->Describe(), " holds ranks ", RanksList(found), ", this daemon's are ",
        RanksList(ours), ": another daemon of this job has node_id \"", w.part.node(),
        "\" (give each its own)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, v1::NodePart>> CheckpointService::ReadParts(
    const ClusterWork& w) {
  Storage* const store = remote_.remote();
  std::map<std::string, v1::NodePart> known;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    if (it == pending_.end()) return known;
    known = it->second->cluster.parts;
  }
  CKPTD_ASSIGN_OR_RETURN(std::vector<std::string> names, store->List(ClusterDirOf(w.dir)));
  std::map<std::string, v1::NodePart> added;
  for (const std::string& name : names) {
    absl::string_view node = name;
    if (!absl::ConsumeSuffix(&node, ".part") || known.contains(std::string(node))) continue;
    const std::string path = NodePartPath(w.dir, std::string(node));
    CKPTD_ASSIGN_OR_RETURN(std::string bytes, store->Get(path));
    v1::NodePart part;
    if (!part.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat(path, " on ", store->Describe(), " does not parse"));
    }
    added.emplace(std::string(node), std::move(part));
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(w.key);
  if (it == pending_.end()) return known;
  for (auto& [node, part] : added) it->second->cluster.parts.emplace(node, part);
  return it->second->cluster.parts;
}

absl::StatusOr<Manifest> CheckpointService::BuildClusterManifest(
    const ClusterWork& w, const std::map<std::string, v1::NodePart>& parts) {
  // Every part is the job owner's (docs/SECURITY.md "Ownership"): its recorded owner maps to the
  // coordinator's owner of the job (a part of an older version records none). Another uid's
  // ranks under the same job name on another node make no checkpoint of this owner's: abort.
  for (const auto& [node, part] : parts) {
    if (!part.has_owner()) continue;
    absl::StatusOr<uint32_t> uid = deps_.options->owners.LocalUid(part.owner());
    if (!uid.ok() || *uid != w.owner_uid) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the part of node ", node, " is owned by ", OwnerMap::Describe(part.owner()),
          uid.ok() ? absl::StrCat(", uid ", *uid, " here")
                   : absl::StrCat(" (", uid.status().message(), ")"),
          ", but job ", w.key.first, " belongs to uid ", w.owner_uid, " on the coordinator"));
    }
  }
  // Committed at the peer tier, or through the store: every node saved under the same policy, and
  // at the peer tier each part names the peers holding it (its only copies off its node).
  const bool on_nodes = w.policy == v1::TIER_LOCAL_AND_PEER;
  for (const auto& [node, part] : parts) {
    if (part.blobs_on_nodes() != on_nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("the part of node ", node, " was saved ",
                       part.blobs_on_nodes() ? "under local+peer (its blobs on its node and peers)"
                                             : "with its blobs on the store",
                       ", and the coordinator's ranks under ", v1::TierPolicy_Name(w.policy),
                       ": give every rank the same tier policy"));
    }
    if (on_nodes && part.replica_nodes().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the part of node ", node, " is on no peer, and its blobs are on no other tier"));
    }
  }
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<PendingCheckpoint> merged,
                         MergeNodeParts(w.key.first, w.key.second, w.world_size, w.partial, parts));
  CKPTD_ASSIGN_OR_RETURN(Manifest m, BuildManifest(*merged, NowMs()));
  *m.header.mutable_owner() = OwnerRecordOf(w.owner_uid);
  m.header.set_blobs_on_nodes(on_nodes);
  // Each blob's node and the peers holding its copies (a blob is one rank's: blob id = rank, or
  // a blob shared by deltas, RankOfBlobId).
  std::map<uint32_t, const v1::NodePart*> part_of_rank;
  for (const auto& [node, part] : parts) {
    for (const v1::RankRecord& r : part.ranks()) part_of_rank[r.rank()] = &part;
  }
  for (v1::BlobInfo& b : *m.header.mutable_blobs()) {
    auto it = part_of_rank.find(RankOfBlobId(b.id()));
    if (it == part_of_rank.end()) continue;
    b.set_node(it->second->node());
    *b.mutable_peers() = it->second->replica_nodes();
  }
  CKPTD_RETURN_IF_ERROR(EncodeManifest(m).status());  // validates
  return m;
}

void CheckpointService::DecideCommit(ClusterWork& w,
                                     const std::map<std::string, v1::NodePart>& parts) {
  Storage* const store = remote_.remote();
  const std::string what = CkptName(w.key.first, w.key.second);
  absl::StatusOr<Manifest> m = BuildClusterManifest(w, parts);
  if (!m.ok()) {
    if (absl::IsInvalidArgument(m.status())) {
      DecideAbort(w,
                  absl::StrCat("the node parts do not make a checkpoint: ", m.status().message()));
    } else {
      SetWaitingFor(w.key, absl::StrCat("building the manifest (retried): ", m.status().message()));
    }
    return;
  }
  {
    // From here no Abort can race the decision (Abort refuses kCommitting).
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    if (it == pending_.end() || it->second->phase() != CheckpointPhase::kAwaitingCluster) return;
    if (!it->second->cluster.abort_requested.empty()) return;  // the next step decides abort
    // A partial Commit's journal write in flight (its row must land before COMMITTED): next step.
    if (it->second->journals_in_flight > 0) return;
    it->second->Transition(CheckpointPhase::kAwaitingCluster, CheckpointPhase::kCommitting);
    it->second->cluster.waiting_for = "writing the commit decision";
  }
  v1::ClusterDecision d;
  d.set_commit(true);
  d.set_node(deps_.options->node_id);
  d.set_decided_unix_ms(NowMs());
  absl::Status st = store->PutIfAbsent(DecisionPath(w.dir), d.SerializeAsString());
  auto back_to_waiting = [&](const std::string& why) {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    if (it == pending_.end()) return;
    it->second->Transition(CheckpointPhase::kCommitting, CheckpointPhase::kAwaitingCluster);
    it->second->cluster.waiting_for = why;
  };
  if (absl::IsAlreadyExists(st)) {
    // Decided before (by this daemon before a restart): the next step reads it.
    back_to_waiting("reading the decision");
    return;
  }
  if (!st.ok()) {
    back_to_waiting(absl::StrCat("writing the commit decision (retried): ", st.message()));
    return;
  }
  CKPTD_SYNC_POINT("cluster.decision_written");
  absl::StatusOr<std::string> bytes = EncodeManifest(*m);
  st = bytes.ok() ? store->PutAtomic(absl::StrCat(w.dir, "/", kManifestFileName), *bytes)
                  : bytes.status();
  if (!st.ok()) {
    // Decided: the manifest is written again by the next step (FinishClusterCommit).
    back_to_waiting(absl::StrCat("writing the manifest (retried): ", st.message()));
    return;
  }
  CKPTD_SYNC_POINT("cluster.manifest_written");
  spdlog::info("{}: committed across {} nodes", what, parts.size());
  w.phase = CheckpointPhase::kCommitting;
  CommitFromStore(w, *std::move(m));
}

void CheckpointService::DecideAbort(const ClusterWork& w, const std::string& reason) {
  Storage* const store = remote_.remote();
  v1::ClusterDecision d;
  d.set_commit(false);
  d.set_reason(reason.substr(0, 1024));
  d.set_node(deps_.options->node_id);
  d.set_decided_unix_ms(NowMs());
  absl::Status st = store->PutIfAbsent(DecisionPath(w.dir), d.SerializeAsString());
  if (absl::IsAlreadyExists(st)) return;  // the next step reads what was decided
  if (!st.ok()) {
    SetWaitingFor(w.key, absl::StrCat("writing the abort decision (retried): ", st.message()));
    return;
  }
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(w.key);
  if (it == pending_.end() || it->second->aborting() || it->second->committing()) return;
  it->second->cluster.abort_decided = true;  // RecordAbort writes no second decision
  AbortLocked(*it->second, reason);
}

void CheckpointService::FinishClusterCommit(const ClusterWork& w) {
  Storage* const store = remote_.remote();
  const std::string path = absl::StrCat(w.dir, "/", kManifestFileName);
  if (w.phase != CheckpointPhase::kAwaitingCluster) {
    // Not all of this node's ranks are persisted yet (a partial commit left them out, or they
    // are still flushing): recorded once they are.
    SetWaitingFor(w.key, "this node's ranks, to record the commit decided");
    return;
  }
  absl::StatusOr<std::string> bytes = store->Get(path);
  if (absl::IsNotFound(bytes.status()) && w.coordinator) {
    // Decided, but the coordinator stopped before the manifest: written again.
    absl::StatusOr<std::map<std::string, v1::NodePart>> parts = ReadParts(w);
    absl::StatusOr<Manifest> m = parts.ok() ? BuildClusterManifest(w, *parts) : parts.status();
    absl::StatusOr<std::string> encoded = m.ok() ? EncodeManifest(*m) : m.status();
    absl::Status st = encoded.ok() ? store->PutAtomic(path, *encoded) : encoded.status();
    if (!st.ok()) {
      SetWaitingFor(w.key, absl::StrCat("writing the manifest (retried): ", st.message()));
      return;
    }
    bytes = std::move(encoded);
  }
  if (!bytes.ok()) {
    SetWaitingFor(w.key,
                  absl::IsNotFound(bytes.status())
                      ? std::string("the coordinator's manifest (decided: commit)")
                      : absl::StrCat("reading the manifest (retried): ", bytes.status().message()));
    return;
  }
  absl::StatusOr<Manifest> m = DecodeManifest(*bytes, path);
  if (!m.ok()) {
    SetWaitingFor(w.key, absl::StrCat("the manifest on ", store->Describe(),
                                      " does not verify: ", m.status().message()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    if (it == pending_.end() || it->second->phase() != CheckpointPhase::kAwaitingCluster) return;
    if (it->second->journals_in_flight > 0) return;  // the next step
    it->second->Transition(CheckpointPhase::kAwaitingCluster, CheckpointPhase::kCommitting);
  }
  CommitFromStore(w, *std::move(m));
}

void CheckpointService::CommitFromStore(const ClusterWork& w, Manifest m) {
  const std::string what = CkptName(w.key.first, w.key.second);
  // This node's ranks the manifest leaves out (a partial commit): their journal rows go too.
  std::set<uint32_t> present(m.header.ranks_present().begin(), m.header.ranks_present().end());
  std::vector<uint32_t> left_out;
  for (uint32_t r : w.own_ranks) {
    if (!present.contains(r)) left_out.push_back(r);
  }
  std::shared_ptr<const Manifest> committed;  // in the manifest cache once COMMITTED
  v1::CheckpointTimings timings;              // this node's ranks', read once, at the commit
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    CKPTD_CHECK(it != pending_.end() && it->second->committing());
    timings = TimingsLocked(*it->second);
  }
  timings.set_committed_ms(MsAfter(w.created_unix_ms));
  const bool on_nodes = m.header.blobs_on_nodes();
  // Committed at the peer tier, on the store's cadence too (remote_every): this node's own blobs
  // are uploaded in the background (an upload row PENDING with COMMITTED).
  const uint64_t every = deps_.options->RetentionOf(w.key.first).remote_every;
  const bool upload = on_nodes && every > 0 && w.key.second % every == 0;
  absl::Status st = IndexCommitted(m, w.dir,
                                   CommittedTiers{.policy = w.policy,
                                                  .local = false,
                                                  .remote_durable = !on_nodes,
                                                  .local_part = on_nodes,
                                                  .upload_part = upload},
                                   left_out, timings);
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(w.key);
    CKPTD_CHECK(it != pending_.end() && it->second->committing());
    PendingCheckpoint& p = *it->second;
    if (!st.ok()) {
      // The store's decision stands: the row is written again by the next step.
      p.Transition(CheckpointPhase::kCommitting, CheckpointPhase::kAwaitingCluster);
      p.cluster.waiting_for = absl::StrCat("recording COMMITTED (retried): ", st.message());
      spdlog::error("{}: recording COMMITTED (retried): {}", what, st.ToString());
      return;
    }
    spdlog::info("{} COMMITTED across nodes ({} items, {} bytes, {} ranks, {} here)", what,
                 m.items.size(), m.header.total_bytes(), m.header.ranks_present_size(),
                 p.ranks.size());
    CKPTD_CHECK(p.journals_in_flight == 0 && p.flushes_in_flight == 0);
    committed = std::make_shared<const Manifest>(std::move(m));
    manifest_cache_.Put(w.key, committed);
    p.Transition(CheckpointPhase::kCommitting, CheckpointPhase::kCommitted);
    pending_.erase(w.key);
    KeyChangedLocked(w.key);
    changed_.SignalAll();
  }
  ram_tier_.Commit(w.key);
  CKPTD_SYNC_POINT("cluster.committed");
  if (on_nodes) {
    // Committed at the peer tier: this node's own blobs stay, and beside them a copy of the
    // manifest (after the row: recovery never adopts it as a local checkpoint, and a restart
    // reads it without the store). A crash before it: the manifest is read from the store.
    absl::StatusOr<std::string> bytes = EncodeManifest(*committed);
    absl::Status kept =
        bytes.ok() ? deps_.storage->PutAtomic(absl::StrCat(w.dir, "/", kManifestFileName), *bytes)
                   : bytes.status();
    if (!kept.ok()) spdlog::warn("{}: its local copy of the manifest: {}", what, kept.ToString());
    if (upload) remote_.Track(w.key.first, w.key.second, w.dir);
    WatchOwnPart(committed->header, w.dir);
    return;
  }
  // Read from the store from now on: this node's blobs alone are no local copy (a crash before
  // they go leaves them to recovery: a COMMITTED row without a local copy has no local files).
  absl::Status removed = deps_.storage->RemoveAll(w.dir);
  if (!removed.ok()) spdlog::warn("{}: removing the local blobs: {}", what, removed.ToString());
}

absl::flat_hash_set<uint32_t> CheckpointService::NodePartRanksLocked(
    const PendingCheckpoint& p) const {
  absl::flat_hash_set<uint32_t> ranks;
  for (const auto& [node, part] : p.cluster.parts) {
    for (const v1::RankRecord& r : part.ranks()) ranks.insert(r.rank());
  }
  return ranks;
}

void CheckpointService::FillNodesLocked(const PendingCheckpoint& p,
                                        v1::CheckpointStatus* out) const {
  v1::NodeStatus* self = out->add_nodes();
  self->set_node(deps_.options->node_id);
  for (const auto& [r, pr] : p.ranks) self->add_ranks(r);
  self->set_part_durable(p.cluster.part_durable);
  self->set_coordinator(p.coordinator());
  for (const auto& [node, part] : p.cluster.parts) {
    if (node == deps_.options->node_id) continue;
    v1::NodeStatus* n = out->add_nodes();
    n->set_node(node);
    for (const v1::RankRecord& r : part.ranks()) {
      n->add_ranks(r.rank());
      n->set_coordinator(n->coordinator() || r.rank() == 0);
    }
    n->set_part_durable(true);
  }
  out->set_waiting_for(p.cluster.waiting_for);
}

}  // namespace ckptd
