// PlanLoad (see load_plan.h for the steps). Every step is a sort or a binary search over what the
// load touches; the per-item interval index keeps the shard lookup away from all pairs.
#include "format/load_plan.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "format/dtype.h"
#include "format/region.h"
#include "format/region_internal.h"

namespace ckptd {
namespace {

using region_internal::Piece;

// An interval index over the boxes of one item's shards along one dimension: the boxes sorted by
// start, seen as an implicit balanced tree whose nodes carry the largest end in their subtree.
// A query visits only subtrees that can hold an overlapping box: O(log n + hits).
class ShardIndex {
 public:
  ShardIndex(std::span<const uint64_t> shape, const v1::ItemEntry& item) : n_(shape.size()) {
    for (int s = 0; s < item.shards_size(); ++s) {
      if (item.shards(s).length() == 0) continue;
      for (const Piece& p : region_internal::RegionPieces(shape, item.shards(s).region())) {
        boxes_.push_back(Entry{p, static_cast<uint32_t>(s)});
      }
    }
    dim_ = MostDistinctDim();
    std::sort(boxes_.begin(), boxes_.end(),
              [&](const Entry& a, const Entry& b) { return Lo(a) < Lo(b); });
    max_end_.resize(boxes_.size());
    if (!boxes_.empty()) Build(0, boxes_.size());
  }

  // Indices of the shards with a box overlapping `q`, sorted and unique.
  void Query(const Piece& q, std::vector<uint32_t>* shards) const {
    if (n_ == 0) {
      for (const Entry& e : boxes_) shards->push_back(e.shard);
    } else if (!boxes_.empty()) {
      Visit(0, boxes_.size(), q, shards);
    }
    std::sort(shards->begin(), shards->end());
    shards->erase(std::unique(shards->begin(), shards->end()), shards->end());
  }

 private:
  struct Entry {
    Piece box;
    uint32_t shard;
  };
  uint64_t Lo(const Entry& e) const { return n_ == 0 ? 0 : e.box.off[dim_]; }
  uint64_t Hi(const Entry& e) const { return n_ == 0 ? 1 : e.box.off[dim_] + e.box.len[dim_]; }

  // The dimension along which the boxes start at the most distinct offsets: the sharded one.
  size_t MostDistinctDim() const {
    size_t best = 0, best_count = 0;
    std::vector<uint64_t> starts;
    for (size_t d = 0; d < n_; ++d) {
      starts.clear();
      for (const Entry& e : boxes_) starts.push_back(e.box.off[d]);
      std::sort(starts.begin(), starts.end());
      size_t count = std::unique(starts.begin(), starts.end()) - starts.begin();
      if (count > best_count) best = d, best_count = count;
    }
    return best;
  }

  uint64_t Build(size_t lo, size_t hi) {
    size_t mid = lo + (hi - lo) / 2;
    uint64_t m = Hi(boxes_[mid]);
    if (lo < mid) m = std::max(m, Build(lo, mid));
    if (mid + 1 < hi) m = std::max(m, Build(mid + 1, hi));
    return max_end_[mid] = m;
  }

  bool Overlaps(const Piece& a, const Piece& b) const {
    for (size_t d = 0; d < n_; ++d) {
      if (a.off[d] >= b.off[d] + b.len[d] || b.off[d] >= a.off[d] + a.len[d]) return false;
    }
    return true;
  }

  void Visit(size_t lo, size_t hi, const Piece& q, std::vector<uint32_t>* out) const {
    size_t mid = lo + (hi - lo) / 2;
    if (max_end_[mid] <= q.off[dim_]) return;  // nothing here ends after the query starts
    if (lo < mid) Visit(lo, mid, q, out);
    if (Lo(boxes_[mid]) >= q.off[dim_] + q.len[dim_]) return;  // nor starts before it ends
    if (Overlaps(boxes_[mid].box, q)) out->push_back(boxes_[mid].shard);
    if (mid + 1 < hi) Visit(mid + 1, hi, q, out);
  }

  size_t n_;
  size_t dim_ = 0;
  std::vector<Entry> boxes_;
  std::vector<uint64_t> max_end_;  // per tree node (indexed like boxes_)
};

// Bytes of one shard that one request uses: blob [file_offset, +bytes) → dst_offset.
struct Need {
  uint32_t blob;  // index into Planner::blob_sizes_
  uint64_t file_offset;
  uint64_t bytes;
  uint32_t request;
  uint64_t dst_offset;
};

// Blocks of one shard to read and verify, in blob coordinates [begin, end).
struct CheckRange {
  uint32_t blob;
  uint64_t begin;
  uint64_t end;
  const v1::ShardEntry* shard;
};

// Sorts `v` by (blob, offset). In one pass when it already is, and in O(n) when each blob's
// entries come in offset order (the usual request order: item by item, a shard's rows ascending,
// the blobs interleaved): a counting sort by blob, then a sort of any blob's entries that are not.
template <typename T, typename Offset>
void SortByBlob(std::vector<T>* v, size_t blobs, const Offset& offset) {
  auto less = [&](const T& a, const T& b) {
    return std::pair(a.blob, offset(a)) < std::pair(b.blob, offset(b));
  };
  if (std::is_sorted(v->begin(), v->end(), less)) return;
  std::vector<size_t> start(blobs + 1, 0);
  for (const T& x : *v) ++start[x.blob + 1];
  for (size_t b = 0; b < blobs; ++b) start[b + 1] += start[b];
  std::vector<size_t> next(start.begin(), start.end() - 1);
  std::vector<T> out(v->size());
  for (const T& x : *v) out[next[x.blob]++] = x;
  for (size_t b = 0; b < blobs; ++b) {
    auto first = out.begin() + static_cast<ptrdiff_t>(start[b]);
    auto last = out.begin() + static_cast<ptrdiff_t>(start[b + 1]);
    if (!std::is_sorted(first, last, less)) std::sort(first, last, less);
  }
  *v = std::move(out);
}

class Planner {
 public:
  Planner(const Manifest& m, const PlanOptions& o) : o_(o) {
    block_ = m.header.checksum_block_bytes();
    for (const v1::BlobInfo& b : m.header.blobs()) {
      blob_index_[b.id()] = static_cast<uint32_t>(blob_ids_.size());
      blob_ids_.push_back(b.id());
      blob_sizes_.push_back(b.size_bytes());
    }
  }

  absl::Status AddRequests(std::span<const PlanRequest> requests, LoadPlan* plan);
  void MakeRuns(LoadPlan* plan);

 private:
  absl::Status AddTensor(const PlanRequest& r, uint32_t index, uint64_t* bytes);
  void AddShardUse(const v1::ShardEntry& s, uint64_t shard_begin, uint64_t shard_end,
                   uint32_t request, uint64_t dst_offset);
  std::vector<std::pair<uint64_t, uint64_t>> MergedRuns(uint32_t blob,
                                                        std::span<const CheckRange> checks) const;
  void Split(std::vector<std::pair<uint64_t, uint64_t>>* runs,
             std::span<const CheckRange> checks) const;
  void NeededStats(LoadPlan* plan);

  const PlanOptions& o_;
  uint64_t block_ = 0;
  absl::flat_hash_map<uint32_t, uint32_t> blob_index_;
  std::vector<uint32_t> blob_ids_;
  std::vector<uint64_t> blob_sizes_;
  absl::flat_hash_map<const v1::ItemEntry*, std::unique_ptr<ShardIndex>> indexes_;
  std::vector<Need> needs_;
  std::vector<CheckRange> checks_;
};

void Planner::AddShardUse(const v1::ShardEntry& s, uint64_t shard_begin, uint64_t shard_end,
                          uint32_t request, uint64_t dst_offset) {
  uint32_t blob = blob_index_.at(s.blob_id());  // ValidateManifest checked the id
  needs_.push_back(
      Need{blob, s.offset() + shard_begin, shard_end - shard_begin, request, dst_offset});
  uint64_t b0 = RoundDown(shard_begin, block_);
  uint64_t b1 = std::min(RoundUp(shard_end, block_), s.length());
  checks_.push_back(CheckRange{blob, s.offset() + b0, s.offset() + b1, &s});
}

absl::Status Planner::AddTensor(const PlanRequest& r, uint32_t index, uint64_t* bytes) {
  const v1::ItemEntry& item = *r.item;
  std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
  CKPTD_ASSIGN_OR_RETURN(uint32_t elem, DTypeSize(item.dtype()));
  absl::Status valid = ValidateRegion(r.region, shape);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("item \"%s\": %s", item.name(), valid.message()));
  }
  const uint64_t want = RegionElements(r.region, shape);
  *bytes = want * elem;
  if (want == 0) return absl::OkStatus();
  std::vector<uint32_t> shards;
  if (static_cast<uint32_t>(item.shards_size()) <= o_.linear_shards_max) {
    // A handful of shards: trying each is cheaper than building an index.
    for (int s = 0; s < item.shards_size(); ++s) shards.push_back(static_cast<uint32_t>(s));
  } else {
    std::unique_ptr<ShardIndex>& index_of_item = indexes_[&item];
    if (index_of_item == nullptr) index_of_item = std::make_unique<ShardIndex>(shape, item);
    for (const Piece& q : region_internal::RegionPieces(shape, r.region)) {
      index_of_item->Query(q, &shards);
    }
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
  }
  uint64_t got = 0;
  for (uint32_t si : shards) {
    const v1::ShardEntry& s = item.shards(static_cast<int>(si));
    got += ForEachCopyRun(shape, s.region(), r.region, [&](uint64_t sp, uint64_t dp, uint64_t n) {
      AddShardUse(s, sp * elem, (sp + n) * elem, index, dp * elem);
    });
  }
  if (got != want) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "item \"%s\": region %s is only partly in this checkpoint (%d of %d elements; it was "
        "committed as partial)",
        item.name(), DescribeRegion(r.region), got, want));
  }
  return absl::OkStatus();
}

absl::Status Planner::AddRequests(std::span<const PlanRequest> requests, LoadPlan* plan) {
  plan->request_bytes.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const PlanRequest& r = requests[i];
    CKPTD_CHECK(r.item != nullptr);
    if (r.item->kind() == v1::TENSOR) {
      CKPTD_RETURN_IF_ERROR(AddTensor(r, static_cast<uint32_t>(i), &plan->request_bytes[i]));
      continue;
    }
    CKPTD_CHECK(r.object_shard != nullptr);
    plan->request_bytes[i] = r.object_shard->length();
    if (r.object_shard->length() > 0) {
      AddShardUse(*r.object_shard, 0, r.object_shard->length(), static_cast<uint32_t>(i), 0);
    }
  }
  return absl::OkStatus();
}

// The union of `checks` (one blob, sorted by begin) rounded out to the alignment, capped at the
// blob's end, then merged across gaps of at most max(alignment, fraction of the merged run).
std::vector<std::pair<uint64_t, uint64_t>> Planner::MergedRuns(
    uint32_t blob, std::span<const CheckRange> checks) const {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  const uint64_t size = blob_sizes_[blob];
  for (const CheckRange& c : checks) {
    uint64_t b = RoundDown(c.begin, o_.alignment_bytes);
    uint64_t e = std::min(RoundUp(c.end, o_.alignment_bytes), std::max(size, c.end));
    if (!runs.empty() && b <= runs.back().second) {
      runs.back().second = std::max(runs.back().second, e);
    } else {
      runs.emplace_back(b, e);
    }
  }
  // Merging grows runs, which can make an earlier-rejected neighbour mergeable: repeat until no
  // pair qualifies, so no two runs of the plan could still merge.
  for (bool merged_any = true; merged_any;) {
    merged_any = false;
    std::vector<std::pair<uint64_t, uint64_t>> out;
    for (const auto& [b, e] : runs) {
      if (!out.empty()) {
        auto& [ob, oe] = out.back();
        uint64_t merged = e - ob;
        if (b - oe <= std::max<uint64_t>(o_.alignment_bytes,
                                         static_cast<uint64_t>(o_.merge_gap_fraction * merged))) {
          oe = e;
          merged_any = true;
          continue;
        }
      }
      out.emplace_back(b, e);
    }
    runs = std::move(out);
  }
  return runs;
}

// Splits runs longer than max_run_bytes. A split point inside a check range moves down to that
// shard's block boundary, so no verified block straddles two runs.
void Planner::Split(std::vector<std::pair<uint64_t, uint64_t>>* runs,
                    std::span<const CheckRange> checks) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (auto [b, e] : *runs) {
    while (e - b > o_.max_run_bytes) {
      uint64_t p = b + o_.max_run_bytes;
      auto it = std::upper_bound(checks.begin(), checks.end(), p,
                                 [](uint64_t v, const CheckRange& c) { return v < c.begin; });
      if (it != checks.begin() && std::prev(it)->end > p) {
        const CheckRange& c = *std::prev(it);
        uint64_t shard_start = c.shard->offset();
        p = shard_start + RoundDown(p - shard_start, block_);
      }
      out.emplace_back(b, p);
      b = p;
    }
    out.emplace_back(b, e);
  }
  *runs = std::move(out);
}

void Planner::NeededStats(LoadPlan* plan) {
  SortByBlob(&needs_, blob_ids_.size(), [](const Need& n) { return n.file_offset; });
  uint64_t raw = 0, aligned = 0;
  uint32_t blob = UINT32_MAX;
  uint64_t raw_end = 0, aligned_end = 0;
  for (const Need& n : needs_) {
    if (n.blob != blob) blob = n.blob, raw_end = 0, aligned_end = 0;
    uint64_t end = n.file_offset + n.bytes;
    raw += end > std::max(raw_end, n.file_offset) ? end - std::max(raw_end, n.file_offset) : 0;
    raw_end = std::max(raw_end, end);
    uint64_t ab = RoundDown(n.file_offset, o_.alignment_bytes);
    uint64_t ae = std::min(RoundUp(end, o_.alignment_bytes), std::max(blob_sizes_[n.blob], end));
    aligned += ae > std::max(aligned_end, ab) ? ae - std::max(aligned_end, ab) : 0;
    aligned_end = std::max(aligned_end, ae);
  }
  plan->needed_bytes = raw;
  plan->needed_aligned_bytes = aligned;
}

void Planner::MakeRuns(LoadPlan* plan) {
  NeededStats(plan);
  // One check range per shard span: union the ranges of each shard (they are block-aligned to it).
  SortByBlob(&checks_, blob_ids_.size(), [](const CheckRange& c) { return c.begin; });
  std::vector<CheckRange> checks;
  for (const CheckRange& c : checks_) {
    if (!checks.empty() && checks.back().shard == c.shard && c.begin <= checks.back().end) {
      checks.back().end = std::max(checks.back().end, c.end);
    } else {
      checks.push_back(c);
    }
  }
  size_t ci = 0;
  size_t ni = 0;
  std::vector<Need> carry;
  while (ci < checks.size()) {
    const uint32_t blob = checks[ci].blob;
    size_t cj = ci;
    while (cj < checks.size() && checks[cj].blob == blob) ++cj;
    std::span<const CheckRange> bc(checks.data() + ci, cj - ci);
    std::vector<std::pair<uint64_t, uint64_t>> runs = MergedRuns(blob, bc);
    Split(&runs, bc);
    size_t k = 0;  // next check of this blob
    for (const auto& run_bounds : runs) {
      // Named copies, not structured bindings: the lambda below uses them, which clang before 16
      // does not accept (the fuzzing tier builds with clang 15).
      const uint64_t b = run_bounds.first, e = run_bounds.second;
      ReadRun run{blob_ids_[blob], b, e - b};
      run.first_check = static_cast<uint32_t>(plan->checks.size());
      // Checks that start before this run ends; one cut by a split continues in the next run.
      while (k < bc.size() && bc[k].begin < e) {
        const CheckRange& c = bc[k];
        uint64_t cb = std::max(c.begin, b), ce = std::min(c.end, e);
        plan->checks.push_back(BlockCheck{c.shard, cb - b, (cb - c.shard->offset()) / block_,
                                          (ce - c.shard->offset() + block_ - 1) / block_});
        if (c.end > e) break;
        ++k;
      }
      run.check_count = static_cast<uint32_t>(plan->checks.size()) - run.first_check;
      run.first_copy = plan->copies.size();
      // Needs cut by the previous (adjacent, split) run continue here, before those starting here.
      std::vector<Need> cut;
      auto take = [&](Need n) {
        uint64_t bytes = std::min(n.bytes, e - n.file_offset);
        plan->copies.push_back(RunCopy{n.file_offset - b, n.request, n.dst_offset, bytes});
        if (bytes < n.bytes) {
          n.file_offset += bytes, n.dst_offset += bytes, n.bytes -= bytes;
          cut.push_back(n);
        }
      };
      for (const Need& n : carry) take(n);
      for (; ni < needs_.size() && needs_[ni].blob == blob && needs_[ni].file_offset < e; ++ni) {
        take(needs_[ni]);
      }
      carry = std::move(cut);
      run.copy_count = plan->copies.size() - run.first_copy;
      plan->read_bytes += run.length;
      plan->runs.push_back(run);
    }
    ci = cj;
  }
}

}  // namespace

absl::StatusOr<LoadPlan> PlanLoad(const Manifest& manifest, std::span<const PlanRequest> requests,
                                  const PlanOptions& options) {
  const uint64_t block = manifest.header.checksum_block_bytes();
  if (options.alignment_bytes == 0 || block % options.alignment_bytes != 0 ||
      options.max_run_bytes < 2 * block || options.max_run_bytes % options.alignment_bytes != 0 ||
      !(options.merge_gap_fraction >= 0 && options.merge_gap_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "load plan options: alignment %d bytes, max run %d bytes, merge gap fraction %g do not "
        "fit checksum blocks of %d bytes",
        options.alignment_bytes, options.max_run_bytes, options.merge_gap_fraction, block));
  }
  LoadPlan plan;
  Planner planner(manifest, options);
  CKPTD_RETURN_IF_ERROR(planner.AddRequests(requests, &plan));
  planner.MakeRuns(&plan);
  return plan;
}

}  // namespace ckptd
