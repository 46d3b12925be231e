// PendingCheckpoint: one checkpoint being saved (docs/DESIGN.md "Save", "Commit"), from its first
// staged rank until it is COMMITTED or its abort is recorded — the lifecycle as one object with
// an explicit state and checked transitions (was: six booleans mutated from four files).
//
// Lifecycle (Transition() CHECK-fails on any other step):
//
//   kStaging ──all ranks staged / Commit(partial)──▶ kPersisting ──every rank persisted──▶
//   kCommitting ──manifest + COMMITTED row durable──▶ kCommitted (the object is dropped)
//   kStaging | kPersisting | kCommitting ──abort / failure──▶ kAborting ──idle──▶ kAborted
//   kCommitting ──the pool refused the commit task (shutting down)──▶ kPersisting
// Spanning nodes (multi_node(): "all ranks" are this daemon's local_world_size;
// service/cluster.cc):
//   kPersisting ──every local rank persisted──▶ kAwaitingCluster (the cluster thread publishes
//   this node's part, then waits for the other parts or the coordinator's decision)
//   ──decided to commit──▶ kCommitting ──COMMITTED row durable──▶ kCommitted
//   kCommitting ──its COMMITTED row failed (the store's decision stands: retried)──▶
//   kAwaitingCluster;  kAwaitingCluster ──abort decided──▶ kAborting
//
// A rank: kJournaling (accepted, its journal row being written) ──durable──▶ kJournaled
//   ──flush posted──▶ kFlushing ──blob synced and "persisted" journaled──▶ kPersisted;
//   kFlushing ──flush refused or ended by an abort──▶ kJournaled. Recovery rebuilds ranks as
//   kJournaled or kPersisted (what the journal says).
//
// Ownership: the lifecycle table (CheckpointService's `mu_`, "the lifecycle lock") owns every
// PendingCheckpoint; every field here is read and written only with that lock held. What runs
// with the lock released (a journal write, a flush, the commit) pins the object through the
// in-flight counters: no abort finishes and no commit starts while one is non-zero.
// Threads: any thread holding the lifecycle lock. Nothing here blocks or does I/O.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/v1/ckptd.pb.h"
#include "ckptd/v1/cluster.pb.h"
#include "ckptd/v1/index.pb.h"
#include "dataplane/region_registry.h"
#include "format/manifest.h"

namespace ckptd {

// Identifies the stored copy of a shard within a checkpoint: item + region (tensors), item +
// saving rank (per-rank objects), item (replicated objects). Equal keys are replicas.
std::string StoredCopyKey(const v1::ShardSpec& spec, uint32_t rank);

enum class CheckpointPhase : uint8_t {
  kStaging,          // takes ranks (STAGING)
  kPersisting,       // every rank staged, or committed partial: takes no ranks (PERSISTING)
  kAwaitingCluster,  // spanning nodes: the part is published or being published; waits for
                     // the other nodes' parts or the coordinator's decision (PERSISTING)
  kCommitting,       // the commit task is posted or running (PERSISTING)
  kAborting,   // aborted; waits for in-flight work before its ABORTED row is recorded (ABORTED)
  kCommitted,  // final: the COMMITTED row is durable
  kAborted,    // final: handed to the abort recorder
};
enum class RankPhase : uint8_t { kJournaling, kJournaled, kFlushing, kPersisted };

const char* CheckpointPhaseName(CheckpointPhase phase);
const char* RankPhaseName(RankPhase phase);

struct ItemMeta {
  v1::ItemKind kind = v1::ITEM_KIND_UNSPECIFIED;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<uint64_t> shape;
  v1::ObjectScope scope = v1::OBJECT_SCOPE_UNSPECIFIED;
  uint32_t first_rank = 0;
};

struct PendingRank {
  v1::RankRecord rec;
  std::vector<RegionLease> leases;   // region-backed shards, held until persisted
  std::vector<uint64_t> extent_ids;  // freed once persisted
  // When it was staged (its journal row durable), for the flush's queued_us; not journaled, so
  // unknown (InfinitePast) for a rank rebuilt by recovery. Its timings are in rec.timings().
  absl::Time staged_at = absl::InfinitePast();

  RankPhase phase() const { return phase_; }
  // Only a durable journal row is flushed: a flush journals "persisted" over the same row, which
  // the rank's own journal write, landing later, would overwrite.
  bool journaled() const { return phase_ != RankPhase::kJournaling; }
  bool persisted() const { return phase_ == RankPhase::kPersisted; }
  bool flushing() const { return phase_ == RankPhase::kFlushing; }
  // CHECK-fails unless the rank is in `from` and `from → to` is a step of the rank lifecycle.
  void Transition(RankPhase from, RankPhase to);
  // Recovery: a rank rebuilt from its journal row (kJournaled or kPersisted).
  void Restore(bool persisted) {
    phase_ = persisted ? RankPhase::kPersisted : RankPhase::kJournaled;
  }

 private:
  RankPhase phase_ = RankPhase::kJournaling;
};

// A checkpoint spanning nodes, this daemon's side (service/cluster.cc). Guarded like every field
// of PendingCheckpoint; the cluster thread fills it from what it read on the shared tier.
struct ClusterState {
  bool part_durable = false;  // this node's blobs and part are on the shared tier
  // Read from the shared tier (the coordinator reads every part): node → its part.
  std::map<std::string, v1::NodePart> parts;
  std::string waiting_for;      // for status, in words
  std::string abort_requested;  // coordinator: an Abort's reason, for the cluster thread to decide
  bool abort_decided = false;   // the abort decision is on the shared tier
  // The peer tier (tier/peer_tier.h): this node's part was copied to these nodes (before its
  // part was published; recorded there). Not journaled: a restart replicates again (the peers
  // deduplicate copies they still hold).
  bool replicated = false;
  std::vector<std::string> replica_nodes;
};

class PendingCheckpoint {
 public:
  PendingCheckpoint(std::string job, uint64_t step) : job(std::move(job)), step(step) {}

  const std::string job;
  const uint64_t step;
  uint32_t owner_uid = 0;     // the uid of its first Save; only it may add ranks
  bool job_recorded = false;  // the job's JobRecord (owner) is in the index
  uint32_t world_size = 0;
  // The ranks that save through this daemon: world_size, or fewer for a checkpoint spanning nodes.
  uint32_t local_world_size = 0;
  ClusterState cluster;
  uint64_t created_unix_ms = 0;
  uint64_t first_staged_unix_ms = 0;  // when its first rank staged (the flush gate's start)
  // Fixed when the checkpoint is created (options.checksum_block_bytes) and journaled with every
  // rank, so a restart with another option value does not mix block sizes.
  uint32_t checksum_block_bytes = 0;
  std::map<uint32_t, PendingRank> ranks;
  std::map<std::string, ItemMeta> items;
  // item '\0' RegionKey → (rank, shard index) of the copy that is stored.
  absl::flat_hash_map<std::string, std::pair<uint32_t, size_t>> stored_copy;
  bool partial = false;  // committed as an intentionally partial set (Commit(partial))
  // The tiers it is made durable on (resolved: never TIER_POLICY_DEFAULT), fixed by the Save that
  // opened it and journaled in its summary.
  v1::TierPolicy tier_policy = v1::TIER_LOCAL;
  std::string error;  // why it was aborted
  int flushes_in_flight = 0;
  // Journal writes in flight with the lifecycle lock released; their rows land in the order
  // they were queued at the committer (one FIFO), so no write waits for another here.
  int journals_in_flight = 0;

  CheckpointPhase phase() const { return phase_; }
  // The state clients see: STAGING, PERSISTING (persisting and committing) or ABORTED.
  v1::CheckpointState api_state() const;
  bool staging() const { return phase_ == CheckpointPhase::kStaging; }
  bool aborting() const { return phase_ == CheckpointPhase::kAborting; }
  bool committing() const { return phase_ == CheckpointPhase::kCommitting; }
  // Spans nodes: saved through several daemons, committed through the shared tier.
  bool multi_node() const { return local_world_size != 0 && local_world_size < world_size; }
  // The ranks this daemon waits for before it commits (or, spanning nodes, publishes its part).
  uint32_t expected_ranks() const { return multi_node() ? local_world_size : world_size; }
  // Spanning nodes: this daemon holds rank 0, so it decides commit or abort.
  bool coordinator() const { return ranks.contains(0); }
  // No flush, journal write or commit is in flight (an abort may finish).
  bool idle() const { return flushes_in_flight == 0 && journals_in_flight == 0 && !committing(); }
  // Every rank expected is staged (all of world_size, or those there when committed partial)
  // and persisted: the commit may start.
  bool ready_to_commit() const;
  // CHECK-fails unless the checkpoint is in `from` and `from → to` is a lifecycle step (above).
  void Transition(CheckpointPhase from, CheckpointPhase to);
  // Adds staged rank `r` (kJournaling; the caller checked it is new and its items agree): the
  // first rank to stage a region stores it, later identical regions are replicas (they only
  // verify); its new items are recorded; the checkpoint turns kPersisting once every rank is
  // staged. Returns the rank's bytes (replicas included).
  uint64_t AddRank(uint32_t r, PendingRank rank);
  // Records the items of `rec`'s shards that no rank recorded before (kind, dtype, global shape,
  // scope; `r` as their first rank). AddRank does it for a new rank; recovery, rebuilding a
  // journaled checkpoint rank by rank, does it with the replica flags the journal recorded.
  void NoteItems(uint32_t r, const v1::RankRecord& rec);

 private:
  CheckpointPhase phase_ = CheckpointPhase::kStaging;
};

// The manifest of `p` (every rank persisted): its items with their stored shards, replicas
// attached to the stored copy — INVALID_ARGUMENT when a tensor replica's bytes (checksums) differ
// from it. Pure (service/commit.cc); the caller validates it (EncodeManifest).
absl::StatusOr<Manifest> BuildManifest(const PendingCheckpoint& p, uint64_t committed_unix_ms);

}  // namespace ckptd
