#include "format/blob_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "format/crc32c.h"
#include "format/names.h"
#include "format/text.h"

namespace ckptd {

ShardPlacement PlaceShard(uint64_t offset, uint64_t length) {
  CKPTD_CHECK(offset % kBlobAlignmentBytes == 0 && length <= limits::kBlobBytesMax);
  ShardPlacement p;
  p.length = length;
  if (length == 0) return p;  // occupies nothing, wherever it is appended
  p.offset = offset;
  p.padded_length = RoundUp(length, kBlobAlignmentBytes);
  p.body_bytes = RoundDown(length, kBlobAlignmentBytes);
  p.tail_bytes = length - p.body_bytes;
  return p;
}

absl::StatusOr<ShardPlacement> BlobLayout::Append(uint64_t length) {
  // Both terms are <= kBlobBytesMax (1 << 60), so the sum cannot overflow.
  if (length > limits::kBlobBytesMax ||
      RoundUp(length, kBlobAlignmentBytes) > limits::kBlobBytesMax - size_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("blob of ", size_bytes_, " bytes plus a shard of ", length,
                     " bytes would exceed the limit of ", limits::kBlobBytesMax, " bytes"));
  }
  ShardPlacement p = PlaceShard(size_bytes_, length);
  ++shard_count_;
  if (length > 0) {
    data_end_ = p.offset + p.length;
    size_bytes_ = p.end();
  }
  return p;
}

uint64_t ShardEndInBlob(const v1::ShardEntry& shard) {
  if (shard.length() == 0) return 0;
  return shard.offset() + RoundUp(shard.length(), kBlobAlignmentBytes);
}

v1::BlobInfo MakeBlobInfo(uint32_t rank, uint64_t size_bytes) {
  v1::BlobInfo b;
  b.set_id(rank);
  b.set_name(BlobName(rank));
  b.set_size_bytes(size_bytes);
  return b;
}

absl::Status ValidateChecksumBlockBytes(uint64_t block_bytes) {
  if (block_bytes < limits::kChecksumBlockBytesMin ||
      block_bytes > limits::kChecksumBlockBytesMax || (block_bytes & (block_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum block of ", block_bytes, " bytes: must be a power of two in [",
                     limits::kChecksumBlockBytesMin, ", ", limits::kChecksumBlockBytesMax, "]"));
  }
  return absl::OkStatus();
}

BlockSpan ChecksumBlock(uint64_t shard_length, uint32_t block_bytes, uint64_t index) {
  CKPTD_CHECK(block_bytes > 0 && index < BlockCount(shard_length, block_bytes));
  BlockSpan b;
  b.begin = index * block_bytes;
  b.length = std::min<uint64_t>(block_bytes, shard_length - b.begin);
  return b;
}

BlockCrcStream::BlockCrcStream(uint32_t block_bytes) : block_bytes_(block_bytes) {
  CKPTD_CHECK(block_bytes > 0);
}

void BlockCrcStream::Update(const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    uint64_t take = std::min<uint64_t>(n, block_bytes_ - block_fill_);
    crc_ = Crc32c(p, take, crc_);
    block_fill_ += take;
    p += take;
    n -= take;
    if (block_fill_ == block_bytes_) {
      crcs_.push_back(crc_);
      crc_ = 0;
      block_fill_ = 0;
    }
  }
}

std::vector<uint32_t> BlockCrcStream::Finish() {
  if (block_fill_ > 0) crcs_.push_back(crc_);
  block_fill_ = 0;
  crc_ = 0;
  std::vector<uint32_t> out = std::move(crcs_);
  crcs_.clear();
  return out;
}

absl::Status VerifyShardBytes(std::span<const uint8_t> blob, uint64_t blob_offset,
                              const v1::ShardEntry& shard, uint32_t block_bytes,
                              std::string_view context) {
  if (shard.offset() % kBlobAlignmentBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(context), ": shard offset ", shard.offset(), " is not aligned"));
  }
  if (shard.length() == 0) return VerifyBlocks(nullptr, 0, 0, 0, {}, block_bytes, context);
  if (shard.offset() < blob_offset || shard.length() > blob.size() ||
      shard.offset() - blob_offset > blob.size() - shard.length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(context), ": shard bytes [", shard.offset(), ", +", shard.length(),
        ") are not inside the blob bytes read [", blob_offset, ", +", blob.size(), ")"));
  }
  return VerifyBlocks(
      blob.data() + (shard.offset() - blob_offset), 0, shard.length(), shard.length(),
      std::span<const uint32_t>(shard.block_crc32c().data(), shard.block_crc32c().size()),
      block_bytes, context);
}

absl::Status VerifyBlobPadding(std::span<const uint8_t> blob, uint64_t size_bytes,
                               std::span<const ShardPlacement> shards, std::string_view context) {
  if (blob.size() != size_bytes) {
    return absl::DataLossError(absl::StrCat(AbslView(context), ": the file has ", blob.size(),
                                            " bytes; its layout says ", size_bytes));
  }
  std::vector<std::pair<uint64_t, uint64_t>> data;  // [begin, end) of shard bytes
  for (const ShardPlacement& s : shards) {
    if (s.length > 0) data.emplace_back(s.offset, s.offset + s.length);
  }
  std::sort(data.begin(), data.end());
  uint64_t pos = 0;
  auto zero_until = [&](uint64_t end) -> absl::Status {
    for (; pos < end; ++pos) {
      if (blob[pos] != 0) {
        return absl::DataLossError(
            absl::StrCat(AbslView(context), ": padding byte at offset ", pos, " is not zero"));
      }
    }
    return absl::OkStatus();
  };
  for (const auto& [begin, end] : data) {
    if (end > size_bytes || begin < pos) {
      return absl::DataLossError(absl::StrCat(AbslView(context), ": shard bytes [", begin, ", ",
                                              end, ") overlap or leave the blob"));
    }
    CKPTD_RETURN_IF_ERROR(zero_until(begin));
    pos = end;
  }
  return zero_until(size_bytes);
}

}  // namespace ckptd
