// Names of jobs, items and the files of a checkpoint directory. A checkpoint lives at
// <root>/<job>/step-<20-digit step>/ with one blob per saving rank and the manifest:
//   llama3-8b/step-00000000000000001000/r00003.blob
//   llama3-8b/step-00000000000000001000/manifest.ckm
// Job names become path components, so they are restricted to a safe character set; item names
// never touch the file system and may be any printable UTF-8. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd {

inline constexpr char kManifestFileName[] = "manifest.ckm";
// A job's owner on the remote store (<job>/owner.ckj: a serialized v1::Owner, written once by the
// first write of the job's data there; tier/remote_tier.h). Not a checkpoint directory.
inline constexpr char kJobOwnerFileName[] = "owner.ckj";
// The peer registry on the remote store (<store>/.ckptd-peers/<node_id>: a v1::PeerRegistration;
// peer/replicator.h). Not a job directory.
inline constexpr char kPeerRegistryDir[] = ".ckptd-peers";
inline constexpr char kStepDirPrefix[] = "step-";

// OK iff `job` is 1..limits::kJobNameBytesMax bytes of [A-Za-z0-9._-] and does not start with
// '.' (so "", ".", ".." and hidden names are out). INVALID_ARGUMENT naming the job and the rule.
absl::Status ValidateJobName(std::string_view job);

// OK iff `item` is 1..limits::kItemNameBytesMax bytes with no control characters (< 0x20, 0x7f).
// INVALID_ARGUMENT naming the item (escaped) and the rule.
absl::Status ValidateItemName(std::string_view item);

// "step-%020d": zero-padded so directory listings sort by step.
std::string StepDirName(uint64_t step);

// "<job>/step-%020d", relative to the storage root.
std::string CheckpointDir(std::string_view job, uint64_t step);

// Inverse of StepDirName: exactly "step-" + 20 digits, value <= limits::kStepMax.
// INVALID_ARGUMENT otherwise.
absl::StatusOr<uint64_t> ParseStepDirName(std::string_view name);

// "r%05d.blob": the blob written for one saving rank.
std::string BlobName(uint32_t rank);
// "<dir>/cluster/<node>.uploaded": on the store, beside the node parts of a checkpoint committed
// at the peer tier, written once `node` has copied its own blobs there (remote_every).
std::string NodeUploadedPath(const std::string& dir, const std::string& node);
// "<dir>/cluster/<node>.copies": on the store, the peers holding `node`'s part now
// (v1::NodeCopies), once that node copied its part again after a peer lost it.
std::string NodeCopiesPath(const std::string& dir, const std::string& node);
inline constexpr char kNodeCopiesSuffix[] = ".copies";
// "r%05d-s%020d.blob": the blob written for `rank` by the checkpoint of `step`, linked into a
// later checkpoint's directory that references shards in it (deltas).
std::string LinkedBlobName(uint32_t rank, uint64_t step);
// `name` is a name BlobName or LinkedBlobName gives: "r" + 5 to 10 digits, optionally "-s" +
// 20 digits, then ".blob".
bool IsBlobFileName(std::string_view name);

}  // namespace ckptd
