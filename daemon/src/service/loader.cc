// The loader (loader.h): resolve the requested items and destinations, plan the reads
// (format/load_plan.h: only the byte runs needed, coalesced), read them in bounded batches,
// verify every checksum block used, and copy into the destination extents/regions.
#include "service/loader.h"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "common/limits.h"
#include "dataplane/memory_guard.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/load_plan.h"
#include "format/names.h"
#include "format/region.h"
#include "service/hot_direct.h"
#include "spdlog/spdlog.h"

namespace ckptd {

Loader::Loader(const DaemonOptions* options, Storage* storage, StagingArena* arena,
               RegionRegistry* regions, GpuStaging* gpu)
    : options_(options), storage_(storage), arena_(arena), regions_(regions), gpu_(gpu) {
  const size_t threads = LoadCopyThreads(*options);
  if (threads > 1) {
    // One helper per thread for each of a few loads at once; more are refused (the load's own
    // thread then does its share).
    copy_pool_ = std::make_unique<WorkerPool>("copy", threads - 1, 4 * threads);
  }
}

size_t LoadCopyThreads(const DaemonOptions& options) {
  if (options.load_copy_threads != 0) return options.load_copy_threads;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int n = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return std::clamp<size_t>(static_cast<size_t>(n), 1, limits::kLoadCopyThreadsAuto);
}

absl::StatusOr<uint8_t*> Loader::ResolveDest(const std::string& session, const v1::MemRef& ref,
                                             uint64_t need_bytes, std::vector<MemoryLease>* leases,
                                             const std::string& what, int* device) const {
  if (ref.length() < need_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": destination holds ", ref.length(),
                                                   " bytes, ", need_bytes, " are needed"));
  }
  if (need_bytes == 0) return nullptr;
  if (ref.target_case() == v1::MemRef::kExtentId) {
    // Leased for the whole load: a release or the session's end meanwhile cannot hand these
    // bytes to another client while this load still writes them.
    absl::StatusOr<ExtentLease> e = arena_->Lease(session, ref.extent_id());
    if (!e.ok()) return Annotate(e.status(), what);
    const ExtentInfo& x = **e;
    CKPTD_RETURN_IF_ERROR(CheckInExtent(x, ref.offset(), ref.length(), what));
    uint8_t* p = arena_->Data(x) + ref.offset();
    leases->push_back(*std::move(e));
    return p;
  }
  if (ref.target_case() == v1::MemRef::kRegionId) {
    absl::StatusOr<RegionLease> lease =
        regions_->Acquire(session, ref.region_id(), ref.offset(), ref.length());
    if (!lease.ok()) return Annotate(lease.status(), what);
    const MappedRegion& r = **lease;
    uint8_t* p = nullptr;
    if (r.on_device()) {
      if (gpu_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, ": destination is GPU memory but this daemon has no GPU support"));
      }
      // A device address, never dereferenced on the host (VerifyAndCopy copies to it).
      p = reinterpret_cast<uint8_t*>(r.device_addr(ref.offset()));
      *device = r.device();
    } else {
      p = r.base + ref.offset();
    }
    leases->push_back(*std::move(lease));
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": destination names no extent or region"));
}

absl::Status Loader::ResolveLoadItem(const std::string& session, const Manifest& m,
                                     const v1::LoadItemRequest& req, uint32_t rank,
                                     std::vector<MemoryLease>* leases, PlanRequest* request,
                                     uint8_t** dst, int* device, v1::LoadedItem* out) const {
  const std::string ckpt = absl::StrCat(m.header.job(), "/", m.header.step());
  const v1::ItemEntry* item = FindItem(m, req.item());
  if (item == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("item \"", req.item(), "\" is not in checkpoint ", ckpt));
  }
  std::string what = absl::StrCat("checkpoint ", ckpt, " item \"", req.item(), "\"");
  request->item = item;
  uint64_t need = 0;
  if (item->kind() == v1::TENSOR) {
    std::vector<uint64_t> shape(item->shape().begin(), item->shape().end());
    CKPTD_ASSIGN_OR_RETURN(uint32_t elem, DTypeSize(item->dtype()));
    CKPTD_RETURN_IF_ERROR(Annotate(ValidateRegion(req.region(), shape), what));
    request->region = req.region();
    need = RegionElements(req.region(), shape) * elem;
  } else {
    const uint32_t want = req.has_saved_by_rank() ? req.saved_by_rank() : rank;
    std::vector<uint32_t> saved;
    for (const v1::ShardEntry& s : item->shards()) {
      saved.push_back(s.saved_by_rank());
      if (item->scope() == v1::REPLICATED || s.saved_by_rank() == want) {
        request->object_shard = &s;
        break;
      }
    }
    if (request->object_shard == nullptr) {
      return absl::NotFoundError(absl::StrCat(what,
                                              ": no copy of this per-rank object was saved "
                                              "by rank ",
                                              want, " (saved by ranks ", absl::StrJoin(saved, ", "),
                                              ")"));
    }
    need = request->object_shard->length();
    out->set_saved_by_rank(request->object_shard->saved_by_rank());
  }
  CKPTD_ASSIGN_OR_RETURN(*dst, ResolveDest(session, req.dest(), need, leases, what, device));
  out->set_item(req.item());
  out->set_bytes(need);
  return absl::OkStatus();
}

PlanOptions Loader::LoadPlanOptions(uint32_t block_bytes) const {
  PlanOptions o;
  o.alignment_bytes = limits::kAlignmentBytes;
  // Up to 4 runs per read batch keep several large reads in flight.
  uint64_t quarter =
      options_->load_buffer_bytes / 4 / limits::kAlignmentBytes * limits::kAlignmentBytes;
  o.max_run_bytes = std::max<uint64_t>(2ull * block_bytes, std::min(o.max_run_bytes, quarter));
  return o;
}

namespace {

// A next batch at least this large is read on the reader pool while this one is copied.
constexpr uint64_t kPrefetchBytesMin = 1 << 20;

// Reads the runs of a plan batch by batch (consecutive runs of one blob that fit a buffer).
// One BatchReader is used by one thread at a time; a prefetched batch's BlobReader is used by a
// reader of the pool until its ticket is waited for, and only then is the next batch prepared.
class BatchReader {
 public:
  // in_place (DirectPrefixes, or empty): leading bytes of copies read straight into dst.
  BatchReader(Storage* storage, const Manifest& m, const LoadPlan& plan, uint64_t cap,
              const LoadDests& dst, std::span<const uint64_t> in_place)
      : storage_(storage),
        m_(m),
        plan_(plan),
        cap_(cap),
        dst_(dst),
        in_place_(in_place),
        dir_(CheckpointDir(m.header.job(), m.header.step())) {}

  struct Batch {
    size_t first = 0, end = 0;  // runs [first, end)
    std::vector<uint64_t> at;   // buffer offset of each run
    std::string path;
    absl::Status status;
    BlobReader* reader = nullptr;  // the blob's, once prepared
    std::vector<IoSlice> slices;   // what to read into the buffer
  };

  // The end of the batch starting at run `first` (consecutive runs of one blob that fit the
  // buffer, each at an aligned buffer offset); *bytes: the buffer bytes it uses.
  size_t BatchEnd(size_t first, uint64_t* bytes) const {
    uint64_t used = 0;
    const uint32_t blob = plan_.runs[first].blob_id;
    size_t j = first;
    for (; j < plan_.runs.size() && plan_.runs[j].blob_id == blob &&
           (j == first || used + plan_.runs[j].length <= cap_);
         ++j) {
      used = RoundUp(used + plan_.runs[j].length, limits::kAlignmentBytes);
    }
    *bytes = used;
    return j;
  }
  uint64_t BatchBytes(size_t first) const {
    uint64_t bytes = 0;
    BatchEnd(first, &bytes);
    return bytes;
  }

  // Reads the batch starting at run `first` into `buf` (cap bytes), on this thread.
  Batch Read(size_t first, uint8_t* buf) {
    Batch b = Prepare(first, buf);
    if (b.status.ok() && !b.slices.empty()) {
      b.status = Annotate(b.reader->Read(b.slices), "reading " + b.path);
    }
    return b;
  }

  // Lays out the batch starting at run `first` in `buf` (cap bytes), opening its blob if need be,
  // without reading it: b.reader reads b.slices.
  Batch Prepare(size_t first, uint8_t* buf) {
    Batch b;
    b.first = first;
    const uint32_t blob_id = plan_.runs[first].blob_id;
    if (blob_id != open_blob_) {
      const v1::BlobInfo* blob = nullptr;
      for (const v1::BlobInfo& info : m_.header.blobs()) {
        if (info.id() == blob_id) blob = &info;
      }
      CKPTD_CHECK(blob != nullptr);  // ValidateManifest checked it
      path_ = absl::StrCat(dir_, "/", blob->name());
      absl::StatusOr<std::unique_ptr<BlobReader>> r = storage_->OpenBlob(path_);
      if (!r.ok()) {
        b.status = r.status();
        return b;
      }
      reader_ = *std::move(r);
      open_blob_ = blob_id;
    }
    b.path = path_;
    b.reader = reader_.get();
    std::vector<IoSlice>& slices = b.slices;
    uint64_t unused = 0;
    b.end = BatchEnd(first, &unused);
    uint64_t used = 0;
    for (size_t j = first; j < b.end; ++j) {
      // Blobs of older versions may end before their manifest's 4 KiB-rounded size (an unpadded
      // last shard): read what the file has; the rest of the run is padding nobody uses.
      const ReadRun& run = plan_.runs[j];
      uint64_t file_end = std::max(reader_->size_bytes(), run.offset);
      uint64_t len = std::min(run.length, file_end - run.offset);
      std::memset(buf + used + len, 0, run.length - len);
      // The run's bytes: its copies' in-place prefixes straight into their destinations, the
      // rest into the buffer (a short file: all into the buffer).
      uint64_t at = 0;
      if (!in_place_.empty() && len == run.length) {
        std::vector<uint64_t> direct;
        for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
          if (in_place_[c] > 0) direct.push_back(c);
        }
        std::sort(direct.begin(), direct.end(), [&](uint64_t x, uint64_t y) {
          return plan_.copies[x].run_offset < plan_.copies[y].run_offset;
        });
        for (uint64_t c : direct) {
          const RunCopy& cp = plan_.copies[c];
          if (cp.run_offset > at) {
            slices.push_back(IoSlice{buf + used + at, cp.run_offset - at, run.offset + at});
          }
          slices.push_back(IoSlice{dst_.ptr[cp.request] + cp.dst_offset, in_place_[c],
                                   run.offset + cp.run_offset});
          at = cp.run_offset + in_place_[c];
        }
      }
      if (len > at) slices.push_back(IoSlice{buf + used + at, len - at, run.offset + at});
      b.at.push_back(used);
      used = RoundUp(used + run.length, limits::kAlignmentBytes);
    }
    return b;
  }

 private:
  Storage* storage_;
  const Manifest& m_;
  const LoadPlan& plan_;
  const uint64_t cap_;
  const LoadDests& dst_;
  const std::span<const uint64_t> in_place_;
  const std::string dir_;
  std::unique_ptr<BlobReader> reader_;
  std::string path_;
  uint32_t open_blob_ = UINT32_MAX;
};

// Verifies the blocks of a read batch and copies its bytes to their destinations, in pieces on
// `pool` (GPU copies beside them; all done before the buffer is reused).
absl::Status VerifyAndCopy(const Manifest& m, const LoadPlan& plan, const BatchReader::Batch& batch,
                           const uint8_t* buf, const LoadDests& dst,
                           std::span<const uint64_t> in_place, WorkerPool* pool) {
  std::vector<DeviceCopy> to_device;
  std::vector<CopyPiece> pieces;
  FusedBatcher small(&pieces);  // a strided load's one-block runs, many to a piece
  for (size_t k = batch.first; k < batch.end; ++k) {
    const uint8_t* data = buf + batch.at[k - batch.first];
    AddRunPieces(
        m, plan, k, [data](uint64_t off, uint64_t) { return data + off; }, dst, &batch.path,
        &pieces, &to_device, in_place, &small);
  }
  small.Flush();
  return RunPiecesAndDeviceCopies(pool, pieces, m, dst, to_device);
}

}  // namespace

AlignedBuffer Loader::AcquireLoadBuffer(uint64_t bytes) {
  const uint64_t pooled = options_->load_buffer_bytes;
  if (bytes > pooled) return AllocateAligned(bytes);
  {
    absl::MutexLock lock(&load_buffers_mu_);
    if (!load_buffers_.empty()) {
      AlignedBuffer b = std::move(load_buffers_.back());
      load_buffers_.pop_back();
      return b;
    }
  }
  AlignedBuffer b = AllocateAligned(pooled);
  if (b != nullptr) std::memset(b.get(), 0, pooled);  // fault it in once, here
  return b;
}

void Loader::ReturnLoadBuffer(AlignedBuffer buf, uint64_t bytes) {
  if (buf == nullptr || bytes > options_->load_buffer_bytes) return;
  absl::MutexLock lock(&load_buffers_mu_);
  if (load_buffers_.size() < 2ull * options_->load_threads) {
    load_buffers_.push_back(std::move(buf));
  }
}

absl::Status Loader::ReadPlanFrom(Storage* storage, const Manifest& m, const LoadPlan& plan,
                                  const LoadDests& dst, uint64_t* bytes_read) {
  if (plan.runs.empty()) return absl::OkStatus();
  uint64_t largest = 0;
  for (const ReadRun& r : plan.runs) largest = std::max(largest, r.length);
  const uint64_t cap =
      RoundUp(std::max(largest, std::min(options_->load_buffer_bytes, plan.read_bytes)),
              limits::kAlignmentBytes);
  // Two buffers, the second allocated once a second batch exists: the next batch is read while
  // this one is verified and copied.
  AlignedBuffer bufs[2];
  absl::Cleanup give_back = [&] {
    for (AlignedBuffer& b : bufs) ReturnLoadBuffer(std::move(b), cap);
  };
  auto allocate = [&](int b) -> absl::Status {
    if (bufs[b] != nullptr) return absl::OkStatus();
    bufs[b] = AcquireLoadBuffer(cap);
    if (bufs[b] == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("load buffer of ", cap, " bytes"));
    }
    return absl::OkStatus();
  };
  CKPTD_RETURN_IF_ERROR(allocate(0));
  const std::vector<uint64_t> in_place =
      options_->load_into_destination && storage->ReadsThroughKernel()
          ? DirectPrefixes(plan, dst, m.header.checksum_block_bytes())
          : std::vector<uint64_t>{};
  BatchReader reader(storage, m, plan, cap, dst, in_place);
  int cur = 0;
  BatchReader::Batch batch = reader.Read(0, bufs[cur].get());
  while (true) {
    CKPTD_RETURN_IF_ERROR(batch.status);
    const bool more = batch.end < plan.runs.size();
    // Small batches (many small blobs) are read inline: a thread would cost more than it hides.
    const bool prefetch = more && reader.BatchBytes(batch.end) >= kPrefetchBytesMin;
    BatchReader::Batch following;
    ReadTicket reading;
    if (prefetch) {
      CKPTD_RETURN_IF_ERROR(allocate(cur ^ 1));
      following = reader.Prepare(batch.end, bufs[cur ^ 1].get());
      if (following.status.ok()) {
        absl::StatusOr<ReadTicket> t = reader_pool_.SubmitBlobRead(
            following.reader, following.slices, following.path, WorkerPool::WhenFull::kWait);
        if (t.ok()) {
          reading = *std::move(t);
        } else {
          following.status = t.status();
        }
      }
    }
    absl::Status copied =
        VerifyAndCopy(m, plan, batch, bufs[cur].get(), dst, in_place, copy_pool_.get());
    for (size_t k = batch.first; k < batch.end; ++k) *bytes_read += plan.runs[k].length;
    if (!more) return copied;
    if (prefetch) {
      // Always waited for before returning: a reader may still be filling the buffer.
      absl::Status read = reading.Wait();
      if (following.status.ok()) following.status = Annotate(read, "reading " + following.path);
      CKPTD_RETURN_IF_ERROR(copied);
      batch = std::move(following);
      cur ^= 1;
    } else {
      CKPTD_RETURN_IF_ERROR(copied);
      batch = reader.Read(batch.end, bufs[cur].get());
    }
  }
}

absl::Status Loader::ReadPlan(const Manifest& m, const LoadPlan& plan,
                              std::span<uint8_t* const> dst, std::span<Storage* const> tiers,
                              std::span<uint64_t> bytes_read) {
  return ReadPlan(m, plan, LoadDests{dst, {}, nullptr}, tiers, bytes_read);
}

absl::Status Loader::ReadPlan(const Manifest& m, const LoadPlan& plan, const LoadDests& dst,
                              std::span<Storage* const> tiers, std::span<uint64_t> bytes_read) {
  Storage* const own[] = {storage_};
  uint64_t own_bytes = 0;
  if (tiers.empty()) {
    tiers = own;
    bytes_read = std::span<uint64_t>(&own_bytes, 1);
  }
  CKPTD_CHECK(bytes_read.size() == tiers.size());
  const std::string ckpt = absl::StrCat(m.header.job(), "/", m.header.step());
  auto other_tier_may_have_it = [](const absl::Status& st) {
    return absl::IsNotFound(st) || absl::IsDataLoss(st);
  };
  // The whole plan from the fastest tier: the common case, batched across blobs.
  absl::Status st = ReadPlanFrom(tiers[0], m, plan, dst, &bytes_read[0]);
  if (st.ok() || !other_tier_may_have_it(st) || tiers.size() == 1) return st;
  spdlog::warn("load of {}: {} failed ({}); each blob is read from the first tier that has it",
               ckpt, tiers[0]->Describe(), st.ToString());
  // Blob by blob (runs are sorted by blob): each from the fastest tier whose copy of that blob
  // reads and verifies, so one bad local blob costs a remote read of that blob alone. The
  // destinations are overwritten with verified bytes.
  for (size_t first = 0; first < plan.runs.size();) {
    const uint32_t blob = plan.runs[first].blob_id;
    size_t end = first;
    while (end < plan.runs.size() && plan.runs[end].blob_id == blob) ++end;
    const LoadPlan one = SelectRuns(plan, first, end, [](size_t) { return true; });
    for (size_t t = 0; t < tiers.size(); ++t) {
      st = ReadPlanFrom(tiers[t], m, one, dst, &bytes_read[t]);
      if (st.ok()) break;
      if (!other_tier_may_have_it(st) || t + 1 == tiers.size()) return st;
      spdlog::warn("load of {}: blob {} on {} failed ({}); reading it from {}", ckpt, blob,
                   tiers[t]->Describe(), st.ToString(), tiers[t + 1]->Describe());
    }
    first = end;
  }
  return absl::OkStatus();
}

absl::Status Loader::CopyFromRam(const HotCopy& hot, const Manifest& m, const LoadPlan& plan,
                                 const LoadDests& dst, std::vector<bool>* served,
                                 uint64_t* bytes) const {
  const uint32_t block = m.header.checksum_block_bytes();
  served->assign(plan.runs.size(), false);
  std::vector<DeviceCopy> to_device;
  std::vector<CopyPiece> pieces;
  FusedBatcher batch(&pieces);               // a strided load's one-block runs, many to a piece
  const std::string where = "the RAM tier";  // outlives the pieces: run below
  for (size_t k = 0; k < plan.runs.size(); ++k) {
    const ReadRun& run = plan.runs[k];
    auto at = [&](uint64_t off, uint64_t n) { return hot.Find(run.blob_id, run.offset + off, n); };
    bool all = true;
    for (uint32_t c = run.first_check; all && c < run.first_check + run.check_count; ++c) {
      const BlockCheck& chk = plan.checks[c];
      all = at(chk.run_offset, CheckedBytes(chk, block)) != nullptr;
    }
    for (uint64_t c = run.first_copy; all && c < run.first_copy + run.copy_count; ++c) {
      all = at(plan.copies[c].run_offset, plan.copies[c].bytes) != nullptr;
    }
    if (!all) continue;  // a blob (or part) not in RAM: read from storage
    AddRunPieces(m, plan, k, at, dst, &where, &pieces, &to_device, {}, &batch);
    (*served)[k] = true;
    for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
      *bytes += plan.copies[c].bytes;
    }
  }
  batch.Flush();
  return RunPiecesAndDeviceCopies(copy_pool_.get(), pieces, m, dst, to_device);
}

absl::Status Loader::ServeFromRam(const HotCopy& hot, uint32_t uid, const Manifest& m,
                                  const LoadPlan& plan, const LoadDests& dst,
                                  const std::vector<bool>& direct_ok, LoadPlan* rest,
                                  v1::LoadResponse* resp) const {
  const uint32_t block = m.header.checksum_block_bytes();
  const LoadPlan* from = &plan;
  LoadPlan daemon_runs;
  uint64_t direct_bytes = 0;
  if (std::find(direct_ok.begin(), direct_ok.end(), true) != direct_ok.end()) {
    HotDirectPlan d = PlanHotDirect(hot, uid, plan, direct_ok, block);
    if (d.bytes > 0 && d.copies <= limits::kHotSpanCopiesMax) {
      AddHotSpans(hot, plan, d, block, resp);
      direct_bytes = d.bytes;
      daemon_runs = SelectRuns(plan, 0, plan.runs.size(), [&](size_t k) { return !d.run[k]; });
      from = &daemon_runs;
    }
  }
  std::vector<bool> served;
  uint64_t from_ram = 0;
  absl::Status st = CopyFromRam(hot, m, *from, dst, &served, &from_ram);
  if (!st.ok()) {
    resp->clear_hot_spans();  // the caller reads the whole plan from storage
    for (v1::LoadedItem& item : *resp->mutable_items()) item.set_hot_direct(false);
    return st;
  }
  resp->set_bytes_from_ram(from_ram + direct_bytes);
  *rest = SelectRuns(*from, 0, from->runs.size(), [&](size_t k) { return !served[k]; });
  return absl::OkStatus();
}

absl::Status Loader::Load(const std::string& session, uint32_t uid, const Manifest& m,
                          const v1::LoadRequest& req, std::span<Storage* const> tiers,
                          const Storage* remote, const Storage* peers, const HotCopy* hot,
                          bool* hot_failed, v1::LoadResponse* resp) {
  Storage* const own[] = {storage_};
  if (tiers.empty()) tiers = own;
  std::vector<MemoryLease> leases;  // held until the copies are done
  std::vector<PlanRequest> requests(req.items_size());
  std::vector<uint8_t*> dst(req.items_size());
  std::vector<int> device(req.items_size(), -1);
  std::vector<bool> direct_ok(req.items_size(), false);
  for (int i = 0; i < req.items_size(); ++i) {
    CKPTD_RETURN_IF_ERROR(ResolveLoadItem(session, m, req.items(i), req.rank(), &leases,
                                          &requests[i], &dst[i], &device[i], resp->add_items()));
    // Only scratch the client copies out of: an arena extent in host memory.
    direct_ok[i] = req.items(i).hot_direct() && dst[i] != nullptr && device[i] < 0 &&
                   req.items(i).dest().target_case() == v1::MemRef::kExtentId;
  }
  absl::StatusOr<LoadPlan> plan =
      PlanLoad(m, requests, LoadPlanOptions(m.header.checksum_block_bytes()));
  if (!plan.ok()) {
    return Annotate(plan.status(),
                    absl::StrCat("checkpoint ", m.header.job(), "/", m.header.step()));
  }
  if (options_->debug_load_delay_ms > 0) {
    absl::SleepFor(absl::Milliseconds(options_->debug_load_delay_ms));
  }
  const LoadDests dests{dst, device, gpu_};
  std::vector<uint64_t> bytes_read(tiers.size());
  const LoadPlan* cold = &*plan;
  LoadPlan rest;
  if (hot != nullptr) {
    absl::Status st = ServeFromRam(*hot, uid, m, *plan, dests, direct_ok, &rest, resp);
    if (st.ok()) {
      cold = &rest;
    } else if (absl::IsDataLoss(st)) {
      // Reading storage overwrites every destination with verified bytes.
      spdlog::error("load of {}/{}: {}; reading it from storage", m.header.job(), m.header.step(),
                    st.ToString());
      *hot_failed = true;
    } else {
      return st;
    }
  }
  CKPTD_RETURN_IF_ERROR(ReadPlan(m, *cold, dests, tiers, bytes_read));
  uint64_t total = 0;
  for (size_t t = 0; t < bytes_read.size(); ++t) {
    total += bytes_read[t];
    if (t < tiers.size() && tiers[t] == remote) resp->set_bytes_read_remote(bytes_read[t]);
    if (t < tiers.size() && peers != nullptr && tiers[t] == peers) {
      resp->set_bytes_read_peer(bytes_read[t]);
    }
  }
  resp->set_bytes_read(total);
  resp->set_bytes_needed(plan->needed_bytes);
  resp->set_bytes_needed_aligned(plan->needed_aligned_bytes);
  return absl::OkStatus();
}

}  // namespace ckptd
