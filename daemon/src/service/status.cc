// What a checkpoint being saved reports: its summary (also its journal row's), its status with
// the ranks seen and missing (and, spanning nodes, the nodes: cluster.cc), and Wait, which
// answers one of them once the checkpoint reaches the state asked for.
#include "ckptd/status.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "service/checkpoint_service.h"

namespace ckptd {

v1::CheckpointSummary CheckpointService::SummaryLocked(const PendingCheckpoint& p) const {
  v1::CheckpointSummary s;
  s.set_job(p.job);
  s.set_step(p.step);
  s.set_state(p.api_state());
  s.set_world_size(p.world_size);
  s.set_created_unix_ms(p.created_unix_ms);
  s.set_partial(p.partial);
  s.set_error(p.error);
  s.set_item_count(p.items.size());
  s.set_tier_policy(p.tier_policy);
  if (p.multi_node()) s.set_local_world_size(p.local_world_size);
  uint64_t bytes = 0;
  bool staged = false;
  for (const auto& [r, pr] : p.ranks) {
    for (const v1::StagedShard& sh : pr.rec.shards()) {
      if (!sh.replica()) bytes += sh.spec().data().length();
    }
    staged |= !pr.persisted();
  }
  s.set_bytes(bytes);
  s.mutable_tiers()->set_staged(staged && p.api_state() != v1::ABORTED);
  return s;
}

void AddTimingFields(LogScope& fields, const v1::CheckpointTimings& t) {
  auto known = [&](const char* key, uint64_t v) {
    if (v != 0) fields.Num(key, v);
  };
  known("all_staged_ms", t.all_staged_ms());
  known("all_persisted_ms", t.all_persisted_ms());
  known("manifest_us", t.manifest_us());
  known("committed_ms", t.committed_ms());
  if (t.ranks().empty()) return;
  // The slowest rank of each phase (the one the checkpoint waited for).
  uint64_t reserve = 0, copy = 0, staged = 0, queued = 0, flush = 0, fsync = 0;
  const v1::RankTimings* last = &t.ranks(0);
  for (const v1::RankTimings& r : t.ranks()) {
    reserve = std::max(reserve, r.reserve_us());
    copy = std::max(copy, r.copy_us());
    staged = std::max(staged, r.staged_us());
    queued = std::max(queued, r.queued_us());
    flush = std::max(flush, r.flush_us());
    fsync = std::max(fsync, r.fsync_us());
    if (r.persisted_at_ms() > last->persisted_at_ms()) last = &r;
  }
  known("max_reserve_us", reserve);
  known("max_copy_us", copy);
  known("max_staged_us", staged);
  known("max_queued_us", queued);
  known("max_flush_us", flush);
  known("max_fsync_us", fsync);
  fields.Num("last_persisted_rank", last->rank());
}

v1::CheckpointTimings CheckpointService::TimingsLocked(const PendingCheckpoint& p) const {
  v1::CheckpointTimings t;
  uint64_t staged = 0, persisted = 0;
  bool all_persisted = !p.ranks.empty();
  for (const auto& [r, pr] : p.ranks) {
    *t.add_ranks() = pr.rec.timings();
    t.mutable_ranks()->rbegin()->set_rank(r);
    staged = std::max(staged, pr.rec.timings().staged_at_ms());
    persisted = std::max(persisted, pr.rec.timings().persisted_at_ms());
    all_persisted &= pr.persisted();
  }
  if (p.ranks.size() == p.expected_ranks() || p.partial) {
    t.set_all_staged_ms(staged);
    if (all_persisted) t.set_all_persisted_ms(persisted);
  }
  return t;
}

void CheckpointService::FillStatusLocked(const PendingCheckpoint& p,
                                         v1::CheckpointStatus* out) const {
  *out->mutable_summary() = SummaryLocked(p);
  uint64_t staged = 0, persisted = 0;
  for (const auto& [r, pr] : p.ranks) {
    v1::RankStatus* rs = out->add_ranks();
    rs->set_rank(r);
    rs->set_staged(true);
    rs->set_persisted(pr.persisted());
    rs->set_bytes_staged(pr.rec.bytes());
    rs->set_bytes_persisted(pr.persisted() ? pr.rec.bytes() : 0);
    rs->set_shard_count(pr.rec.shards_size());
    staged += pr.rec.bytes();
    persisted += pr.persisted() ? pr.rec.bytes() : 0;
  }
  if (!p.partial) {
    const absl::flat_hash_set<uint32_t> in_parts = NodePartRanksLocked(p);
    for (uint32_t r = 0; r < p.world_size; ++r) {
      if (!p.ranks.contains(r) && !in_parts.contains(r)) out->add_missing_ranks(r);
    }
  }
  out->set_bytes_staged(staged);
  out->set_bytes_persisted(persisted);
  *out->mutable_timings() = TimingsLocked(p);
  if (p.multi_node()) FillNodesLocked(p, out);
}

absl::Status CheckpointService::Wait(const Caller& caller, const v1::WaitRequest& req,
                                     v1::CheckpointStatus* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobStep(req.job(), req.step()));
  const std::string what = CkptName(req.job(), req.step());
  // A job is claimed before anything of it exists (owners.cc), and its owner never changes: no
  // owner, no checkpoint (answered so at once, as before; nothing a uid that claims the job a
  // moment later saves can reach this caller).
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(req.job()));
  if (!owner) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  CKPTD_RETURN_IF_ERROR(AccessAllowed(caller, req.job(), owner, Access::kRead));
  v1::WaitFor until =
      req.until() == v1::WAIT_FOR_UNSPECIFIED ? v1::WAIT_FOR_COMMITTED : req.until();
  absl::Time deadline =
      absl::Now() + absl::Milliseconds(std::min(req.timeout_ms(), limits::kWaitTimeoutMsMax));
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = pending_.find(Key{req.job(), req.step()});
    if (it != pending_.end()) {
      PendingCheckpoint& p = *it->second;
      if (until == v1::WAIT_FOR_ALL_STAGED && (p.ranks.size() == p.expected_ranks() || p.partial)) {
        FillStatusLocked(p, resp);
        return absl::OkStatus();
      }
    } else {
      // Read with mu_ released (no RocksDB read under the lifecycle lock); the maps are checked
      // after it, consistent with the row (ReadRowLocked).
      CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                             ReadRowLocked(Key{req.job(), req.step()}, /*corrupt_is_error=*/true));
      if (pending_.contains(Key{req.job(), req.step()})) continue;  // opened meanwhile
      // While an abort, a delete, a CORRUPT marking or a reshard still works on the key, its
      // row is not final: the answer waits for it (each signals when done). So an abort is
      // answered once its files are gone (RecordAbort writes ABORTED first), one whose first
      // journal write failed (no row yet) is not "does not exist", and a reshard's target is
      // answered once the reshard is over (a Delete right after is not refused as running).
      const Key key{req.job(), req.step()};
      const bool busy = rewriting_.contains(key) || reshards_.contains(key);
      if (!rec && !busy) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
      if (rec) *resp->mutable_summary() = rec->summary();
      if (rec && rec->summary().state() == v1::ABORTED && !busy) {
        return absl::AbortedError(absl::StrCat(what, " was aborted: ", rec->summary().error()));
      }
      if (rec && rec->summary().state() == v1::COMMITTED && !busy) {
        if (until != v1::WAIT_FOR_REMOTE) return absl::OkStatus();
        return WaitRemoteLocked(req.job(), req.step(), deadline, resp);
      }
    }
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  auto it = pending_.find(Key{req.job(), req.step()});
  if (it == pending_.end()) return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
  FillStatusLocked(*it->second, resp);
  std::vector<uint32_t> missing(resp->missing_ranks().begin(), resp->missing_ranks().end());
  return absl::DeadlineExceededError(absl::StrCat(
      what, " is ", v1::CheckpointState_Name(it->second->api_state()), " after ", req.timeout_ms(),
      " ms", missing.empty() ? "" : absl::StrCat("; ranks missing: ", RanksList(missing))));
}

Metrics::Levels CheckpointService::MetricLevels() const {
  Metrics::Levels l;
  l.arena_capacity_bytes = deps_.arena->capacity_bytes();
  l.arena_free_bytes = deps_.arena->free_bytes();
  const StagingArena::ReserveWaits waits = deps_.arena->reserve_waits();
  l.reserve_waits = waits.count;
  l.reserve_wait_seconds = waits.seconds;
  l.reserve_waiting_arena_bytes = waits.waiting_arena_bytes;
  l.reserve_waiting_uid_share = waits.waiting_uid_share;
  l.reserve_waiting_bytes = waits.waiting_bytes;
  l.arena_prefault_left_bytes = deps_.arena->prefault_left_bytes();
  const RamTier::Stats tier = ram_tier_.stats();
  l.ram_tier_hot_bytes = tier.hot_bytes;
  l.ram_tier_provisional_bytes = tier.provisional_bytes;
  l.ram_tier_hot_checkpoints = tier.hot_checkpoints;
  l.ram_tier_evictions = tier.evictions;
  l.ram_tier_budget_bytes = ram_tier_.enabled() ? ram_tier_.budget_bytes() : 0;
  l.sessions = sessions_.size();
  {
    absl::MutexLock lock(&mu_);
    l.checkpoints_in_flight = pending_.size() + reshards_.size();
  }
  l.queued.emplace_back("flush", deps_.flush_pool->queued());
  return l;
}

}  // namespace ckptd
