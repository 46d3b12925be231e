// Flush: one staged rank → one blob, written straight from the arena (or the client's region)
// with O_DIRECT, checksummed per block, fdatasync'd; then its staging is freed.
#include <cstring>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "format/crc32c.h"
#include "format/names.h"
#include "index/keys.h"
#include "common/limits.h"
#include "dataplane/memory_guard.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

// Blobs at least this large are checksummed on a second thread while they are written: both only
// read the staged bytes, and the disk, not the CPU, bounds the flush.
constexpr uint64_t kParallelChecksumBytesMin = 1 * limits::kMiB;

struct ChecksumJob {
  v1::ShardEntry* entry;
  const uint8_t* src;
  uint64_t length;
};

struct CrcArgs {
  const uint8_t* src;
  uint64_t length;
  uint32_t block;
  uint32_t* out;
};

// Reads the staged bytes, which live in client-visible memory: guarded (memory_guard.h).
absl::Status ComputeChecksums(const std::vector<ChecksumJob>& jobs, uint32_t block) {
  for (const ChecksumJob& j : jobs) {
    auto* crcs = j.entry->mutable_block_crc32c();
    crcs->Resize(static_cast<int>(BlockCount(j.length, block)), 0);
    if (j.length == 0) continue;
    CrcArgs a{j.src, j.length, block, crcs->mutable_data()};
    CKPTD_RETURN_IF_ERROR(GuardClientMemory(
        [](void* p) {
          auto* c = static_cast<CrcArgs*>(p);
          BlockCrcsInto(c->src, c->length, c->block, c->out);
        },
        &a, "staged bytes being checksummed"));
  }
  return absl::OkStatus();
}

}  // namespace

const uint8_t* CheckpointService::ShardSource(const v1::StagedShard& s,
                                              const std::vector<RegionLease>& leases) const {
  const v1::MemRef& m = s.spec().data();
  if (m.length() == 0) return nullptr;
  if (m.target_case() == v1::MemRef::kExtentId) {
    return deps_.arena->base() + s.arena_offset() + m.offset();
  }
  for (const RegionLease& l : leases) {
    if (l->id == m.region_id()) return l->base + m.offset();
  }
  CKPTD_CHECK(false);  // ResolveSaveData leased every region it accepted
  return nullptr;
}

absl::Status CheckpointService::WriteRankBlob(const std::string& dir,
                                              const std::vector<RegionLease>& leases,
                                              v1::RankRecord* rec) {
  const uint32_t block = RankBlockBytes(*rec);
  std::vector<IoSlice> slices;
  std::vector<AlignedBuffer> bounce;  // live until the write returns
  uint64_t blob_off = 0;
  std::vector<ChecksumJob> checksums;
  uint64_t checksum_bytes = 0;
  // Extents holding exactly one shard may be written whole (tail included, zeroed first), which
  // keeps every write aligned for O_DIRECT.
  absl::flat_hash_map<uint64_t, int> shards_per_extent;
  for (const v1::StagedShard& s : rec->shards()) {
    if (s.spec().data().target_case() == v1::MemRef::kExtentId && s.spec().data().length() > 0) {
      ++shards_per_extent[s.extent_id()];
    }
  }
  for (int i = 0; i < rec->shards_size(); ++i) {
    v1::StagedShard* s = rec->mutable_shards(i);
    const v1::MemRef& m = s->spec().data();
    v1::ShardEntry* e = s->mutable_stored();
    e->Clear();
    e->set_saved_by_rank(rec->rank());
    e->set_blob_id(rec->rank());
    e->set_length(m.length());
    if (s->spec().has_tensor() && s->spec().tensor().has_region()) {
      *e->mutable_region() = s->spec().tensor().region();
    }
    const uint8_t* src = m.length() == 0 ? nullptr : ShardSource(*s, leases);
    checksums.push_back(ChecksumJob{e, src, m.length()});
    checksum_bytes += m.length();
    if (s->replica() || m.length() == 0) continue;
    e->set_offset(blob_off);
    uint64_t len = m.length();
    uint64_t rounded = RoundUp(len, limits::kAlignmentBytes);
    if (m.target_case() == v1::MemRef::kExtentId && shards_per_extent[s->extent_id()] == 1 &&
        m.offset() + rounded <= s->extent_length()) {
      CKPTD_RETURN_IF_ERROR(
          GuardedZero(const_cast<uint8_t*>(src) + len, rounded - len, "staged extent tail"));
      len = rounded;
    }
    // Otherwise the partial last page goes through a zeroed bounce page, so the blob holds whole
    // pages (its size is what the manifest says, and loads read it with O_DIRECT to the end).
    uint64_t body = len / limits::kAlignmentBytes * limits::kAlignmentBytes;
    if (body > 0) slices.push_back(IoSlice{const_cast<uint8_t*>(src), body, blob_off});
    if (len > body) {
      AlignedBuffer& held = bounce.emplace_back(AllocateAligned(limits::kAlignmentBytes));
      if (held == nullptr) return absl::ResourceExhaustedError("flush bounce page");
      uint8_t* page = held.get();
      std::memset(page, 0, limits::kAlignmentBytes);
      CKPTD_RETURN_IF_ERROR(GuardedCopy(page, src + body, len - body, "staged bytes"));
      slices.push_back(IoSlice{page, limits::kAlignmentBytes, blob_off + body});
    }
    blob_off += rounded;
  }
  if (slices.empty() || checksum_bytes < kParallelChecksumBytesMin) {
    CKPTD_RETURN_IF_ERROR(ComputeChecksums(checksums, block));
    if (slices.empty()) return absl::OkStatus();
    checksums.clear();
  }
  // Each job fills its own entry; `rec` is not touched by this thread until the join.
  std::future<absl::Status> summing;
  if (!checksums.empty()) {
    summing = std::async(std::launch::async, ComputeChecksums, std::cref(checksums), block);
  }
  std::string path = absl::StrCat(dir, "/", rec->blob_name());
  absl::Status st = [&]() -> absl::Status {
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> w, deps_.storage->CreateBlob(path));
    CKPTD_RETURN_IF_ERROR(Annotate(w->Write(slices), absl::StrCat("writing ", path)));
    return Annotate(w->Sync(), absl::StrCat("syncing ", path));
  }();
  absl::Status summed = summing.valid() ? summing.get() : absl::OkStatus();
  return st.ok() ? summed : st;
}

void CheckpointService::FlushRank(Key key, uint32_t rank) {
  if (deps_.options->debug_flush_delay_ms > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(deps_.options->debug_flush_delay_ms));
  }
  v1::RankRecord rec;
  std::vector<RegionLease> leases;
  bool write = false;
  {
    absl::MutexLock lock(&mu_);
    Pending& p = *pending_.at(key);
    PendingRank& pr = p.ranks.at(rank);
    if (!p.aborting) {
      rec = pr.rec;
      leases = pr.leases;
      write = true;
    }
  }
  absl::Status st = absl::OkStatus();
  if (write) {
    st = WriteRankBlob(CheckpointDir(key.first, key.second), leases, &rec);
    if (st.ok()) {
      // "Persisted" is journaled synced, outside the service lock, before the extents are freed:
      // once they are reused, a restart must never flush this rank again from the arena (the
      // bytes there would be another checkpoint's).
      rec.set_persisted(true);
      MetaStore::Write w{keys::Rank(key.first, key.second, rank), rec.SerializeAsString()};
      st = Annotate(deps_.meta->Commit({&w, 1}, /*sync=*/true), "journaling a persisted rank");
    }
  }
  leases.clear();
  absl::MutexLock lock(&mu_);
  Pending& p = *pending_.at(key);
  PendingRank& pr = p.ranks.at(rank);
  pr.flushing = false;
  --p.flushes_in_flight;
  if (!p.aborting && !st.ok()) {
    AbortLocked(p, absl::StrCat("flushing rank ", rank, " failed: ", st.message()));
    return;  // AbortLocked freed the rank's staging and may have erased p
  }
  if (!p.aborting) {
    pr.rec = std::move(rec);
    pr.persisted = true;
  }
  deps_.arena->Free(pr.extent_ids);
  pr.extent_ids.clear();
  pr.leases.clear();  // "released": the client may write its region again
  changed_.SignalAll();
  if (p.aborting) {
    if (p.flushes_in_flight == 0 && !p.committing) FinishAbortLocked(p);
    return;
  }
  MaybeStartCommitLocked(p);
}

}  // namespace ckptd
