// PeerTier: the peer tier as the service sees it (docs/PEERS.md "Replication"), a narrow
// interface in the manner of RecoveryHost: the service names only what it needs, and the
// implementation (peer/replicator.h, over the peer channel's mutual TLS) lives in the peer
// module, which the service does not link (the service links no gRPC). It lives in tier/, below
// both the service and the peer module (tests/lint/check_layers.py). Null in ServiceDeps: the
// daemon replicates nothing and reads no peer.
//
// What it does for the service:
//  - Replicate: copies this node's part of a checkpoint spanning nodes (its blobs, read from
//    local storage) to other nodes' peer stores, in the documented placement order, before the
//    node part is published; the part records the nodes that acknowledged every blob.
//  - reader(): a read-only Storage over the copies peers hold, tried by loads after this node's
//    own tiers and before the remote store: a blob path of a checkpoint whose manifest (on the
//    shared tier) names the blob's origin node and peers is read from the first peer that
//    answers (the loader verifies every block against the manifest, as for any tier, and falls
//    back to the next tier for a blob no peer serves whole and verified).
//  - Drop: asks the peers this node placed copies of (job, step) on to drop them (its Delete).
//  - Watch / CopiesOf: repair (docs/PEERS.md "Repair"). The service hands over this node's part
//    of each job's newest checkpoint committed at the peer tier; the peer tier checks, every
//    peer_repair_interval_ms, that its holders still hold it whole, copies it to the next nodes
//    in placement order when one lost it (died, restarted, evicted it), records the new holders
//    on the store (<dir>/cluster/<node>.copies) for every reader, and says how the part is
//    copied now (the status shows it, "degraded" until the copies are back).
//
// Threads: every method from any thread, with no service lock held (they do network I/O).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckptd/storage.h"

namespace ckptd {

class PeerTier {
 public:
  virtual ~PeerTier() = default;

  // Copies the blobs (name, size) of this node's part of (job, step), under the checkpoint
  // directory `dir` of local storage, to up to `replicas` other nodes in placement order (a node
  // that cannot take every blob is skipped for the next). Returns the nodes that acknowledged
  // every blob (fewer than asked: replication is degraded; the status says so). Errors only for
  // what no other node would change (a local blob that cannot be read).
  virtual absl::StatusOr<std::vector<std::string>> Replicate(
      const std::string& job, uint64_t step, const std::string& dir,
      const std::vector<std::pair<std::string, uint64_t>>& blobs, uint32_t replicas) = 0;

  // The copies peers hold, as a read-only Storage (Describe: "peers"); owned by the PeerTier.
  virtual Storage* reader() = 0;

  // Drops the copies of (job, step) this node placed on `nodes` and wherever repair placed them
  // since (best effort: a peer that is down evicts them in time); the part is no longer watched.
  virtual void Drop(const std::string& job, uint64_t step,
                    const std::vector<std::string>& nodes) = 0;

  // This node's part of a committed checkpoint: its blobs (name, size) under `dir` on local
  // storage, to be kept on `replicas` peers, held now (as far as the caller knows) by `holders`.
  struct Part {
    std::string job;
    uint64_t step = 0;
    std::string dir;
    std::vector<std::pair<std::string, uint64_t>> blobs;
    uint32_t replicas = 0;
    std::vector<std::string> holders;
  };
  // Keeps `part` copied from now on. One part per job: the newest step's (a part of an older
  // step than the one watched is ignored; a newer one replaces it).
  virtual void Watch(Part part) = 0;
  // How this node's part of (job, step) is copied now, while it is watched: the nodes holding
  // it whole at the last check, and why it is short of copies ("" when it is not).
  struct Copies {
    std::vector<std::string> holders;
    std::string degraded;
  };
  virtual std::optional<Copies> CopiesOf(const std::string& job, uint64_t step) = 0;
};

}  // namespace ckptd
