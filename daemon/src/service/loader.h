// Loader: executes a Load against a verified manifest (docs/DESIGN.md "Load"): resolves each
// requested item and its destination (an arena extent or a registered region, leased for the whole
// load), plans the reads (format/load_plan.h: only the byte runs needed, coalesced), reads them in
// batches of at most options.load_buffer_bytes — the next batch prefetched on the reader pool
// ("reader-<i>", long-lived threads each keeping its io_uring ring) while this one is verified
// (ReadPlan) — verifies every checksum block used and copies into the destinations, in pieces
// on the load's thread and the copy pool ("copy-<i>", load_copy_threads - 1 threads). The catalog's
// side (access, "latest", the manifest) stays in CheckpointService.
//
// Ownership: borrows options, storage, arena and regions (they outlive it); owns the pool of
// reusable load buffers, the reader pool and the copy pool (joined when the loader is destroyed).
// Threads: any thread, concurrently (each Load runs on its caller's thread; prefetched batches on
// the reader pool, waiting for a reader when all are busy); the only lock is load_buffers_mu_, held
// only to take or return a buffer. Errors (Load): NOT_FOUND for an item not in the checkpoint or a
// per-rank object not saved by the rank asked; INVALID_ARGUMENT / OUT_OF_RANGE for a bad region or
// destination; the arena's and region registry's lease errors; RESOURCE_EXHAUSTED when no read
// buffer can be allocated; DATA_LOSS when a block does not verify; the storage's read errors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/storage.h"
#include "ckptd/v1/ckptd.pb.h"
#include "common/align.h"
#include "dataplane/arena.h"
#include "dataplane/gpu_staging.h"
#include "dataplane/region_registry.h"
#include "format/load_plan.h"
#include "format/manifest.h"
#include "io/reader_pool.h"
#include "options.h"
#include "service/run_copy.h"
#include "tier/ram_tier.h"

namespace ckptd {

// A lease on client memory (RegionLease or ExtentLease) held for one operation.
using MemoryLease = std::shared_ptr<const void>;

class Loader {
 public:
  // `gpu` may be null: no GPU destinations.
  Loader(const DaemonOptions* options, Storage* storage, StagingArena* arena,
         RegionRegistry* regions, GpuStaging* gpu = nullptr);

  // Loads req.items() of `m` (verified, COMMITTED) into their destinations in `session`'s
  // memory: the runs `hot` holds (the RAM tier's pinned copy; may be null) are verified where
  // they are and copied from there (CopyFromRam), the others read from `tiers` (fastest first;
  // see ReadPlan). Fills resp's items and byte counts (not its step); bytes read from `remote` go
  // to bytes_read_remote too, from `peers` (may be null) to bytes_read_peer, those copied from
  // `hot` (by the daemon or, for spans, the client) to bytes_from_ram. When a hot block does
  // not verify, *hot_failed is set, the error logged and the whole load read from `tiers`.
  // Items asking hot_direct whose bytes lie in `hot` in the segment of `uid` (the caller's) are
  // not copied: their spans go to resp->hot_spans for the client to copy (service/hot_direct.h;
  // the caller leases `hot` to the session while the client copies).
  absl::Status Load(const std::string& session, uint32_t uid, const Manifest& m,
                    const v1::LoadRequest& req, std::span<Storage* const> tiers,
                    const Storage* remote, const Storage* peers, const HotCopy* hot,
                    bool* hot_failed, v1::LoadResponse* resp) ABSL_LOCKS_EXCLUDED(load_buffers_mu_);
  // The runs of `plan` whose every checked block and copy lies in `hot`: their blocks verified
  // in place, then copied into `dst`; served[k] set for each (sized like plan.runs), *bytes
  // counts their bytes. DATA_LOSS when a block does not verify (destinations may then hold
  // some bytes already).
  absl::Status CopyFromRam(const HotCopy& hot, const Manifest& m, const LoadPlan& plan,
                           const LoadDests& dst, std::vector<bool>* served, uint64_t* bytes) const;
  // Plan options for manifests with checksum blocks of `block_bytes`.
  PlanOptions LoadPlanOptions(uint32_t block_bytes) const;
  // Executes a plan of `m`: reads its runs in batches of at most options.load_buffer_bytes (the
  // next batch on a second thread while this one is verified), verifies every block used and
  // copies into dst[request] (each sized plan.request_bytes). Reshard reads through it too.
  // Reads from tiers[0]; when that fails with NOT_FOUND (a blob missing) or DATA_LOSS (a block
  // that does not verify, a short blob), logs it and reads the plan again blob by blob, each
  // blob from the first tier whose copy of it reads and verifies (the destinations are
  // overwritten with verified bytes): one bad local blob costs a remote read of that blob only.
  // bytes_read[i] counts what was read from tiers[i] (sized like tiers). Empty `tiers`: the
  // loader's own storage only.
  absl::Status ReadPlan(const Manifest& m, const LoadPlan& plan, std::span<uint8_t* const> dst,
                        std::span<Storage* const> tiers, std::span<uint64_t> bytes_read)
      ABSL_LOCKS_EXCLUDED(load_buffers_mu_);
  // The same with destinations that may be in GPU memory.
  absl::Status ReadPlan(const Manifest& m, const LoadPlan& plan, const LoadDests& dst,
                        std::span<Storage* const> tiers, std::span<uint64_t> bytes_read)
      ABSL_LOCKS_EXCLUDED(load_buffers_mu_);

 private:
  // The runs of `plan` the daemon copies from `hot` (CopyFromRam), after the client's
  // (hot_direct items) are answered as spans; `direct_ok` per request. *rest: the runs neither
  // serves. DATA_LOSS (no span left in resp) when a hot block does not verify.
  absl::Status ServeFromRam(const HotCopy& hot, uint32_t uid, const Manifest& m,
                            const LoadPlan& plan, const LoadDests& dst,
                            const std::vector<bool>& direct_ok, LoadPlan* rest,
                            v1::LoadResponse* resp) const;
  // Checks one requested item and its destination; fills the planner's request, the destination
  // pointer (nullptr for 0 bytes) and the answer's entry.
  absl::Status ResolveLoadItem(const std::string& session, const Manifest& m,
                               const v1::LoadItemRequest& req, uint32_t rank,
                               std::vector<MemoryLease>* leases, PlanRequest* request,
                               uint8_t** dst, int* device, v1::LoadedItem* out) const;
  // The destination's address; *device set to its GPU for a CUDA region (the address is then a
  // device address).
  absl::StatusOr<uint8_t*> ResolveDest(const std::string& session, const v1::MemRef& ref,
                                       uint64_t need_bytes, std::vector<MemoryLease>* leases,
                                       const std::string& what, int* device) const;
  // A read buffer of at least `bytes` for a load. Buffers of load_buffer_bytes are kept for
  // reuse after their first use (touched once, so later loads do not fault them in page by
  // page), at most two per load thread; larger ones are allocated for the one load. Null when
  // memory is exhausted.
  // ReadPlan from one storage.
  absl::Status ReadPlanFrom(Storage* storage, const Manifest& m, const LoadPlan& plan,
                            const LoadDests& dst, uint64_t* bytes_read)
      ABSL_LOCKS_EXCLUDED(load_buffers_mu_);
  AlignedBuffer AcquireLoadBuffer(uint64_t bytes) ABSL_LOCKS_EXCLUDED(load_buffers_mu_);
  void ReturnLoadBuffer(AlignedBuffer buf, uint64_t bytes) ABSL_LOCKS_EXCLUDED(load_buffers_mu_);

  const DaemonOptions* const options_;
  Storage* const storage_;
  StagingArena* const arena_;
  RegionRegistry* const regions_;
  GpuStaging* const gpu_;
  absl::Mutex load_buffers_mu_;
  std::vector<AlignedBuffer> load_buffers_ ABSL_GUARDED_BY(load_buffers_mu_);
  // Prefetched batches' blob reads (reads go through the Storage plugin, so the pool has no Io of
  // its own; limits.h bounds its threads and queue).
  ReaderPool reader_pool_{nullptr, ReaderPool::Options{}};
  // Helpers of loads' verify-and-copy pieces (RunPieces); null with one copy thread.
  std::unique_ptr<WorkerPool> copy_pool_;
};

// The threads verifying and copying one load: options.load_copy_threads, or for 0 the CPUs the
// daemon may run on (at most 16).
size_t LoadCopyThreads(const DaemonOptions& options);

}  // namespace ckptd
