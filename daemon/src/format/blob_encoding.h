// Encoded blobs on the remote store (docs/BLOB_FORMAT.md "Encoded blobs on the store"): with the
// remote_codec option on, the remote tier stores a blob as its raw bytes cut into chunks, each
// one frame of the chunk codec (format/codec.h), back to back; the store's manifest records, per
// blob, the chunk size and every frame's size (v1::BlobEncoding in BlobInfo.encoding), so a reader
// finds the frames covering any byte range without reading the others. The local and RAM tiers
// never encode: a manifest there has no encoding.
//
// This file is the pure part: the record's checks, where each frame lies, the chunk size a writer
// picks and the plane count of each chunk. Reading and writing encoded objects is
// tier/encoded_store.h. Pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/manifest.pb.h"
#include "format/manifest.h"

namespace ckptd {

// BlobEncoding.codec of the frame format format/codec.h writes ("CKC1" frames).
inline constexpr char kBlobCodecCkc1[] = "ckc1";

// Checks blob.encoding() (when present) against the blob: codec "ckc1", chunk_bytes a power of
// two in [limits::kAlignmentBytes, limits::kCodecChunkBytesMax], one frame size per chunk
// (ceil(size_bytes / chunk_bytes)), each frame at least a header and at most
// CodecFrameBytesMax of its chunk's decoded size, and encoded_bytes their sum.
// FAILED_PRECONDITION "blob 3 (r00003.blob): encoding: ..." naming what was wrong (the manifest's
// decoder turns it into DATA_LOSS).
absl::Status ValidateBlobEncoding(const v1::BlobInfo& blob);

// Where the frames of an encoded blob lie: frame i is [offsets[i], offsets[i + 1]) of the object
// and decodes to DecodedBytes(i) bytes, raw bytes [i * chunk_bytes, + DecodedBytes(i)).
struct BlobFrames {
  uint64_t size_bytes = 0;  // raw (decoded) bytes of the blob
  uint64_t chunk_bytes = 0;
  std::vector<uint64_t> offsets;  // chunks() + 1 values; offsets.back(): the object's size

  uint64_t chunks() const { return offsets.empty() ? 0 : offsets.size() - 1; }
  uint64_t DecodedBytes(uint64_t chunk) const {
    return std::min(chunk_bytes, size_bytes - chunk * chunk_bytes);
  }
  uint64_t encoded_bytes() const { return offsets.empty() ? 0 : offsets.back(); }
};

// The frames of `blob`, whose encoding passed ValidateBlobEncoding (a CHECK).
BlobFrames FramesOf(const v1::BlobInfo& blob);

// The chunk size a writer uses for the blobs of `m`: the checksum block size, at least
// limits::kEncodedChunkBytesMin (zstd gains little on smaller planes), doubled while the frames
// of all blobs would exceed limits::kEncodedFramesPerManifestMax (the manifest's header record
// holds them all). nullopt when even limits::kCodecChunkBytesMax chunks are too many: the blobs
// are stored raw.
std::optional<uint64_t> EncodedChunkBytes(const Manifest& m);

// The plane count of each chunk of blob `blob_id` of `m` (size_bytes raw bytes, chunks of
// chunk_bytes): the plane count of the dtype (CodecPlanesFor) shared by every shard whose bytes
// lie in the chunk; 1 when they differ, for objects, and for a chunk holding no shard bytes.
// Shards start 4 KiB-aligned, so the elements of every shard of a chunk line up with its planes.
std::vector<uint8_t> ChunkPlanes(const Manifest& m, uint32_t blob_id, uint64_t size_bytes,
                                 uint64_t chunk_bytes);

}  // namespace ckptd
