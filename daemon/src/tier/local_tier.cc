// The local tier (local_tier.h): one staged rank → one blob, written straight from
// the arena (or the client's region) with O_DIRECT, checksummed per block, fdatasync'd.
#include "tier/local_tier.h"

#include <algorithm>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/align.h"
#include "common/clock.h"
#include "common/limits.h"
#include "dataplane/memory_guard.h"
#include "format/blob_layout.h"
#include "format/checksum_pool.h"
#include "format/crc32c.h"
#include "format/names.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

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

// Reads the staged bytes, which live in client-visible memory: guarded (memory_guard.h). `out` is
// written through CrcArgs, which clang-tidy does not follow.
// NOLINTNEXTLINE(readability-non-const-parameter)
absl::Status GuardedBlockCrcs(const uint8_t* src, uint64_t length, uint32_t block, uint32_t* out) {
  CrcArgs a{src, length, block, out};
  return GuardClientMemory(
      [](void* p) {
        auto* c = static_cast<CrcArgs*>(p);
        BlockCrcsInto(c->src, c->length, c->block, c->out);
      },
      &a, "staged bytes being checksummed");
}

// Sizes each job's entry for its block crcs; returns where they go.
std::vector<CrcRange> CrcRanges(const std::vector<ChecksumJob>& jobs, uint32_t block) {
  std::vector<CrcRange> ranges;
  for (const ChecksumJob& j : jobs) {
    auto* crcs = j.entry->mutable_block_crc32c();
    crcs->Resize(static_cast<int>(BlockCount(j.length, block)), 0);
    if (j.length > 0) ranges.push_back(CrcRange{j.src, j.length, crcs->mutable_data()});
  }
  return ranges;
}

// The stored entry of `s`, saved by `rank`, reset to its place in the rank's own blob (offset and
// block crcs still to fill).
v1::ShardEntry* ResetStoredEntry(uint32_t rank, v1::StagedShard* s) {
  v1::ShardEntry* e = s->mutable_stored();
  e->Clear();
  e->set_saved_by_rank(rank);
  e->set_blob_id(rank);
  e->set_length(s->spec().data().length());
  if (s->spec().has_tensor() && s->spec().tensor().has_region()) {
    *e->mutable_region() = s->spec().tensor().region();
  }
  return e;
}

// A staged shard's bytes and where they go in the blob (length rounded up to whole pages when
// the tail in the arena may be written too).
struct BlobPiece {
  const uint8_t* src;
  uint64_t length;
  uint64_t offset;
};

// Lays out the blob of `rec` (format/blob_layout.h): fills each shard's stored entry (offset in
// the blob), the pieces to write (replicas and empty shards have none) and the checksum jobs.
// `source` gives a staged shard's bytes. Shards marked in `referenced` (deltas) keep their stored
// entry (an earlier blob's) and take no place here.
absl::Status LayOutRankBlob(absl::FunctionRef<const uint8_t*(const v1::StagedShard&)> source,
                            const std::vector<bool>& referenced, v1::RankRecord* rec,
                            std::vector<BlobPiece>* pieces, std::vector<ChecksumJob>* checksums,
                            uint64_t* checksum_bytes) {
  // Extents holding exactly one shard may be written whole (tail included, zeroed first), which
  // keeps every write aligned for O_DIRECT.
  absl::flat_hash_map<uint64_t, int> shards_per_extent;
  for (const v1::StagedShard& s : rec->shards()) {
    if (s.spec().data().target_case() == v1::MemRef::kExtentId && s.spec().data().length() > 0) {
      ++shards_per_extent[s.extent_id()];
    }
  }
  BlobLayout layout;
  for (int i = 0; i < rec->shards_size(); ++i) {
    if (!referenced.empty() && referenced[static_cast<size_t>(i)]) continue;
    v1::StagedShard* s = rec->mutable_shards(i);
    const v1::MemRef& m = s->spec().data();
    v1::ShardEntry* e = ResetStoredEntry(rec->rank(), s);
    const uint8_t* src = m.length() == 0 ? nullptr : source(*s);
    checksums->push_back(ChecksumJob{e, src, m.length()});
    *checksum_bytes += m.length();
    if (s->replica() || m.length() == 0) continue;
    CKPTD_ASSIGN_OR_RETURN(ShardPlacement placed, layout.Append(m.length()));
    e->set_offset(placed.offset);
    uint64_t len = placed.length;
    if (m.target_case() == v1::MemRef::kExtentId && shards_per_extent[s->extent_id()] == 1 &&
        m.offset() + placed.padded_length <= s->extent_length()) {
      CKPTD_RETURN_IF_ERROR(GuardedZero(const_cast<uint8_t*>(src) + len, placed.padded_length - len,
                                        "staged extent tail"));
      len = placed.padded_length;
    }
    pieces->push_back(BlobPiece{src, len, placed.offset});
  }
  return absl::OkStatus();
}

// Writes `pieces` to a new blob at `path` and syncs it; `*sync` is how long the sync took.
absl::Status WritePieces(Storage& storage, const std::string& path,
                         const std::vector<BlobPiece>& pieces, absl::Duration* sync) {
  // A piece's partial last page goes through a zeroed bounce page, so the blob holds whole
  // pages (its size is what the manifest says, and loads read it with O_DIRECT to the end).
  // The bounce pages of one flush are bounded (kFlushBounceBytesMax): when they run out, what
  // is gathered is written and the pages are reused.
  constexpr uint64_t kPage = limits::kAlignmentBytes;
  uint64_t tails = 0;
  for (const BlobPiece& piece : pieces) tails += piece.length % kPage != 0;
  const uint64_t bounce_pages = std::min(tails, limits::kFlushBounceBytesMax / kPage);
  AlignedBuffer bounce;
  if (bounce_pages > 0) {
    bounce = AllocateAligned(bounce_pages * kPage);
    if (bounce == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("writing ", path, ": ", bounce_pages * kPage, " bytes of bounce pages"));
    }
  }
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> w, storage.CreateBlob(path));
  std::vector<IoSlice> slices;
  uint64_t used = 0;
  auto write_gathered = [&]() -> absl::Status {
    CKPTD_RETURN_IF_ERROR(Annotate(w->Write(slices), absl::StrCat("writing ", path)));
    slices.clear();
    used = 0;
    return absl::OkStatus();
  };
  for (const BlobPiece& piece : pieces) {
    uint64_t body = piece.length / kPage * kPage;
    if (body > 0) slices.push_back(IoSlice{const_cast<uint8_t*>(piece.src), body, piece.offset});
    if (piece.length == body) continue;
    if (used == bounce_pages) CKPTD_RETURN_IF_ERROR(write_gathered());
    uint8_t* page = bounce.get() + used++ * kPage;
    std::memset(page, 0, kPage);
    CKPTD_RETURN_IF_ERROR(GuardedCopy(page, piece.src + body, piece.length - body, "staged bytes"));
    slices.push_back(IoSlice{page, kPage, piece.offset + body});
  }
  if (!slices.empty()) CKPTD_RETURN_IF_ERROR(write_gathered());
  CKPTD_SYNC_POINT("flush.blob_written");
  const absl::Time sync_start = absl::Now();
  absl::Status synced = Annotate(w->Sync(), absl::StrCat("syncing ", path));
  *sync = absl::Now() - sync_start;
  return synced;
}

struct CompareArgs {
  const uint8_t* staged;
  const uint8_t* read;
  uint64_t n;
  bool same;
};

// Whether `length` staged bytes at `src` (client-visible memory: guarded) equal the bytes of
// the file `r` at `offset` (4 KiB aligned). Reads through `buf` (kDeltaCompareBytes, aligned),
// which it fills through an IoSlice (clang-tidy does not follow it).
absl::StatusOr<bool> SameAsFile(BlobReader& r, uint64_t offset, const uint8_t* src, uint64_t length,
                                uint8_t* buf) {  // NOLINT(readability-non-const-parameter)
  for (uint64_t done = 0; done < length;) {
    const uint64_t n = std::min(length - done, limits::kDeltaCompareBytes);
    IoSlice slice{buf, RoundUp(n, limits::kAlignmentBytes), offset + done};
    if (slice.offset + slice.len > r.size_bytes()) return false;  // not the file it was
    CKPTD_RETURN_IF_ERROR(r.Read(std::span<const IoSlice>(&slice, 1)));
    CompareArgs c{src + done, buf, n, false};
    CKPTD_RETURN_IF_ERROR(GuardClientMemory(
        [](void* p) {
          auto* a = static_cast<CompareArgs*>(p);
          a->same = std::memcmp(a->staged, a->read, a->n) == 0;
        },
        &c, "staged bytes being compared"));
    if (!c.same) return false;
    done += n;
  }
  return true;
}

// Resets every stored entry of `rec` to the rank's own blob and sizes its block crcs; returns
// where each stored shard's crcs go (replicas and empty shards have none).
std::vector<CrcRange> EntriesToSum(absl::FunctionRef<const uint8_t*(const v1::StagedShard&)> source,
                                   uint32_t block, v1::RankRecord* rec) {
  std::vector<CrcRange> ranges;
  for (int i = 0; i < rec->shards_size(); ++i) {
    v1::StagedShard* s = rec->mutable_shards(i);
    const v1::MemRef& m = s->spec().data();
    v1::ShardEntry* e = ResetStoredEntry(rec->rank(), s);
    if (s->replica() || m.length() == 0) continue;
    auto* crcs = e->mutable_block_crc32c();
    crcs->Resize(static_cast<int>(BlockCount(m.length(), block)), 0);
    ranges.push_back(CrcRange{source(*s), m.length(), crcs->mutable_data()});
  }
  return ranges;
}

}  // namespace

std::vector<size_t> LocalTier::LinkAndCompare(
    const std::string& link, const DeltaBase& base, const DeltaGroup& g,
    absl::FunctionRef<const uint8_t*(const v1::StagedShard&)> source, const v1::RankRecord& rec,
    uint8_t* buf) {
  // Linked first, then compared through the link: the bytes compared are the bytes this
  // checkpoint keeps, whatever happens to the earlier checkpoint meanwhile.
  std::vector<size_t> same;
  absl::Status linked = storage_->LinkBlob(absl::StrCat(base.dir, "/", g.base_name), link);
  absl::StatusOr<std::unique_ptr<BlobReader>> reader =
      linked.ok() ? storage_->OpenBlob(link) : linked;
  if (!reader.ok()) {
    spdlog::info("deltas: {} of step {} not shared ({}); its shards are written", g.base_name,
                 base.step, reader.status().ToString());
  }
  for (size_t k = 0; reader.ok() && k < g.shards.size(); ++k) {
    const v1::StagedShard& s = rec.shards(g.shards[k]);
    absl::StatusOr<bool> eq =
        SameAsFile(**reader, g.offsets[k], source(s), s.stored().length(), buf);
    if (eq.ok() && *eq) {
      same.push_back(k);
      continue;
    }
    spdlog::warn("deltas: \"{}\" of rank {} does not match {} of step {} ({}); written again",
                 s.spec().item(), rec.rank(), g.base_name, base.step,
                 eq.ok() ? "its bytes differ" : eq.status().ToString());
  }
  if (same.empty() && linked.ok()) {
    absl::Status removed = storage_->RemoveAll(link);
    if (!removed.ok()) spdlog::warn("deltas: {}", removed.ToString());
  }
  return same;
}

absl::StatusOr<std::vector<bool>> LocalTier::ReferenceUnchanged(
    const std::string& dir, const DeltaBase& base,
    absl::FunctionRef<const uint8_t*(const v1::StagedShard&)> source, v1::RankRecord* rec) {
  const uint32_t block = RankBlockBytes(*rec);
  const uint32_t rank = rec->rank();
  rec->clear_linked_blobs();
  rec->set_bytes_referenced(0);
  // Every stored shard's block checksums first: they pick the candidates. (The shards that end
  // up written are summed again while they are written, as without deltas.)
  std::vector<CrcRange> ranges = EntriesToSum(source, block, rec);
  std::vector<bool> referenced(static_cast<size_t>(rec->shards_size()), false);
  CKPTD_RETURN_IF_ERROR(ParallelBlockCrcs(checksum_pool_, ranges, block, GuardedBlockCrcs));
  std::vector<DeltaGroup> groups = PlanDelta(*rec, base);
  if (groups.empty()) return referenced;
  AlignedBuffer buf = AllocateAligned(limits::kDeltaCompareBytes);
  if (buf == nullptr) return referenced;  // no memory to compare with: write everything
  uint32_t slot = 0;
  uint64_t bytes_referenced = 0;
  for (const DeltaGroup& g : groups) {
    const std::string name = LinkedBlobName(rank, g.written_at_step);
    const std::vector<size_t> same =
        LinkAndCompare(absl::StrCat(dir, "/", name), base, g, source, *rec, buf.get());
    if (same.empty()) continue;
    v1::BlobInfo* b = rec->add_linked_blobs();
    b->set_id(LinkedBlobId(rank, slot++));
    b->set_name(name);
    b->set_size_bytes(g.size_bytes);
    b->set_written_at_step(g.written_at_step);
    for (size_t k : same) {
      const int i = g.shards[k];
      v1::ShardEntry* e = rec->mutable_shards(i)->mutable_stored();
      e->set_blob_id(b->id());
      e->set_offset(g.offsets[k]);
      referenced[static_cast<size_t>(i)] = true;
      bytes_referenced += e->length();
    }
  }
  rec->set_bytes_referenced(bytes_referenced);
  return referenced;
}

LocalTier::LocalTier(const DaemonOptions* options, Storage* storage, StagingArena* arena,
                     Executor* pool)
    : options_(options), storage_(storage), arena_(arena), pool_(pool) {}

bool LocalTier::GateOpen(size_t staged_ranks, size_t expected_ranks, uint64_t first_staged_unix_ms,
                         uint64_t now_unix_ms) const {
  return staged_ranks == expected_ranks || GateElapsed(first_staged_unix_ms, now_unix_ms);
}

bool LocalTier::GateElapsed(uint64_t first_staged_unix_ms, uint64_t now_unix_ms) const {
  return first_staged_unix_ms != 0 && now_unix_ms - first_staged_unix_ms >= options_->flush_gate_ms;
}

absl::Duration LocalTier::GateTick() const {
  return absl::Milliseconds(std::clamp<uint64_t>(options_->flush_gate_ms / 4, 10, 200));
}

bool LocalTier::Post(std::function<void()> flush) {
  return pool_->Post([this, flush = std::move(flush)] {
    if (options_->debug_flush_delay_ms > 0) {
      absl::SleepFor(absl::Milliseconds(options_->debug_flush_delay_ms));
    }
    flush();
  });
}

const uint8_t* LocalTier::ShardSource(const std::string& arena_generation, const v1::StagedShard& s,
                                      const std::vector<RegionLease>& leases) const {
  const v1::MemRef& m = s.spec().data();
  if (m.length() == 0) return nullptr;
  if (m.target_case() == v1::MemRef::kExtentId) {
    // Save staged it in its uid's segment; recovery restored it only into an adopted one. A
    // segment retired since (damaged) is still mapped: its bytes are read there, guarded.
    const uint8_t* p = arena_->AtGeneration(arena_generation, s.arena_offset() + m.offset());
    CKPTD_CHECK(p != nullptr);
    return p;
  }
  for (const RegionLease& l : leases) {
    if (l->id == m.region_id()) return l->base + m.offset();
  }
  CKPTD_CHECK(false);  // ResolveSaveData leased every region it accepted
  return nullptr;
}

absl::Status LocalTier::WriteRankBlob(const std::string& dir,
                                      const std::vector<RegionLease>& leases, v1::RankRecord* rec,
                                      Storage* to, const DeltaBase* base) {
  const absl::Time started = absl::Now();
  const uint32_t block = RankBlockBytes(*rec);
  std::vector<BlobPiece> pieces;
  std::vector<ChecksumJob> checksums;
  uint64_t checksum_bytes = 0;
  const std::string& generation = rec->arena_generation();
  auto source = [&](const v1::StagedShard& s) { return ShardSource(generation, s, leases); };
  std::vector<bool> referenced;
  if (base != nullptr && (to == nullptr || to == storage_)) {
    CKPTD_ASSIGN_OR_RETURN(referenced, ReferenceUnchanged(dir, *base, source, rec));
  }
  CKPTD_RETURN_IF_ERROR(
      LayOutRankBlob(source, referenced, rec, &pieces, &checksums, &checksum_bytes));
  std::vector<CrcRange> ranges = CrcRanges(checksums, block);
  if (pieces.empty() || checksum_bytes < limits::kChecksumParallelBytesMin) {
    for (const CrcRange& r : ranges) {
      CKPTD_RETURN_IF_ERROR(GuardedBlockCrcs(r.data, r.length, block, r.out));
    }
    if (pieces.empty()) {
      rec->mutable_timings()->set_flush_us(MicrosBetween(started, absl::Now()));
      return absl::OkStatus();
    }
    ranges.clear();
  }
  // The checksum pool sums while this thread writes: both only read the staged bytes, and the
  // disk, not the CPU, bounds the flush. Each task fills its own entry's crcs; `rec` is not
  // otherwise touched until the job is waited for.
  BlockCrcJob summing = StartBlockCrcs(checksum_pool_, ranges, block, GuardedBlockCrcs);
  absl::Duration sync = absl::ZeroDuration();
  absl::Status st = WritePieces(to != nullptr ? *to : *storage_,
                                absl::StrCat(dir, "/", rec->blob_name()), pieces, &sync);
  absl::Status summed = summing.Wait();
  const absl::Time ended = absl::Now();
  rec->mutable_timings()->set_flush_us(MicrosBetween(started + sync, ended));
  rec->mutable_timings()->set_fsync_us(static_cast<uint64_t>(absl::ToInt64Microseconds(sync)));
  return st.ok() ? summed : st;
}

}  // namespace ckptd
