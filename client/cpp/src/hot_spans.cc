#include "hot_spans.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "format/crc32c.h"

namespace ckptd::internal {
namespace {

constexpr uint64_t kPieceBytes = 4ull << 20;  // one task of a fused span: whole blocks
constexpr unsigned kThreadsMax = 16;

// One unit of work: blocks [first_block, first_block + blocks) of span `span`.
struct Task {
  int span = 0;
  uint64_t first_block = 0;
  uint64_t blocks = 0;
  bool fused = false;  // one copy that is the whole span: copied straight into the destination
};

absl::Status CheckSpan(const ArenaMapping& arena, const v1::HotSpan& s, int i,
                       std::span<const HotDest> dests) {
  const auto where = [&] { return absl::StrCat("Load answered hot span ", i); };
  if (s.block_bytes() == 0 || s.length() == 0 ||
      static_cast<uint64_t>(s.block_crc32c_size()) != BlockCount(s.length(), s.block_bytes())) {
    return absl::InternalError(absl::StrCat(where(), " with ", s.length(), " bytes, blocks of ",
                                            s.block_bytes(), " and ", s.block_crc32c_size(),
                                            " checksums"));
  }
  absl::StatusOr<uint8_t*> at = arena.At(s.arena_offset(), s.length());
  if (!at.ok()) return absl::InternalError(absl::StrCat(where(), ": ", at.status().message()));
  for (const v1::HotSpanCopy& c : s.copies()) {
    if (c.item() >= dests.size() || dests[c.item()].data == nullptr ||
        c.span_offset() > s.length() || c.bytes() > s.length() - c.span_offset() ||
        c.dst_offset() > dests[c.item()].bytes ||
        c.bytes() > dests[c.item()].bytes - c.dst_offset()) {
      return absl::InternalError(absl::StrCat(where(), ": a copy of ", c.bytes(), " bytes to item ",
                                              c.item(), " at ", c.dst_offset(),
                                              " that does not fit it or the span"));
    }
  }
  return absl::OkStatus();
}

bool IsFused(const v1::HotSpan& s) {
  return s.copies_size() == 1 && s.copies(0).span_offset() == 0 &&
         s.copies(0).bytes() == s.length();
}

std::vector<Task> MakeTasks(const v1::LoadResponse& resp) {
  std::vector<Task> tasks;
  for (int i = 0; i < resp.hot_spans_size(); ++i) {
    const v1::HotSpan& s = resp.hot_spans(i);
    const uint64_t blocks = static_cast<uint64_t>(s.block_crc32c_size());
    if (!IsFused(s)) {
      tasks.push_back(Task{i, 0, blocks, false});
      continue;
    }
    const uint64_t per = std::max<uint64_t>(1, kPieceBytes / s.block_bytes());
    for (uint64_t b = 0; b < blocks; b += per) {
      tasks.push_back(Task{i, b, std::min(per, blocks - b), true});
    }
  }
  return tasks;
}

// Runs one task; false when a block did not verify.
bool RunTask(const ArenaMapping& arena, const v1::HotSpan& s, const Task& t,
             std::span<const HotDest> dests, std::vector<uint8_t>* bounce,
             std::vector<uint32_t>* crcs) {
  const uint64_t block = s.block_bytes();
  const uint64_t off = t.first_block * block;
  const uint64_t n = std::min(s.length() - off, t.blocks * block);
  const uint8_t* src = *arena.At(s.arena_offset() + off, n);  // CheckSpan checked it
  crcs->resize(t.blocks);
  if (t.fused) {
    const v1::HotSpanCopy& c = s.copies(0);
    CopyAndBlockCrcs(dests[c.item()].data + c.dst_offset() + off, src, n, s.block_bytes(),
                     crcs->data());
  } else {
    // Parts of the span go to the destinations: the span into a private copy first, checksummed
    // there, so the parts are taken from the bytes that verified.
    bounce->resize(n);
    std::memcpy(bounce->data(), src, n);
    BlockCrcsInto(bounce->data(), n, s.block_bytes(), crcs->data());
  }
  for (uint64_t b = 0; b < t.blocks; ++b) {
    if ((*crcs)[b] != s.block_crc32c(static_cast<int>(t.first_block + b))) return false;
  }
  if (!t.fused) {
    for (const v1::HotSpanCopy& c : s.copies()) {
      std::memcpy(dests[c.item()].data + c.dst_offset(), bounce->data() + c.span_offset(),
                  c.bytes());
    }
  }
  return true;
}

}  // namespace

unsigned HotCopyThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  unsigned n = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = static_cast<unsigned>(CPU_COUNT(&set));
  if (n == 0) n = std::thread::hardware_concurrency();
  return std::clamp(n, 1u, kThreadsMax);
}

absl::StatusOr<std::vector<bool>> CopyHotSpans(const ArenaMapping& arena,
                                               const v1::LoadResponse& resp,
                                               std::span<const HotDest> dests, unsigned threads) {
  for (int i = 0; i < resp.hot_spans_size(); ++i) {
    absl::Status st = CheckSpan(arena, resp.hot_spans(i), i, dests);
    if (!st.ok()) return st;
  }
  const std::vector<Task> tasks = MakeTasks(resp);
  std::vector<std::atomic<bool>> failed_span(static_cast<size_t>(resp.hot_spans_size()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    std::vector<uint8_t> bounce;
    std::vector<uint32_t> crcs;
    for (size_t t = next++; t < tasks.size(); t = next++) {
      const v1::HotSpan& s = resp.hot_spans(tasks[t].span);
      if (!RunTask(arena, s, tasks[t], dests, &bounce, &crcs)) {
        failed_span[static_cast<size_t>(tasks[t].span)] = true;
      }
    }
  };
  std::vector<std::thread> helpers;
  const size_t extra = std::min<size_t>(std::max(threads, 1u) - 1, tasks.size() / 2);
  for (size_t i = 0; i < extra; ++i) helpers.emplace_back(work);
  work();
  for (std::thread& h : helpers) h.join();
  std::vector<bool> ok(dests.size(), true);
  for (int i = 0; i < resp.hot_spans_size(); ++i) {
    if (!failed_span[static_cast<size_t>(i)]) continue;
    for (const v1::HotSpanCopy& c : resp.hot_spans(i).copies()) ok[c.item()] = false;
  }
  return ok;
}

}  // namespace ckptd::internal
