// What the control-plane simulation (simulation_test.cc) saves and expects back: random
// checkpoint layouts and their logical bytes, the shards one rank saves, and random loads with
// the bytes each must return. Pure code over a caller's std::mt19937_64: the same seed draws the
// same layouts and bytes. Expected bytes are computed here from the global tensors, never by the
// daemon's own region code, so a bug there cannot hide behind itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd::sim {

inline uint64_t Uniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}
inline bool Chance(std::mt19937_64& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// One item of a checkpoint. Tensors are 2-D [rows, cols].
struct Item {
  enum Kind {
    kRows,        // rank r saves rows [split[r], split[r+1]) (a box)
    kFlat,        // rank r saves elements [split[r], split[r+1]) (a flat range)
    kReplicated,  // every rank saves the whole tensor (region unset): stored once
    kObject,      // a REPLICATED object, the same bytes from every rank
    kRankObject,  // a PER_RANK object, its own bytes per rank
  };
  std::string name;
  Kind kind = kRows;
  v1::DType dtype = v1::FLOAT32;
  uint32_t elem = 4;
  uint64_t rows = 0, cols = 0;
  std::vector<uint64_t> split;  // kRows / kFlat: world + 1 boundaries, strictly increasing

  bool tensor() const { return kind == kRows || kind == kFlat || kind == kReplicated; }
  uint64_t bytes() const { return rows * cols * elem; }
};

// A checkpoint as saved: its layout and its logical bytes (tensors whole and row-major).
struct Plan {
  uint32_t world = 1;
  std::vector<Item> items;
  std::map<std::string, std::string> bytes;                         // tensors, kObject
  std::map<std::string, std::map<uint32_t, std::string>> per_rank;  // kRankObject
};

inline std::string RandomBytes(std::mt19937_64& rng, uint64_t n) {
  std::string out(n, '\0');
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    for (uint64_t j = i; j < std::min(n, i + 8); ++j, v >>= 8) out[j] = static_cast<char>(v);
  }
  return out;
}

// world + 1 strictly increasing boundaries from 0 to n (n >= world).
inline std::vector<uint64_t> RandomSplit(std::mt19937_64& rng, uint64_t n, uint32_t world) {
  std::set<uint64_t> cuts;
  while (cuts.size() + 1 < world) cuts.insert(Uniform(rng, 1, n - 1));
  std::vector<uint64_t> split = {0};
  split.insert(split.end(), cuts.begin(), cuts.end());
  split.push_back(n);
  return split;
}

inline Item RandomTensor(std::mt19937_64& rng, std::string name, Item::Kind kind, uint32_t world) {
  static const std::pair<v1::DType, uint32_t> kTypes[] = {
      {v1::FLOAT32, 4}, {v1::BFLOAT16, 2}, {v1::UINT8, 1}, {v1::INT64, 8}};
  Item it;
  it.name = std::move(name);
  it.kind = kind;
  std::tie(it.dtype, it.elem) = kTypes[Uniform(rng, 0, 3)];
  it.rows = Uniform(rng, world, 24);
  it.cols = Uniform(rng, 1, 24);
  if (kind == Item::kRows) it.split = RandomSplit(rng, it.rows, world);
  if (kind == Item::kFlat) it.split = RandomSplit(rng, it.rows * it.cols, world);
  return it;
}

// 1..4 items of random kinds (at least one sharded tensor) with random bytes.
inline Plan RandomPlan(std::mt19937_64& rng, uint32_t world) {
  Plan p;
  p.world = world;
  const uint64_t n = Uniform(rng, 1, 4);
  for (uint64_t i = 0; i < n; ++i) {
    auto kind = static_cast<Item::Kind>(i == 0 ? Uniform(rng, 0, 1) : Uniform(rng, 0, 4));
    std::string name = absl::StrCat(i == 0 ? "model.layers." : "extra.", i, ".",
                                    kind == Item::kRankObject ? "rng" : "w");
    if (kind == Item::kObject || kind == Item::kRankObject) {
      Item it;
      it.name = std::move(name);
      it.kind = kind;
      p.items.push_back(it);
      if (kind == Item::kObject) p.bytes[it.name] = RandomBytes(rng, Uniform(rng, 1, 3000));
      for (uint32_t r = 0; kind == Item::kRankObject && r < world; ++r) {
        p.per_rank[it.name][r] = RandomBytes(rng, Uniform(rng, 1, 3000));
      }
      continue;
    }
    p.items.push_back(RandomTensor(rng, std::move(name), kind, world));
    p.bytes[p.items.back().name] = RandomBytes(rng, p.items.back().bytes());
  }
  return p;
}

// Bytes of rows [r0, r1) x cols [c0, c1) of a [rows, cols] tensor.
inline std::string BoxBytes(const Item& it, const std::string& global, uint64_t r0, uint64_t r1,
                            uint64_t c0, uint64_t c1) {
  std::string out;
  for (uint64_t r = r0; r < r1; ++r) {
    out += global.substr((r * it.cols + c0) * it.elem, (c1 - c0) * it.elem);
  }
  return out;
}

inline v1::Region Box(uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1) {
  v1::Region region;
  v1::Box* b = region.mutable_box();
  b->add_offsets(r0);
  b->add_offsets(c0);
  b->add_lengths(r1 - r0);
  b->add_lengths(c1 - c0);
  return region;
}

inline v1::Region Flat(uint64_t start, uint64_t end) {
  v1::Region region;
  region.mutable_flat()->set_start(start);
  region.mutable_flat()->set_count(end - start);
  return region;
}

// One shard a rank saves: its spec (data not set) and bytes.
struct Shard {
  v1::ShardSpec spec;
  std::string bytes;
};

// The shards rank `rank` of `p` saves, in item order. `bad_replica`: the replicated tensors
// carry other bytes than the other ranks' (their commit must fail).
inline std::vector<Shard> RankShards(const Plan& p, uint32_t rank, bool bad_replica = false) {
  std::vector<Shard> out;
  for (const Item& it : p.items) {
    Shard s;
    s.spec.set_item(it.name);
    if (!it.tensor()) {
      s.spec.mutable_object()->set_scope(it.kind == Item::kObject ? v1::REPLICATED : v1::PER_RANK);
      s.bytes = it.kind == Item::kObject ? p.bytes.at(it.name) : p.per_rank.at(it.name).at(rank);
      out.push_back(std::move(s));
      continue;
    }
    v1::TensorShardSpec* t = s.spec.mutable_tensor();
    t->set_dtype(it.dtype);
    t->add_global_shape(it.rows);
    t->add_global_shape(it.cols);
    const std::string& g = p.bytes.at(it.name);
    if (it.kind == Item::kRows) {
      *t->mutable_region() = Box(it.split[rank], it.split[rank + 1], 0, it.cols);
      s.bytes = BoxBytes(it, g, it.split[rank], it.split[rank + 1], 0, it.cols);
    } else if (it.kind == Item::kFlat) {
      *t->mutable_region() = Flat(it.split[rank], it.split[rank + 1]);
      s.bytes = g.substr(it.split[rank] * it.elem, (it.split[rank + 1] - it.split[rank]) * it.elem);
    } else {
      s.bytes = g;
      if (bad_replica) s.bytes[0] = static_cast<char>(s.bytes[0] ^ 0x5a);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// One item of a load and the bytes it must return.
struct Ask {
  v1::LoadItemRequest req;  // dest not set
  std::string expect;
};

// A random read of tensor `it`: whole, a row block, a flat block or a random box.
inline Ask RandomTensorAsk(std::mt19937_64& rng, const Item& it, const std::string& g) {
  Ask a;
  a.req.set_item(it.name);
  const uint64_t mode = Uniform(rng, 0, 3);
  const uint64_t n = Uniform(rng, 1, 4);
  if (mode == 0) {
    a.expect = g;
  } else if (mode == 1 && it.rows >= n) {
    const uint64_t k = Uniform(rng, 0, n - 1);
    const uint64_t r0 = it.rows * k / n, r1 = it.rows * (k + 1) / n;
    *a.req.mutable_region() = Box(r0, r1, 0, it.cols);
    a.expect = BoxBytes(it, g, r0, r1, 0, it.cols);
  } else if (mode == 2) {
    const uint64_t e = it.rows * it.cols, k = Uniform(rng, 0, std::min(n, e) - 1);
    const uint64_t s0 = e * k / std::min(n, e), s1 = e * (k + 1) / std::min(n, e);
    *a.req.mutable_region() = Flat(s0, s1);
    a.expect = g.substr(s0 * it.elem, (s1 - s0) * it.elem);
  } else {
    const uint64_t r0 = Uniform(rng, 0, it.rows - 1), r1 = Uniform(rng, r0 + 1, it.rows);
    const uint64_t c0 = Uniform(rng, 0, it.cols - 1), c1 = Uniform(rng, c0 + 1, it.cols);
    *a.req.mutable_region() = Box(r0, r1, c0, c1);
    a.expect = BoxBytes(it, g, r0, r1, c0, c1);
  }
  return a;
}

// A random load of a checkpoint of `p` whose ranks `have` were committed (all of them unless it
// was committed partial): random regions of every tensor it holds whole, the saved regions of
// the sharded ones it holds in part, and the objects.
inline std::vector<Ask> RandomLoad(std::mt19937_64& rng, const Plan& p,
                                   const std::set<uint32_t>& have) {
  const bool whole = have.size() == p.world;
  std::vector<Ask> asks;
  for (const Item& it : p.items) {
    if (it.kind == Item::kReplicated || (whole && it.tensor())) {
      asks.push_back(RandomTensorAsk(rng, it, p.bytes.at(it.name)));
    } else if (it.tensor()) {
      for (uint32_t r : have) {
        Shard s = RankShards(p, r)[&it - p.items.data()];
        Ask a;
        a.req.set_item(it.name);
        *a.req.mutable_region() = s.spec.tensor().region();
        a.expect = std::move(s.bytes);
        asks.push_back(std::move(a));
      }
    } else if (it.kind == Item::kObject) {
      Ask a;
      a.req.set_item(it.name);
      a.expect = p.bytes.at(it.name);
      asks.push_back(std::move(a));
    } else {
      for (uint32_t r : have) {
        Ask a;
        a.req.set_item(it.name);
        a.req.set_saved_by_rank(r);
        a.expect = p.per_rank.at(it.name).at(r);
        asks.push_back(std::move(a));
      }
    }
  }
  return asks;
}

// A region of a sharded tensor of `p` that a partial checkpoint of ranks `have` lacks in part,
// if there is one.
inline std::optional<Ask> MissingAsk(const Plan& p, const std::set<uint32_t>& have) {
  for (uint32_t r = 0; r < p.world; ++r) {
    if (have.contains(r)) continue;
    for (const Item& it : p.items) {
      if (it.kind != Item::kRows && it.kind != Item::kFlat) continue;
      Shard s = RankShards(p, r)[&it - p.items.data()];
      Ask a;
      a.req.set_item(it.name);
      *a.req.mutable_region() = s.spec.tensor().region();
      a.expect = std::move(s.bytes);  // its size: the load must fail before any byte lands
      return a;
    }
  }
  return std::nullopt;
}

}  // namespace ckptd::sim
