// Flush of one rank, the lifecycle's side: take what to write under the lifecycle lock, have the
// tier write the blob (tier/local_tier.h) and journal "persisted" (committer) with no lock
// held, hand its staged bytes to the RAM tier (tier/ram_tier.h), then record the result: the
// rank persisted and the staging the RAM tier did not take freed, or the checkpoint aborted.
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

HotParts CheckpointService::HotBytesOfRank(const v1::RankRecord& rec) const {
  HotParts hot;
  std::optional<ArenaSegmentInfo> seg = deps_.arena->SegmentOfGeneration(rec.arena_generation());
  if (!seg) return hot;
  for (const v1::StagedShard& s : rec.shards()) {
    const v1::MemRef& m = s.spec().data();
    if (s.replica() || m.length() == 0 || m.target_case() != v1::MemRef::kExtentId) continue;
    hot.ranges.push_back(HotRange{.blob_id = s.stored().blob_id(),
                                  .blob_offset = s.stored().offset(),
                                  .length = s.stored().length(),
                                  .uid = seg->uid,
                                  .arena_offset = s.arena_offset() + m.offset()});
    const bool known = std::any_of(hot.extents.begin(), hot.extents.end(),
                                   [&](const HotExtent& e) { return e.id == s.extent_id(); });
    if (!known) {
      hot.extents.push_back(HotExtent{.id = s.extent_id(),
                                      .uid = seg->uid,
                                      .offset = s.arena_offset(),
                                      .length = s.extent_length()});
    }
  }
  return hot;
}

void CheckpointService::FlushRank(const Key& key, uint32_t rank) {
  v1::RankRecord rec;
  std::vector<RegionLease> leases;
  Storage* to = nullptr;
  const bool write = TakeRankForFlush(key, rank, &rec, &leases, &to);
  absl::Status st = write ? WriteAndJournalRank(key, rank, leases, to, &rec) : absl::OkStatus();
  const bool persisted = write && st.ok();
  leases.clear();
  // The RAM tier takes the staged bytes of the persisted rank (before the lock: the commit this
  // flush may start finds them there); an abort meanwhile drops them with the checkpoint.
  std::vector<uint64_t> hot_ids;
  if (persisted && ram_tier_.enabled()) hot_ids = HandRankToRamTier(key, rec);
  absl::MutexLock lock(&mu_);
  FinishFlushLocked(key, rank, st, persisted, std::move(rec), hot_ids);
}

bool CheckpointService::TakeRankForFlush(const Key& key, uint32_t rank, v1::RankRecord* rec,
                                         std::vector<RegionLease>* leases, Storage** to) {
  absl::MutexLock lock(&mu_);
  PendingCheckpoint& p = *pending_.at(key);
  PendingRank& pr = p.ranks.at(rank);
  if (p.aborting()) return false;
  *rec = pr.rec;
  *leases = pr.leases;
  *to = BlobTier(p.tier_policy);
  if (pr.staged_at != absl::InfinitePast()) {
    rec->mutable_timings()->set_queued_us(MicrosBetween(pr.staged_at, absl::Now()));
  }
  return true;
}

absl::Status CheckpointService::WriteAndJournalRank(const Key& key, uint32_t rank,
                                                    const std::vector<RegionLease>& leases,
                                                    Storage* to, v1::RankRecord* rec) {
  const absl::Time started = absl::Now();
  std::optional<DeltaBase> base;
  if (to == deps_.storage && deps_.options->RetentionOf(key.first).deltas) base = DeltaBaseOf(key);
  CKPTD_RETURN_IF_ERROR(flush_.WriteRankBlob(CheckpointDir(key.first, key.second), leases, rec, to,
                                             base ? &*base : nullptr));
  if (deps_.metrics != nullptr) {
    deps_.metrics->Flushed(to == deps_.storage ? "local" : "remote",
                           rec->bytes() - std::min(rec->bytes(), rec->bytes_referenced()),
                           absl::ToDoubleSeconds(absl::Now() - started));
    if (rec->bytes_referenced() > 0)
      deps_.metrics->Flushed("referenced", rec->bytes_referenced(), 0);
  }
  CKPTD_SYNC_POINT("flush.blob_synced");
  // "Persisted" is journaled synced, outside the service lock, before the extents are freed:
  // once they are reused, a restart must never flush this rank again from the arena (the bytes
  // there would be another checkpoint's).
  rec->set_persisted(true);
  std::vector<MetaStore::Write> w{
      {keys::Rank(key.first, key.second, rank), rec->SerializeAsString()}};
  CKPTD_RETURN_IF_ERROR(
      Annotate(committer_.Commit(keys::Checkpoint(key.first, key.second), std::move(w)),
               "journaling a persisted rank"));
  CKPTD_SYNC_POINT("flush.rank_persisted");
  return absl::OkStatus();
}

std::optional<DeltaBase> CheckpointService::DeltaBaseOf(const Key& key) {
  // The newest COMMITTED step before this one with a copy on this node's storage; its manifest
  // verified. Anything in the way (none yet, a read error) means a full write, never a failure.
  absl::StatusOr<std::vector<uint64_t>> steps = CommittedSteps(key.first);
  if (!steps.ok()) return std::nullopt;
  for (uint64_t step : *steps) {
    if (step >= key.second) continue;
    absl::StatusOr<std::optional<v1::CheckpointRecord>> rec = GetRecord(key.first, step);
    if (!rec.ok() || !*rec) return std::nullopt;
    const v1::Tiers& tiers = (*rec)->summary().tiers();
    if ((*rec)->summary().state() != v1::COMMITTED || !(tiers.local() || tiers.local_part())) {
      return std::nullopt;
    }
    absl::StatusOr<std::shared_ptr<const Manifest>> m =
        GetManifest(key.first, step, std::vector<Storage*>{deps_.storage});
    if (!m.ok()) return std::nullopt;
    return DeltaBase{.step = step,
                     .dir = (*rec)->dir().empty() ? CheckpointDir(key.first, step) : (*rec)->dir(),
                     .manifest = *std::move(m),
                     .live_min_percent = deps_.options->delta_live_min_percent};
  }
  return std::nullopt;
}

std::vector<uint64_t> CheckpointService::HandRankToRamTier(const Key& key,
                                                           const v1::RankRecord& rec) {
  HotParts hot = HotBytesOfRank(rec);
  std::vector<uint64_t> hot_ids;
  hot_ids.reserve(hot.extents.size());
  for (const HotExtent& e : hot.extents) hot_ids.push_back(e.id);
  if (!ram_tier_.AddRank(key, std::move(hot))) hot_ids.clear();
  // Not freed but now reclaimable: a reservation waiting for space may evict them, and they
  // leave the saving uid's share of the arena.
  if (!hot_ids.empty()) {
    deps_.arena->Uncharge(hot_ids);
    deps_.arena->WakeReservations();
  }
  return hot_ids;
}

void CheckpointService::FinishFlushLocked(const Key& key, uint32_t rank, const absl::Status& st,
                                          bool persisted, v1::RankRecord rec,
                                          const std::vector<uint64_t>& hot_ids) {
  PendingCheckpoint& p = *pending_.at(key);
  PendingRank& pr = p.ranks.at(rank);
  --p.flushes_in_flight;
  const bool aborting = p.aborting();
  pr.Transition(RankPhase::kFlushing,
                !aborting && persisted ? RankPhase::kPersisted : RankPhase::kJournaled);
  if (!aborting && !st.ok()) {
    AbortLocked(p, absl::StrCat("flushing rank ", rank, " failed: ", st.message()));
    return;  // the abort frees the rank's staging (and may have erased p)
  }
  if (!aborting) {
    if (persisted) {
      v1::RankTimings& t = *rec.mutable_timings();
      t.set_persisted_at_ms(MsAfter(p.created_unix_ms));
      LogScope fields;
      fields.Str("job", key.first).Num("step", key.second).Num("rank", rank);
      fields.Str("event", "rank_persisted").Num("bytes", rec.bytes());
      fields.Num("queued_us", t.queued_us()).Num("flush_us", t.flush_us());
      fields.Num("fsync_us", t.fsync_us()).Num("persisted_at_ms", t.persisted_at_ms());
      spdlog::debug("{} rank {} persisted ({} bytes)", CkptName(key.first, key.second), rank,
                    rec.bytes());
    }
    pr.rec = std::move(rec);
  }
  // The extents go once "persisted" is journaled (to the RAM tier, or freed); those of a rank
  // aborted unpersisted go with its checkpoint's ABORTED row (RecordAbort).
  if (persisted) {
    const absl::flat_hash_set<uint64_t> hot(hot_ids.begin(), hot_ids.end());
    std::erase_if(pr.extent_ids, [&](uint64_t id) { return hot.contains(id); });
    deps_.arena->Free(pr.extent_ids);
    pr.extent_ids.clear();
  }
  pr.leases.clear();  // "released": the client may write its region again
  CKPTD_SYNC_POINT("flush.extents_freed");
  changed_.SignalAll();
  if (aborting) {
    if (p.idle()) FinishAbortLocked(p);
    return;
  }
  MaybeStartCommitLocked(p);
}

}  // namespace ckptd
