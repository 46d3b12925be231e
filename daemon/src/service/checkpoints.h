// Checkpoints by name, shared by the service's parts (the lifecycle, the catalog, recovery, the
// resharder): how a checkpoint is named in messages, what a valid (job, step) is, where a
// COMMITTED one is durable, and reading its manifest and walking checkpoint directories on a
// storage tier. Plain functions: no state, any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/storage.h"
#include "ckptd/v1/ckptd.pb.h"
#include "format/manifest.h"

namespace ckptd {

// Where a checkpoint recorded COMMITTED is durable: its policy, whether its local copy is there,
// and whether its remote copy is (adopted from the store) or is to be uploaded (PENDING row).
struct CommittedTiers {
  v1::TierPolicy policy = v1::TIER_LOCAL;
  bool local = true;
  bool remote_durable = false;
  // TIER_LOCAL_AND_PEER: this node's own blobs of a checkpoint spanning nodes stay on local
  // storage (local is false: the others' blobs are on their nodes and peers).
  bool local_part = false;
  // With local_part: this node's own blobs are to be copied to the store too (remote_every), an
  // upload row PENDING with the COMMITTED row.
  bool upload_part = false;
};

// The tiers of a checkpoint indexed from its manifest on the store (adopted, or restored by
// recovery): on the remote tier alone, DURABLE — or, committed at the peer tier
// (blobs_on_nodes), on its nodes and peers, with no local copy here and no upload.
CommittedTiers StoreTiersOf(const Manifest& m);
// The policy puts the checkpoint's blobs on the remote tier (local+remote, or remote only).
bool HasRemoteTier(v1::TierPolicy policy);
// The policy needs the shared store: for the blobs (HasRemoteTier), or as the channel of control
// of a checkpoint committed at the peer tier (TIER_LOCAL_AND_PEER: parts, decision, manifest).
bool UsesStore(v1::TierPolicy policy);
// "checkpoint job/7", for messages.
std::string CkptName(const std::string& job, uint64_t step);
// "[0, 3, 5]" (the first 32, then the count), for messages.
std::string RanksList(const std::vector<uint32_t>& ranks);
// The job name is valid and the step within limits::kStepMax; INVALID_ARGUMENT otherwise.
absl::Status ValidateJobStep(const std::string& job, uint64_t step);
// Reads and verifies the manifest of (job, step) on `storage`: decodes it (framing, checksums)
// and checks that it names that checkpoint. DATA_LOSS when it does not verify; the storage's
// errors (NOT_FOUND: no manifest) when it cannot be read.
absl::StatusOr<Manifest> ReadManifest(Storage& storage, const std::string& job, uint64_t step);
// Calls fn(job, step) for every checkpoint directory of `storage` under `scope` (a job, or "" for
// every job); an entry that is not a job or checkpoint directory goes to `problem`, named.
// Errors: listing the root (scope "") or the job (scope a job); fn's first error stops the walk.
absl::Status ForEachCheckpointDir(
    Storage& storage, const std::string& scope, const std::function<void(std::string)>& problem,
    const std::function<absl::Status(const std::string&, uint64_t)>& fn);

}  // namespace ckptd
