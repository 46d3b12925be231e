#include "format/blob_encoding.h"

#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/codec.h"

namespace ckptd {
namespace {

absl::Status Invalid(const v1::BlobInfo& blob, const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrFormat("blob %d (%s): encoding: %s", blob.id(), blob.name(), what));
}

}  // namespace

absl::Status ValidateBlobEncoding(const v1::BlobInfo& blob) {
  if (!blob.has_encoding()) return absl::OkStatus();
  const v1::BlobEncoding& e = blob.encoding();
  if (e.codec() != kBlobCodecCkc1) {
    return Invalid(blob, absl::StrFormat("codec \"%s\" is not one this build decodes (%s)",
                                         e.codec(), kBlobCodecCkc1));
  }
  const uint64_t chunk = e.chunk_bytes();
  if (chunk < limits::kAlignmentBytes || chunk > limits::kCodecChunkBytesMax ||
      (chunk & (chunk - 1)) != 0) {
    return Invalid(blob, absl::StrFormat("chunk size %d is not a power of two in [%d, %d]", chunk,
                                         limits::kAlignmentBytes, limits::kCodecChunkBytesMax));
  }
  const uint64_t size = blob.size_bytes();
  const uint64_t chunks = size / chunk + (size % chunk != 0 ? 1 : 0);
  if (static_cast<uint64_t>(e.frame_bytes_size()) != chunks) {
    return Invalid(blob, absl::StrFormat("%d frame sizes for %d chunks of %d bytes (%d bytes)",
                                         e.frame_bytes_size(), chunks, chunk, size));
  }
  uint64_t sum = 0;  // at most size + chunks * the largest header: no overflow
  for (uint64_t i = 0; i < chunks; ++i) {
    const uint64_t decoded = std::min(chunk, size - i * chunk);
    const uint64_t frame = e.frame_bytes(static_cast<int>(i));
    if (frame < CodecHeaderBytes(1) || frame > CodecFrameBytesMax(decoded, kCodecPlanesMax)) {
      return Invalid(blob, absl::StrFormat("frame %d is %d bytes; a frame of %d decoded bytes "
                                           "is %d to %d",
                                           i, frame, decoded, CodecHeaderBytes(1),
                                           CodecFrameBytesMax(decoded, kCodecPlanesMax)));
    }
    sum += frame;
  }
  if (sum != e.encoded_bytes()) {
    return Invalid(blob, absl::StrFormat("the frames add up to %d bytes, the record says %d", sum,
                                         e.encoded_bytes()));
  }
  return absl::OkStatus();
}

BlobFrames FramesOf(const v1::BlobInfo& blob) {
  CKPTD_CHECK(blob.has_encoding());
  BlobFrames f;
  f.size_bytes = blob.size_bytes();
  f.chunk_bytes = blob.encoding().chunk_bytes();
  f.offsets.reserve(static_cast<size_t>(blob.encoding().frame_bytes_size()) + 1);
  uint64_t at = 0;
  f.offsets.push_back(at);
  for (uint32_t n : blob.encoding().frame_bytes()) f.offsets.push_back(at += n);
  return f;
}

std::optional<uint64_t> EncodedChunkBytes(const Manifest& m) {
  uint64_t chunk =
      std::max<uint64_t>(m.header.checksum_block_bytes(), limits::kEncodedChunkBytesMin);
  chunk = std::min<uint64_t>(chunk, limits::kCodecChunkBytesMax);
  for (; chunk <= limits::kCodecChunkBytesMax; chunk *= 2) {
    uint64_t frames = 0;
    for (const v1::BlobInfo& b : m.header.blobs()) frames += (b.size_bytes() + chunk - 1) / chunk;
    if (frames <= limits::kEncodedFramesPerManifestMax) return chunk;
  }
  return std::nullopt;
}

std::vector<uint8_t> ChunkPlanes(const Manifest& m, uint32_t blob_id, uint64_t size_bytes,
                                 uint64_t chunk_bytes) {
  CKPTD_CHECK(chunk_bytes > 0);
  const uint64_t chunks = (size_bytes + chunk_bytes - 1) / chunk_bytes;
  constexpr uint8_t kUnset = 0, kMixed = 0xff;
  std::vector<uint8_t> planes(chunks, kUnset);
  for (const v1::ItemEntry& item : m.items) {
    uint8_t p = 1;
    if (item.kind() == v1::TENSOR) {
      absl::StatusOr<uint32_t> e = CodecPlanesFor(item.dtype());
      p = e.ok() ? static_cast<uint8_t>(*e) : 1;
    }
    for (const v1::ShardEntry& s : item.shards()) {
      if (s.blob_id() != blob_id || s.length() == 0 || s.offset() >= size_bytes) continue;
      const uint64_t end = std::min(size_bytes, s.offset() + s.length());
      for (uint64_t c = s.offset() / chunk_bytes; c <= (end - 1) / chunk_bytes; ++c) {
        planes[c] = planes[c] == kUnset || planes[c] == p ? p : kMixed;
      }
    }
  }
  for (uint8_t& p : planes) p = p == kUnset || p == kMixed ? 1 : p;
  return planes;
}

}  // namespace ckptd
