// Executing one run of a load plan (format/load_plan.h): verify the checksum blocks it uses and
// copy its bytes into the load's destinations, from wherever the run's bytes are (a read buffer,
// the RAM tier's hot extents). The loader (loader.h) drives it for every run it serves.
//
// Pure code over memory: no I/O, no lock. Copies into client memory run under the SIGBUS guard
// (dataplane/memory_guard.h); copies into GPU memory are collected for the caller
// (CopyToDevice). The work of a run is split into pieces (AddRunPieces) that RunPieces executes
// on several threads, so one load's checksums and copies are not bound by one core. Errors:
// DATA_LOSS naming the checkpoint, item and block that did not verify; FAILED_PRECONDITION when
// client memory vanished under a copy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "common/worker_pool.h"
#include "dataplane/gpu_staging.h"
#include "dataplane/memory_guard.h"
#include "format/crc32c.h"
#include "format/load_plan.h"
#include "format/manifest.h"

namespace ckptd {

// Where a plan's requests land: ptr[request] in host memory, or — where device[request] >= 0 —
// a device address on that GPU (ptr is then never dereferenced; gpu copies to it). An empty
// `device`: all host.
struct LoadDests {
  std::span<uint8_t* const> ptr;
  std::span<const int> device;
  GpuStaging* gpu = nullptr;
};

// The item holding shard `s`, for error messages only (a linear scan).
const v1::ItemEntry* ItemOfShard(const Manifest& m, const v1::ShardEntry* s);
// Bytes of check `chk` that are verified (whole blocks; the shard's last may be short).
uint64_t CheckedBytes(const BlockCheck& chk, uint32_t block);
// Makes the GPU copies AddRunPieces collected.
absl::Status CopyToDevice(const Manifest& m, const LoadDests& dst,
                          const std::vector<DeviceCopy>& to_device);

// One independent part of the verify-and-copy work of a load: checksums of some blocks, a
// one-pass copy-and-checksum of some blocks, or a group of plain copies. Runs on any thread
// (RunPieces); captures only pointers into the plan, the manifest and the source and
// destination memory, which outlive it.
using CopyPiece = std::function<absl::Status()>;

// Runs every piece and returns the first error (the others are skipped once one failed). With a
// pool, the calling thread and up to pool->threads() of the pool's take pieces in turn; it
// returns only once no piece is still running. Without one (or when the pool refuses), all run
// on the calling thread, in order. Never called from one of the pool's own threads (a CHECK).
absl::Status RunPieces(WorkerPool* pool, std::span<const CopyPiece> pieces);
// RunPieces and the GPU copies AddRunPieces collected for the same pieces, the GPU copies on one
// of the pool's threads while the pieces verify (a GPU destination may so receive bytes of a
// block that then fails: the load fails, as for the one-pass host copies). Without a pool, the
// GPU copies are made after every piece succeeded. Returns the first error; returns only once
// no copy still reads the source.
absl::Status RunPiecesAndDeviceCopies(WorkerPool* pool, std::span<const CopyPiece> pieces,
                                      const Manifest& m, const LoadDests& dst,
                                      const std::vector<DeviceCopy>& to_device);

namespace run_copy_internal {

struct Context {
  const Manifest* m;
  const LoadPlan* plan;
  const std::string* where;  // where the run's bytes are, for messages
  uint32_t block;
};
// The DATA_LOSS (or other) status for check `chk` failing with `ok`, naming checkpoint, item and
// rank.
absl::Status CheckFailed(const Context& c, const BlockCheck& chk, const absl::Status& ok);
// Verifies blocks [first, first + count) of check `chk` whose bytes are at `data`.
absl::Status VerifyPart(const Context& c, const BlockCheck& chk, const uint8_t* data,
                        uint64_t first, uint64_t count);
// The same where `data` (the check's first byte) is client memory: checksummed under the guard.
absl::Status VerifyInPlacePart(const Context& c, const BlockCheck& chk, const uint8_t* data,
                               uint64_t first, uint64_t count);
// Copies blocks [first, first + count) of check `chk` from `src` to `dst` (client memory, under
// the guard) as it checksums them, then compares them with the manifest's.
absl::Status CopyAndVerifyPart(const Context& c, const BlockCheck& chk, uint8_t* dst,
                               const uint8_t* src, uint64_t first, uint64_t count);
// A whole check copied from `src` to `dst` (client memory) as it is checksummed.
struct FusedCopy {
  const BlockCheck* chk;
  uint8_t* dst;
  const uint8_t* src;
};
// CopyAndVerifyPart of every block of each check, the copies under one guard: small checks (a
// strided load's one-block runs) are batched, since a guard (a signal-mask syscall), a piece and
// a checksum buffer each cost more than copying one 4 KiB block.
absl::Status CopyAndVerifyChecks(const Context& c, std::span<const FusedCopy> copies);
struct PlainCopy {
  uint8_t* dst;
  const uint8_t* src;
  uint64_t bytes;
};
// The copies, in client memory, under one guard.
absl::Status CopyPlain(std::span<const PlainCopy> copies);

}  // namespace run_copy_internal

// Small whole checks copied and verified together (CopyAndVerifyChecks: one piece and one guard
// for many blocks), across the runs of one load: a strided load's runs are often one block each.
// AddRunPieces adds to it and pushes a piece whenever limits::kCopyPieceBytes have gathered; the
// caller calls Flush after its last run (before running the pieces). One load's runs only: every
// Add names the same context.
class FusedBatcher {
 public:
  explicit FusedBatcher(std::vector<CopyPiece>* pieces) : pieces_(pieces) {}
  void Add(const run_copy_internal::Context& ctx, const run_copy_internal::FusedCopy& f,
           uint64_t bytes) {
    ctx_ = ctx;
    copies_.push_back(f);
    bytes_ += bytes;
    if (bytes_ >= limits::kCopyPieceBytes) Flush();
  }
  void Flush() {
    if (copies_.empty()) return;
    pieces_->push_back([ctx = ctx_, copies = std::move(copies_)] {
      return run_copy_internal::CopyAndVerifyChecks(ctx, copies);
    });
    copies_ = {};
    bytes_ = 0;
  }

 private:
  std::vector<CopyPiece>* pieces_;
  run_copy_internal::Context ctx_{};
  std::vector<run_copy_internal::FusedCopy> copies_;
  uint64_t bytes_ = 0;
};

// Whether copy `cp` lands in host memory (not on a GPU).
inline bool IsHostCopy(const LoadDests& dst, const RunCopy& cp) {
  return dst.device.empty() || dst.device[cp.request] < 0;
}

// A check of a run whose bytes go whole to one host copy (the whole-shard case): checksummed and
// copied in one pass.
struct FusedPair {
  uint32_t check;
  uint64_t copy;
};
// The fused pairs of run `k` (each copy in at most one, each check in at most one), in check
// order. Inline for a few (a strided load's runs are one check and one copy each: no allocation
// per run).
using FusedPairList = absl::InlinedVector<FusedPair, 4>;
FusedPairList FusedPairs(const LoadPlan& plan, size_t k, const LoadDests& dst, uint32_t block);

// Reading straight into the destination (no bounce copy): for each copy of `plan` (indexed like
// plan.copies), how many of its leading bytes are read from storage straight into its
// destination and verified there, 0 for none. A copy qualifies when it is a fused pair's (its
// bytes are exactly one check's, to host memory), its destination and its file offset are
// limits::kAlignmentBytes-aligned (O_DIRECT's rule), and it has at least
// limits::kDirectReadBytesMin bytes, and no other copy of its run (host or GPU) takes any of
// those bytes (a load asking for the same bytes twice: the other copy is made from the read
// buffer, so they are read there); the bytes are its whole checksum blocks (the shard's short
// last block, if any, goes through the read buffer).
std::vector<uint64_t> DirectPrefixes(const LoadPlan& plan, const LoadDests& dst, uint32_t block);

// Adds the work of run `k` to `pieces`: its blocks verified and its bytes copied to their
// destinations; at(run_offset, n) is where the run's bytes [run_offset, run_offset + n) are (in a
// read buffer or the RAM tier), called now, not by the pieces. Pieces are at most about
// limits::kCopyPieceBytes (split at checksum-block bounds), so one big shard is many pieces. A
// check whose bytes go whole to one host destination (the whole-shard case) is checksummed and
// copied in one pass (CopyAndBlockCrcs: about 1.6 memcpys against 2.2 for a checksum pass and a
// copy, bench/verify_copy_bench.cc); the others are verified, and their copies made in groups
// under one SIGBUS guard each (a guard costs a signal-mask syscall: one per copy was a syscall per
// row of a column-sliced load). A block that fails fails the load (DATA_LOSS) even when its bytes
// were already copied (pieces run in any order): the caller never uses a failed load's
// destinations, or overwrites them from storage. Copies into GPU memory (dst.device[request] >=
// 0; dst.ptr is then a device address) are added to `to_device` for the caller to make once every
// piece succeeded (or, on a pool, while they run: RunPiecesAndDeviceCopies), before the source is
// reused. `where` must outlive the pieces. in_place (empty, or indexed like plan.copies, as
// DirectPrefixes answers): leading bytes of a fused copy already read into its destination; their
// blocks are verified there (under the guard) instead of copied. `batch` (optional) gathers the
// run's small whole checks with other runs' (the caller flushes it); without one they are
// batched within this run.
template <typename At>
void AddRunPieces(const Manifest& m, const LoadPlan& plan, size_t k, const At& at,
                  const LoadDests& dst, const std::string* where, std::vector<CopyPiece>* pieces,
                  std::vector<DeviceCopy>* to_device, std::span<const uint64_t> in_place = {},
                  FusedBatcher* batch = nullptr) {
  using run_copy_internal::FusedCopy;
  using run_copy_internal::PlainCopy;
  const run_copy_internal::Context ctx{&m, &plan, where, m.header.checksum_block_bytes()};
  const uint32_t block = ctx.block;
  const uint64_t blocks_per_piece = std::max<uint64_t>(1, limits::kCopyPieceBytes / block);
  const ReadRun& run = plan.runs[k];
  const FusedPairList pairs = FusedPairs(plan, k, dst, block);  // in check order
  absl::InlinedVector<uint64_t, 4> fused;                       // their copies, sorted
  for (const FusedPair& f : pairs) fused.push_back(f.copy);
  std::sort(fused.begin(), fused.end());
  size_t next_pair = 0;
  // Whole checks smaller than a piece, copied and verified together (CopyAndVerifyChecks).
  FusedBatcher own(pieces);
  FusedBatcher* small = batch != nullptr ? batch : &own;
  for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
    const BlockCheck* chk = &plan.checks[c];
    const uint64_t n = CheckedBytes(*chk, block);
    const uint8_t* src = at(chk->run_offset, n);
    uint8_t* to = nullptr;
    uint64_t ready = 0;  // leading blocks already read into `to`: verified there
    if (next_pair < pairs.size() && pairs[next_pair].check == c) {
      const uint64_t copy = pairs[next_pair++].copy;
      const RunCopy& cp = plan.copies[copy];
      to = dst.ptr[cp.request] + cp.dst_offset;
      if (!in_place.empty()) ready = in_place[copy] / block;
    }
    const uint64_t blocks = BlockCount(n, block);
    if (to != nullptr && ready == 0 && blocks < blocks_per_piece) {
      small->Add(ctx, FusedCopy{chk, to, src}, n);
      continue;
    }
    for (uint64_t first = 0; first < blocks;) {
      const uint64_t end =
          std::min({first + blocks_per_piece, blocks, first < ready ? ready : blocks});
      const uint64_t count = end - first;
      if (first < ready) {
        pieces->push_back([ctx, chk, to, first, count] {
          return run_copy_internal::VerifyInPlacePart(ctx, *chk, to, first, count);
        });
      } else if (to != nullptr) {
        pieces->push_back([ctx, chk, to, src, first, count] {
          return run_copy_internal::CopyAndVerifyPart(ctx, *chk, to, src, first, count);
        });
      } else {
        pieces->push_back([ctx, chk, src, first, count] {
          return run_copy_internal::VerifyPart(ctx, *chk, src, first, count);
        });
      }
      first = end;
    }
  }
  own.Flush();
  std::vector<PlainCopy> group;
  uint64_t group_bytes = 0;
  auto flush_group = [&] {
    if (group.empty()) return;
    pieces->push_back([copies = std::move(group)] { return run_copy_internal::CopyPlain(copies); });
    group = {};
    group_bytes = 0;
  };
  for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
    const RunCopy& cp = plan.copies[c];
    if (!IsHostCopy(dst, cp)) {
      to_device->push_back({dst.device[cp.request],
                            GpuCopy{reinterpret_cast<uint64_t>(dst.ptr[cp.request]) + cp.dst_offset,
                                    const_cast<uint8_t*>(at(cp.run_offset, cp.bytes)), cp.bytes}});
      continue;
    }
    if (std::binary_search(fused.begin(), fused.end(), c)) continue;
    const uint8_t* src = at(cp.run_offset, cp.bytes);
    for (uint64_t off = 0; off < cp.bytes; off += limits::kCopyPieceBytes) {
      const uint64_t n = std::min<uint64_t>(limits::kCopyPieceBytes, cp.bytes - off);
      group.push_back({dst.ptr[cp.request] + cp.dst_offset + off, src + off, n});
      group_bytes += n;
      if (group_bytes >= limits::kCopyPieceBytes) flush_group();
    }
  }
  flush_group();
}

// The runs [begin, end) of `plan` that `keep` selects, with their checks and copies (re-indexed).
template <typename Keep>
LoadPlan SelectRuns(const LoadPlan& plan, size_t begin, size_t end, const Keep& keep) {
  LoadPlan out;
  for (size_t k = begin; k < end; ++k) {
    if (!keep(k)) continue;
    ReadRun r = plan.runs[k];
    out.checks.insert(out.checks.end(), plan.checks.begin() + r.first_check,
                      plan.checks.begin() + r.first_check + r.check_count);
    out.copies.insert(out.copies.end(), plan.copies.begin() + static_cast<long>(r.first_copy),
                      plan.copies.begin() + static_cast<long>(r.first_copy + r.copy_count));
    r.first_check = static_cast<uint32_t>(out.checks.size() - r.check_count);
    r.first_copy = out.copies.size() - r.copy_count;
    out.read_bytes += r.length;
    out.runs.push_back(r);
  }
  out.request_bytes = plan.request_bytes;
  return out;
}

}  // namespace ckptd
