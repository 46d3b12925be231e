// The resharder: resharder.h.
#include "service/resharder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/align.h"
#include "format/blob_layout.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/names.h"
#include "format/region.h"

namespace ckptd {

// Appends shards to one blob through an aligned buffer, placed as the blob layout says
// (format/blob_layout.h): full buffers are written with O_DIRECT at aligned offsets, zero padding
// goes before each shard up to its offset, and every shard's block checksums are computed as its
// bytes stream through.
class BlobAppender {
 public:
  BlobAppender(std::unique_ptr<BlobWriter> w, uint32_t block_bytes)
      : w_(std::move(w)), crcs_(block_bytes) {
    buf_ = AllocateAligned(limits::kReshardChunkBytes);
  }
  bool ok() const { return buf_ != nullptr; }
  // Starts a shard where the layout places the next one (after zero padding).
  absl::Status BeginShard() {
    CKPTD_RETURN_IF_ERROR(PadTo(layout_.next_offset()));
    shard_bytes_ = 0;
    return absl::OkStatus();
  }
  absl::Status Append(const uint8_t* p, uint64_t n) {
    shard_bytes_ += n;
    for (uint64_t left = n; left > 0;) {
      uint64_t take = std::min(left, limits::kReshardChunkBytes - used_);
      std::memcpy(buf_.get() + used_, p, take);
      crcs_.Update(p, take);
      used_ += take, p += take, left -= take;
      if (used_ == limits::kReshardChunkBytes) CKPTD_RETURN_IF_ERROR(Spill());
    }
    return absl::OkStatus();
  }
  // Ends the shard begun last: its place in the blob, and its block crcs into *crcs (the short
  // last block included).
  absl::StatusOr<ShardPlacement> EndShard(std::vector<uint32_t>* crcs) {
    *crcs = crcs_.Finish();
    CKPTD_ASSIGN_OR_RETURN(ShardPlacement placed, layout_.Append(shard_bytes_));
    CKPTD_CHECK(placed.length == 0 || placed.offset + placed.length == written_ + used_);
    return placed;
  }
  // Writes the rest (padded to the layout's size) and syncs; returns the blob's size.
  absl::StatusOr<uint64_t> Finish() {
    CKPTD_RETURN_IF_ERROR(PadTo(layout_.size_bytes()));
    if (used_ > 0) CKPTD_RETURN_IF_ERROR(Spill());
    CKPTD_RETURN_IF_ERROR(w_->Sync());
    return layout_.size_bytes();
  }

 private:
  // Zeroes up to blob offset `end`, which the layout aligns: the buffer (a multiple of the
  // alignment, spilled whole) always has room for it.
  absl::Status PadTo(uint64_t end) {
    CKPTD_CHECK(end >= written_ + used_ && end - written_ <= limits::kReshardChunkBytes);
    uint64_t pad = end - written_ - used_;
    std::memset(buf_.get() + used_, 0, pad);
    used_ += pad;
    if (used_ == limits::kReshardChunkBytes) CKPTD_RETURN_IF_ERROR(Spill());
    return absl::OkStatus();
  }
  absl::Status Spill() {
    IoSlice s{buf_.get(), used_, written_};
    CKPTD_RETURN_IF_ERROR(w_->Write(std::span<const IoSlice>(&s, 1)));
    written_ += used_;
    used_ = 0;
    return absl::OkStatus();
  }

  std::unique_ptr<BlobWriter> w_;
  BlobLayout layout_;
  BlockCrcStream crcs_;
  AlignedBuffer buf_;
  uint64_t used_ = 0;         // bytes in buf_
  uint64_t written_ = 0;      // bytes written to the blob before buf_
  uint64_t shard_bytes_ = 0;  // of the shard begun last
};

uint32_t ReshardWorldSize(const ReshardSpec& spec, const Manifest& source) {
  uint32_t world_size = 1;
  for (const v1::ItemEntry& item : source.items) {
    const ReshardRule* rule = item.kind() == v1::TENSOR ? MatchRule(spec, item.name()) : nullptr;
    if (rule != nullptr) world_size = std::max(world_size, RuleWorldSize(*rule));
    // Per-rank objects keep their saving rank, which must stay below the world size.
    for (const v1::ShardEntry& s : item.shards()) {
      if (item.kind() == v1::OBJECT && item.scope() == v1::PER_RANK) {
        world_size = std::max(world_size, s.saved_by_rank() + 1);
      }
    }
  }
  return world_size;
}

Resharder::Resharder(const DaemonOptions* options, Storage* storage, Loader* loader,
                     const Clock* clock)
    : options_(options), storage_(storage), loader_(loader), clock_(clock) {}

absl::Status Resharder::Start(std::shared_ptr<ReshardJob> job, Done done) {
  return pool_.Post(
      [this, job = std::move(job), done = std::move(done)] { done(*job, Write(*job)); },
      WorkerPool::WhenFull::kRefuse);
}

absl::Status Resharder::CopyShard(ReshardJob& job, const PlanRequest& whole, BlobAppender& out,
                                  v1::ShardEntry* shard) {
  // Tensors go through the bounded buffer in chunks contiguous in the shard; objects whole.
  std::vector<PlanRequest> parts = {whole};
  if (whole.item->kind() == v1::TENSOR) {
    std::vector<uint64_t> shape(whole.item->shape().begin(), whole.item->shape().end());
    CKPTD_ASSIGN_OR_RETURN(uint32_t elem, DTypeSize(whole.item->dtype()));
    parts.clear();
    for (v1::Region& part :
         ContiguousChunks(shape, whole.region, limits::kReshardChunkBytes / elem)) {
      parts.push_back(PlanRequest{whole.item, std::move(part), nullptr});
    }
  }
  const PlanOptions options = loader_->LoadPlanOptions(job.src->header.checksum_block_bytes());
  std::vector<uint8_t> chunk;
  for (const PlanRequest& part : parts) {
    if (options_->debug_reshard_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_->debug_reshard_delay_ms));
    }
    if (job.cancel.load()) return absl::CancelledError(job.cancel_reason);
    CKPTD_ASSIGN_OR_RETURN(LoadPlan plan, PlanLoad(*job.src, std::span(&part, 1), options));
    chunk.resize(plan.request_bytes[0]);
    uint8_t* dst = chunk.data();
    std::vector<uint64_t> read(job.src_tiers.size());
    CKPTD_RETURN_IF_ERROR(
        loader_->ReadPlan(*job.src, plan, std::span(&dst, 1), job.src_tiers, read));
    CKPTD_RETURN_IF_ERROR(out.Append(chunk.data(), chunk.size()));
    shard->set_length(shard->length() + chunk.size());
    job.bytes_done += chunk.size();
  }
  return absl::OkStatus();
}

absl::StatusOr<Manifest> Resharder::Write(ReshardJob& job) {
  const Manifest& src = *job.src;
  const std::string dir = CheckpointDir(job.target.first, job.target.second);
  const uint32_t block = options_->checksum_block_bytes;
  Manifest m;
  for (const v1::ItemEntry& item : src.items) {
    v1::ItemEntry e = item;
    e.clear_shards();
    m.items.push_back(std::move(e));
  }
  for (uint32_t rank = 0; rank < job.world_size; ++rank) {
    std::unique_ptr<BlobAppender> out;
    for (size_t i = 0; i < src.items.size(); ++i) {
      const v1::ItemEntry& item = src.items[i];
      std::vector<std::pair<const v1::ShardEntry*, v1::Region>> mine;
      if (item.kind() == v1::TENSOR) {
        std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
        for (auto& [r, region] : TargetRegions(job.spec, item.name(), shape)) {
          if (r == rank) mine.emplace_back(nullptr, std::move(region));
        }
      } else {
        for (const v1::ShardEntry& s : item.shards()) {
          uint32_t owner = item.scope() == v1::PER_RANK ? s.saved_by_rank() : 0;
          if (owner == rank) mine.emplace_back(&s, v1::Region());
        }
      }
      for (auto& [object, region] : mine) {
        if (out == nullptr) {
          CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> w,
                                 storage_->CreateBlob(absl::StrCat(dir, "/", BlobName(rank))));
          out = std::make_unique<BlobAppender>(std::move(w), block);
          if (!out->ok()) return absl::ResourceExhaustedError("reshard write buffer");
        }
        v1::ShardEntry* shard = m.items[i].add_shards();
        shard->set_blob_id(rank);
        // The target rank writing it: a per-rank object keeps its saving rank (owner == rank);
        // a replicated one belongs to rank 0 of the target, whatever rank stored it in the
        // source (which may be beyond the target's world size).
        shard->set_saved_by_rank(rank);
        CKPTD_RETURN_IF_ERROR(out->BeginShard());
        if (object == nullptr) *shard->mutable_region() = region;
        CKPTD_RETURN_IF_ERROR(CopyShard(job, PlanRequest{&item, region, object}, *out, shard));
        std::vector<uint32_t> crcs;
        CKPTD_ASSIGN_OR_RETURN(ShardPlacement placed, out->EndShard(&crcs));
        shard->set_offset(placed.offset);
        for (uint32_t c : crcs) shard->add_block_crc32c(c);
      }
    }
    if (out != nullptr) {
      CKPTD_ASSIGN_OR_RETURN(uint64_t size, out->Finish());
      CKPTD_SYNC_POINT("reshard.blob_written");
      *m.header.add_blobs() = MakeBlobInfo(rank, size);
    }
    m.header.add_ranks_present(rank);
  }
  v1::ManifestHeader& h = m.header;
  h.set_format_version(kManifestFormatVersion);
  h.set_job(job.target.first);
  h.set_step(job.target.second);
  h.set_world_size(job.world_size);
  h.set_partial(src.header.partial());
  h.set_created_unix_ms(job.rec.summary().created_unix_ms());
  h.set_committed_unix_ms(clock_->NowUnixMs());
  h.set_checksum_block_bytes(block);
  h.set_total_bytes(src.header.total_bytes());
  h.set_item_count(m.items.size());
  h.set_origin(job.rec.summary().origin());
  return m;
}

}  // namespace ckptd
