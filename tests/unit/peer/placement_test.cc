// Placement of the peer tier (peer/placement.h, docs/PEERS.md "Replication"): the registered node
// ids, sorted, form a ring; a node's candidates start after it and wrap around, itself excluded,
// whatever order the registry listed them in — so every node, and a replacement, computes the
// same order.
#include "peer/placement.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>

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

}  // namespace ckptd::peer
