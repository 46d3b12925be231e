// Node parts: a checkpoint that spans nodes, as its daemons write it to the shared tier
// (proto/ckptd/v1/cluster.proto has the files; service/cluster.cc the protocol). Pure functions:
// where the files are, and the merge of the parts the coordinator read into one checkpoint.
//
// Errors: INVALID_ARGUMENT naming the node(s) and rank(s) of parts that cannot be merged.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckptd/v1/cluster.pb.h"
#include "service/pending_checkpoint.h"

namespace ckptd {

inline constexpr uint32_t kNodePartFormatVersion = 1;

// <dir>/cluster/<node>.part and <dir>/cluster/decision.
std::string ClusterDirOf(const std::string& dir);
std::string NodePartPath(const std::string& dir, const std::string& node);
std::string DecisionPath(const std::string& dir);

// The checkpoint the parts make together, for BuildManifest: every rank of every part
// (persisted), one stored copy per region — a region stored by ranks on several nodes (each node
// stores its own first copy) keeps the lowest rank's, the others become replicas, which the
// manifest build checks byte for byte (their checksums). Checks that the parts agree (job, step,
// world size, checksum block size, format), that no rank is in two parts and that, unless
// `partial`, they cover ranks 0..world_size-1.
absl::StatusOr<std::unique_ptr<PendingCheckpoint>> MergeNodeParts(
    const std::string& job, uint64_t step, uint32_t world_size, bool partial,
    const std::map<std::string, v1::NodePart>& parts);

}  // namespace ckptd
