// Placement of the peer tier (docs/PEERS.md "Replication"): which nodes receive the copies of a
// node's part. Deterministic and computed from what every daemon can read — the node ids
// registered on the shared tier — so every node, and a replacement, computes the same order:
// the registered ids sorted form a ring; a node's candidates are the ids after its own, around
// the ring, itself excluded. The replicator tries them in that order and keeps the first
// `peer_replicas` that take every blob (a node that is down or full is skipped for the next);
// the node part records the ones that did, so a load never has to guess.
#pragma once

#include <string>
#include <vector>

namespace ckptd::peer {

// The candidates of `self` among `registered` (any order, duplicates ignored): every other id,
// starting with the first after `self` in sorted order and wrapping around. `self` need not be
// registered (a node that has not registered yet places as if it were).
std::vector<std::string> PlacementOrder(std::vector<std::string> registered,
                                        const std::string& self);

}  // namespace ckptd::peer
