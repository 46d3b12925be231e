#include "format/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <nmmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "format/text.h"

namespace ckptd {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78;
constexpr uint32_t kMaskDelta = 0xa282ead8;

// Slicing-by-8 tables: table[k][b] is the crc of byte b followed by k zero bytes.
struct Tables {
  uint32_t t[8][256];
};

constexpr Tables MakeTables() {
  Tables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ ((crc & 1) ? kPolyReflected : 0);
    tables.t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) {
      uint32_t prev = tables.t[k - 1][b];
      tables.t[k][b] = (prev >> 8) ^ tables.t[0][prev & 0xff];
    }
  }
  return tables;
}

constexpr Tables kTables = MakeTables();

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;  // x86-64 and aarch64 Linux are little-endian.
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareImpl(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, LoadLe64(p));
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

// Three equal-length blocks at once: the crc32 instruction has a latency of three cycles and a
// throughput of one, so three independent chains run about three times as fast as one.
__attribute__((target("sse4.2"))) void HardwareImpl3(const uint8_t* a, const uint8_t* b,
                                                     const uint8_t* c, size_t n, uint32_t out[3]) {
  uint64_t ca = 0xffffffffu, cb = 0xffffffffu, cc = 0xffffffffu;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    ca = _mm_crc32_u64(ca, LoadLe64(a + i));
    cb = _mm_crc32_u64(cb, LoadLe64(b + i));
    cc = _mm_crc32_u64(cc, LoadLe64(c + i));
  }
  auto a32 = static_cast<uint32_t>(ca), b32 = static_cast<uint32_t>(cb),
       c32 = static_cast<uint32_t>(cc);
  for (; i < n; ++i) {
    a32 = _mm_crc32_u8(a32, a[i]);
    b32 = _mm_crc32_u8(b32, b[i]);
    c32 = _mm_crc32_u8(c32, c[i]);
  }
  out[0] = ~a32;
  out[1] = ~b32;
  out[2] = ~c32;
}

// Copies n bytes with non-temporal 16-byte stores (dst 16-byte aligned, n a multiple of 16): the
// destination is not read for ownership and does not evict the source from cache.
__attribute__((target("sse4.2"))) void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
  for (size_t i = 0; i < n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
}
#endif

bool DetectHardware() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  const auto& t = kTables.t;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v = LoadLe64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xff];
  return ~c;
}

bool Crc32cHardwareAvailable() {
  static const bool available = DetectHardware();
  return available;
}

uint32_t Crc32cHardware(const void* data, size_t n, uint32_t crc) {
  CKPTD_CHECK(Crc32cHardwareAvailable());
#if defined(__x86_64__)
  return HardwareImpl(static_cast<const uint8_t*>(data), n, crc);
#else
  return Crc32cPortable(data, n, crc);
#endif
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (Crc32cHardwareAvailable()) return HardwareImpl(static_cast<const uint8_t*>(data), n, crc);
#endif
  return Crc32cPortable(data, n, crc);
}

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t UnmaskCrc(uint32_t masked_crc) {
  uint32_t rot = masked_crc - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

uint64_t BlockCount(uint64_t bytes, uint32_t block_bytes) {
  CKPTD_CHECK(block_bytes > 0);
  return bytes / block_bytes + (bytes % block_bytes != 0 ? 1 : 0);
}

void BlockCrcsInto(const void* data, uint64_t n, uint32_t block_bytes, uint32_t* out) {
  CKPTD_CHECK(block_bytes > 0);
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t off = 0;
#if defined(__x86_64__)
  if (Crc32cHardwareAvailable()) {
    for (; n - off >= 3ull * block_bytes; off += 3ull * block_bytes, out += 3) {
      HardwareImpl3(p + off, p + off + block_bytes, p + off + 2ull * block_bytes, block_bytes, out);
    }
  }
#endif
  for (; off < n; off += block_bytes)
    *out++ = Crc32c(p + off, std::min<uint64_t>(block_bytes, n - off));
}

void CopyAndBlockCrcs(void* dst, const void* src, uint64_t n, uint32_t block_bytes, uint32_t* out) {
  CKPTD_CHECK(block_bytes > 0);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  uint64_t off = 0;
#if defined(__x86_64__)
  // Three blocks at a time: checksummed (they are then in L1), then streamed to the destination.
  if (Crc32cHardwareAvailable() && reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
      block_bytes % 64 == 0) {
    for (; n - off >= 3ull * block_bytes; off += 3ull * block_bytes, out += 3) {
      HardwareImpl3(s + off, s + off + block_bytes, s + off + 2ull * block_bytes, block_bytes, out);
      StreamCopy(d + off, s + off, 3ull * block_bytes);
    }
    _mm_sfence();  // the non-temporal stores are ordered before what the caller does next
  }
#endif
  if (off < n) {
    std::memcpy(d + off, s + off, n - off);
    BlockCrcsInto(s + off, n - off, block_bytes, out);
  }
}

std::vector<uint32_t> BlockCrcs(const void* data, uint64_t n, uint32_t block_bytes) {
  std::vector<uint32_t> crcs(BlockCount(n, block_bytes));
  BlockCrcsInto(data, n, block_bytes, crcs.data());
  return crcs;
}

absl::Status VerifyBlocks(const void* data, uint64_t first_block, uint64_t n_bytes,
                          uint64_t shard_bytes, std::span<const uint32_t> crcs,
                          uint32_t block_bytes, std::string_view context) {
  if (block_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(context), ": checksum block size is 0"));
  }
  uint64_t blocks = BlockCount(shard_bytes, block_bytes);
  if (crcs.size() != blocks) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(context), ": ", crcs.size(),
                                                   " block checksums for a shard of ", shard_bytes,
                                                   " bytes (want ", blocks, ")"));
  }
  bool in_range = first_block <= blocks;
  uint64_t start_bytes = in_range ? first_block * block_bytes : 0;
  uint64_t end_bytes = start_bytes + n_bytes;
  bool whole = in_range && n_bytes <= shard_bytes - std::min(start_bytes, shard_bytes) &&
               (end_bytes == shard_bytes || n_bytes % block_bytes == 0);
  if (!whole) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(context), ": bytes [", first_block, "*", block_bytes, ", +", n_bytes,
                     ") are not whole checksum blocks of a ", shard_bytes, "-byte shard"));
  }
  // In groups of blocks, so the three-way hardware path gets long runs.
  constexpr uint64_t kGroupBlocks = 48;
  uint32_t actual[kGroupBlocks];
  const auto* p = static_cast<const uint8_t*>(data);
  const uint64_t group_bytes = kGroupBlocks * block_bytes;
  for (uint64_t off = 0; off < n_bytes; off += group_bytes) {
    uint64_t len = std::min<uint64_t>(group_bytes, n_bytes - off);
    BlockCrcsInto(p + off, len, block_bytes, actual);
    for (uint64_t i = 0; i < BlockCount(len, block_bytes); ++i) {
      uint64_t block = first_block + off / block_bytes + i;
      if (actual[i] != crcs[block]) {
        return absl::DataLossError(
            absl::StrCat(AbslView(context), ": block ", block, " crc32c mismatch: expected 0x",
                         absl::Hex(crcs[block], absl::kZeroPad8), ", actual 0x",
                         absl::Hex(actual[i], absl::kZeroPad8)));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd
