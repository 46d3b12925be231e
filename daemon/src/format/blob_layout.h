// The blob layout: the one definition of where a shard's bytes go in a blob file, how much the
// blob's size is, and where its checksum blocks begin and end (docs/BLOB_FORMAT.md describes the
// format for readers of the files). Writers (the flush of a staged rank, the offline reshard, the
// upcoming uploads) and the commit that records a blob's size all ask this module; none computes
// a layout of its own.
//
// The rules:
//  - A blob holds shards back to back in the order they are appended. Each stored shard starts
//    at an offset that is a multiple of kBlobAlignmentBytes (4 KiB, for O_DIRECT); its bytes are
//    followed by zero padding up to the next multiple (the next shard's offset).
//  - An empty shard occupies nothing: its offset is 0 and the next shard's offset is unchanged.
//  - The blob's size (ManifestHeader.blobs[].size_bytes) is the end of its last stored shard
//    rounded up to the alignment, i.e. the offset the next shard would get: the file holds whole
//    pages, so every read of it may be O_DIRECT up to its end.
//  - A shard of n bytes carries BlockCount(n, B) crc32c values (format/crc32c.h), one per block
//    of B = checksum_block_bytes bytes starting at the shard's first byte; the last block may be
//    short. Padding is never checksummed.
//  - The blob saved by rank r is named BlobName(r) (format/names.h) and has blob id r.
//
// Pure code, no I/O. BlobLayout and BlockCrcStream are values used by one thread at a time; the
// free functions are thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/manifest.pb.h"
#include "common/limits.h"

namespace ckptd {

inline constexpr uint64_t kBlobAlignmentBytes = limits::kAlignmentBytes;

// Where one shard lives in its blob.
struct ShardPlacement {
  uint64_t offset = 0;  // of its first byte; a multiple of kBlobAlignmentBytes; 0 when empty
  uint64_t length = 0;  // its bytes
  // Bytes it occupies in the blob: length rounded up to the alignment (0 when empty).
  uint64_t padded_length = 0;
  // length split at its last whole page: `body_bytes` may go to the file straight from the
  // source with O_DIRECT; the `tail_bytes` (< kBlobAlignmentBytes) go through a zeroed page.
  uint64_t body_bytes = 0;
  uint64_t tail_bytes = 0;

  uint64_t end() const { return offset + padded_length; }  // the blob bytes it takes end here
  bool operator==(const ShardPlacement&) const = default;
};

// The placement of a shard of `length` bytes at `offset` (which must be aligned: a bug
// otherwise). length must be <= limits::kBlobBytesMax (a bug otherwise).
ShardPlacement PlaceShard(uint64_t offset, uint64_t length);

// The layout of one blob being written, shard by shard.
class BlobLayout {
 public:
  // Places the next shard of `length` bytes after those appended so far.
  // RESOURCE_EXHAUSTED "blob of <n> bytes would exceed the limit of <max> bytes" when the blob
  // would grow past limits::kBlobBytesMax (the layout is then unchanged).
  absl::StatusOr<ShardPlacement> Append(uint64_t length);

  // Where the next non-empty shard would start; equals size_bytes().
  uint64_t next_offset() const { return size_bytes_; }
  // The blob's size as the manifest records it and the file holds it (whole pages).
  uint64_t size_bytes() const { return size_bytes_; }
  uint64_t shard_count() const { return shard_count_; }
  // Zero padding the file holds after its last shard's bytes (what a writer appends last).
  uint64_t tail_padding_bytes() const { return size_bytes_ - data_end_; }

 private:
  uint64_t size_bytes_ = 0;
  uint64_t data_end_ = 0;  // end of the last stored shard's bytes (unpadded)
  uint64_t shard_count_ = 0;
};

// The blob bytes a stored shard entry takes (offset + padded length; 0 for an empty shard): a
// blob's size is the largest of these over its shards (the commit's rule, for blobs whose
// layout it did not see being built).
uint64_t ShardEndInBlob(const v1::ShardEntry& shard);

// The BlobInfo of the blob saved by `rank`: id `rank`, name BlobName(rank), size `size_bytes`.
v1::BlobInfo MakeBlobInfo(uint32_t rank, uint64_t size_bytes);

// OK iff block_bytes is a power of two in [limits::kChecksumBlockBytesMin,
// limits::kChecksumBlockBytesMax]; INVALID_ARGUMENT naming the value and the rule otherwise.
absl::Status ValidateChecksumBlockBytes(uint64_t block_bytes);

// Block `index` of a shard of `shard_length` bytes: [begin, begin + length) in shard bytes.
// index must be < BlockCount(shard_length, block_bytes) (a bug otherwise).
struct BlockSpan {
  uint64_t begin = 0;
  uint64_t length = 0;
  bool operator==(const BlockSpan&) const = default;
};
BlockSpan ChecksumBlock(uint64_t shard_length, uint32_t block_bytes, uint64_t index);

// The block crcs of a shard whose bytes arrive in pieces of any size (the reshard streams a shard
// through a bounded buffer): Update with the bytes in order, then Finish. Equal to
// BlockCrcs(all bytes, block_bytes).
class BlockCrcStream {
 public:
  explicit BlockCrcStream(uint32_t block_bytes);  // block_bytes > 0 (a bug otherwise)
  void Update(const void* data, uint64_t n);
  // The crcs of every block so far, the short last one included; resets the stream.
  std::vector<uint32_t> Finish();

 private:
  uint32_t block_bytes_;
  uint64_t block_fill_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint32_t> crcs_;
};

// How a reader verifies one shard it has read whole: `blob` holds blob bytes
// [blob_offset, blob_offset + blob.size()); the shard must lie inside, and every block's crc32c
// must match the entry. INVALID_ARGUMENT when the shard is not inside `blob` or its offset is not
// aligned; DATA_LOSS "<context>: block <i> crc32c mismatch: ..." on a mismatch (VerifyBlocks).
absl::Status VerifyShardBytes(std::span<const uint8_t> blob, uint64_t blob_offset,
                              const v1::ShardEntry& shard, uint32_t block_bytes,
                              std::string_view context);

// OK iff the padding of a blob file is zero where the layout says it is: every byte of `blob`
// (the whole file) outside the shards' [offset, offset + length) and below size_bytes is zero, and
// the file is exactly size_bytes long. For fsck-style checks and the layout tests.
// DATA_LOSS naming the first offending offset.
absl::Status VerifyBlobPadding(std::span<const uint8_t> blob, uint64_t size_bytes,
                               std::span<const ShardPlacement> shards, std::string_view context);

}  // namespace ckptd
