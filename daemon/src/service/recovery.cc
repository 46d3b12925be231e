// Recovery at start: the steps and their contract are in recovery.h.
#include "service/recovery.h"

#include <signal.h>

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "format/names.h"
#include "format/region.h"
#include "index/keys.h"
#include "spdlog/spdlog.h"
#include "tier/local_tier.h"

namespace ckptd {
namespace {

// At most this many problems are repeated in the summary line (each was logged already).
constexpr size_t kRecoverySummaryProblemsMax = 16;

// An index key for a message (keys hold '\0' and big-endian numbers).
std::string EscapeKey(std::string_view key) {
  return absl::CHexEscape(absl::string_view(key.data(), key.size()));
}

// Parses the index row at `key` into *rec; false when it does not parse or does not name the
// checkpoint its key names (a valid job and step): such a row is never trusted for a path.
bool ParseRow(std::string_view key, std::string_view v, v1::CheckpointRecord* rec) {
  if (!rec->ParseFromArray(v.data(), static_cast<int>(v.size()))) return false;
  absl::StatusOr<std::pair<std::string, uint64_t>> id = keys::DecodeCheckpoint(key);
  return id.ok() && ValidateJobStep(id->first, id->second).ok() &&
         rec->summary().job() == id->first && rec->summary().step() == id->second;
}

v1::CheckpointRecord BareRecord(const std::string& job, uint64_t step) {
  v1::CheckpointRecord rec;
  rec.mutable_summary()->set_job(job);
  rec.mutable_summary()->set_step(step);
  rec.set_dir(CheckpointDir(job, step));
  return rec;
}

}  // namespace

absl::Status Recovery::Run() {
  CKPTD_RETURN_IF_ERROR(RepairIndexRows());
  CKPTD_SYNC_POINT("recovery.rows_repaired");
  CKPTD_RETURN_IF_ERROR(FinishDeletes());
  CKPTD_SYNC_POINT("recovery.deletes_finished");
  CKPTD_RETURN_IF_ERROR(AdoptManifests());
  if (stores_.remote != nullptr) {
    absl::Status st = host_.ScanStore("", [this](std::string what) { Problem(std::move(what)); });
    if (!st.ok()) {
      // (A failing index fails the steps after this one.)
      Problem(absl::StrCat("the remote tier cannot be listed (", st.ToString(),
                           "); its checkpoints are adopted when a client asks about their job"));
    }
  }
  CKPTD_SYNC_POINT("recovery.manifests_adopted");
  CKPTD_RETURN_IF_ERROR(ResumePending());
  CKPTD_SYNC_POINT("recovery.pending_resumed");
  CKPTD_RETURN_IF_ERROR(CheckCommittedRows());
  CKPTD_SYNC_POINT("recovery.committed_rows_checked");
  CKPTD_RETURN_IF_ERROR(VerifyNewestCommitted());
  CKPTD_SYNC_POINT("recovery.newest_verified");
  CKPTD_RETURN_IF_ERROR(AdoptHotCopies());
  const size_t n = problems_.size();
  if (n > 0) {
    std::vector<std::string> shown(
        problems_.begin(),
        problems_.begin() + static_cast<long>(std::min(n, kRecoverySummaryProblemsMax)));
    spdlog::warn("recovery: {} entr{} skipped or repaired; serving everything else: {}{}", n,
                 n == 1 ? "y" : "ies", absl::StrJoin(shown, " | "),
                 n > shown.size() ? " | ..." : "");
  }
  return absl::OkStatus();
}

absl::Status Recovery::AdoptHotCopies() {
  std::vector<std::pair<std::string, std::string>> rows;
  CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(keys::AllHotPrefix(), "", 0,
                                           [&](std::string_view key, std::string_view v) {
                                             rows.emplace_back(std::string(key), std::string(v));
                                             return true;
                                           }));
  uint64_t adopted = 0;
  for (const auto& [key, value] : rows) {
    absl::StatusOr<std::pair<std::string, uint64_t>> id = keys::DecodeHot(key);
    v1::HotRecord rec;
    absl::Status st = !id.ok() ? id.status()
                      : !rec.ParseFromString(value)
                          ? absl::DataLossError("its RAM tier row does not parse")
                          : host_.AdoptHot(id->first, id->second, rec);
    if (st.ok()) {
      ++adopted;
      continue;
    }
    // Not a problem of the checkpoint: it is read from storage. The row goes.
    spdlog::info("recovery: RAM tier row {} not adopted ({}); removed", absl::CEscape(key),
                 st.ToString());
    CKPTD_RETURN_IF_ERROR(
        stores_.meta->Commit(std::vector<MetaStore::Write>{{key, std::nullopt}}, /*sync=*/false));
  }
  if (adopted > 0) spdlog::info("recovery: {} checkpoint(s) hot in the RAM tier again", adopted);
  return absl::OkStatus();
}

void Recovery::Problem(std::string what) {
  spdlog::warn("recovery: {}", what);
  problems_.push_back(std::move(what));
}

absl::Status Recovery::RepairIndexRows() {
  CKPTD_RETURN_IF_ERROR(
      stores_.meta->Scan(keys::JobPrefix(), "", 0, [&](std::string_view key, std::string_view v) {
        v1::JobRecord jr;
        if (!jr.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
          Problem(absl::StrCat(
              "index row \"", EscapeKey(key),
              "\" (a job's owner) does not parse; calls on that job answer DATA_LOSS"));
        }
        return true;
      }));
  std::vector<std::string> broken;
  CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(keys::AllCheckpointsPrefix(), "", 0,
                                           [&](std::string_view key, std::string_view v) {
                                             v1::CheckpointRecord rec;
                                             if (!ParseRow(key, v, &rec)) broken.emplace_back(key);
                                             return true;
                                           }));
  for (const std::string& key : broken) {
    absl::StatusOr<std::pair<std::string, uint64_t>> id = keys::DecodeCheckpoint(key);
    if (!id.ok() || !ValidateJobStep(id->first, id->second).ok()) {
      Problem(absl::StrCat("index row \"", EscapeKey(key),
                           "\" does not parse or names no checkpoint; skipped"));
      continue;
    }
    const auto& [job, step] = *id;
    const std::string dir = CheckpointDir(job, step);
    const std::string what =
        absl::StrCat("the index row of ", CkptName(job, step), " (", stores_.storage->Describe(),
                     "/", dir, ") does not parse or names another checkpoint");
    absl::StatusOr<bool> has_manifest =
        stores_.storage->Exists(absl::StrCat(dir, "/", kManifestFileName));
    if (!has_manifest.ok()) {
      Problem(absl::StrCat(what, "; left as is: ", has_manifest.status().ToString()));
      continue;
    }
    if (!*has_manifest) {
      AbortRecovered(BareRecord(job, step), absl::StrCat(what, " and it has no manifest"));
      Problem(absl::StrCat(what, "; it has no manifest: ABORTED"));
      continue;
    }
    absl::StatusOr<Manifest> m = ReadManifest(*stores_.storage, job, step);
    if (m.ok()) {
      absl::Status indexed = host_.IndexCommitted(*m, dir, {});
      if (absl::IsPermissionDenied(indexed)) {  // its owner is not this job's here: left as is
        Problem(absl::StrCat(what, "; ", indexed.message()));
        continue;
      }
      CKPTD_RETURN_IF_ERROR(indexed);
      Problem(absl::StrCat(what, "; rebuilt from its manifest (COMMITTED)"));
      continue;
    }
    v1::CheckpointRecord rec = BareRecord(job, step);
    rec.mutable_summary()->set_state(v1::CORRUPT);
    rec.mutable_summary()->set_error(absl::StrCat(
        "its index row did not parse and its manifest does not verify: ", m.status().message()));
    CKPTD_RETURN_IF_ERROR(host_.PutRecordSync(rec));
    Problem(absl::StrCat(what, " and its manifest does not verify (", m.status().ToString(),
                         "): CORRUPT"));
  }
  return absl::OkStatus();
}

absl::Status Recovery::FinishDeletes() {
  std::vector<v1::CheckpointRecord> deleting;
  CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(
      keys::AllCheckpointsPrefix(), "", 0, [&](std::string_view key, std::string_view v) {
        v1::CheckpointRecord rec;
        if (ParseRow(key, v, &rec) && rec.summary().state() == v1::DELETING) {
          deleting.push_back(std::move(rec));
        }
        return true;
      }));
  for (v1::CheckpointRecord& rec : deleting) {
    const std::string job = rec.summary().job();
    const uint64_t step = rec.summary().step();
    absl::Status st = host_.RemoveCheckpoint(job, step, std::move(rec));
    if (st.ok()) {
      spdlog::info("recovery: finished the interrupted delete of {}", CkptName(job, step));
    } else {
      Problem(absl::StrCat("could not finish the delete of ", CkptName(job, step),
                           " (it stays DELETING; delete it again): ", st.ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status Recovery::AdoptManifests() {
  return ForEachCheckpointDir(
      *stores_.storage, "", [this](std::string what) { Problem(std::move(what)); },
      [this](const std::string& job, uint64_t step) { return AdoptManifest(job, step); });
}

absl::Status Recovery::AdoptManifest(const std::string& job, uint64_t step) {
  Storage& storage = *stores_.storage;
  const std::string root = storage.Describe();
  const std::string dir = CheckpointDir(job, step);
  const std::string path = absl::StrCat(dir, "/", kManifestFileName);
  absl::StatusOr<bool> exists = storage.Exists(path);
  if (!exists.ok()) {
    Problem(absl::StrCat(root, "/", path, " cannot be checked (", exists.status().ToString(),
                         "); skipped"));
    return absl::OkStatus();
  }
  if (!*exists) return absl::OkStatus();
  absl::StatusOr<std::optional<v1::CheckpointRecord>> rec = host_.ReadRecord(job, step);
  if (!rec.ok()) {
    if (!absl::IsDataLoss(rec.status())) return rec.status();
    Problem(absl::StrCat(rec.status().message(), "; ", root, "/", dir, " skipped"));
    return absl::OkStatus();
  }
  const v1::CheckpointState state =
      *rec ? (*rec)->summary().state() : v1::CHECKPOINT_STATE_UNSPECIFIED;
  if (state == v1::COMMITTED || state == v1::DELETING) return absl::OkStatus();
  absl::StatusOr<Manifest> m = ReadManifest(storage, job, step);
  if (!m.ok()) return ManifestNotVerified(job, step, *rec, m.status());
  if (m->header.blobs_on_nodes()) {
    // This node's copy of a manifest committed at the peer tier, beside its own blobs
    // alone: never a local checkpoint (its row comes from the cluster protocol, or from the
    // store's catalog).
    return absl::OkStatus();
  }
  CommittedTiers tiers;
  if (*rec && (*rec)->summary().tier_policy() == v1::TIER_LOCAL_AND_REMOTE) {
    // Its journal row says it was saved local+remote (the manifest does not): its upload
    // is recorded PENDING with COMMITTED, as the commit it finishes would have.
    tiers.policy = v1::TIER_LOCAL_AND_REMOTE;
  }
  absl::Status indexed = host_.IndexCommitted(*m, dir, tiers);
  if (absl::IsPermissionDenied(indexed)) {  // its recorded owner maps to no uid here, or
    Problem(absl::StrCat(root, "/", path, ": ", indexed.message()));  // to another's
    return absl::OkStatus();
  }
  CKPTD_RETURN_IF_ERROR(indexed);
  spdlog::info("recovery: adopted {} from its manifest on {}{}", CkptName(job, step), root,
               state == v1::CORRUPT   ? " (it was CORRUPT; the manifest verifies again)"
               : state == v1::MISSING ? " (it was MISSING; its manifest is back and verifies)"
                                      : "");
  return absl::OkStatus();
}

absl::Status Recovery::ManifestNotVerified(const std::string& job, uint64_t step,
                                           const std::optional<v1::CheckpointRecord>& rec,
                                           const absl::Status& why) {
  const std::string path = absl::StrCat(stores_.storage->Describe(), "/", CheckpointDir(job, step),
                                        "/", kManifestFileName);
  const v1::CheckpointState state = rec ? rec->summary().state() : v1::CHECKPOINT_STATE_UNSPECIFIED;
  if (state == v1::MISSING) {
    // Its manifest is back but does not verify: CORRUPT, files still kept.
    v1::CheckpointRecord marked = *rec;
    marked.mutable_summary()->set_state(v1::CORRUPT);
    marked.mutable_summary()->set_error(
        absl::StrCat("its manifest does not verify: ", why.message()).substr(0, 4096));
    CKPTD_RETURN_IF_ERROR(host_.PutRecordSync(marked));
    Problem(absl::StrCat(path, " is back but does not verify: ", CkptName(job, step),
                         " is CORRUPT: ", why.ToString()));
  } else if (state != v1::CORRUPT) {
    Problem(absl::StrCat(path, " does not verify; ", CkptName(job, step),
                         " not exposed: ", why.ToString()));
  } else {
    spdlog::warn("recovery: {} stays CORRUPT: {}", CkptName(job, step), why.ToString());
  }
  return absl::OkStatus();
}

void Recovery::AbortRecovered(const v1::CheckpointRecord& rec, const std::string& reason) {
  const v1::CheckpointSummary& s = rec.summary();
  spdlog::warn("recovery: checkpoint {}/{} ABORTED: {}", s.job(), s.step(), reason);
  absl::Status st = stores_.storage->RemoveAll(CheckpointDir(s.job(), s.step()));
  if (st.ok() && s.tier_policy() == v1::TIER_REMOTE && s.local_world_size() == 0 &&
      stores_.remote != nullptr) {
    st = stores_.remote->RemoveAll(CheckpointDir(s.job(), s.step()));
  }
  if (!st.ok()) spdlog::error("recovery: removing files: {}", st.ToString());
  CKPTD_SYNC_POINT("recovery.aborted_files_removed");
  v1::CheckpointRecord out = rec;
  out.mutable_summary()->set_state(v1::ABORTED);
  out.mutable_summary()->set_error(reason);
  out.mutable_summary()->mutable_tiers()->Clear();
  st = host_.PutRecordSync(out);
  if (st.ok()) st = stores_.meta->DeletePrefix(keys::RankPrefix(s.job(), s.step()), false);
  if (st.ok()) st = stores_.meta->DeletePrefix(keys::BlobPrefix(s.job(), s.step()), true);
  if (st.ok()) st = stores_.meta->DeletePrefix(keys::ItemPrefix(s.job(), s.step()), true);
  if (!st.ok()) spdlog::error("recovery: recording abort: {}", st.ToString());
}

absl::Status Recovery::ResumePending() {
  std::vector<v1::CheckpointRecord> open;
  std::vector<v1::CheckpointRecord> aborted;
  CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(keys::AllCheckpointsPrefix(), "", 0,
                                           [&](std::string_view key, std::string_view v) {
                                             v1::CheckpointRecord rec;
                                             if (!ParseRow(key, v, &rec)) return true;
                                             auto state = rec.summary().state();
                                             if (state == v1::STAGING || state == v1::PERSISTING)
                                               open.push_back(rec);
                                             if (state == v1::ABORTED) aborted.push_back(rec);
                                             return true;
                                           }));
  for (const v1::CheckpointRecord& rec : aborted) {
    // Collect partial data an interrupted abort may have left; what cannot be removed now is
    // only space (the checkpoint is ABORTED either way), retried at the next start.
    const std::string dir = CheckpointDir(rec.summary().job(), rec.summary().step());
    if (absl::Status st = stores_.storage->RemoveAll(dir); !st.ok()) {
      spdlog::warn("recovery: the files of aborted checkpoint {} stay for now: {}", dir,
                   st.ToString());
    }
  }
  for (const v1::CheckpointRecord& rec : open) {
    if (!rec.summary().origin().empty()) {  // a reshard: not resumable, and the source remains
      AbortRecovered(rec, absl::StrCat(rec.summary().origin(),
                                       " was interrupted by a daemon restart; run it again"));
      continue;
    }
    std::vector<v1::RankRecord> ranks;
    std::string bad_row;
    CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(
        keys::RankPrefix(rec.summary().job(), rec.summary().step()), "", 0,
        [&](std::string_view key, std::string_view v) {
          if (!ranks.emplace_back().ParseFromArray(v.data(), static_cast<int>(v.size()))) {
            bad_row = EscapeKey(key);
            return false;
          }
          return true;
        }));
    if (!bad_row.empty()) {
      std::string why = absl::StrCat("its journal row \"", bad_row, "\" does not parse");
      Problem(absl::StrCat(CkptName(rec.summary().job(), rec.summary().step()),
                           " cannot resume: ", why, "; ABORTED"));
      AbortRecovered(rec, why);
      continue;
    }
    absl::Status st = ResumeOne(rec, ranks);
    if (!st.ok()) AbortRecovered(rec, std::string(st.message()));
  }
  return absl::OkStatus();
}

absl::Status Recovery::ResumeOne(const v1::CheckpointRecord& rec,
                                 const std::vector<v1::RankRecord>& ranks) {
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<PendingCheckpoint> p, ResumedCheckpoint(rec.summary()));
  if (!ranks.empty()) p->checksum_block_bytes = RankBlockBytes(ranks.front());
  for (const v1::RankRecord& rr : ranks) CKPTD_RETURN_IF_ERROR(ResumeRank(rr, p.get()));
  if (p->partial || p->ranks.size() == p->expected_ranks()) {
    p->Transition(CheckpointPhase::kStaging, CheckpointPhase::kPersisting);
  }
  spdlog::info(
      "recovery: resuming checkpoint {}/{} ({} of {} ranks staged{})", p->job, p->step,
      p->ranks.size(), p->expected_ranks(),
      p->multi_node() ? absl::StrCat(" here; it spans nodes, world_size ", p->world_size) : "");
  host_.Resume(std::move(p));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PendingCheckpoint>> Recovery::ResumedCheckpoint(
    const v1::CheckpointSummary& s) {
  auto p = std::make_unique<PendingCheckpoint>(s.job(), s.step());
  p->world_size = s.world_size();
  p->created_unix_ms = s.created_unix_ms();
  p->partial = s.partial();
  p->tier_policy = UsesStore(s.tier_policy()) ? s.tier_policy() : v1::TIER_LOCAL;
  if (p->tier_policy == v1::TIER_REMOTE && stores_.remote == nullptr) {
    return absl::FailedPreconditionError(
        "it is saved straight to the remote tier (policy remote), but this daemon has no remote "
        "tier now");
  }
  if (p->tier_policy == v1::TIER_LOCAL_AND_PEER && stores_.remote == nullptr) {
    return absl::FailedPreconditionError(
        "it is committed at the peer tier (policy local+peer) through the shared store, but this "
        "daemon has no remote tier now");
  }
  p->local_world_size = s.local_world_size() != 0 ? s.local_world_size() : s.world_size();
  if (p->multi_node() && stores_.remote == nullptr) {
    return absl::FailedPreconditionError(
        "it spans nodes and commits through the shared tier, but this daemon has no remote tier "
        "now");
  }
  // Its owner is its job's: only that uid may add ranks, and the job's row, already written, is
  // not journaled again (with another owner).
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, host_.JobOwner(s.job()));
  p->owner_uid = owner.value_or(0);
  p->job_recorded = owner.has_value();
  p->checksum_block_bytes = stores_.checksum_block_bytes;
  return p;
}

absl::Status Recovery::ResumeRank(const v1::RankRecord& rr, PendingCheckpoint* p) {
  PendingRank pr;
  pr.rec = rr;
  pr.Restore(rr.persisted());
  absl::flat_hash_set<uint64_t> restored;  // pr.extent_ids, for a linear dedup
  for (int i = 0; i < rr.shards_size(); ++i) {
    const v1::StagedShard& sh = rr.shards(i);
    const v1::ShardSpec& spec = sh.spec();
    if (!pr.persisted() && spec.data().length() > 0) {
      if (spec.data().target_case() != v1::MemRef::kExtentId) {
        return absl::DataLossError(absl::StrCat("recovery: rank ", rr.rank(),
                                                " staged from a client region, which did not "
                                                "survive the restart"));
      }
      std::optional<ArenaSegmentInfo> seg =
          stores_.arena->SegmentOfGeneration(rr.arena_generation());
      if (!seg || !seg->adopted) {
        return absl::DataLossError(
            absl::StrCat("recovery: the staging arena segment was lost (rank ", rr.rank(),
                         " was staged into generation ", rr.arena_generation(),
                         ", which this daemon did not adopt)"));
      }
      if (restored.insert(sh.extent_id()).second) {
        CKPTD_RETURN_IF_ERROR(stores_.arena->Restore(sh.extent_id(), seg->uid, sh.arena_offset(),
                                                     sh.extent_length()));
        pr.extent_ids.push_back(sh.extent_id());
      }
    }
    if (!sh.replica()) {
      p->stored_copy[StoredCopyKey(spec, rr.rank())] = {rr.rank(), static_cast<size_t>(i)};
    }
  }
  p->NoteItems(rr.rank(), rr);
  p->ranks.emplace(rr.rank(), std::move(pr));
  return absl::OkStatus();
}

absl::Status Recovery::CheckCommittedRows() {
  std::vector<v1::CheckpointRecord> committed;
  CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(
      keys::AllCheckpointsPrefix(), "", 0, [&](std::string_view key, std::string_view v) {
        v1::CheckpointRecord rec;
        if (ParseRow(key, v, &rec) && rec.summary().state() == v1::COMMITTED) {
          committed.push_back(rec);
        }
        return true;
      }));
  for (v1::CheckpointRecord& rec : committed) CKPTD_RETURN_IF_ERROR(CheckCommittedRow(rec));
  return absl::OkStatus();
}

absl::Status Recovery::CheckCommittedRow(v1::CheckpointRecord& rec) {
  if (rec.summary().tiers().local_part()) return CheckPeerTierPart(rec);
  if (!rec.summary().tiers().local()) {
    RemoveLocalLeftovers(rec);
    return absl::OkStatus();
  }
  std::string path = absl::StrCat(CheckpointDir(rec.summary().job(), rec.summary().step()), "/",
                                  kManifestFileName);
  absl::StatusOr<bool> exists = stores_.storage->Exists(path);
  if (!exists.ok()) {
    Problem(absl::StrCat(stores_.storage->Describe(), "/", path, " cannot be checked (",
                         exists.status().ToString(), "); left COMMITTED"));
    return absl::OkStatus();
  }
  if (*exists) return absl::OkStatus();
  // Gone locally: still COMMITTED where the remote tier holds a durable copy.
  absl::StatusOr<std::vector<Storage*>> tiers = host_.ReadTiers(rec);
  if (tiers.ok() && tiers->size() == 2) {
    rec.mutable_summary()->mutable_tiers()->set_local(false);
    CKPTD_RETURN_IF_ERROR(host_.PutRecordSync(rec));
    Problem(absl::StrCat(stores_.storage->Describe(), "/", path,
                         " is missing; the checkpoint stays COMMITTED on the remote tier"));
    return absl::OkStatus();
  }
  if (RestoreFromStore(rec, path)) return absl::OkStatus();
  return MarkMissing(rec, path);
}

absl::Status Recovery::CheckPeerTierPart(v1::CheckpointRecord& rec) {
  // Committed at the peer tier: this node's own blobs are local, the rest on their nodes and
  // peers. Gone locally: its blobs are read from its peers (the row says so from now on).
  const std::string dir = CheckpointDir(rec.summary().job(), rec.summary().step());
  absl::StatusOr<bool> there = stores_.storage->Exists(dir);
  if (there.ok() && !*there) {
    rec.mutable_summary()->mutable_tiers()->set_local_part(false);
    CKPTD_RETURN_IF_ERROR(host_.PutRecordSync(rec));
    Problem(absl::StrCat(stores_.storage->Describe(), "/", dir, " is missing; ",
                         CkptName(rec.summary().job(), rec.summary().step()),
                         " (committed at the peer tier) is read from its peers"));
  }
  return absl::OkStatus();
}

void Recovery::RemoveLocalLeftovers(const v1::CheckpointRecord& rec) {
  // On the remote tier only. Local files there are leftovers: a node's own blobs of a checkpoint
  // that spans nodes, when it stopped between its COMMITTED row and their removal (a dropped
  // local copy loses its files before its row says so).
  const std::string dir = CheckpointDir(rec.summary().job(), rec.summary().step());
  absl::StatusOr<bool> there = stores_.storage->Exists(dir);
  if (there.ok() && *there) {
    absl::Status removed = stores_.storage->RemoveAll(dir);
    spdlog::info("recovery: {} is read from the remote tier; its local leftovers {}",
                 CkptName(rec.summary().job(), rec.summary().step()),
                 removed.ok() ? "are removed" : "stay: " + removed.ToString());
  }
}

bool Recovery::RestoreFromStore(const v1::CheckpointRecord& rec, const std::string& path) {
  // The store may hold a complete copy its upload row does not record as durable (a crash
  // between the manifest's put and the row, or another node's upload): the checkpoint is
  // restored from there, COMMITTED on the remote tier alone, as a scan adopts one.
  if (stores_.remote == nullptr) return false;
  const std::string& job = rec.summary().job();
  const uint64_t step = rec.summary().step();
  absl::StatusOr<Manifest> far = ReadManifest(*stores_.remote, job, step);
  absl::Status restored =
      far.ok() ? host_.IndexCommitted(*far, CheckpointDir(job, step), StoreTiersOf(*far))
               : far.status();
  if (restored.ok()) {
    Problem(absl::StrCat(stores_.storage->Describe(), "/", path, " is missing; ",
                         CkptName(job, step), " is restored from its copy on ",
                         stores_.remote->Describe(), " (COMMITTED there)"));
    return true;
  }
  if (!absl::IsNotFound(restored)) {
    spdlog::warn("recovery: {} has no usable copy on {}: {}", CkptName(job, step),
                 stores_.remote->Describe(), restored.ToString());
  }
  return false;
}

absl::Status Recovery::MarkMissing(v1::CheckpointRecord& rec, const std::string& path) {
  // No tier holds it. Removing what is left is the operator's decision: it is marked MISSING
  // (never visible to load or latest) with its files and rows kept.
  const std::string where = absl::StrCat(stores_.storage->Describe(), "/", path);
  rec.mutable_summary()->set_state(v1::MISSING);
  rec.mutable_summary()->mutable_tiers()->set_ram(false);
  rec.mutable_summary()->mutable_tiers()->set_ram_bytes(0);
  rec.mutable_summary()->set_error(absl::StrCat(
      "its manifest ", where,
      " is missing and no other tier holds a copy; its other files are kept: put the manifest "
      "back and restart the daemon, or delete the checkpoint"));
  CKPTD_RETURN_IF_ERROR(host_.PutRecordSync(rec));
  Problem(absl::StrCat(where, " is missing and no other tier holds a copy: ",
                       CkptName(rec.summary().job(), rec.summary().step()),
                       " is MISSING (its files are kept; never loaded or latest)"));
  return absl::OkStatus();
}

absl::Status Recovery::VerifyNewestCommitted() {
  std::map<std::string, std::vector<uint64_t>> committed;  // job → steps, oldest first
  CKPTD_RETURN_IF_ERROR(stores_.meta->Scan(
      keys::AllCheckpointsPrefix(), "", 0, [&](std::string_view key, std::string_view v) {
        v1::CheckpointRecord rec;
        if (ParseRow(key, v, &rec) && rec.summary().state() == v1::COMMITTED) {
          committed[rec.summary().job()].push_back(rec.summary().step());
        }
        return true;
      }));
  for (const auto& [job, steps] : committed) {
    for (auto step = steps.rbegin(); step != steps.rend(); ++step) {
      // GetManifest keeps what verifies in the manifest cache: the first load of the latest
      // checkpoint after a restart does not read it again.
      absl::StatusOr<std::shared_ptr<const Manifest>> m = host_.GetManifest(job, *step);
      if (m.ok()) break;
      const std::string path = absl::StrCat(stores_.storage->Describe(), "/",
                                            CheckpointDir(job, *step), "/", kManifestFileName);
      if (!absl::IsDataLoss(m.status())) {
        Problem(absl::StrCat(path, " cannot be read to verify it (", m.status().ToString(), "); ",
                             CkptName(job, *step), " left COMMITTED"));
        break;
      }
      Problem(
          absl::StrCat(path, " does not verify: ", CkptName(job, *step),
                       " is CORRUPT, latest falls back to an older one: ", m.status().ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd
