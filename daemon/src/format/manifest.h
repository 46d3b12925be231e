// The on-disk manifest of one checkpoint (proto/ckptd/v1/manifest.proto): every item, its dtype
// and shape, its shards and the blobs they live in. Writing it is the commit, so it is validated
// before it is encoded and again after it is decoded (docs/STYLE.md: assert on both sides of
// persistence). File layout:
//   "CKPTMAN1" | record(ManifestHeader) | record(ManifestSegment) x header.segment_count
//   record = u32le payload_len | u32le MaskCrc(crc32c(payload)) | payload
// Segments hold items in name order and are kept under limits::kManifestSegmentBytesTarget (an
// item larger than that alone gets its own segment, up to limits::kManifestRecordBytesMax), so
// the manifest can be sent and read a segment at a time. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/manifest.pb.h"

namespace ckptd {

inline constexpr uint32_t kManifestFormatVersion = 1;
inline constexpr char kManifestMagic[8] = {'C', 'K', 'P', 'T', 'M', 'A', 'N', '1'};
// u32le payload_len + u32le masked crc32c.
inline constexpr size_t kManifestRecordHeaderBytes = 8;

struct Manifest {
  v1::ManifestHeader header;
  std::vector<v1::ItemEntry> items;  // sorted by name, unique
};

// OK iff the manifest is self-consistent:
//  - header: job name valid, step <= limits::kStepMax, 1 <= world_size <= limits::kWorldSizeMax,
//    ranks_present < world_size, checksum_block_bytes > 0, blob ids unique and blob names plain
//    file names, each blob's encoding (if any) consistent (ValidateBlobEncoding,
//    format/blob_encoding.h), item_count == items.size() <= limits::kItemsPerCheckpointMax;
//  - items: names valid, sorted and unique; kind TENSOR or OBJECT;
//  - every shard: blob_id in header.blobs, offset limits::kAlignmentBytes-aligned,
//    offset + length <= blob size, block_crc32c.size() == BlockCount(length,
//    checksum_block_bytes), saved_by_rank and replica_ranks < world_size;
//  - tensors: dtype known, shape valid, each region valid with length == elements * dtype size,
//    and the regions cover every element exactly once (at most once if header.partial);
//  - objects: no region, scope set, REPLICATED has exactly one shard, PER_RANK shards have
//    distinct saved_by_rank, length <= limits::kObjectBytesMax.
// header.total_bytes is not checked (its meaning belongs to the writer).
// FAILED_PRECONDITION "manifest of job \"j\" step 7: item \"w\": ..." otherwise.
absl::Status ValidateManifest(const Manifest& manifest);

// Sets header.format_version, item_count and segment_count, validates (the errors of
// ValidateManifest), splits the items into segments and returns the file's bytes.
// INVALID_ARGUMENT if one item alone exceeds limits::kManifestRecordBytesMax or the segments
// exceed limits::kManifestSegmentsMax.
absl::StatusOr<std::string> EncodeManifest(Manifest manifest);

// Decodes and validates a manifest file; `context` names it in errors (e.g. its path).
// DATA_LOSS "manifest <context>: ..." for a bad magic, a truncated or oversized record, a record
// checksum mismatch ("record 3 checksum mismatch"), an unparsable record, a segment count that
// does not match, trailing bytes, or a manifest that fails ValidateManifest.
// FAILED_PRECONDITION "manifest <context> has format version 99; this build reads version 1".
absl::StatusOr<Manifest> DecodeManifest(std::string_view bytes, std::string_view context);

// Appends one record (length, masked crc32c, payload) to *out. For writers and tests.
void AppendManifestRecord(std::string_view payload, std::string* out);

// The item named `name`, or nullptr. Binary search: items must be sorted.
const v1::ItemEntry* FindItem(const Manifest& manifest, std::string_view name);

}  // namespace ckptd
