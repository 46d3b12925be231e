// Placement of the peer tier (peer/placement.h, docs/PEERS.md "Replication"): the registered node
// ids, sorted, form a ring; a node's candidates start after it and wrap around, itself excluded,
// whatever order the registry listed them in — so every node, and a replacement, computes the
// same order.
#include "peer/placement.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "common/limits.h"

namespace ckptd::peer {

TEST_CASE("placement: the ring after the node, wrapping around, itself excluded", "[unit][peer]") {
  const std::vector<std::string> nodes = {"node-c", "node-a", "node-d", "node-b"};
  CHECK(PlacementOrder(nodes, "node-a") == std::vector<std::string>{"node-b", "node-c", "node-d"});
  CHECK(PlacementOrder(nodes, "node-c") == std::vector<std::string>{"node-d", "node-a", "node-b"});
  CHECK(PlacementOrder(nodes, "node-d") == std::vector<std::string>{"node-a", "node-b", "node-c"});
  // A node not registered (yet) places as if it were; duplicates count once.
  CHECK(PlacementOrder({"b", "d", "d"}, "c") == std::vector<std::string>{"d", "b"});
  CHECK(PlacementOrder({"a"}, "a").empty());
  CHECK(PlacementOrder({}, "a").empty());
}

TEST_CASE("placement: the order does not depend on how the registry listed the nodes",
          "[unit][peer]") {
  std::vector<std::string> nodes;
  for (int i = 0; i < 100; ++i) nodes.push_back("n" + std::to_string(i));
  const std::vector<std::string> want = PlacementOrder(nodes, "n42");
  std::mt19937 rng(7);
  for (int i = 0; i < 10; ++i) {
    std::shuffle(nodes.begin(), nodes.end(), rng);
    CHECK(PlacementOrder(nodes, "n42") == want);
  }
  // Each node is some node's first choice exactly once: a part of every node on every other.
  std::vector<std::string> firsts;
  for (const std::string& n : nodes) firsts.push_back(PlacementOrder(nodes, n).front());
  std::sort(firsts.begin(), firsts.end());
  std::vector<std::string> sorted = nodes;
  std::sort(sorted.begin(), sorted.end());
  CHECK(firsts == sorted);
}

TEST_CASE(
    "placement: failure domains put the first copies in other domains, the rest in ring order",
    "[unit][peer]") {
  // Racks as host names usually go: the ring's neighbours share a rack.
  const std::map<std::string, std::string> rack = {{"r1-a", "r1"}, {"r1-b", "r1"}, {"r1-c", "r1"},
                                                   {"r2-a", "r2"}, {"r2-b", "r2"}, {"r3-a", "r3"},
                                                   {"r3-b", "r3"}};
  std::vector<std::string> ids;
  for (const auto& [id, r] : rack) ids.push_back(id);
  int lookups = 0;
  auto domain_of = [&](const std::string& n) -> std::optional<std::string> {
    ++lookups;
    return rack.at(n);
  };
  const std::vector<std::string> ring = PlacementOrder(ids, "r1-a");
  CHECK(ring == std::vector<std::string>{"r1-b", "r1-c", "r2-a", "r2-b", "r3-a", "r3-b"});
  CHECK(DomainOrder(ring, "r1", domain_of, 100) ==
        std::vector<std::string>{"r2-a", "r3-a", "r1-b", "r1-c", "r2-b", "r3-b"});
  // The second node of a rack sends its copies to the second nodes of the next racks.
  CHECK(DomainOrder(PlacementOrder(ids, "r1-b"), "r1", domain_of, 100) ==
        std::vector<std::string>{"r2-b", "r3-b", "r1-c", "r2-a", "r3-a", "r1-a"});
  CHECK(DomainOrder(PlacementOrder(ids, "r2-b"), "r2", domain_of, 100) ==
        std::vector<std::string>{"r3-b", "r1-b", "r3-a", "r1-a", "r1-c", "r2-a"});
  // A node whose domain is unknown (its registration unreadable) is not taken early.
  auto unknown_r2a = [&](const std::string& n) -> std::optional<std::string> {
    if (n == "r2-a") return std::nullopt;
    return rack.at(n);
  };
  CHECK(DomainOrder(ring, "r1", unknown_r2a, 100) ==
        std::vector<std::string>{"r2-b", "r3-a", "r1-b", "r1-c", "r2-a", "r3-b"});
  // Lookups stop at the limit (back and forward): the rest keep their ring order.
  lookups = 0;
  CHECK(DomainOrder(ring, "r1", domain_of, 2) == ring);  // r1-b, r1-c: its own rack
  CHECK(lookups == 3);                                   // r3-b back; r1-b, r1-c forward
  CHECK(DomainOrder({}, "r1", domain_of, 100).empty());
}

TEST_CASE(
    "placement: with failure domains every node holds its share, and a rack's loss loses "
    "no part",
    "[unit][peer]") {
  // 8 racks of 6, named rack-major; every node places 2 copies.
  std::vector<std::string> ids;
  for (int r = 0; r < 8; ++r) {
    for (int n = 0; n < 6; ++n) ids.push_back("r" + std::to_string(r) + "-n" + std::to_string(n));
  }
  auto rack = [](const std::string& id) { return id.substr(0, id.find('-')); };
  auto domain_of = [&](const std::string& n) -> std::optional<std::string> { return rack(n); };
  std::map<std::string, int> held;
  std::map<std::string, std::vector<std::string>> copies;
  for (const std::string& self : ids) {
    std::vector<std::string> order = DomainOrder(PlacementOrder(ids, self), rack(self), domain_of,
                                                 limits::kPeerDomainLookupsMax);
    copies[self] = {order[0], order[1]};
    for (int k = 0; k < 2; ++k) ++held[order[k]];
  }
  for (const std::string& id : ids) {
    INFO(id);
    CHECK(held[id] == 2);
    CHECK(rack(copies[id][0]) != rack(id));
    CHECK(rack(copies[id][1]) != rack(id));
    CHECK(rack(copies[id][0]) != rack(copies[id][1]));
  }
}

}  // namespace ckptd::peer
