#include "service/run_copy.h"

#include <atomic>
#include <future>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {

const v1::ItemEntry* ItemOfShard(const Manifest& m, const v1::ShardEntry* s) {
  for (const v1::ItemEntry& item : m.items) {
    for (const v1::ShardEntry& e : item.shards()) {
      if (&e == s) return &item;
    }
  }
  return nullptr;
}

uint64_t CheckedBytes(const BlockCheck& chk, uint32_t block) {
  return std::min<uint64_t>(chk.end_block * block, chk.shard->length()) - chk.first_block * block;
}

absl::Status CopyToDevice(const Manifest& m, const LoadDests& dst,
                          const std::vector<DeviceCopy>& to_device) {
  if (to_device.empty()) return absl::OkStatus();
  CKPTD_CHECK(dst.gpu != nullptr);  // ResolveDest hands out device destinations only with one
  return Annotate(dst.gpu->CopyToDevice(to_device),
                  absl::StrCat("checkpoint ", m.header.job(), "/", m.header.step(),
                               ": copying into GPU memory"));
}

namespace {

// The pieces of one RunPieces call, shared with the pool's helpers: a helper that starts after
// every piece was taken finds none left and never touches the (by then gone) span.
struct PieceRun {
  explicit PieceRun(std::span<const CopyPiece> p) : pieces(p) {}
  const std::span<const CopyPiece> pieces;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  size_t done ABSL_GUARDED_BY(mu) = 0;
  absl::Status first ABSL_GUARDED_BY(mu);

  void Work() {
    for (size_t i = next.fetch_add(1); i < pieces.size(); i = next.fetch_add(1)) {
      absl::Status st = failed.load() ? absl::OkStatus() : pieces[i]();
      absl::MutexLock lock(&mu);
      if (!st.ok() && first.ok()) {
        first = std::move(st);
        failed.store(true);
      }
      ++done;
    }
  }
};

}  // namespace

absl::Status RunPieces(WorkerPool* pool, std::span<const CopyPiece> pieces) {
  if (pool == nullptr || pieces.size() < 2) {
    for (const CopyPiece& piece : pieces) CKPTD_RETURN_IF_ERROR(piece());
    return absl::OkStatus();
  }
  CKPTD_CHECK(!pool->OnPoolThread());
  auto run = std::make_shared<PieceRun>(pieces);
  const size_t helpers = std::min(pool->threads(), pieces.size() - 1);
  for (size_t h = 0; h < helpers; ++h) {
    // Refused when the pool's queue is full (other loads' helpers): this thread does the rest.
    if (!pool->Post([run] { run->Work(); }, WorkerPool::WhenFull::kRefuse).ok()) break;
  }
  run->Work();
  absl::MutexLock lock(&run->mu);
  run->mu.Await(absl::Condition(
      +[](PieceRun* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu) { return r->done == r->pieces.size(); },
      run.get()));
  return run->first;
}

absl::Status RunPiecesAndDeviceCopies(WorkerPool* pool, std::span<const CopyPiece> pieces,
                                      const Manifest& m, const LoadDests& dst,
                                      const std::vector<DeviceCopy>& to_device) {
  if (pool == nullptr || to_device.empty()) {
    CKPTD_RETURN_IF_ERROR(RunPieces(pool, pieces));
    return CopyToDevice(m, dst, to_device);
  }
  // Posted first, so the device copy starts while the pieces are still queued behind it.
  absl::StatusOr<std::future<absl::Status>> copying =
      pool->Submit([&m, &dst, &to_device] { return CopyToDevice(m, dst, to_device); },
                   WorkerPool::WhenFull::kWait);
  absl::Status verified = RunPieces(pool, pieces);
  absl::Status copied = copying.ok() ? copying->get() : CopyToDevice(m, dst, to_device);
  return verified.ok() ? copied : verified;
}

namespace run_copy_internal {

absl::Status CheckFailed(const Context& c, const BlockCheck& chk, const absl::Status& ok) {
  // The item's name is looked up only for the message (a scan of the manifest).
  return absl::Status(
      ok.code(), absl::StrCat("checkpoint ", c.m->header.job(), "/", c.m->header.step(), " item \"",
                              ItemOfShard(*c.m, chk.shard)->name(), "\" (saved by rank ",
                              chk.shard->saved_by_rank(), ") in ", *c.where, ok.message()));
}

namespace {

// Bytes of blocks [first, first + count) of `chk`.
uint64_t PartBytes(const Context& c, const BlockCheck& chk, uint64_t first, uint64_t count) {
  return std::min(CheckedBytes(chk, c.block) - first * c.block, count * c.block);
}

std::span<const uint32_t> Crcs(const BlockCheck& chk) {
  return {chk.shard->block_crc32c().data(), static_cast<size_t>(chk.shard->block_crc32c().size())};
}

}  // namespace

absl::Status VerifyPart(const Context& c, const BlockCheck& chk, const uint8_t* data,
                        uint64_t first, uint64_t count) {
  const uint64_t off = first * c.block;
  absl::Status ok =
      VerifyBlocks(data + off, chk.first_block + first, PartBytes(c, chk, first, count),
                   chk.shard->length(), Crcs(chk), c.block, "");
  return ok.ok() ? ok : CheckFailed(c, chk, ok);
}

absl::Status VerifyInPlacePart(const Context& c, const BlockCheck& chk, const uint8_t* data,
                               uint64_t first, uint64_t count) {
  struct Work {
    const uint8_t* data;
    uint64_t bytes;
    uint32_t block;
    uint32_t* crcs;
  };
  std::vector<uint32_t> crcs(count);  // allocated outside the guard
  Work w{data + first * c.block, PartBytes(c, chk, first, count), c.block, crcs.data()};
  CKPTD_RETURN_IF_ERROR(GuardClientMemory(
      [](void* arg) {
        const Work& w = *static_cast<const Work*>(arg);
        BlockCrcsInto(w.data, w.bytes, w.block, w.crcs);
      },
      &w, "load destination"));
  const std::span<const uint32_t> want = Crcs(chk);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t b = chk.first_block + first + i;
    if (crcs[i] != want[b]) {
      return CheckFailed(
          c, chk,
          absl::DataLossError(absl::StrFormat(
              ": block %d crc32c mismatch: expected 0x%08x, actual 0x%08x", b, want[b], crcs[i])));
    }
  }
  return absl::OkStatus();
}

absl::Status CopyAndVerifyPart(const Context& c, const BlockCheck& chk,
                               uint8_t* dst,  // NOLINT(readability-non-const-parameter): written
                                              // through Work::dst, under the guard
                               const uint8_t* src, uint64_t first, uint64_t count) {
  const uint64_t off = first * c.block;
  struct Work {
    uint8_t* dst;
    const uint8_t* src;
    uint64_t bytes;
    uint32_t block;
    uint32_t* crcs;
  };
  std::vector<uint32_t> crcs(count);  // allocated outside the guard
  Work w{dst + off, src + off, PartBytes(c, chk, first, count), c.block, crcs.data()};
  CKPTD_RETURN_IF_ERROR(GuardClientMemory(
      [](void* arg) {
        const Work& w = *static_cast<const Work*>(arg);
        CopyAndBlockCrcs(w.dst, w.src, w.bytes, w.block, w.crcs);
      },
      &w, "load destination"));
  const std::span<const uint32_t> want = Crcs(chk);
  if (std::equal(crcs.begin(), crcs.end(),
                 want.begin() + static_cast<long>(chk.first_block + first))) {
    return absl::OkStatus();
  }
  // Verified again from the source, for the message naming the block.
  absl::Status ok = VerifyPart(c, chk, src, first, count);
  return ok.ok() ? CheckFailed(c, chk, absl::DataLossError(": a block changed while it was copied"))
                 : ok;
}

absl::Status CopyAndVerifyChecks(const Context& c, std::span<const FusedCopy> copies) {
  struct Work {
    std::span<const FusedCopy> copies;
    uint32_t block;
    uint32_t* crcs;
  };
  uint64_t total = 0;
  for (const FusedCopy& f : copies) total += BlockCount(CheckedBytes(*f.chk, c.block), c.block);
  std::vector<uint32_t> crcs(total);  // allocated outside the guard
  Work w{copies, c.block, crcs.data()};
  CKPTD_RETURN_IF_ERROR(GuardClientMemory(
      [](void* arg) {
        const Work& w = *static_cast<const Work*>(arg);
        uint32_t* out = w.crcs;
        for (const FusedCopy& f : w.copies) {
          const uint64_t n = CheckedBytes(*f.chk, w.block);
          CopyAndBlockCrcs(f.dst, f.src, n, w.block, out);
          out += BlockCount(n, w.block);
        }
      },
      &w, "load destination"));
  const uint32_t* got = crcs.data();
  for (const FusedCopy& f : copies) {
    const uint64_t count = BlockCount(CheckedBytes(*f.chk, c.block), c.block);
    const std::span<const uint32_t> want = Crcs(*f.chk);
    if (!std::equal(got, got + count, want.begin() + static_cast<long>(f.chk->first_block))) {
      // Verified again from the source, for the message naming the block.
      absl::Status ok = VerifyPart(c, *f.chk, f.src, 0, count);
      return ok.ok() ? CheckFailed(c, *f.chk,
                                   absl::DataLossError(": a block changed while it was copied"))
                     : ok;
    }
    got += count;
  }
  return absl::OkStatus();
}

absl::Status CopyPlain(std::span<const PlainCopy> copies) {
  return GuardClientMemory(
      [](void* arg) {
        for (const PlainCopy& cp : *static_cast<std::span<const PlainCopy>*>(arg)) {
          std::memcpy(cp.dst, cp.src, cp.bytes);
        }
      },
      &copies, "load destination");
}

}  // namespace run_copy_internal

FusedPairList FusedPairs(const LoadPlan& plan, size_t k, const LoadDests& dst, uint32_t block) {
  const ReadRun& run = plan.runs[k];
  FusedPairList pairs;
  auto fits = [&](const BlockCheck& chk, uint64_t c) {
    const RunCopy& cp = plan.copies[c];
    return IsHostCopy(dst, cp) && cp.run_offset == chk.run_offset &&
           cp.bytes == CheckedBytes(chk, block);
  };
  if (run.copy_count <= 64 && run.copy_count * run.check_count <= 256) {
    // Few: a scan, the copies taken marked in a mask (the common case: no allocation).
    uint64_t taken = 0;
    for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
      for (uint64_t i = 0; i < run.copy_count; ++i) {
        if ((taken >> i & 1) == 0 && fits(plan.checks[c], run.first_copy + i)) {
          pairs.push_back({c, run.first_copy + i});
          taken |= uint64_t{1} << i;
          break;
        }
      }
    }
    return pairs;
  }
  absl::flat_hash_map<uint64_t, uint64_t> copy_at;  // run offset -> copy, host copies only
  for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
    if (IsHostCopy(dst, plan.copies[c])) copy_at.emplace(plan.copies[c].run_offset, c);
  }
  for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
    const BlockCheck& chk = plan.checks[c];
    auto it = copy_at.find(chk.run_offset);
    if (it != copy_at.end() && fits(chk, it->second)) {
      pairs.push_back({c, it->second});
      copy_at.erase(it);  // one check per copy
    }
  }
  return pairs;
}

namespace {

// Whether a copy's bytes of run `k` also go to another copy of the run (host or GPU): such bytes
// must be in the read buffer, since that other copy is made from there.
class RunOverlaps {
 public:
  RunOverlaps(const LoadPlan& plan, size_t k) {
    const ReadRun& run = plan.runs[k];
    for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
      spans_.push_back(
          {plan.copies[c].run_offset, plan.copies[c].run_offset + plan.copies[c].bytes});
    }
    std::sort(spans_.begin(), spans_.end());
    uint64_t max_end = 0;
    for (const auto& [b, e] : spans_) max_end_.push_back(max_end = std::max(max_end, e));
  }
  // Whether bytes [begin, end) of the copy starting at `begin` reach another copy's.
  bool Shared(uint64_t begin, uint64_t end) const {
    auto first_at = [this](uint64_t off) {
      return static_cast<size_t>(
          std::lower_bound(spans_.begin(), spans_.end(), std::pair(off, uint64_t{0})) -
          spans_.begin());
    };
    const size_t lo = first_at(begin), hi = first_at(end);
    // One copy starting before `begin` ends after it, or another starts inside (the copy itself
    // is the one starting at `begin`).
    return (lo > 0 && max_end_[lo - 1] > begin) || hi - lo > 1;
  }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> spans_;  // [start, end) of each copy, sorted
  std::vector<uint64_t> max_end_;                     // the furthest end of spans_[0..i]
};

}  // namespace

std::vector<uint64_t> DirectPrefixes(const LoadPlan& plan, const LoadDests& dst, uint32_t block) {
  std::vector<uint64_t> in_place(plan.copies.size(), 0);
  const uint64_t align = limits::kAlignmentBytes;
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    std::optional<RunOverlaps> overlaps;  // built for the first copy that qualifies otherwise
    for (const FusedPair& f : FusedPairs(plan, k, dst, block)) {
      const RunCopy& cp = plan.copies[f.copy];
      const uint64_t whole = cp.bytes / block * block;
      const auto to = reinterpret_cast<uintptr_t>(dst.ptr[cp.request] + cp.dst_offset);
      if (whole >= limits::kDirectReadBytesMin && to % align == 0 &&
          (plan.runs[k].offset + cp.run_offset) % align == 0) {
        if (!overlaps) overlaps.emplace(plan, k);
        if (!overlaps->Shared(cp.run_offset, cp.run_offset + whole)) in_place[f.copy] = whole;
      }
    }
  }
  return in_place;
}

}  // namespace ckptd
