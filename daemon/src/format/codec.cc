#include "format/codec.h"

// ZSTD_c_literalCompressionMode is one of zstd's experimental parameters (in the shared library;
// its declaration needs this). Set where the library has it; ignored where it does not.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/crc32c.h"
#include "format/dtype.h"

namespace ckptd {
namespace {

bool ValidPlanes(uint32_t planes) {
  return planes == 1 || planes == 2 || planes == 4 || planes == 8;
}

uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;  // the daemon runs on little-endian hosts only (as the manifest framing assumes)
}

void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

absl::Status FrameError(std::string_view context, std::string_view what) {
  return absl::DataLossError(absl::StrFormat("%s: encoded chunk: %s", context, what));
}

// Byte grouping: plane p of `planes` gets byte p of each of the m whole elements of src. Each
// element is loaded as one little-endian word and its bytes shifted out, so the loops are
// straight-line per element (GCC vectorizes the 2-byte case).
template <typename Word>
void SplitPlanes(const uint8_t* src, uint64_t m, uint8_t* dst) {
  constexpr uint32_t E = sizeof(Word);
  for (uint64_t i = 0; i < m; ++i) {
    Word w;
    std::memcpy(&w, src + i * E, E);
    for (uint32_t p = 0; p < E; ++p) dst[p * m + i] = static_cast<uint8_t>(w >> (8 * p));
  }
}

template <typename Word>
void JoinPlanes(const uint8_t* src, uint64_t m, uint8_t* dst) {
  constexpr uint32_t E = sizeof(Word);
  for (uint64_t i = 0; i < m; ++i) {
    Word w = 0;
    for (uint32_t p = 0; p < E; ++p) w |= static_cast<Word>(Word{src[p * m + i]} << (8 * p));
    std::memcpy(dst + i * E, &w, E);
  }
}

void Split(const uint8_t* src, uint64_t m, uint32_t planes, uint8_t* dst) {
  switch (planes) {
    case 2:
      return SplitPlanes<uint16_t>(src, m, dst);
    case 4:
      return SplitPlanes<uint32_t>(src, m, dst);
    case 8:
      return SplitPlanes<uint64_t>(src, m, dst);
    default:
      CKPTD_CHECK(false);  // callers pass 2, 4 or 8
  }
}

void Join(const uint8_t* src, uint64_t m, uint32_t planes, uint8_t* dst) {
  switch (planes) {
    case 2:
      return JoinPlanes<uint16_t>(src, m, dst);
    case 4:
      return JoinPlanes<uint32_t>(src, m, dst);
    case 8:
      return JoinPlanes<uint64_t>(src, m, dst);
    default:
      CKPTD_CHECK(false);
  }
}

// Checks the plane sizes of a header whose fixed part passed, and fills them in.
absl::Status ParsePlaneSizes(const uint8_t* sizes, CodecFrameInfo& info, std::string_view context) {
  const uint64_t m = info.decoded_bytes / info.planes;
  uint64_t stored_total = 0;
  for (uint32_t p = 0; p < info.planes; ++p) {
    const uint32_t stored = LoadU32(sizes + uint64_t{4} * p);
    const bool zstd = (info.zstd_planes >> p) & 1;
    if (!zstd && stored != m) {
      return FrameError(context, absl::StrFormat("raw plane %u stores %u bytes, not the %u of "
                                                 "its %u-byte plane",
                                                 p, stored, m, m));
    }
    if (zstd && (stored == 0 || stored >= m)) {
      return FrameError(context, absl::StrFormat("zstd plane %u stores %u bytes: a compressed "
                                                 "plane is 1..%u bytes (smaller than its %u raw)",
                                                 p, stored, m == 0 ? 0 : m - 1, m));
    }
    info.plane_stored_bytes[p] = stored;
    stored_total += stored;
  }
  info.frame_bytes = info.header_bytes + stored_total + info.decoded_bytes % info.planes;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint32_t> CodecPlanesFor(v1::DType dtype) {
  absl::StatusOr<uint32_t> size = DTypeSize(dtype);
  if (!size.ok()) return size.status();
  return *size == 2 || *size == 4 || *size == 8 ? *size : 1;
}

absl::Status ValidateZstdLevel(int level) {
  if (level >= limits::kCodecZstdLevelMin && level <= limits::kCodecZstdLevelMax) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "zstd level %d is outside [%d, %d] (limits::kCodecZstdLevelMin, kCodecZstdLevelMax)", level,
      limits::kCodecZstdLevelMin, limits::kCodecZstdLevelMax));
}

absl::StatusOr<CodecFrameInfo> ParseCodecFrameHeader(std::span<const uint8_t> bytes,
                                                     std::string_view context) {
  if (bytes.size() < kCodecHeaderFixedBytes) {
    return FrameError(context, absl::StrFormat("%u bytes, shorter than a header", bytes.size()));
  }
  if (std::memcmp(bytes.data(), kCodecFrameMagic, 4) != 0) {
    return FrameError(context, "bad magic (not a CKC1 frame)");
  }
  CodecFrameInfo info;
  info.planes = bytes[4];
  if (!ValidPlanes(info.planes)) {
    return FrameError(context, absl::StrFormat("plane count %u (not 1, 2, 4 or 8)", info.planes));
  }
  info.header_bytes = CodecHeaderBytes(info.planes);
  if (bytes.size() < info.header_bytes) {
    return FrameError(context, absl::StrFormat("%u bytes, shorter than its %u-byte header",
                                               bytes.size(), info.header_bytes));
  }
  const uint64_t crc_at = info.header_bytes - 4;
  const uint32_t header_crc = Crc32c(bytes.data(), crc_at);
  if (UnmaskCrc(LoadU32(bytes.data() + crc_at)) != header_crc) {
    return FrameError(context,
                      absl::StrFormat("header crc32c mismatch: stored 0x%08x, actual "
                                      "0x%08x",
                                      UnmaskCrc(LoadU32(bytes.data() + crc_at)), header_crc));
  }
  info.zstd_planes = bytes[5];
  if ((info.zstd_planes >> info.planes) != 0 || bytes[6] != 0 || bytes[7] != 0) {
    return FrameError(context, "reserved header bits are set");
  }
  info.decoded_bytes = LoadU32(bytes.data() + 8);
  if (info.decoded_bytes == 0 || info.decoded_bytes > limits::kCodecChunkBytesMax) {
    return FrameError(context, absl::StrFormat("decoded size %u is outside 1..%u "
                                               "(limits::kCodecChunkBytesMax)",
                                               info.decoded_bytes, limits::kCodecChunkBytesMax));
  }
  info.decoded_crc32c = LoadU32(bytes.data() + 12);
  info.stored_crc32c = LoadU32(bytes.data() + 16);
  if (absl::Status s = ParsePlaneSizes(bytes.data() + kCodecHeaderFixedBytes, info, context);
      !s.ok()) {
    return s;
  }
  return info;
}

absl::StatusOr<CodecFrameInfo> VerifyCodecFrame(std::span<const uint8_t> frame,
                                                std::string_view context) {
  absl::StatusOr<CodecFrameInfo> info = ParseCodecFrameHeader(frame, context);
  if (!info.ok()) return info.status();
  if (frame.size() != info->frame_bytes) {
    return FrameError(context, absl::StrFormat("%u bytes, but its header says %u", frame.size(),
                                               info->frame_bytes));
  }
  const uint32_t crc = Crc32c(frame.data() + info->header_bytes, frame.size() - info->header_bytes);
  if (crc != info->stored_crc32c) {
    return FrameError(context, absl::StrFormat("stored crc32c mismatch: expected 0x%08x, actual "
                                               "0x%08x",
                                               info->stored_crc32c, crc));
  }
  return info;
}

// --- encoding ----------------------------------------------------------------------------------

struct ChunkEncoder::State {
  ZSTD_CCtx* cctx = nullptr;
  std::vector<uint8_t> grouped;  // the planes of the chunk being encoded
  std::vector<uint8_t> sample;   // a trial compression of a plane's start
};

ChunkEncoder::ChunkEncoder(int zstd_level) : state_(std::make_unique<State>()) {
  CKPTD_CHECK(ValidateZstdLevel(zstd_level).ok());
  state_->cctx = ZSTD_createCCtx();
  CKPTD_CHECK(state_->cctx != nullptr);
  CKPTD_CHECK(
      !ZSTD_isError(ZSTD_CCtx_setParameter(state_->cctx, ZSTD_c_compressionLevel, zstd_level)));
  // The content size is what a decoder checks against its plane; our crc replaces zstd's.
  CKPTD_CHECK(!ZSTD_isError(ZSTD_CCtx_setParameter(state_->cctx, ZSTD_c_contentSizeFlag, 1)));
  CKPTD_CHECK(!ZSTD_isError(ZSTD_CCtx_setParameter(state_->cctx, ZSTD_c_checksumFlag, 0)));
  // zstd's negative levels skip entropy coding of literals, but a byte plane's gain is in its
  // literals (the exponent bytes' skewed histogram), not in matches: keep Huffman on, so a fast
  // level only searches less for matches. A library without the parameter refuses it; the level
  // then stands as zstd defines it (the frames decode the same either way).
  if (zstd_level < 0) {
    (void)ZSTD_CCtx_setParameter(state_->cctx, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
  }
}

ChunkEncoder::~ChunkEncoder() { ZSTD_freeCCtx(state_->cctx); }

// A plane is stored compressed only when that saves at least 1/kMinSavingDivisor of it: a plane
// of near-random bytes (the low mantissa bytes) then decodes as a memcpy. A plane of at least
// kSampleMinBytes is tried on its first kSampleBytes first, and stored raw without compressing
// the rest when the sample does not save that much (encoding then skips most of zstd's work on
// incompressible planes).
constexpr uint64_t kMinSavingDivisor = 32;
constexpr uint64_t kSampleBytes = uint64_t{64} * 1024;
constexpr uint64_t kSampleMinBytes = 8 * kSampleBytes;

absl::StatusOr<uint64_t> ChunkEncoder::CompressPlane(const uint8_t* plane, uint64_t m,
                                                     uint8_t* dst) {
  const uint64_t room = m - m / kMinSavingDivisor;
  if (m < 2 || room == 0) return 0;
  if (m >= kSampleMinBytes) {
    const uint64_t sample_room = kSampleBytes - kSampleBytes / kMinSavingDivisor;
    state_->sample.resize(sample_room);
    const size_t r =
        ZSTD_compress2(state_->cctx, state_->sample.data(), sample_room, plane, kSampleBytes);
    if (ZSTD_isError(r)) {
      if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) return 0;
      return absl::InternalError(absl::StrCat("codec: zstd: ", ZSTD_getErrorName(r)));
    }
  }
  // zstd fails with dstSize_tooSmall when the plane would not fit the room: stored raw.
  const size_t r = ZSTD_compress2(state_->cctx, dst, room, plane, m);
  if (ZSTD_isError(r)) {
    if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) return 0;
    return absl::InternalError(absl::StrCat("codec: zstd: ", ZSTD_getErrorName(r)));
  }
  return r;
}

absl::Status ChunkEncoder::Encode(std::span<const uint8_t> in, uint32_t planes, std::string* out) {
  if (in.empty() || in.size() > limits::kCodecChunkBytesMax) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codec: a chunk is 1..%u bytes (limits::kCodecChunkBytesMax), not %u",
                        limits::kCodecChunkBytesMax, in.size()));
  }
  if (!ValidPlanes(planes)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("codec: plane count %u is not 1, 2, 4 or 8", planes));
  }
  const uint64_t n = in.size(), m = n / planes, header = CodecHeaderBytes(planes);
  const uint8_t* grouped = in.data();
  if (planes > 1) {
    state_->grouped.resize(m * planes);
    Split(in.data(), m, planes, state_->grouped.data());
    grouped = state_->grouped.data();
  }
  const uint64_t base = out->size();
  out->resize(base + CodecFrameBytesMax(n, planes));
  uint8_t* frame = reinterpret_cast<uint8_t*>(out->data()) + base;
  uint64_t pos = header;
  uint8_t zstd_planes = 0;
  for (uint32_t p = 0; p < planes; ++p) {
    const uint8_t* plane = grouped + p * m;
    absl::StatusOr<uint64_t> r = CompressPlane(plane, m, frame + pos);
    if (!r.ok()) return r.status();
    const bool compressed = *r != 0;
    if (!compressed) {
      *r = m;
      if (m > 0) std::memcpy(frame + pos, plane, m);
    }
    zstd_planes |= compressed ? uint8_t(1u << p) : 0;
    StoreU32(frame + kCodecHeaderFixedBytes + uint64_t{4} * p, static_cast<uint32_t>(*r));
    pos += *r;
  }
  std::memcpy(frame + pos, in.data() + m * planes, n - m * planes);  // the partial element
  pos += n - m * planes;
  std::memcpy(frame, kCodecFrameMagic, 4);
  frame[4] = static_cast<uint8_t>(planes);
  frame[5] = zstd_planes;
  frame[6] = frame[7] = 0;
  StoreU32(frame + 8, static_cast<uint32_t>(n));
  StoreU32(frame + 12, Crc32c(in.data(), n));
  StoreU32(frame + 16, Crc32c(frame + header, pos - header));
  StoreU32(frame + header - 4, MaskCrc(Crc32c(frame, header - 4)));
  out->resize(base + pos);
  return absl::OkStatus();
}

// --- decoding ----------------------------------------------------------------------------------

struct ChunkDecoder::State {
  ZSTD_DCtx* dctx = nullptr;
  std::vector<uint8_t> grouped;
};

ChunkDecoder::ChunkDecoder() : state_(std::make_unique<State>()) {
  state_->dctx = ZSTD_createDCtx();
  CKPTD_CHECK(state_->dctx != nullptr);
  CKPTD_CHECK(!ZSTD_isError(
      ZSTD_DCtx_setParameter(state_->dctx, ZSTD_d_windowLogMax, limits::kCodecZstdWindowLogMax)));
}

ChunkDecoder::~ChunkDecoder() { ZSTD_freeDCtx(state_->dctx); }

absl::Status ChunkDecoder::DecodePlane(std::span<const uint8_t> stored, bool zstd,
                                       std::span<uint8_t> plane, uint32_t p,
                                       std::string_view context) {
  if (!zstd) {
    if (!plane.empty()) std::memcpy(plane.data(), stored.data(), plane.size());
    return absl::OkStatus();
  }
  const unsigned long long content = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (content != plane.size()) {
    return FrameError(context,
                      absl::StrFormat("plane %u: zstd frame %s, not the plane's %u bytes", p,
                                      content == ZSTD_CONTENTSIZE_ERROR ? "does not parse"
                                      : content == ZSTD_CONTENTSIZE_UNKNOWN
                                          ? "states no content size"
                                          : absl::StrCat("holds ", content, " bytes"),
                                      plane.size()));
  }
  const size_t frame_size = ZSTD_findFrameCompressedSize(stored.data(), stored.size());
  if (ZSTD_isError(frame_size) || frame_size != stored.size()) {
    return FrameError(
        context, absl::StrFormat("plane %u: zstd frame does not end at the plane's "
                                 "%u stored bytes (%s)",
                                 p, stored.size(),
                                 ZSTD_isError(frame_size) ? ZSTD_getErrorName(frame_size)
                                                          : absl::StrCat(frame_size, " bytes")));
  }
  const size_t r =
      ZSTD_decompressDCtx(state_->dctx, plane.data(), plane.size(), stored.data(), stored.size());
  if (ZSTD_isError(r) || r != plane.size()) {
    return FrameError(context, absl::StrFormat("plane %u: zstd: %s", p,
                                               ZSTD_isError(r) ? ZSTD_getErrorName(r)
                                                               : absl::StrCat(r, " bytes")));
  }
  return absl::OkStatus();
}

absl::Status ChunkDecoder::Decode(std::span<const uint8_t> frame, std::span<uint8_t> out,
                                  std::string_view context) {
  absl::StatusOr<CodecFrameInfo> info = VerifyCodecFrame(frame, context);
  if (!info.ok()) return info.status();
  if (out.size() != info->decoded_bytes) {
    return FrameError(context, absl::StrFormat("decodes to %u bytes, expected %u",
                                               info->decoded_bytes, out.size()));
  }
  const uint32_t planes = info->planes;
  const uint64_t m = info->decoded_bytes / planes;
  uint8_t* grouped = out.data();
  if (planes > 1) {
    state_->grouped.resize(m * planes);
    grouped = state_->grouped.data();
  }
  uint64_t pos = info->header_bytes;
  for (uint32_t p = 0; p < planes; ++p) {
    const uint32_t stored = info->plane_stored_bytes[p];
    if (absl::Status s = DecodePlane(frame.subspan(pos, stored), (info->zstd_planes >> p) & 1,
                                     std::span<uint8_t>(grouped + p * m, m), p, context);
        !s.ok()) {
      return s;
    }
    pos += stored;
  }
  if (planes > 1) Join(grouped, m, planes, out.data());
  std::memcpy(out.data() + m * planes, frame.data() + pos, out.size() - m * planes);
  const uint32_t crc = Crc32c(out.data(), out.size());
  if (crc != info->decoded_crc32c) {
    return FrameError(context, absl::StrFormat("decoded crc32c mismatch: expected 0x%08x, "
                                               "actual 0x%08x",
                                               info->decoded_crc32c, crc));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
