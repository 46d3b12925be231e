// Deltas (docs/USER_GUIDE.md "Deltas"): which shards of a rank's flush did not change since the
// job's previous checkpoint on this node, so that the flush references them in that checkpoint's
// blob (shared by a hard link, Storage::LinkBlob) instead of writing them again.
//
// The plan is pure (no I/O): a staged shard is a candidate when the previous checkpoint holds a
// shard of the same item, kind, dtype, shape, region and length, saved by the same rank, whose
// block checksums equal the ones just computed. Candidates are grouped by the earlier blob file
// holding them; a group is kept only when its shards are at least `live_min_percent` of that
// file's bytes (else sharing the file would keep alive more than the checkpoint uses), and at
// most limits::kDeltaLinkedBlobsPerRankMax files per rank, those referencing the most bytes first.
// Checksums only pick candidates: the flush compares every candidate's bytes with the earlier
// blob's (through the new link) before it references them (LocalTier::WriteRankBlob).
//
// Resources: a linked blob file is one inode with a name in every checkpoint directory that
// references it; each name is owned by its checkpoint (removed with its directory by Delete and
// retention), and the bytes live until the last name goes. So nothing refers outside a
// checkpoint's directory, and deleting the checkpoint that wrote the file never leaves a later
// one dangling.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckptd/v1/index.pb.h"
#include "common/limits.h"
#include "format/manifest.h"

namespace ckptd {

// The previous committed checkpoint a rank's flush may reference.
struct DeltaBase {
  uint64_t step = 0;
  std::string dir;  // its directory on local storage (format/names.h CheckpointDir)
  std::shared_ptr<const Manifest> manifest;
  uint32_t live_min_percent = 50;
};

// One earlier blob file whose unchanged shards a rank's flush references.
struct DeltaGroup {
  uint32_t base_blob_id = 0;
  std::string base_name;         // its name in the base checkpoint's directory
  uint64_t written_at_step = 0;  // the checkpoint that wrote it (names the link)
  uint64_t size_bytes = 0;
  uint64_t bytes = 0;             // of the shards referenced
  std::vector<int> shards;        // indexes into RankRecord.shards
  std::vector<uint64_t> offsets;  // each one's offset in the file
};

// The groups `rec` (its stored block crcs filled for every shard) may reference in `base`.
std::vector<DeltaGroup> PlanDelta(const v1::RankRecord& rec, const DeltaBase& base);

// The id of the `slot`-th file a rank links (0 <= slot < kDeltaLinkedBlobsPerRankMax): above
// every rank's own blob id, unique per (rank, slot) within a checkpoint.
uint32_t LinkedBlobId(uint32_t rank, uint32_t slot);
// The rank whose blob `id` is (its own, or one it linked).
inline uint32_t RankOfBlobId(uint32_t id) { return id % limits::kWorldSizeMax; }

}  // namespace ckptd
