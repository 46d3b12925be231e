#include "service/hot_direct.h"

#include <algorithm>
#include <deque>

#include "service/run_copy.h"

namespace ckptd {
namespace {

// The check of run `k` whose blocks hold run bytes [off, off + n); plan.checks.size() if none.
uint32_t CheckHolding(const LoadPlan& plan, const ReadRun& run, uint64_t off, uint64_t n,
                      uint32_t block) {
  for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
    const BlockCheck& chk = plan.checks[c];
    if (chk.run_offset <= off && off + n <= chk.run_offset + CheckedBytes(chk, block)) return c;
  }
  return static_cast<uint32_t>(plan.checks.size());
}

// Whether run `k` lies whole in `hot` ranges of `uid`'s segment, each copy inside a check.
bool RunInOwnSegment(const HotCopy& hot, uint32_t uid, const LoadPlan& plan, size_t k,
                     uint32_t block) {
  const ReadRun& run = plan.runs[k];
  for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
    const BlockCheck& chk = plan.checks[c];
    const HotRange* r =
        hot.FindRange(run.blob_id, run.offset + chk.run_offset, CheckedBytes(chk, block));
    if (r == nullptr || r->uid != uid) return false;
  }
  for (uint64_t i = run.first_copy; i < run.first_copy + run.copy_count; ++i) {
    const RunCopy& cp = plan.copies[i];
    if (CheckHolding(plan, run, cp.run_offset, cp.bytes, block) == plan.checks.size()) {
      return false;
    }
  }
  return run.check_count > 0;
}

}  // namespace

HotDirectPlan PlanHotDirect(const HotCopy& hot, uint32_t uid, const LoadPlan& plan,
                            const std::vector<bool>& direct_ok, uint32_t block_bytes) {
  HotDirectPlan d;
  d.run.assign(plan.runs.size(), true);
  d.request.assign(direct_ok.begin(), direct_ok.end());
  // A bad run makes every request it copies to bad, and a bad request every run copying to it.
  std::vector<std::vector<uint32_t>> runs_of(direct_ok.size());
  std::vector<bool> has_run(direct_ok.size(), false);
  std::deque<std::pair<bool, size_t>> bad;  // (is_run, index)
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    const ReadRun& run = plan.runs[k];
    for (uint64_t i = run.first_copy; i < run.first_copy + run.copy_count; ++i) {
      runs_of[plan.copies[i].request].push_back(static_cast<uint32_t>(k));
      has_run[plan.copies[i].request] = true;
    }
    if (!RunInOwnSegment(hot, uid, plan, k, block_bytes)) {
      d.run[k] = false;
      bad.emplace_back(true, k);
    }
  }
  for (size_t r = 0; r < d.request.size(); ++r) {
    if (!d.request[r] || !has_run[r]) {
      d.request[r] = false;
      bad.emplace_back(false, r);
    }
  }
  while (!bad.empty()) {
    const auto [is_run, i] = bad.front();
    bad.pop_front();
    if (is_run) {
      const ReadRun& run = plan.runs[i];
      for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
        const uint32_t r = plan.copies[c].request;
        if (d.request[r]) {
          d.request[r] = false;
          bad.emplace_back(false, r);
        }
      }
    } else {
      for (uint32_t k : runs_of[i]) {
        if (d.run[k]) {
          d.run[k] = false;
          bad.emplace_back(true, k);
        }
      }
    }
  }
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    if (!d.run[k]) continue;
    const ReadRun& run = plan.runs[k];
    d.copies += run.copy_count;
    for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
      d.bytes += plan.copies[c].bytes;
    }
  }
  return d;
}

void AddHotSpans(const HotCopy& hot, const LoadPlan& plan, const HotDirectPlan& d,
                 uint32_t block_bytes, v1::LoadResponse* resp) {
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    if (!d.run[k]) continue;
    const ReadRun& run = plan.runs[k];
    const int first_span = resp->hot_spans_size();
    for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
      const BlockCheck& chk = plan.checks[c];
      const uint64_t n = CheckedBytes(chk, block_bytes);
      const HotRange* r = hot.FindRange(run.blob_id, run.offset + chk.run_offset, n);
      CKPTD_CHECK(r != nullptr);  // PlanHotDirect found it
      v1::HotSpan* s = resp->add_hot_spans();
      s->set_arena_offset(r->arena_offset + (run.offset + chk.run_offset - r->blob_offset));
      s->set_length(n);
      s->set_block_bytes(block_bytes);
      for (uint64_t b = chk.first_block; b < chk.end_block; ++b) {
        s->add_block_crc32c(chk.shard->block_crc32c(static_cast<int>(b)));
      }
    }
    for (uint64_t i = run.first_copy; i < run.first_copy + run.copy_count; ++i) {
      const RunCopy& cp = plan.copies[i];
      const uint32_t c = CheckHolding(plan, run, cp.run_offset, cp.bytes, block_bytes);
      v1::HotSpanCopy* o =
          resp->mutable_hot_spans(first_span + static_cast<int>(c - run.first_check))->add_copies();
      o->set_item(cp.request);
      o->set_span_offset(cp.run_offset - plan.checks[c].run_offset);
      o->set_dst_offset(cp.dst_offset);
      o->set_bytes(cp.bytes);
    }
  }
  for (size_t r = 0; r < d.request.size(); ++r) {
    if (d.request[r]) resp->mutable_items(static_cast<int>(r))->set_hot_direct(true);
  }
}

}  // namespace ckptd
