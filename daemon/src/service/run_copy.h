// Executing one run of a load plan (format/load_plan.h): verify the checksum blocks it uses and
// copy its bytes into the load's destinations, from wherever the run's bytes are (a read buffer,
// the RAM tier's hot extents). The loader (loader.h) drives it for every run it serves.
//
// Pure code over memory: no I/O, no lock. Copies into client memory run under the SIGBUS guard
// (dataplane/memory_guard.h); copies into GPU memory are collected for the caller
// (CopyToDevice). Errors: DATA_LOSS naming the checkpoint, item and block that did not verify;
// FAILED_PRECONDITION when client memory vanished under a copy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
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
// Makes the GPU copies VerifyAndCopyRun collected.
absl::Status CopyToDevice(const Manifest& m, const LoadDests& dst,
                          const std::vector<DeviceCopy>& to_device);

// Verifies the blocks of run `k` and copies its bytes to their destinations; at(run_offset, n)
// is where the run's bytes [run_offset, run_offset + n) are (in a read buffer or the RAM tier).
// A check whose bytes go whole to one host destination (the whole-shard case) is checksummed
// and copied in one pass (CopyAndBlockCrcs: about 1.6 memcpys against 2.2 for a checksum pass
// and a copy, bench/verify_copy_bench.cc); the others are verified, then copied. A block that
// fails fails the load (DATA_LOSS) even when its bytes were already copied: the caller never uses
// a failed load's destinations (or overwrites them from storage). The copies into client memory
// run under one SIGBUS guard per run (a guard costs a signal-mask syscall: one per copy was a
// syscall per row of a column-sliced load). Copies into GPU memory (dst.device[request] >= 0;
// dst.ptr is then a device address) are added to `to_device` for the caller to make before the
// source is reused.
template <typename At>
absl::Status VerifyAndCopyRun(const Manifest& m, const LoadPlan& plan, size_t k, const At& at,
                              const LoadDests& dst, const std::string& where,
                              std::vector<DeviceCopy>* to_device) {
  const uint32_t block = m.header.checksum_block_bytes();
  const ReadRun& run = plan.runs[k];
  auto host_dest = [&](const RunCopy& cp) {
    return dst.device.empty() || dst.device[cp.request] < 0;
  };
  // The one host copy of exactly each check's bytes, if any: copied as it is checksummed.
  absl::flat_hash_map<uint64_t, uint64_t> copy_at;  // run offset -> copy, host copies only
  for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
    if (host_dest(plan.copies[c])) copy_at.emplace(plan.copies[c].run_offset, c);
  }
  struct Fused {
    uint32_t check;
    uint64_t copy;
  };
  std::vector<Fused> fused;
  absl::flat_hash_set<uint64_t> fused_copies;
  auto failed = [&](const BlockCheck& chk, const absl::Status& ok) {
    // The item's name is looked up only for the message (a scan of the manifest).
    return absl::Status(
        ok.code(), absl::StrCat("checkpoint ", m.header.job(), "/", m.header.step(), " item \"",
                                ItemOfShard(m, chk.shard)->name(), "\" (saved by rank ",
                                chk.shard->saved_by_rank(), ") in ", where, ok.message()));
  };
  auto verify = [&](const BlockCheck& chk) {
    const uint64_t n = CheckedBytes(chk, block);
    return VerifyBlocks(at(chk.run_offset, n), chk.first_block, n, chk.shard->length(),
                        std::span<const uint32_t>(chk.shard->block_crc32c().data(),
                                                  chk.shard->block_crc32c().size()),
                        block, "");
  };
  for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
    const BlockCheck& chk = plan.checks[c];
    auto it = copy_at.find(chk.run_offset);
    if (it != copy_at.end() && plan.copies[it->second].bytes == CheckedBytes(chk, block) &&
        fused_copies.insert(it->second).second) {
      fused.push_back({c, it->second});
      continue;
    }
    if (absl::Status ok = verify(chk); !ok.ok()) return failed(chk, ok);
  }
  struct Work {
    const LoadPlan& plan;
    const At& at;
    const LoadDests& dst;
    uint32_t block;
    std::vector<Fused> fused;
    std::vector<const RunCopy*> plain;
    std::vector<uint32_t> crcs;
    std::optional<uint32_t> mismatch;  // a fused check whose blocks did not verify
  } w{plan, at, dst, block, std::move(fused), {}, {}, std::nullopt};
  for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
    const RunCopy& cp = plan.copies[c];
    if (!host_dest(cp)) {
      to_device->push_back({dst.device[cp.request],
                            GpuCopy{reinterpret_cast<uint64_t>(dst.ptr[cp.request]) + cp.dst_offset,
                                    const_cast<uint8_t*>(at(cp.run_offset, cp.bytes)), cp.bytes}});
    } else if (!fused_copies.contains(c)) {
      w.plain.push_back(&cp);
    }
  }
  if (w.fused.empty() && w.plain.empty()) return absl::OkStatus();
  CKPTD_RETURN_IF_ERROR(GuardClientMemory(
      [](void* arg) {
        Work& w = *static_cast<Work*>(arg);
        for (const Fused& f : w.fused) {
          const BlockCheck& chk = w.plan.checks[f.check];
          const RunCopy& cp = w.plan.copies[f.copy];
          w.crcs.resize(BlockCount(cp.bytes, w.block));
          CopyAndBlockCrcs(w.dst.ptr[cp.request] + cp.dst_offset, w.at(cp.run_offset, cp.bytes),
                           cp.bytes, w.block, w.crcs.data());
          if (!std::equal(w.crcs.begin(), w.crcs.end(),
                          chk.shard->block_crc32c().begin() + static_cast<int>(chk.first_block))) {
            w.mismatch = f.check;
            return;
          }
        }
        for (const RunCopy* cp : w.plain) {
          std::memcpy(w.dst.ptr[cp->request] + cp->dst_offset, w.at(cp->run_offset, cp->bytes),
                      cp->bytes);
        }
      },
      &w, "load destination"));
  if (w.mismatch) {
    // Verified again from the source, for the message naming the block.
    const BlockCheck& chk = plan.checks[*w.mismatch];
    absl::Status ok = verify(chk);
    return failed(chk, ok.ok() ? absl::DataLossError(": a block changed while it was copied") : ok);
  }
  return absl::OkStatus();
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
