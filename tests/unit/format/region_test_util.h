// Reference (brute-force) helpers and random generators for the region tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "ckptd/v1/common.pb.h"

namespace ckptd::testing {

inline v1::Region Box(std::vector<uint64_t> offsets, std::vector<uint64_t> lengths) {
  v1::Region r;
  for (uint64_t o : offsets) r.mutable_box()->add_offsets(o);
  for (uint64_t l : lengths) r.mutable_box()->add_lengths(l);
  r.mutable_box();  // a 0-d box is still a box
  return r;
}

inline v1::Region Flat(uint64_t start, uint64_t count) {
  v1::Region r;
  r.mutable_flat()->set_start(start);
  r.mutable_flat()->set_count(count);
  return r;
}

inline uint64_t RefNumel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// Whether global element g lies in the region.
inline bool RefContains(const std::vector<uint64_t>& shape, const v1::Region& r, uint64_t g) {
  if (r.has_flat()) return g >= r.flat().start() && g < r.flat().start() + r.flat().count();
  if (!r.has_box()) return true;
  for (size_t d = shape.size(); d-- > 0;) {
    uint64_t c = g % shape[d];
    g /= shape[d];
    uint64_t off = r.box().offsets(static_cast<int>(d));
    if (c < off || c >= off + r.box().lengths(static_cast<int>(d))) return false;
  }
  return true;
}

// The global indices of the region's elements in its buffer order (global row-major order).
inline std::vector<uint64_t> RefElements(const std::vector<uint64_t>& shape, const v1::Region& r) {
  std::vector<uint64_t> out;
  uint64_t numel = RefNumel(shape);
  for (uint64_t g = 0; g < numel; ++g) {
    if (RefContains(shape, r, g)) out.push_back(g);
  }
  return out;
}

// Random cut points of [0, n) into 1..max_parts segments (empty segments allowed when
// allow_empty), returned as boundaries b0 = 0 < ... <= bk = n.
inline std::vector<uint64_t> RandomCuts(std::mt19937_64& rng, uint64_t n, int max_parts,
                                        bool allow_empty) {
  int parts = 1 + static_cast<int>(rng() % max_parts);
  std::vector<uint64_t> cuts = {0, n};
  for (int i = 1; i < parts; ++i) {
    uint64_t c = n == 0 ? 0 : rng() % (n + 1);
    if (!allow_empty && (c == 0 || c == n)) continue;
    cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  if (!allow_empty) cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  if (cuts.size() == 1) cuts.push_back(n);  // n == 0: one empty segment
  return cuts;
}

// Appends the grid of boxes of the sub-box with dim 0 in [lo0, hi0), other dims whole.
inline void AppendBoxGrid(std::mt19937_64& rng, const std::vector<uint64_t>& shape, uint64_t lo0,
                          uint64_t hi0, int max_parts, std::vector<v1::Region>* out) {
  const size_t n = shape.size();
  if (n == 0) {
    out->push_back(Box({}, {}));
    return;
  }
  std::vector<std::vector<uint64_t>> cuts(n);
  for (size_t d = 0; d < n; ++d) {
    uint64_t len = d == 0 ? hi0 - lo0 : shape[d];
    cuts[d] = RandomCuts(rng, len, max_parts, rng() % 8 == 0);
    if (d == 0) {
      for (uint64_t& c : cuts[d]) c += lo0;
    }
  }
  std::vector<size_t> idx(n, 0);
  while (true) {
    std::vector<uint64_t> off(n), len(n);
    for (size_t d = 0; d < n; ++d) {
      off[d] = cuts[d][idx[d]];
      len[d] = cuts[d][idx[d] + 1] - off[d];
    }
    out->push_back(Box(off, len));
    size_t d = n;
    while (d > 0) {
      --d;
      if (++idx[d] + 1 < cuts[d].size()) break;
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

inline void AppendFlatSplit(std::mt19937_64& rng, uint64_t lo, uint64_t hi, int max_parts,
                            std::vector<v1::Region>* out) {
  std::vector<uint64_t> cuts = RandomCuts(rng, hi - lo, max_parts, rng() % 8 == 0);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    out->push_back(Flat(lo + cuts[i], cuts[i + 1] - cuts[i]));
  }
}

// A random exact partition of the tensor: boxes, flat ranges, or slabs of dim 0 each split into
// boxes or flat ranges.
inline std::vector<v1::Region> RandomPartition(std::mt19937_64& rng,
                                               const std::vector<uint64_t>& shape) {
  std::vector<v1::Region> parts;
  uint64_t numel = RefNumel(shape);
  int kind = static_cast<int>(rng() % 4);
  if (kind == 0 || shape.empty()) {
    AppendBoxGrid(rng, shape, 0, shape.empty() ? 0 : shape[0], 3, &parts);
  } else if (kind == 1) {
    AppendFlatSplit(rng, 0, numel, 6, &parts);
  } else if (kind == 2) {
    parts.push_back(v1::Region());  // unset: whole
  } else {
    uint64_t slab = shape[0] == 0 ? 0 : numel / shape[0];
    std::vector<uint64_t> cuts = RandomCuts(rng, shape[0], 3, false);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      if (rng() % 2) {
        AppendBoxGrid(rng, shape, cuts[i], cuts[i + 1], 3, &parts);
      } else {
        AppendFlatSplit(rng, cuts[i] * slab, cuts[i + 1] * slab, 3, &parts);
      }
    }
  }
  std::shuffle(parts.begin(), parts.end(), rng);
  return parts;
}

// A random region of the tensor (any kind, possibly empty).
inline v1::Region RandomRegion(std::mt19937_64& rng, const std::vector<uint64_t>& shape) {
  int kind = static_cast<int>(rng() % 5);
  if (kind == 0) return v1::Region();
  if (kind <= 2) {
    std::vector<uint64_t> off(shape.size()), len(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      off[d] = rng() % (shape[d] + 1);
      len[d] = rng() % (shape[d] - off[d] + 1);
      if (rng() % 3 == 0) {
        off[d] = 0;
        len[d] = shape[d];
      }
    }
    return Box(off, len);
  }
  uint64_t numel = RefNumel(shape);
  uint64_t start = rng() % (numel + 1);
  return Flat(start, rng() % (numel - start + 1));
}

inline std::vector<uint64_t> RandomShape(std::mt19937_64& rng, size_t max_dims, uint64_t max_dim) {
  std::vector<uint64_t> shape(rng() % (max_dims + 1));
  for (uint64_t& d : shape) d = (rng() % 20 == 0) ? 0 : 1 + rng() % max_dim;
  return shape;
}

// The base seed: CKPTD_TEST_SEED when set (to replay a failure), random otherwise.
inline uint64_t TestSeed() {
  if (const char* env = std::getenv("CKPTD_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  return std::random_device{}();
}

}  // namespace ckptd::testing
