// The chunk codec: lossless compression of tensor bytes for the tiers where bytes cost more than
// CPU (the remote store, peers). One chunk (at most limits::kCodecChunkBytesMax decoded bytes) is
// encoded into one self-describing frame; docs/BLOB_FORMAT.md ("Encoded chunks") specifies the
// frame for readers without this source.
//
// Encoding: the chunk's bytes are split into E byte planes, E the element size the caller names
// (1, 2, 4 or 8): plane p holds byte p of every whole element, so the sign+exponent bytes of
// bf16/fp16/fp32 (highly repetitive in trained weights) sit together apart from the mantissa
// bytes (close to random). Each plane is zstd-compressed on its own and stored compressed only
// when that makes it smaller (the encoder asks for a saving of at least 1/32); otherwise raw. The n
// mod E bytes of a trailing partial element follow the planes raw. E = 1 is plain zstd; E = 1
// stored raw is the raw fallback.
//
// Frame (all integers little-endian):
//   0       4     magic "CKC1"
//   4       1     E, the plane count: 1, 2, 4 or 8
//   5       1     zstd_planes: bit p set = plane p is one zstd frame, clear = raw (bits >= E: 0)
//   6       2     reserved: 0
//   8       4     n, decoded bytes: 1..kCodecChunkBytesMax
//   12      4     crc32c of the n decoded bytes (unmasked, format/crc32c.h)
//   16      4     crc32c of the stored bytes: everything after the header to the frame's end
//   20      4*E   stored bytes of plane p, p = 0..E-1
//   20+4E   4     masked crc32c (MaskCrc) of bytes [0, 20+4E): the header's own checksum
//   24+4E   ...   plane 0's stored bytes, ..., plane E-1's, then the n mod E tail bytes raw
// Plane p decodes to floor(n / E) bytes: a raw plane stores exactly that many, a zstd plane is
// one zstd frame whose content size says exactly that many. The frame ends at its last byte.
//
// A decoder trusts no length: the header's checksum is checked before any length is used, every
// size is bounded by the chunk limit and by the bytes actually given, the stored bytes' crc is
// checked before zstd sees them (so any damage to a frame is caught, even one zstd would decode
// to the same bytes, and a verifier can check a frame without decoding it), each zstd frame must
// state its content size, fill its plane exactly and end where the header says, and the decoded
// bytes must match the crc. Any failure is DATA_LOSS naming the caller's context and what was
// wrong.
//
// ChunkEncoder and ChunkDecoder each own one zstd context (freed by their destructor): one
// thread at a time per object; keep one per worker thread. The free functions are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/v1/common.pb.h"

namespace ckptd {

inline constexpr char kCodecFrameMagic[4] = {'C', 'K', 'C', '1'};
inline constexpr uint32_t kCodecPlanesMax = 8;
// The fixed part of the header (before the plane sizes) and the header of a frame of E planes.
inline constexpr uint64_t kCodecHeaderFixedBytes = 20;
constexpr uint64_t CodecHeaderBytes(uint32_t planes) {
  return kCodecHeaderFixedBytes + uint64_t{4} * planes + 4;
}

// The default zstd level: a fast one (bench/codec_bench.cc measures the others). A negative level
// keeps zstd's Huffman coding of literals (where a byte plane's gain is) and only searches less
// for matches: on the exponent planes of bf16 weights -1000 both compresses better and encodes
// faster than level 1 (bench/RESULTS.md "Codecs").
inline constexpr int kCodecZstdLevelDefault = -1000;

// What a frame's header says, once its checksum and limits were checked.
struct CodecFrameInfo {
  uint32_t planes = 1;          // E
  uint32_t zstd_planes = 0;     // bit p: plane p is zstd
  uint64_t decoded_bytes = 0;   // n
  uint32_t decoded_crc32c = 0;  // of the n decoded bytes
  uint32_t stored_crc32c = 0;   // of the frame's bytes after its header
  uint64_t header_bytes = 0;    // CodecHeaderBytes(E)
  uint64_t frame_bytes = 0;     // header + planes + tail
  uint32_t plane_stored_bytes[kCodecPlanesMax] = {};
};

// The plane count that fits a dtype: its element size when that is 2, 4 or 8 (floats and
// integers: their high bytes repeat), else 1. INVALID_ARGUMENT for an unknown dtype.
absl::StatusOr<uint32_t> CodecPlanesFor(v1::DType dtype);

// INVALID_ARGUMENT naming the limits unless level is in [kCodecZstdLevelMin, kCodecZstdLevelMax].
absl::Status ValidateZstdLevel(int level);

// Reads and checks a frame's header at the start of `bytes` (which may hold more than the frame,
// or only part of it: only the header must be there). DATA_LOSS "<context>: encoded chunk: ..."
// when the header is short, has a wrong magic, plane count, reserved bits, decoded size beyond
// the limit, plane sizes that cannot be, or a checksum mismatch.
absl::StatusOr<CodecFrameInfo> ParseCodecFrameHeader(std::span<const uint8_t> bytes,
                                                     std::string_view context);

// Checks a whole frame without decoding it: its header, its length and its stored bytes' crc.
// DATA_LOSS as ParseCodecFrameHeader, or "... stored crc32c mismatch" / a length that differs.
absl::StatusOr<CodecFrameInfo> VerifyCodecFrame(std::span<const uint8_t> frame,
                                                std::string_view context);

class ChunkEncoder {
 public:
  // level: a zstd level already checked by ValidateZstdLevel (a bug otherwise).
  explicit ChunkEncoder(int zstd_level = kCodecZstdLevelDefault);
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Appends the frame of chunk `in` split into `planes` planes to *out. INVALID_ARGUMENT when
  // `in` is empty or larger than kCodecChunkBytesMax, or planes is not 1, 2, 4 or 8; INTERNAL if
  // zstd fails (it does not on valid input). The frame is never larger than
  // CodecFrameBytesMax(in.size(), planes).
  absl::Status Encode(std::span<const uint8_t> in, uint32_t planes, std::string* out);

 private:
  // The plane's zstd frame written to dst (room for m bytes): its size, or 0 to store it raw.
  absl::StatusOr<uint64_t> CompressPlane(const uint8_t* plane, uint64_t m, uint8_t* dst);

  struct State;
  std::unique_ptr<State> state_;
};

// The largest frame Encode writes for n decoded bytes: every plane raw.
constexpr uint64_t CodecFrameBytesMax(uint64_t n, uint32_t planes) {
  return CodecHeaderBytes(planes) + n;
}

class ChunkDecoder {
 public:
  ChunkDecoder();
  ~ChunkDecoder();
  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Decodes the one frame `frame` (exactly its bytes: a frame shorter or longer than its header
  // says is DATA_LOSS; its stored bytes' crc is checked first) into `out`, whose size must be the
  // decoded size the caller expects (from its own record of the chunk: a frame of another size is
  // DATA_LOSS). The decoded bytes' crc32c is checked before returning OK; on an error `out` holds
  // garbage. Errors: DATA_LOSS
  // "<context>: encoded chunk: ..." naming what was wrong.
  absl::Status Decode(std::span<const uint8_t> frame, std::span<uint8_t> out,
                      std::string_view context);

 private:
  absl::Status DecodePlane(std::span<const uint8_t> stored, bool zstd, std::span<uint8_t> plane,
                           uint32_t p, std::string_view context);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ckptd
