// The peer tier's placement simulated at 1,000 and 10,000 nodes (issue 35: "placement and commit
// cost simulated"; the commit's merge is ckptd_bench_cluster_merge). For each node count, with
// the product's own PlacementOrder (peer/placement.h: the registered ids sorted form a ring, a
// node's copies go to the nodes after it, a node down is skipped for the next):
//   * cost: microseconds of one PlacementOrder call (what a node computes per replication or
//     repair pass), median of --reps;
//   * balance: with --down percent of the nodes down (chosen at random, --seed), the copies each
//     live node holds when every live node places --replicas copies of its part: the mean and
//     the maximum (a down node's successors take its load: the hot spot);
//   * correlated loss: racks of --per_rack nodes, node ids named rack-major as host names usually
//     are (r0000-n000, r0000-n001, ...) and rack-minor (n000-r0000, n000-r0001, ...); one whole
//     rack fails: how many of that rack's parts lose every copy (the part's own node and all its
//     replicas in the failed rack); and rack-major ids with each node's rack declared as its
//     peer_failure_domain (the replicator's Candidates: DomainOrder over the ring);
//   * the registry's store requests per refresh, per node and over the cluster: each node lists
//     the registry (one LIST page per 1,000 ids) and reads one registration per node it places
//     on or reads from (replicas + holders), every kRegistryRefresh (5 s).
// One JSON object per line per (nodes, replicas, down).
//
// Usage: ckptd_bench_placement_sim [--nodes 1000,10000] [--replicas 1,2] [--down 0,1,5]
//        [--per_rack 32] [--reps 5] [--seed 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"
#include "peer/placement.h"

namespace {

using ckptd::peer::PlacementOrder;

std::vector<uint64_t> ParseList(const char* s) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      std::fprintf(stderr, "not a number: %s\n", std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

// Rack-major ids, as host names are usually given (r<rack>-n<index in rack>: ring neighbours
// share a rack), or rack-minor ones (n<index in rack>-r<rack>: ring neighbours are in different
// racks). Either way the rack is the 5 characters "r<4 digits>" found by RackOf.
std::vector<std::string> NodeIds(uint64_t nodes, uint64_t per_rack, bool rack_major) {
  std::vector<std::string> ids;
  ids.reserve(nodes);
  for (uint64_t i = 0; i < nodes; ++i) {
    ids.push_back(rack_major ? absl::StrFormat("r%04d-n%03d", i / per_rack, i % per_rack)
                             : absl::StrFormat("n%03d-r%04d", i % per_rack, i / per_rack));
  }
  return ids;
}

std::string RackOf(const std::string& id) { return id.substr(id.find('r'), 5); }

double MedianUs(const std::vector<std::string>& ids, uint64_t reps) {
  std::vector<double> us;
  for (uint64_t r = 0; r < reps; ++r) {
    const std::string& self = ids[(r * 7919) % ids.size()];
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> order = PlacementOrder(ids, self);
    auto t1 = std::chrono::steady_clock::now();
    if (order.size() + 1 != ids.size()) std::abort();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Where each live node's `replicas` copies go when `down` nodes are skipped: PlacementOrder
// walked in order. Every node's own call would sort N ids (N^2 log N for the whole cluster), so
// the order is taken from one sorted ring by rotation — checked equal to PlacementOrder's for a
// sample of nodes first.
// With `domains`, each node's order is DomainOrder's over its ring (each node's rack its
// peer_failure_domain), as the replicator's Candidates; a down node is still registered, so it
// may be its domain's pick, and is skipped then like any node that fails.
std::map<std::string, std::vector<std::string>> Place(const std::vector<std::string>& ids,
                                                      const std::set<std::string>& down,
                                                      uint64_t replicas, bool domains) {
  std::vector<std::string> ring = ids;
  std::sort(ring.begin(), ring.end());
  for (size_t i = 0; i < ring.size(); i += std::max<size_t>(1, ring.size() / 16)) {
    std::vector<std::string> rotated(ring.begin() + static_cast<ptrdiff_t>(i) + 1, ring.end());
    rotated.insert(rotated.end(), ring.begin(), ring.begin() + static_cast<ptrdiff_t>(i));
    if (rotated != PlacementOrder(ids, ring[i])) {
      std::fprintf(stderr, "the ring walk differs from PlacementOrder at %s\n", ring[i].c_str());
      std::exit(1);
    }
  }
  std::map<std::string, std::vector<std::string>> placed;
  auto rack_of = [](const std::string& n) -> std::optional<std::string> { return RackOf(n); };
  for (size_t i = 0; i < ring.size(); ++i) {
    if (down.contains(ring[i])) continue;
    std::vector<std::string>& took = placed[ring[i]];
    // The node's ring as DomainOrder sees it: the next kWindow nodes, then (its tail, walked
    // back for the node's index in its rack) the kWindow before it; the middle of the ring, which
    // it never looks at, follows. Without domains: the ring in order.
    const size_t n = ring.size();
    const size_t window = std::min<size_t>(ckptd::limits::kPeerDomainLookupsMax, (n - 1) / 2);
    auto at = [&](size_t k) -> const std::string& { return ring[(i + k) % n]; };
    std::vector<std::string> order;
    if (domains) {
      for (size_t k = 1; k <= window; ++k) order.push_back(at(k));
      for (size_t k = n - window; k < n; ++k) order.push_back(at(k));
      order = ckptd::peer::DomainOrder(order, RackOf(ring[i]), rack_of,
                                       ckptd::limits::kPeerDomainLookupsMax);
      for (size_t k = window + 1; k < n - window; ++k) order.push_back(at(k));
    } else {
      for (size_t k = 1; k < n && k <= 64; ++k) order.push_back(at(k));  // enough for 5% down
    }
    for (const std::string& cand : order) {
      if (took.size() >= replicas) break;
      if (!down.contains(cand)) took.push_back(cand);
    }
  }
  return placed;
}

void Run(uint64_t nodes, uint64_t replicas, uint64_t down_pct, uint64_t per_rack, uint64_t reps,
         uint64_t seed, bool rack_major, bool domains) {
  const std::vector<std::string> ids = NodeIds(nodes, per_rack, rack_major);
  const double us = MedianUs(ids, reps);

  std::mt19937_64 rng(seed);
  std::vector<std::string> shuffled = ids;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  const std::set<std::string> down(
      shuffled.begin(), shuffled.begin() + static_cast<ptrdiff_t>(nodes * down_pct / 100));
  auto placed = Place(ids, down, replicas, domains);
  std::map<std::string, uint64_t> held;
  for (const auto& [node, took] : placed) {
    for (const std::string& t : took) ++held[t];
  }
  uint64_t max_held = 0, total = 0;
  for (const auto& [node, n] : held) {
    max_held = std::max(max_held, n);
    total += n;
  }
  const double mean_held = placed.empty() ? 0 : static_cast<double>(total) / placed.size();

  // One rack fails (every node up before): the share of its parts with no copy left.
  auto all_up = Place(ids, {}, replicas, domains);
  const std::string rack = RackOf(ids[nodes / 2]);  // a rack in the middle
  uint64_t rack_parts = 0, rack_lost = 0;
  for (const auto& [node, took] : all_up) {
    if (RackOf(node) != rack) continue;
    ++rack_parts;
    bool survives = false;
    for (const std::string& t : took) survives = survives || RackOf(t) != rack;
    if (!survives) ++rack_lost;
  }

  const uint64_t list_pages = (nodes + 999) / 1000;
  const uint64_t per_node_old = list_pages + nodes;  // a GET of every registration
  const uint64_t per_node_needed = list_pages + replicas;
  std::printf(
      "{\"naming\": \"%s\", \"nodes\": %llu, \"replicas\": %llu, \"down_percent\": %llu, "
      "\"placement_us\": %.1f, "
      "\"copies_held_mean\": %.2f, \"copies_held_max\": %llu, \"rack_nodes\": %llu, "
      "\"rack_parts_lost\": %llu, \"registry_requests_per_node_per_refresh\": %llu, "
      "\"registry_requests_cluster_per_s\": %.0f, \"registry_requests_if_listed_only\": %llu, "
      "\"registry_requests_cluster_per_s_if_listed_only\": %.0f}\n",
      domains      ? "rack-major, peer_failure_domain"
      : rack_major ? "rack-major"
                   : "rack-minor",
      static_cast<unsigned long long>(nodes), static_cast<unsigned long long>(replicas),
      static_cast<unsigned long long>(down_pct), us, mean_held,
      static_cast<unsigned long long>(max_held), static_cast<unsigned long long>(rack_parts),
      static_cast<unsigned long long>(rack_lost), static_cast<unsigned long long>(per_node_old),
      static_cast<double>(per_node_old * nodes) / 5.0,
      static_cast<unsigned long long>(per_node_needed),
      static_cast<double>(per_node_needed * nodes) / 5.0);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> nodes = {1000, 10000}, replicas = {1, 2}, down = {0, 1, 5};
  uint64_t per_rack = 32, reps = 5, seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char* flag = argv[i];
    const char* value = argv[i + 1];
    if (std::strcmp(flag, "--nodes") == 0) {
      nodes = ParseList(value);
    } else if (std::strcmp(flag, "--replicas") == 0) {
      replicas = ParseList(value);
    } else if (std::strcmp(flag, "--down") == 0) {
      down = ParseList(value);
    } else if (std::strcmp(flag, "--per_rack") == 0) {
      per_rack = ParseList(value).at(0);
    } else if (std::strcmp(flag, "--reps") == 0) {
      reps = ParseList(value).at(0);
    } else if (std::strcmp(flag, "--seed") == 0) {
      seed = ParseList(value).at(0);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag);
      return 2;
    }
  }
  if (per_rack == 0 || reps == 0) {
    std::fprintf(stderr, "--per_rack and --reps must be at least 1\n");
    return 2;
  }
  for (uint64_t n : nodes) {
    if (n < 2 || n > 16384) {
      std::fprintf(stderr, "--nodes %llu: 2..16384 (limits::kPeerRegistryNodesMax)\n",
                   static_cast<unsigned long long>(n));
      return 2;
    }
    for (uint64_t r : replicas) {
      for (uint64_t d : down) {
        Run(n, r, d, per_rack, reps, seed, /*rack_major=*/true, /*domains=*/false);
        Run(n, r, d, per_rack, reps, seed, /*rack_major=*/false, /*domains=*/false);
        Run(n, r, d, per_rack, reps, seed, /*rack_major=*/true, /*domains=*/true);
      }
    }
  }
  return 0;
}
