// The RAM tier, the service's side (tier/ram_tier.h has the tier itself): Prefetch brings a
// committed checkpoint from storage into daemon-owned extents; recovery adopts the hot copies a
// previous run left in the arena's segments (AdoptHot), each only after every shard it holds
// verified against the manifest.
#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "format/crc32c.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

// Reads blob_of[i] into ranges[i]'s arena bytes, for each i, from the first of `tiers` that has
// it (`dir` is the checkpoint's directory on each); *read grows by each range's length.
absl::Status ReadBlobsIntoArena(StagingArena* arena, const std::vector<Storage*>& tiers,
                                const std::string& dir, const std::string& what,
                                const std::vector<HotRange>& ranges,
                                const std::vector<const v1::BlobInfo*>& blob_of, uint64_t* read) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const HotRange& r = ranges[i];
    const v1::BlobInfo* blob = blob_of[i];
    const std::string path = absl::StrCat(dir, "/", blob->name());
    uint8_t* dst = arena->At(r.uid, r.arena_offset);
    absl::Status st = absl::NotFoundError("no tier");
    for (Storage* tier : tiers) {
      absl::StatusOr<std::unique_ptr<BlobReader>> reader = tier->OpenBlob(path);
      if (!reader.ok()) {
        st = reader.status();
        continue;
      }
      // Blobs of older versions may end before the 4 KiB-rounded size: the rest is padding.
      const uint64_t have = std::min((*reader)->size_bytes(), r.length);
      std::memset(dst + have, 0, r.length - have);
      const IoSlice slice{dst, have, 0};
      st = have == 0 ? absl::OkStatus() : (*reader)->Read({&slice, 1});
      if (st.ok()) break;
      spdlog::warn("prefetch of {}: {} on {}: {}", what, blob->name(), tier->Describe(),
                   st.ToString());
    }
    if (!st.ok()) return Annotate(st, absl::StrCat("prefetch of ", what, ": reading ", path));
    *read += r.length;
  }
  return absl::OkStatus();
}

// Verifies every shard of `m` that `copy` holds against its checksums; with `require_all`, a
// shard it does not hold is an error too. DATA_LOSS naming the item on a mismatch.
absl::Status VerifyHotCopy(const HotCopy& copy, const Manifest& m, bool require_all) {
  const uint32_t block = m.header.checksum_block_bytes();
  for (const v1::ItemEntry& item : m.items) {
    for (const v1::ShardEntry& s : item.shards()) {
      if (s.length() == 0) continue;
      const uint8_t* p = copy.Find(s.blob_id(), s.offset(), s.length());
      if (p == nullptr) {
        if (!require_all) continue;
        return absl::InternalError(absl::StrCat("item \"", item.name(), "\": blob ", s.blob_id(),
                                                " bytes [", s.offset(), ", +", s.length(),
                                                ") are not in the copy"));
      }
      CKPTD_RETURN_IF_ERROR(VerifyBlocks(
          p, 0, s.length(), s.length(),
          std::span<const uint32_t>(s.block_crc32c().data(), s.block_crc32c().size()), block,
          absl::StrCat("RAM tier copy of item \"", item.name(), "\" (saved by rank ",
                       s.saved_by_rank(), ")")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckpointService::AdoptHot(const std::string& job, uint64_t step,
                                         const v1::HotRecord& rec) {
  const std::string what = absl::StrCat("the RAM tier copy of ", CkptName(job, step));
  if (!ram_tier_.enabled()) return absl::FailedPreconditionError("the RAM tier is off");
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> row, ReadRecord(job, step));
  if (!row || row->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": the checkpoint is not COMMITTED"));
  }
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> m, GetManifest(job, step));
  HotParts parts;
  std::vector<uint64_t> ids;  // restored so far: freed again unless the tier takes them
  absl::Cleanup free_restored = [&] { deps_.arena->Free(ids); };
  for (const v1::HotExtent& e : rec.extents()) {
    auto gen = rec.generations().find(e.uid());
    std::optional<ArenaSegmentInfo> seg = gen == rec.generations().end()
                                              ? std::nullopt
                                              : deps_.arena->SegmentOfGeneration(gen->second);
    absl::Status st = !seg || seg->uid != e.uid()
                          ? absl::NotFoundError(absl::StrCat("the arena segment of uid ", e.uid(),
                                                             " it was in did not survive"))
                          : deps_.arena->Restore(e.id(), e.uid(), e.offset(), e.length());
    if (!st.ok()) return Annotate(st, what);
    ids.push_back(e.id());
    parts.extents.push_back(
        HotExtent{.id = e.id(), .uid = e.uid(), .offset = e.offset(), .length = e.length()});
  }
  for (const v1::HotRange& r : rec.ranges()) {
    parts.ranges.push_back(HotRange{.blob_id = r.blob_id(),
                                    .blob_offset = r.blob_offset(),
                                    .length = r.length(),
                                    .uid = r.uid(),
                                    .arena_offset = r.arena_offset()});
  }
  {
    // A range outside its extents would read another's bytes: checked before any is read.
    for (const HotRange& r : parts.ranges) {
      const bool inside = std::any_of(parts.extents.begin(), parts.extents.end(), [&](auto& e) {
        return e.uid == r.uid && r.arena_offset >= e.offset &&
               r.arena_offset + r.length <= e.offset + e.length;
      });
      if (!inside) {
        return absl::DataLossError(absl::StrCat(what, ": its row names bytes outside its extents"));
      }
    }
    const HotCopy probe(deps_.arena, parts.ranges, {});  // views only: frees nothing
    CKPTD_RETURN_IF_ERROR(Annotate(VerifyHotCopy(probe, *m, /*require_all=*/false), what));
  }
  if (!ram_tier_.Insert(Key{job, step}, std::move(parts), /*write_row=*/false)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": it does not fit the RAM tier's budget"));
  }
  std::move(free_restored).Cancel();  // the tier's now
  return absl::OkStatus();
}

absl::Status CheckpointService::Prefetch(const Caller& caller, const v1::PrefetchRequest& req,
                                         v1::PrefetchResponse* resp) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (!ram_tier_.enabled()) {
    return absl::FailedPreconditionError(
        "the RAM tier is off (ram_tier_keep_per_job = 0): nothing can be prefetched");
  }
  uint64_t step = req.step();
  if (req.which_case() != v1::PrefetchRequest::kStep) {
    CKPTD_ASSIGN_OR_RETURN(step, LatestReadable(caller, req.job()));
  }
  const Key key{req.job(), step};
  const std::string what = CkptName(req.job(), step);
  resp->set_step(step);
  if (std::optional<uint64_t> hot = ram_tier_.HotBytes(key)) {
    // Again on what was found (owners.cc): the check above passes for a job with no owner.
    CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
    resp->set_ram_bytes(*hot);
    return absl::OkStatus();
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec,
                         ReadRecordOrAdopt(req.job(), step, /*corrupt_is_error=*/true));
  // Once adopted, and before NOT_FOUND (which would tell another uid which steps the job has).
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (!rec) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  if (rec->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", v1::CheckpointState_Name(rec->summary().state()),
                     "; only COMMITTED checkpoints are prefetched"));
  }
  CKPTD_ASSIGN_OR_RETURN(std::vector<Storage*> tiers, ReadTiers(*rec));
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> m, GetManifest(req.job(), step, tiers));
  tiers = WithPeers(*rec, std::move(tiers));  // the blobs: from peers too, before the store
  uint64_t read = 0;
  CKPTD_RETURN_IF_ERROR(
      prefetches_.Do(key, [&] { return PrefetchInto(key, caller.uid, tiers, *m, &read); }).status);
  resp->set_bytes_read(read);  // 0 when another prefetch of it read it
  resp->set_ram_bytes(ram_tier_.HotBytes(key).value_or(0));
  return absl::OkStatus();
}

absl::Status CheckpointService::PrefetchInto(const Key& key, uint32_t caller_uid,
                                             const std::vector<Storage*>& tiers, const Manifest& m,
                                             uint64_t* read) {
  const auto& [job, step] = key;
  const std::string what = CkptName(job, step);
  // A run that finished just before this one was asked for made it hot already.
  if (ram_tier_.HotBytes(key).has_value()) return absl::OkStatus();
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const v1::BlobInfo& b : m.header.blobs()) {
    if (b.size_bytes() == 0) continue;
    sizes.push_back(b.size_bytes());
    total += RoundUp(b.size_bytes(), limits::kAlignmentBytes);
  }
  if (total > ram_tier_.budget_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " holds ", total, " bytes of blobs; the RAM tier's budget is ",
                     ram_tier_.budget_bytes(), " bytes (ram_tier_bytes_max, staging_bytes_max)"));
  }
  // The job owner's segment (the saving uid's, as for a save); the daemon owns the extents.
  CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, JobOwner(job));
  const uint32_t uid = owner.value_or(caller_uid);
  const std::string session = absl::StrCat("prefetch-", RandomHexId());
  CKPTD_ASSIGN_OR_RETURN(
      std::vector<ExtentInfo> extents,
      deps_.arena->Reserve(session, uid, sizes,
                           absl::Milliseconds(deps_.options->reserve_timeout_ms)));
  std::vector<uint64_t> ids;
  ids.reserve(extents.size());
  for (const ExtentInfo& e : extents) ids.push_back(e.id);
  if (absl::Status taken = deps_.arena->Take(session, ids); !taken.ok()) {
    (void)deps_.arena->Release(session, ids);
    return taken;
  }
  absl::Cleanup free_extents = [&] { deps_.arena->Free(ids); };  // unless the tier takes them
  HotParts parts;
  std::vector<const v1::BlobInfo*> blob_of;  // blob_of[i]: the blob parts.ranges[i] holds
  for (const v1::BlobInfo& b : m.header.blobs()) {
    if (b.size_bytes() == 0) continue;
    const ExtentInfo& e = extents[blob_of.size()];
    blob_of.push_back(&b);
    parts.extents.push_back(
        HotExtent{.id = e.id, .uid = e.uid, .offset = e.offset, .length = e.length});
    parts.ranges.push_back(HotRange{.blob_id = b.id(),
                                    .blob_offset = 0,
                                    .length = b.size_bytes(),
                                    .uid = e.uid,
                                    .arena_offset = e.offset});
  }
  const HotCopy copy(deps_.arena, parts.ranges, {});  // views only: frees nothing
  CKPTD_RETURN_IF_ERROR(ReadBlobsIntoArena(deps_.arena, tiers, CheckpointDir(job, step), what,
                                           parts.ranges, blob_of, read));
  CKPTD_RETURN_IF_ERROR(
      Annotate(VerifyHotCopy(copy, m, /*require_all=*/true), absl::StrCat("prefetch of ", what)));
  if (!ram_tier_.Insert(key, std::move(parts), /*write_row=*/true)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prefetch of ", what, ": it does not fit the RAM tier's budget"));
  }
  std::move(free_extents).Cancel();  // the tier's now
  deps_.arena->Uncharge(ids);        // reclaimable: no longer in the uid's share
  // A delete that ran meanwhile dropped nothing (the copy was not in the tier yet): drop it now.
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> after, ReadRecord(job, step));
  if (!after || after->summary().state() != v1::COMMITTED) {
    ram_tier_.Drop(key);
    return absl::NotFoundError(absl::StrCat(what, " was deleted while it was prefetched"));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
