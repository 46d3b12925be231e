// Saving one rank's part of the test state dict and verifying a loaded checkpoint against the
// regenerated global tensors. Header-only, shared by ckptd_testclient and the test binary.
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "state_dict.h"

namespace ckptd_it {

// Bytes rank `rank` saves (tensors + objects), as Save() copies them.
struct RankPayload {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<ckptd::TensorShard> tensors;
  std::vector<ckptd::ObjectShard> objects;
  uint64_t tensor_bytes = 0;
  uint64_t object_bytes = 0;
};

inline RankPayload MakeRankPayload(uint32_t rank, uint32_t world, uint64_t seed) {
  RankPayload p;
  p.buffers.reserve(StateDict().size());
  for (const TensorItem& t : StateDict()) {
    ShardPlan plan;
    if (!PlanShard(t, rank, world, &plan)) continue;
    std::vector<uint8_t>& buf = p.buffers.emplace_back(plan.elements * ckptd::DTypeSize(t.dtype));
    FillElements(t.name, t.dtype, plan.first_element, plan.elements, seed, buf.data());
    ckptd::TensorShard s;
    s.item = t.name;
    s.dtype = t.dtype;
    s.global_shape = t.shape;
    s.region = plan.region;
    s.data = buf.data();
    s.bytes = buf.size();
    p.tensor_bytes += buf.size();
    p.tensors.push_back(std::move(s));
  }
  p.objects.push_back({kRankObject, /*per_rank=*/true, RankObjectBytes(rank, seed)});
  p.objects.push_back({kReplicatedObject, /*per_rank=*/false, ReplicatedObjectBytes(seed)});
  for (const auto& o : p.objects) p.object_bytes += o.bytes.size();
  return p;
}

inline absl::StatusOr<ckptd::SaveResult> SaveRank(ckptd::Client& client, const std::string& job,
                                                  uint64_t step, uint32_t rank, uint32_t world,
                                                  uint64_t seed) {
  RankPayload p = MakeRankPayload(rank, world, seed);
  return client.Save(job, step, rank, world, p.tensors, p.objects);
}

inline std::string HexAround(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  return absl::StrCat("first difference at byte ", i, " of ", want.size(), " (got size ",
                      got.size(), ")");
}

// Loads `items` (empty: every tensor of the state dict) whole with Load() and checks them
// bit-exact; with `check_objects`, also every rank's per-rank object and the replicated one.
// `result`, if not null, receives the tensors' LoadResult.
inline absl::Status VerifyCheckpoint(ckptd::Client& client, const std::string& job,
                                     std::optional<uint64_t> step, uint64_t seed,
                                     const std::vector<std::string>& items, uint32_t world,
                                     bool check_objects, ckptd::LoadResult* result = nullptr,
                                     const ckptd::LoadOptions& options = {}) {
  std::vector<const TensorItem*> wanted;
  for (const TensorItem& t : StateDict()) {
    if (items.empty() || std::find(items.begin(), items.end(), t.name) != items.end()) {
      wanted.push_back(&t);
    }
  }
  if (!items.empty() && wanted.size() != items.size()) {
    return absl::InvalidArgumentError("VerifyCheckpoint: unknown item requested");
  }
  std::vector<std::vector<uint8_t>> got(wanted.size());
  std::vector<ckptd::LoadTarget> targets;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorItem& t = *wanted[i];
    got[i].assign(ElementCount(t.shape) * ckptd::DTypeSize(t.dtype), 0xAB);
    targets.push_back({t.name, ckptd::Region::Whole(), got[i].data(), got[i].size()});
  }
  absl::StatusOr<ckptd::LoadResult> r = client.Load(job, step, 0, targets, options);
  if (!r.ok()) return r.status();
  if (result != nullptr) *result = *r;
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::vector<uint8_t> want = GlobalBytes(*wanted[i], seed);
    if (got[i] != want) {
      return absl::DataLossError(
          absl::StrCat("item ", wanted[i]->name, " differs: ", HexAround(got[i], want)));
    }
    if (r->item_bytes.size() > i && r->item_bytes[i] != want.size()) {
      return absl::DataLossError(absl::StrCat("item ", wanted[i]->name, ": load reported ",
                                              r->item_bytes[i], " bytes, want ", want.size()));
    }
  }
  if (!check_objects) return absl::OkStatus();
  for (uint32_t rank = 0; rank < world; ++rank) {
    absl::StatusOr<std::string> o = client.LoadObject(job, step, rank, kRankObject);
    if (!o.ok()) return o.status();
    if (*o != RankObjectBytes(rank, seed)) {
      return absl::DataLossError(absl::StrCat(kRankObject, " of rank ", rank, " differs"));
    }
    absl::StatusOr<std::string> rep = client.LoadObject(job, step, rank, kReplicatedObject);
    if (!rep.ok()) return rep.status();
    if (*rep != ReplicatedObjectBytes(seed)) {
      return absl::DataLossError(absl::StrCat(kReplicatedObject, " on rank ", rank, " differs"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd_it
