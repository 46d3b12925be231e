// Commit: validate the staged set, write the manifest durably (that is the commit), then record
// COMMITTED in the index with a synced write.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/align.h"
#include "common/limits.h"
#include "common/log.h"
#include "format/blob_layout.h"
#include "format/names.h"
#include "format/region.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

v1::ItemInfo ItemInfoOf(const v1::ItemEntry& item) {
  v1::ItemInfo info;
  info.set_name(item.name());
  info.set_kind(item.kind());
  info.set_dtype(item.dtype());
  *info.mutable_shape() = item.shape();
  info.set_scope(item.scope());
  info.set_shard_count(item.shards_size());
  uint64_t bytes = 0;
  for (const v1::ShardEntry& s : item.shards()) {
    bytes += s.length();
    if (item.kind() == v1::OBJECT && item.scope() == v1::PER_RANK) {
      info.add_object_ranks(s.saved_by_rank());
    }
  }
  info.set_bytes(bytes);
  return info;
}

}  // namespace

absl::StatusOr<Manifest> BuildManifest(const PendingCheckpoint& p, uint64_t committed_unix_ms) {
  Manifest m;
  v1::ManifestHeader& h = m.header;
  h.set_format_version(kManifestFormatVersion);
  h.set_job(p.job);
  h.set_step(p.step);
  h.set_world_size(p.world_size);
  h.set_partial(p.partial);
  h.set_created_unix_ms(p.created_unix_ms);
  h.set_committed_unix_ms(committed_unix_ms);
  h.set_checksum_block_bytes(p.checksum_block_bytes);
  std::map<std::string, v1::ItemEntry> items;
  // Owner shard of each stored region, to attach replicas: (rank, shard index) → entry.
  std::map<std::pair<uint32_t, size_t>, std::pair<std::string, int>> where;
  uint64_t total = 0;
  for (const auto& [r, pr] : p.ranks) {
    h.add_ranks_present(r);
    uint64_t blob_bytes = 0;
    for (size_t i = 0; i < static_cast<size_t>(pr.rec.shards_size()); ++i) {
      const v1::StagedShard& s = pr.rec.shards(static_cast<int>(i));
      if (s.replica()) continue;
      const v1::ShardSpec& spec = s.spec();
      v1::ItemEntry& item = items[spec.item()];
      if (item.name().empty()) {
        item.set_name(spec.item());
        item.set_kind(spec.has_tensor() ? v1::TENSOR : v1::OBJECT);
        if (spec.has_tensor()) {
          item.set_dtype(spec.tensor().dtype());
          *item.mutable_shape() = spec.tensor().global_shape();
        } else {
          item.set_scope(spec.object().scope());
        }
      }
      where[{r, i}] = {spec.item(), item.shards_size()};
      *item.add_shards() = s.stored();
      total += s.stored().length();
      if (s.stored().blob_id() == r) blob_bytes = std::max(blob_bytes, ShardEndInBlob(s.stored()));
    }
    v1::BlobInfo* b = h.add_blobs();
    b->set_id(r);
    b->set_name(pr.rec.blob_name());
    b->set_size_bytes(blob_bytes);
    // Deltas: the earlier blobs this rank's unchanged shards are referenced in, linked here.
    for (const v1::BlobInfo& linked : pr.rec.linked_blobs()) *h.add_blobs() = linked;
  }
  // Replicas: stored once; a tensor replica must carry the same bytes as the stored copy.
  for (const auto& [r, pr] : p.ranks) {
    for (const v1::StagedShard& s : pr.rec.shards()) {
      if (!s.replica()) continue;
      const v1::ShardSpec& spec = s.spec();
      std::string rkey = StoredCopyKey(spec, r);
      auto owner = p.stored_copy.find(rkey);
      CKPTD_CHECK(owner != p.stored_copy.end());
      const auto& [item_name, idx] = where.at(owner->second);
      v1::ShardEntry* stored = items.at(item_name).mutable_shards(idx);
      if (spec.has_tensor() &&
          !std::equal(stored->block_crc32c().begin(), stored->block_crc32c().end(),
                      s.stored().block_crc32c().begin(), s.stored().block_crc32c().end())) {
        return absl::InvalidArgumentError(
            absl::StrCat("item \"", spec.item(), "\" ", DescribeRegion(spec.tensor().region()),
                         ": ranks ", stored->saved_by_rank(), " and ", r,
                         " saved different bytes for the same region (replicas must match)"));
      }
      stored->add_replica_ranks(r);
    }
  }
  h.set_total_bytes(total);
  for (auto& [name, item] : items) m.items.push_back(std::move(item));
  h.set_item_count(m.items.size());
  return m;
}

absl::Status CheckpointService::IndexCommitted(const Manifest& m, const std::string& dir,
                                               CommittedTiers tiers,
                                               const std::vector<uint32_t>& journaled,
                                               const v1::CheckpointTimings& timings) {
  const v1::ManifestHeader& h = m.header;
  if (tiers.policy == v1::TIER_LOCAL_AND_REMOTE && !remote_.enabled()) {
    // (A TIER_REMOTE checkpoint is never indexed by a daemon without the remote tier: Save
    // refuses it, and recovery aborts one it cannot resume.)
    spdlog::warn("{} was saved with a remote tier, but this daemon has none: local only",
                 CkptName(h.job(), h.step()));
    tiers.policy = v1::TIER_LOCAL;
  }
  v1::CheckpointRecord rec;
  v1::CheckpointSummary* s = rec.mutable_summary();
  s->set_job(h.job());
  s->set_step(h.step());
  s->set_state(v1::COMMITTED);
  s->set_world_size(h.world_size());
  s->set_bytes(h.total_bytes());
  s->mutable_tiers()->set_local(tiers.local);
  s->mutable_tiers()->set_local_part(tiers.local_part);
  s->mutable_tiers()->set_remote(tiers.remote_durable);
  FillPeerTier(h, s->mutable_tiers());
  s->set_tier_policy(tiers.policy);
  s->set_created_unix_ms(h.created_unix_ms());
  s->set_committed_unix_ms(h.committed_unix_ms());
  s->set_partial(h.partial());
  s->set_item_count(h.item_count());
  s->set_origin(h.origin());
  rec.set_dir(dir);
  *rec.mutable_timings() = timings;
  std::vector<MetaStore::Write> writes;
  // The job's owner row comes first (owners.cc): a Save or Reshard claimed it before any row of
  // its checkpoint; an adoption claims it here, for the owner the manifest records, if its
  // caller did not already.
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(h.job()));
  if (!owner) CKPTD_RETURN_IF_ERROR(AdoptOwner(m));
  writes.push_back({keys::Checkpoint(h.job(), h.step()), rec.SerializeAsString()});
  for (const v1::ItemEntry& item : m.items) {
    v1::ItemRecord ir;
    *ir.mutable_info() = ItemInfoOf(item);
    writes.push_back({keys::Item(h.job(), h.step(), item.name()), ir.SerializeAsString()});
  }
  for (uint32_t r : h.ranks_present()) {
    writes.push_back({keys::Rank(h.job(), h.step(), r), std::nullopt});
  }
  for (uint32_t r : journaled) {
    writes.push_back({keys::Rank(h.job(), h.step(), r), std::nullopt});
    writes.push_back({keys::Blob(h.job(), h.step(), BlobName(r)), std::nullopt});
  }
  for (const v1::BlobInfo& b : h.blobs()) {
    writes.push_back({keys::Blob(h.job(), h.step(), b.name()), std::nullopt});
  }
  if (HasRemoteTier(tiers.policy) || tiers.upload_part) {
    uint64_t bytes_total = 0;
    for (const v1::BlobInfo& b : h.blobs()) {
      if (!tiers.upload_part || b.node() == deps_.options->node_id) bytes_total += b.size_bytes();
    }
    writes.push_back(
        remote_.NewRow(h.job(), h.step(), dir, bytes_total,
                       tiers.remote_durable ? v1::UPLOAD_DURABLE : v1::UPLOAD_PENDING));
  }
  return committer_.Commit(keys::Checkpoint(h.job(), h.step()), std::move(writes));
}

absl::Status CheckpointService::WriteCommitted(const Manifest& m, const std::string& dir,
                                               v1::TierPolicy policy,
                                               v1::CheckpointTimings* timings) {
  const absl::Time started = absl::Now();
  CKPTD_ASSIGN_OR_RETURN(std::string bytes, EncodeManifest(m));
  // TIER_REMOTE: the blobs are on the store (flushed there), and so goes the manifest; the
  // checkpoint has no local copy, its upload row is DURABLE at once.
  CKPTD_RETURN_IF_ERROR(
      BlobTier(policy)->PutAtomic(absl::StrCat(dir, "/", kManifestFileName), bytes));
  CKPTD_SYNC_POINT("commit.manifest_durable");
  v1::CheckpointTimings recorded;
  if (timings != nullptr) {
    timings->set_manifest_us(MicrosBetween(started, absl::Now()));
    timings->set_committed_ms(MsAfter(m.header.created_unix_ms()));
    recorded = *timings;
  }
  const bool remote_only = policy == v1::TIER_REMOTE;
  CKPTD_RETURN_IF_ERROR(IndexCommitted(
      m, dir,
      CommittedTiers{.policy = policy, .local = !remote_only, .remote_durable = remote_only}, {},
      recorded));
  CKPTD_SYNC_POINT("commit.indexed");
  return absl::OkStatus();
}

void CheckpointService::CommitCheckpoint(Key key) {
  absl::StatusOr<Manifest> m;
  const std::string dir = CheckpointDir(key.first, key.second);
  v1::TierPolicy policy = v1::TIER_LOCAL;
  v1::CheckpointTimings timings;
  uint32_t owner_uid = 0;
  {
    absl::MutexLock lock(&mu_);
    PendingCheckpoint& p = *pending_.at(key);
    // A key being saved is never being deleted or marked (Delete and MarkCorrupt refuse keys in
    // pending_, and Save refuses keys in rewriting_): the manifest written below cannot be
    // removed by a delete.
    CKPTD_CHECK(!rewriting_.contains(key));
    // Nothing aborts a committing checkpoint but its own commit's failure (below): Abort refuses
    // it, and it takes no ranks, flushes or journal writes.
    CKPTD_CHECK(p.committing());
    m = BuildManifest(p, NowMs());
    policy = p.tier_policy;
    timings = TimingsLocked(p);
    owner_uid = p.owner_uid;
  }
  // The owner travels with the data (docs/SECURITY.md "Ownership"); named outside mu_ (a passwd
  // lookup may be slow).
  if (m.ok()) *m->header.mutable_owner() = OwnerRecordOf(owner_uid);
  CKPTD_SYNC_POINT("commit.manifest_built");
  absl::Status st = m.ok() ? WriteCommitted(*m, dir, policy, &timings) : m.status();
  if (st.ok()) ram_tier_.Commit(key);  // its persisted ranks' staged bytes become hot
  absl::MutexLock lock(&mu_);
  PendingCheckpoint& p = *pending_.at(key);
  if (!st.ok()) {
    AbortLocked(p, absl::StrCat("commit failed: ", st.message()));
    return;
  }
  {
    LogScope fields;
    fields.Str("job", key.first).Num("step", key.second).Str("event", "committed");
    fields.Num("bytes", m->header.total_bytes()).Num("ranks", p.ranks.size());
    AddTimingFields(fields, timings);
    spdlog::info("checkpoint {}/{} COMMITTED ({} items, {} bytes, {} ranks{})", key.first,
                 key.second, m->items.size(), m->header.total_bytes(), p.ranks.size(),
                 p.partial ? ", partial" : "");
  }
  manifest_cache_.Put(key, std::make_shared<const Manifest>(*std::move(m)));
  if (deps_.metrics != nullptr) {
    deps_.metrics->CheckpointEnded(key.first, "committed", SecondsSince(p.first_staged_unix_ms));
  }
  if (policy == v1::TIER_LOCAL_AND_REMOTE && remote_.enabled()) {
    remote_.Track(key.first, key.second, dir);
  }
  // No journal write can be in flight: a committing checkpoint takes no ranks and no partial
  // commit, and the commit started with none in flight.
  CKPTD_CHECK(p.journals_in_flight == 0);
  p.Transition(CheckpointPhase::kCommitting, CheckpointPhase::kCommitted);
  pending_.erase(key);
  KeyChangedLocked(key);
  changed_.SignalAll();
}

}  // namespace ckptd
