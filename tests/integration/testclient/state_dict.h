// The fixed state dict the integration tests save and load, and its deterministic contents.
// Header-only: compiled into both ckptd_testclient (each rank is its own process) and
// ckptd_integration_tests, so any process regenerates the expected bytes of any item from
// (item name, element index, seed) alone.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckptd/client.h"

namespace ckptd_it {

// One tensor item of the state dict. `sharded`: rows (dim 0) are split in world_size equal
// blocks, rank r saving block r; otherwise every rank saves the whole tensor (a replica the
// daemon stores once), or only rank 0 does when `rank0_only`.
struct TensorItem {
  std::string name;
  ckptd::DType dtype;
  std::vector<uint64_t> shape;
  bool sharded = true;
  bool rank0_only = false;
};

inline const std::vector<TensorItem>& StateDict() {
  static const std::vector<TensorItem> items = {
      {"model.embed.weight", ckptd::DType::kFloat32, {64, 33}},  // 8448 B: not 4 KiB-multiple
      {"model.layers.0.attn.qkv", ckptd::DType::kBFloat16, {128, 96}},  // 24576 B
      {"model.layers.0.mlp.fc1", ckptd::DType::kFloat16, {32, 20}},
      {"model.token_ids", ckptd::DType::kInt64, {16, 5}},
      {"model.mask", ckptd::DType::kBool, {12, 7}},
      {"model.layers.0.mlp.fc1.fp8", ckptd::DType::kFloat8E4M3FN, {40, 101}},
      {"optim.step", ckptd::DType::kFloat32, {}, /*sharded=*/false},  // 0-d, replicated
      {"model.empty", ckptd::DType::kFloat32, {0, 8}, /*sharded=*/false, /*rank0_only=*/true},
  };
  return items;
}

inline uint64_t ElementCount(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t NameHash(const std::string& name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Writes the bytes of elements [first, first + count) (row-major, global index) of `name`.
inline void FillElements(const std::string& name, ckptd::DType dtype, uint64_t first,
                         uint64_t count, uint64_t seed, uint8_t* out) {
  const size_t esize = ckptd::DTypeSize(dtype);
  const uint64_t base = NameHash(name) ^ SplitMix64(seed);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v = SplitMix64(base + first + i);
    if (dtype == ckptd::DType::kBool) v &= 1;
    std::memcpy(out + i * esize, &v, esize);  // little-endian low bytes
  }
}

// The global tensor's bytes.
inline std::vector<uint8_t> GlobalBytes(const TensorItem& t, uint64_t seed) {
  const uint64_t n = ElementCount(t.shape);
  std::vector<uint8_t> out(n * ckptd::DTypeSize(t.dtype));
  FillElements(t.name, t.dtype, 0, n, seed, out.data());
  return out;
}

// Rank r's shard: its row block (sharded) or the whole tensor. Returns false when r saves none.
struct ShardPlan {
  ckptd::Region region;
  uint64_t first_element = 0;
  uint64_t elements = 0;
};
inline bool PlanShard(const TensorItem& t, uint32_t rank, uint32_t world, ShardPlan* plan) {
  if (!t.sharded) {
    if (t.rank0_only && rank != 0) return false;
    plan->region = ckptd::Region::Whole();
    plan->first_element = 0;
    plan->elements = ElementCount(t.shape);
    return true;
  }
  const uint64_t rows = t.shape[0] / world;
  const uint64_t row_elems = ElementCount(t.shape) / t.shape[0];
  std::vector<uint64_t> offsets(t.shape.size(), 0), lengths = t.shape;
  offsets[0] = rows * rank;
  lengths[0] = rows;
  plan->region = ckptd::Region::Box(offsets, lengths);
  plan->first_element = rows * rank * row_elems;
  plan->elements = rows * row_elems;
  return true;
}

// The per-rank object every rank saves, and a replicated one.
inline const char* kRankObject = "extra.rng";
inline const char* kReplicatedObject = "extra.config";
inline std::string RankObjectBytes(uint32_t rank, uint64_t seed) {
  std::string s = "rng-state rank=" + std::to_string(rank) + " seed=" + std::to_string(seed) + ":";
  for (int i = 0; i < 37 + static_cast<int>(rank); ++i) {
    s.push_back(static_cast<char>(SplitMix64(seed * 131 + rank * 7 + i) & 0xff));
  }
  return s;
}
inline std::string ReplicatedObjectBytes(uint64_t seed) {
  return "{\"lr\": 0.0003, \"seed\": " + std::to_string(seed) + "}";
}

}  // namespace ckptd_it
