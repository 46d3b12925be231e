#include "service/node_parts.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"

namespace ckptd {

std::string ClusterDirOf(const std::string& dir) { return absl::StrCat(dir, "/cluster"); }

std::string NodePartPath(const std::string& dir, const std::string& node) {
  return absl::StrCat(dir, "/cluster/", node, ".part");
}

std::string DecisionPath(const std::string& dir) { return absl::StrCat(dir, "/cluster/decision"); }

namespace {

// Whether `node`'s part is of (job, step, world_size) in this format and checksums blocks as the
// parts before it did (recorded in `merged` by the first).
absl::Status CheckPart(const std::string& node, const v1::NodePart& part, const std::string& job,
                       uint64_t step, uint32_t world_size, PendingCheckpoint* merged) {
  if (part.format_version() != kNodePartFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("the part of node ", node, " has format version ", part.format_version(),
                     "; this ckptd "
                     "writes ",
                     kNodePartFormatVersion, " (run one ckptd version on every node of a job)"));
  }
  if (part.job() != job || part.step() != step || part.world_size() != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the part of node ", node, " is of ", part.job(), "/", part.step(), " with world_size ",
        part.world_size(), ", not of ", job, "/", step, " with world_size ", world_size));
  }
  if (merged->checksum_block_bytes == 0) {
    merged->checksum_block_bytes = part.checksum_block_bytes();
  }
  if (part.checksum_block_bytes() != merged->checksum_block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node, " checksums blocks of ", part.checksum_block_bytes(),
                     " bytes, another node blocks of ", merged->checksum_block_bytes,
                     " (give every daemon of a job the same checksum_block_bytes)"));
  }
  return absl::OkStatus();
}

// Adds the ranks of `node`'s part to `merged` (each persisted, in the world, in one part only:
// `node_of` says which).
absl::Status AddPartRanks(const std::string& node, const v1::NodePart& part, uint32_t world_size,
                          std::map<uint32_t, std::string>* node_of, PendingCheckpoint* merged) {
  for (const v1::RankRecord& rec : part.ranks()) {
    if (rec.rank() >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat("node ", node, "'s part has rank ", rec.rank(),
                                                     " of world_size ", world_size));
    }
    auto [it, inserted] = node_of->emplace(rec.rank(), node);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rec.rank(), " is in the parts of ",
                                                     it->second, " and ", node,
                                                     " (saved through two daemons)"));
    }
    if (!rec.persisted()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", node, "'s part has rank ", rec.rank(), " not persisted"));
    }
    PendingRank pr;
    pr.rec = rec;
    pr.Restore(/*persisted=*/true);
    merged->ranks.emplace(rec.rank(), std::move(pr));
  }
  return absl::OkStatus();
}

// One stored copy per region: the lowest rank's among those that wrote bytes for it; the others
// (another node's first copy) become replicas — BuildManifest checks they match. A replica whose
// stored copy is in no part is an error.
absl::Status ChooseStoredCopies(const std::map<uint32_t, std::string>& node_of,
                                PendingCheckpoint* merged) {
  for (auto& [r, pr] : merged->ranks) {
    for (int i = 0; i < pr.rec.shards_size(); ++i) {
      v1::StagedShard* sh = pr.rec.mutable_shards(i);
      if (sh->replica()) continue;
      const bool first =
          merged->stored_copy.emplace(StoredCopyKey(sh->spec(), r), std::make_pair(r, size_t(i)))
              .second;
      sh->set_replica(!first);
    }
  }
  for (auto& [r, pr] : merged->ranks) {
    for (const v1::StagedShard& sh : pr.rec.shards()) {
      if (sh.replica() && !merged->stored_copy.contains(StoredCopyKey(sh.spec(), r))) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " (node ", node_of.at(r), ") has a replica of item \"",
                         sh.spec().item(), "\" whose stored copy is in no part"));
      }
    }
    merged->NoteItems(r, pr.rec);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PendingCheckpoint>> MergeNodeParts(
    const std::string& job, uint64_t step, uint32_t world_size, bool partial,
    const std::map<std::string, v1::NodePart>& parts) {
  auto merged = std::make_unique<PendingCheckpoint>(job, step);
  merged->world_size = world_size;
  merged->partial = partial;
  if (parts.empty()) return absl::InvalidArgumentError("no node part");
  std::map<uint32_t, std::string> node_of;  // rank → node
  uint64_t created = UINT64_MAX;
  for (const auto& [node, part] : parts) {
    CKPTD_RETURN_IF_ERROR(CheckPart(node, part, job, step, world_size, merged.get()));
    created = std::min(created, part.created_unix_ms());
    CKPTD_RETURN_IF_ERROR(AddPartRanks(node, part, world_size, &node_of, merged.get()));
  }
  merged->created_unix_ms = created;
  if (!partial && merged->ranks.size() != world_size) {
    std::vector<uint32_t> missing;
    for (uint32_t r = 0; r < world_size && missing.size() < 32; ++r) {
      if (!merged->ranks.contains(r)) missing.push_back(r);
    }
    return absl::InvalidArgumentError(absl::StrCat(world_size - merged->ranks.size(),
                                                   " ranks are in no node's part, the first ",
                                                   missing.front()));
  }
  CKPTD_RETURN_IF_ERROR(ChooseStoredCopies(node_of, merged.get()));
  return merged;
}

}  // namespace ckptd
