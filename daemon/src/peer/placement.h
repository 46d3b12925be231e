// Placement of the peer tier (docs/PEERS.md "Replication"): which nodes receive the copies of a
// node's part. Deterministic and computed from what every daemon can read — the node ids
// registered on the shared tier — so every node, and a replacement, computes the same order:
// the registered ids sorted form a ring; a node's candidates are the ids after its own, around
// the ring, itself excluded. The replicator tries them in that order and keeps the first
// `peer_replicas` that take every blob (a node that is down or full is skipped for the next);
// the node part records the ones that did, so a load never has to guess.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ckptd::peer {

// The candidates of `self` among `registered` (any order, duplicates ignored): every other id,
// starting with the first after `self` in sorted order and wrapping around. `self` need not be
// registered (a node that has not registered yet places as if it were).
std::vector<std::string> PlacementOrder(std::vector<std::string> registered,
                                        const std::string& self);

// Failure domains (peer_failure_domain: a rack, a switch, a power feed): `order` (PlacementOrder's
// for a node of domain `self_domain`) reordered so that copies land in domains that fail apart,
// spread over those domains' nodes. Let j be how many nodes of the node's own domain come just
// before it on the ring (the tail of `order`, walked back). Walking the first `lookups_max` nodes
// of `order`, the nodes of each other domain are grouped in the order the domains first appear;
// from each group in turn the node at index j (modulo the group's size) is taken. So with racks
// named in ring order (r0015-n000, r0015-n001, ...) node n of a rack sends its first copy to node
// n of the next rack, its second to node n of the one after: every node holds about
// `peer_replicas` copies and a rack's failure loses no part. The nodes not taken follow in ring
// order (used once the other domains are exhausted, down or full). `domain_of` names a node's
// domain (nullopt: unknown, e.g. a registration that could not be read: the node is not taken
// early); it is called for at most 2 x `lookups_max` nodes. Deterministic for a given registry.
std::vector<std::string> DomainOrder(
    const std::vector<std::string>& order, const std::string& self_domain,
    const std::function<std::optional<std::string>(const std::string&)>& domain_of,
    size_t lookups_max);

}  // namespace ckptd::peer
