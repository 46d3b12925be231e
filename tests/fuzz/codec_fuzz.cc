// The chunk codec (format/codec.h) on fuzzer-chosen bytes. The first input byte picks the mode:
//  - even: the rest is a frame someone stored. Decoding it into a buffer of the size its header
//    claims (or of a fuzzer-chosen wrong size) never reads or writes out of bounds (ASan watches
//    exact-size buffers), never allocates past the chunk limit (-rss_limit_mb), and answers OK or
//    DATA_LOSS only; when OK, the frame verifies (VerifyCodecFrame), the bytes match the header's
//    crc, and re-encoding them decodes to the same bytes again.
//  - odd: the rest is a chunk to encode with a fuzzer-chosen plane count and zstd level: the frame
//    is at most CodecFrameBytesMax, verifies, decodes to exactly the input, and any one of its
//    bytes flipped is DATA_LOSS.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/limits.h"
#include "format/codec.h"
#include "format/crc32c.h"
#include "fuzz_util.h"

namespace ckptd::fuzz {
namespace {

std::span<const uint8_t> AsSpan(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void DecodeStored(std::span<const uint8_t> frame, uint8_t selector) {
  absl::StatusOr<CodecFrameInfo> info = ParseCodecFrameHeader(frame, "fuzz");
  uint64_t n = info.ok() ? info->decoded_bytes : frame.size();
  if (selector & 2) n = (n + (selector >> 2)) % (limits::kCodecChunkBytesMax + 1);
  std::vector<uint8_t> out(n);
  static ChunkDecoder decoder;  // reused, as the tiers reuse theirs: state must not leak across
  const absl::Status s = decoder.Decode(frame, out, "fuzz");
  FUZZ_CHECK(s.ok() || s.code() == absl::StatusCode::kDataLoss, "decode: %s", s.ToString().c_str());
  if (!s.ok()) {
    FUZZ_CHECK(absl::StartsWith(s.message(), "fuzz: encoded chunk: "), "%s", s.ToString().c_str());
    return;
  }
  FUZZ_CHECK(info.ok() && VerifyCodecFrame(frame, "fuzz").ok(), "decoded but does not verify");
  FUZZ_CHECK(Crc32c(out.data(), out.size()) == info->decoded_crc32c, "crc not checked");
  ChunkEncoder encoder;
  std::string again;
  FUZZ_CHECK(encoder.Encode(out, info->planes, &again).ok(), "re-encode failed");
  std::vector<uint8_t> back(n);
  FUZZ_CHECK(decoder.Decode(AsSpan(again), back, "fuzz").ok() && back == out,
             "re-encoded frame does not round-trip");
}

void EncodeChunk(std::span<const uint8_t> in, uint8_t selector) {
  const uint32_t planes = 1u << ((selector >> 1) & 3);
  const int levels[] = {limits::kCodecZstdLevelMin, -1, 1, 3};  // min: -1000
  ChunkEncoder encoder(levels[(selector >> 3) & 3]);
  std::string frame;
  const absl::Status s = encoder.Encode(in, planes, &frame);
  if (in.empty()) {
    FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument, "empty chunk: %s",
               s.ToString().c_str());
    return;
  }
  FUZZ_CHECK(s.ok(), "encode: %s", s.ToString().c_str());
  FUZZ_CHECK(frame.size() <= CodecFrameBytesMax(in.size(), planes), "frame of %zu bytes for %zu",
             frame.size(), in.size());
  FUZZ_CHECK(VerifyCodecFrame(AsSpan(frame), "fuzz").ok(), "fresh frame does not verify");
  ChunkDecoder decoder;
  std::vector<uint8_t> out(in.size());
  FUZZ_CHECK(decoder.Decode(AsSpan(frame), out, "fuzz").ok() &&
                 std::memcmp(out.data(), in.data(), in.size()) == 0,
             "round trip of %zu bytes in %u planes", in.size(), planes);
  const size_t at = (static_cast<size_t>(selector) * 7919) % frame.size();
  frame[at] = static_cast<char>(frame[at] ^ (1 << (selector % 8)));
  FUZZ_CHECK(decoder.Decode(AsSpan(frame), out, "fuzz").code() == absl::StatusCode::kDataLoss,
             "flipped bit at byte %zu not detected", at);
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  if (data[0] & 1) {
    ckptd::fuzz::EncodeChunk(rest, data[0]);
  } else {
    ckptd::fuzz::DecodeStored(rest, data[0]);
  }
  return 0;
}
