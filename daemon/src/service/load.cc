// Load: intersect the requested regions with the saved shards, read only the checksum blocks
// that hold needed bytes, verify them, and write the bytes into the destination extent/region.
#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "format/crc32c.h"
#include "format/dtype.h"
#include "format/names.h"
#include "format/region.h"
#include "common/limits.h"
#include "service/checkpoint_service.h"

namespace ckptd {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Anonymous memory the size of a shard: only the pages actually read are ever backed, so a load
// that needs a sliver of a huge shard costs a sliver of memory.
class SparseBuffer {
 public:
  static absl::StatusOr<SparseBuffer> Map(uint64_t bytes) {
    SparseBuffer b;
    b.len_ = std::max<uint64_t>(RoundUp(bytes, limits::kAlignmentBytes), limits::kAlignmentBytes);
    void* p = mmap(nullptr, b.len_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", bytes, " bytes"));
    b.p_ = static_cast<uint8_t*>(p);
    return b;
  }
  SparseBuffer() = default;
  SparseBuffer(SparseBuffer&& o) noexcept : p_(o.p_), len_(o.len_) { o.p_ = nullptr; }
  ~SparseBuffer() {
    if (p_ != nullptr) munmap(p_, len_);
  }
  uint8_t* data() const { return p_; }

 private:
  uint8_t* p_ = nullptr;
  uint64_t len_ = 0;
};

const v1::ItemEntry* FindItem(const Manifest& m, const std::string& name) {
  auto it = std::lower_bound(m.items.begin(), m.items.end(), name,
                             [](const v1::ItemEntry& e, const std::string& n) {
                               return e.name() < n;
                             });
  return it != m.items.end() && it->name() == name ? &*it : nullptr;
}

const v1::BlobInfo* FindBlob(const Manifest& m, uint32_t id) {
  for (const v1::BlobInfo& b : m.header.blobs()) {
    if (b.id() == id) return &b;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Manifest>> CheckpointService::GetManifest(
    const std::string& job, uint64_t step) {
  {
    absl::MutexLock lock(&mu_);
    auto it = manifest_cache_.find(Key{job, step});
    if (it != manifest_cache_.end()) return it->second;
  }
  std::string path = absl::StrCat(CheckpointDir(job, step), "/", kManifestFileName);
  CKPTD_ASSIGN_OR_RETURN(std::string bytes, deps_.storage->Get(path));
  CKPTD_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(bytes, path));
  if (m.header.job() != job || m.header.step() != step) {
    return absl::DataLossError(absl::StrCat("manifest ", path, " belongs to ", m.header.job(),
                                            "/", m.header.step()));
  }
  auto shared = std::make_shared<const Manifest>(std::move(m));
  absl::MutexLock lock(&mu_);
  manifest_cache_[Key{job, step}] = shared;
  while (manifest_cache_.size() > 8) manifest_cache_.erase(manifest_cache_.begin());
  return shared;
}

absl::StatusOr<uint8_t*> CheckpointService::ResolveDest(const std::string& session,
                                                        const v1::MemRef& ref,
                                                        uint64_t need_bytes,
                                                        std::vector<RegionLease>* leases,
                                                        const std::string& what) const {
  if (ref.length() < need_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": destination holds ", ref.length(),
                                                   " bytes, ", need_bytes, " are needed"));
  }
  if (need_bytes == 0) return nullptr;
  if (ref.target_case() == v1::MemRef::kExtentId) {
    absl::StatusOr<ExtentInfo> e = deps_.arena->Lookup(session, ref.extent_id());
    if (!e.ok()) return Annotate(e.status(), what);
    if (ref.offset() > e->length || ref.length() > e->length - ref.offset()) {
      return absl::OutOfRangeError(absl::StrCat(what, ": bytes [", ref.offset(), ", ",
                                                ref.offset(), "+", ref.length(),
                                                ") are outside extent ", e->id, " (", e->length,
                                                " bytes)"));
    }
    return deps_.arena->base() + e->offset + ref.offset();
  }
  if (ref.target_case() == v1::MemRef::kRegionId) {
    absl::StatusOr<RegionLease> lease =
        deps_.regions->Acquire(session, ref.region_id(), ref.offset(), ref.length());
    if (!lease.ok()) return Annotate(lease.status(), what);
    uint8_t* p = (*lease)->base + ref.offset();
    leases->push_back(*std::move(lease));
    return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": destination names no extent or region"));
}

absl::Status CheckpointService::LoadItem(const std::string& session, const Manifest& m,
                                         const v1::LoadItemRequest& req, uint32_t rank,
                                         v1::LoadedItem* out, uint64_t* bytes_read) {
  const std::string ckpt = absl::StrCat(m.header.job(), "/", m.header.step());
  const v1::ItemEntry* item = FindItem(m, req.item());
  if (item == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("item \"", req.item(), "\" is not in checkpoint ", ckpt));
  }
  std::string what = absl::StrCat("checkpoint ", ckpt, " item \"", req.item(), "\"");
  std::vector<RegionLease> leases;
  const uint32_t block = m.header.checksum_block_bytes();
  std::vector<uint64_t> shape(item->shape().begin(), item->shape().end());
  uint32_t elem = 1;
  v1::Region dst_region = req.region();
  std::vector<const v1::ShardEntry*> shards;
  uint64_t need = 0;
  if (item->kind() == v1::TENSOR) {
    CKPTD_ASSIGN_OR_RETURN(elem, DTypeSize(item->dtype()));
    CKPTD_RETURN_IF_ERROR(Annotate(ValidateRegion(dst_region, shape), what));
    need = RegionElements(dst_region, shape) * elem;
    for (const v1::ShardEntry& s : item->shards()) shards.push_back(&s);
  } else {
    for (const v1::ShardEntry& s : item->shards()) {
      if (item->scope() == v1::REPLICATED || s.saved_by_rank() == rank) shards.push_back(&s);
    }
    if (shards.empty()) {
      return absl::NotFoundError(absl::StrCat(what, ": no copy of this per-rank object was "
                                                    "saved by rank ", rank));
    }
    need = shards[0]->length();
    out->set_saved_by_rank(shards[0]->saved_by_rank());
    shards.resize(1);
  }
  CKPTD_ASSIGN_OR_RETURN(uint8_t * dst, ResolveDest(session, req.dest(), need, &leases, what));
  for (const v1::ShardEntry* s : shards) {
    if (s->length() == 0) continue;
    std::vector<ByteRange> ranges;
    if (item->kind() == v1::TENSOR) {
      ranges = NeededByteRanges(shape, elem, s->region(), dst_region);
    } else {
      ranges.push_back(ByteRange{0, s->length()});
    }
    if (ranges.empty()) continue;
    const v1::BlobInfo* blob = FindBlob(m, s->blob_id());
    CKPTD_CHECK(blob != nullptr);  // ValidateManifest checked it
    std::string path = absl::StrCat(CheckpointDir(m.header.job(), m.header.step()), "/",
                                    blob->name());
    CKPTD_ASSIGN_OR_RETURN(SparseBuffer buf, SparseBuffer::Map(s->length()));
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobReader> reader, deps_.storage->OpenBlob(path));
    // Whole checksum blocks around each needed range, merged when adjacent.
    std::vector<IoSlice> slices;
    std::vector<std::pair<uint64_t, uint64_t>> blocks;  // [first block, end block)
    for (const ByteRange& r : ranges) {
      uint64_t b0 = r.offset / block, b1 = (r.offset + r.len + block - 1) / block;
      if (!blocks.empty() && blocks.back().second >= b0) {
        blocks.back().second = std::max(blocks.back().second, b1);
      } else {
        blocks.emplace_back(b0, b1);
      }
    }
    for (const auto& [b0, b1] : blocks) {
      uint64_t off = b0 * block;
      uint64_t len = std::min<uint64_t>(b1 * block, s->length()) - off;
      // Whole pages where the blob has them (O_DIRECT), else exactly to its end (buffered).
      uint64_t file_left = reader->size_bytes() > s->offset() + off
                               ? reader->size_bytes() - s->offset() - off
                               : 0;
      uint64_t io_len = std::max(len, std::min(RoundUp(len, limits::kAlignmentBytes), file_left));
      slices.push_back(IoSlice{buf.data() + off, io_len, s->offset() + off});
      *bytes_read += io_len;
    }
    CKPTD_RETURN_IF_ERROR(Annotate(reader->Read(slices), what));
    for (const auto& [b0, b1] : blocks) {
      uint64_t off = b0 * block;
      uint64_t len = std::min<uint64_t>(b1 * block, s->length()) - off;
      CKPTD_RETURN_IF_ERROR(VerifyBlocks(buf.data() + off, b0, len, s->length(),
                                         std::span<const uint32_t>(s->block_crc32c().data(),
                                                                   s->block_crc32c().size()),
                                         block,
                                         absl::StrCat(what, " shard in ", path)));
    }
    if (item->kind() == v1::TENSOR) {
      CopyRegion(shape, elem, s->region(), buf.data(), dst_region, dst);
    } else {
      std::memcpy(dst, buf.data(), s->length());
    }
  }
  out->set_item(req.item());
  out->set_bytes(need);
  return absl::OkStatus();
}

absl::Status CheckpointService::Load(const v1::LoadRequest& req, v1::LoadResponse* resp) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(req.session_id()));
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  if (static_cast<uint64_t>(req.items_size()) > limits::kLoadRequestsMax) {
    return absl::InvalidArgumentError(absl::StrCat("load of ", req.items_size(),
                                                   " items in one call; the limit is ",
                                                   limits::kLoadRequestsMax));
  }
  uint64_t step = req.step();
  if (req.which_case() != v1::LoadRequest::kStep) {
    CKPTD_ASSIGN_OR_RETURN(step, LatestCommitted(req.job()));
  }
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, GetRecord(req.job(), step));
  if (!rec) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", req.job(), "/", step,
                                            " does not exist"));
  }
  if (rec->summary().state() != v1::COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", req.job(), "/", step, " is ",
                     v1::CheckpointState_Name(rec->summary().state()),
                     "; only COMMITTED checkpoints load"));
  }
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> m, GetManifest(req.job(), step));
  resp->set_step(step);
  uint64_t bytes_read = 0;
  for (const v1::LoadItemRequest& item : req.items()) {
    CKPTD_RETURN_IF_ERROR(
        LoadItem(session, *m, item, req.rank(), resp->add_items(), &bytes_read));
  }
  resp->set_bytes_read(bytes_read);
  return absl::OkStatus();
}

}  // namespace ckptd
