// What the chunk codec (format/codec.h) gains and costs on checkpoint-like tensors, one core:
// for each tensor set, side by side in one run, raw (memcpy + crc32c: what storing it unencoded
// costs the CPU), plain zstd (one plane) and byte-grouped zstd (one plane per element byte) at a
// few levels: the ratio (decoded / encoded bytes), encode and decode GB/s on this thread, and for
// a few link speeds the time to push the set through encode + link against sending it raw (the
// encode overlapped with the send, as the upload does chunk by chunk). Prints a table and one
// JSON line per (set, method) to --json. bench/RESULTS.md "Codecs" uses it.
//
// Tensor sets (seeded, so every run encodes the same bytes):
//   weights   weights of a trained-like spread: rows of N(0, s^2) with s log-normal around 0.02
//             (layers and rows differ in scale, as trained matrices do), fp32, bf16 and fp16;
//   adam_m    Adam's first moment: N(0, (1e-4 * row scale)^2) fp32;
//   adam_v    Adam's second moment: squares of such gradients (positive, wide exponents) fp32;
//   file      --file PATH --file_dtype bf16|fp16|fp32: the raw bytes of real tensors (a model's
//             weights written out with torch's `tensor.view(torch.uint8).numpy().tofile`).
//   ckptd_bench_codec [--mib M] [--chunk_kib K] [--reps R] [--levels -1000,1] [--json PATH]
//                     [--file PATH --file_dtype bf16]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"
#include "format/codec.h"
#include "format/crc32c.h"

namespace {

using Clock = std::chrono::steady_clock;
using Bytes = std::vector<uint8_t>;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Set {
  std::string name;
  uint32_t element_bytes;
  Bytes bytes;
};

uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// IEEE half, round to nearest even (normals and subnormals; these values never overflow).
uint16_t ToFp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const float a = std::fabs(f);
  if (a < 6.103515625e-05f) {  // subnormal: units of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  }
  const uint32_t ua = u & 0x7fffffff;
  uint32_t h = ((ua - (112u << 23)) + 0xfff + ((ua >> 13) & 1)) >> 13;
  return static_cast<uint16_t>(sign | h);
}

// Rows of `row` elements, each N(0, (base * row_scale)^2), row_scale log-normal(0, 0.5).
std::vector<float> Rows(uint64_t n, double base, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> scale(0.0, 0.5);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> v(n);
  const uint64_t row = 4096;
  for (uint64_t i = 0; i < n; i += row) {
    const float s = static_cast<float>(base * scale(rng));
    for (uint64_t j = i; j < std::min(n, i + row); ++j) v[j] = s * unit(rng);
  }
  return v;
}

template <typename T, typename F>
Bytes Pack(const std::vector<float>& v, F convert) {
  Bytes b(v.size() * sizeof(T));
  for (size_t i = 0; i < v.size(); ++i) {
    const T x = convert(v[i]);
    std::memcpy(&b[i * sizeof(T)], &x, sizeof(T));
  }
  return b;
}

std::vector<Set> MakeSets(uint64_t bytes) {
  const uint64_t n32 = bytes / 4, n16 = bytes / 2;
  std::vector<Set> sets;
  auto f32 = [](float f) { return f; };
  sets.push_back({"weights fp32", 4, Pack<float>(Rows(n32, 0.02, 1), f32)});
  const std::vector<float> w16 = Rows(n16, 0.02, 1);
  sets.push_back({"weights bf16", 2, Pack<uint16_t>(w16, ToBf16)});
  sets.push_back({"weights fp16", 2, Pack<uint16_t>(w16, ToFp16)});
  sets.push_back({"adam_m fp32", 4, Pack<float>(Rows(n32, 1e-4, 2), f32)});
  std::vector<float> g = Rows(n32, 1e-3, 3);
  for (float& x : g) x = x * x;
  sets.push_back({"adam_v fp32", 4, Pack<float>(g, f32)});
  return sets;
}

struct Result {
  double ratio = 0, encode_gbs = 0, decode_gbs = 0;
};

// Encodes then decodes the set chunk by chunk, reps times; the best time of each.
Result Measure(const Set& set, uint32_t planes, int level, uint64_t chunk, int reps) {
  ckptd::ChunkEncoder enc(level);
  ckptd::ChunkDecoder dec;
  const uint64_t n = set.bytes.size();
  std::string frames;
  std::vector<uint64_t> ends;
  Bytes out(chunk);
  double best_enc = 1e9, best_dec = 1e9;
  for (int r = 0; r < reps; ++r) {
    frames.clear();
    ends.clear();
    frames.reserve(n + n / 16);
    auto t0 = Clock::now();
    for (uint64_t at = 0; at < n; at += chunk) {
      const uint64_t len = std::min(chunk, n - at);
      if (!enc.Encode({set.bytes.data() + at, len}, planes, &frames).ok()) std::abort();
      ends.push_back(frames.size());
    }
    best_enc = std::min(best_enc, Since(t0));
    t0 = Clock::now();
    uint64_t begin = 0, at = 0;
    for (uint64_t end : ends) {
      const uint64_t len = std::min(chunk, n - at);
      const absl::Status s =
          dec.Decode({reinterpret_cast<const uint8_t*>(frames.data()) + begin, end - begin},
                     {out.data(), len}, "bench");
      if (!s.ok() || std::memcmp(out.data(), set.bytes.data() + at, len) != 0) std::abort();
      begin = end;
      at += len;
    }
    best_dec = std::min(best_dec, Since(t0));
  }
  return {static_cast<double>(n) / static_cast<double>(frames.size()), n / best_enc / 1e9,
          n / best_dec / 1e9};
}

// Raw: what the tier does with unencoded bytes on the CPU (copy into a part buffer, crc32c).
Result MeasureRaw(const Set& set, uint64_t chunk, int reps) {
  Bytes dst(set.bytes.size());
  double best = 1e9;
  uint32_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (uint64_t at = 0; at < dst.size(); at += chunk) {
      const uint64_t len = std::min<uint64_t>(chunk, dst.size() - at);
      std::memcpy(dst.data() + at, set.bytes.data() + at, len);
      sink ^= ckptd::Crc32c(dst.data() + at, len);
    }
    best = std::min(best, Since(t0));
  }
  if (sink == 0x12345678) std::puts("");  // keep the crc
  const double gbs = dst.size() / best / 1e9;
  return {1.0, gbs, gbs};
}

// Time to send a byte over a link of link_gbs with the CPU work of one core overlapped (a
// pipeline: the slower stage bounds it), as a speed-up over the raw row (whose CPU work is the
// copy and crc32c): above 1 the codec pays on that link with one core encoding.
double UploadSpeedup(const Result& raw, const Result& r, double link_gbs) {
  const double raw_s = std::max(1.0 / raw.encode_gbs, 1.0 / link_gbs);
  const double coded_s = std::max(1.0 / r.encode_gbs, 1.0 / (r.ratio * link_gbs));
  return raw_s / coded_s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 64, chunk_kib = 4096;
  int reps = 3;
  std::vector<int> levels = {-1000, 1};
  std::string json_path, file, file_dtype = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--mib")
      mib = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--chunk_kib")
      chunk_kib = std::strtoull(v.c_str(), nullptr, 10);
    else if (a == "--reps")
      reps = std::atoi(v.c_str());
    else if (a == "--json")
      json_path = v;
    else if (a == "--file")
      file = v;
    else if (a == "--file_dtype")
      file_dtype = v;
    else if (a == "--levels") {
      levels.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int l = 0;
        if (!absl::SimpleAtoi(s, &l) || !ckptd::ValidateZstdLevel(l).ok()) {
          std::fprintf(stderr, "bad level %s\n", std::string(s).c_str());
          return 2;
        }
        levels.push_back(l);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const uint64_t chunk = chunk_kib << 10;
  if (chunk == 0 || chunk > ckptd::limits::kCodecChunkBytesMax || mib == 0 || reps < 1) {
    std::fprintf(stderr, "--chunk_kib is 1..16384, --mib and --reps at least 1\n");
    return 2;
  }
  std::vector<Set> sets = MakeSets(mib << 20);
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    Bytes b;
    if (in) b.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    const uint32_t eb = file_dtype == "fp32" ? 4 : 2;
    if (b.empty()) {
      std::fprintf(stderr, "--file %s: empty or unreadable\n", file.c_str());
      return 2;
    }
    sets.push_back({"file " + file_dtype, eb, std::move(b)});
  }
  std::FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "a");
  const double links[] = {1.25, 3.125, 12.5};  // 10, 25 and 100 Gbit/s in GB/s
  std::printf("%-13s %-12s %6s %9s %9s %8s %8s %8s\n", "set", "method", "ratio", "enc GB/s",
              "dec GB/s", "10Gb/s", "25Gb/s", "100Gb/s");
  for (const Set& set : sets) {
    struct Row {
      std::string method;
      Result r;
    };
    std::vector<Row> rows = {{"raw", MeasureRaw(set, chunk, reps)}};
    for (int level : levels) {
      rows.push_back({"zstd-" + std::to_string(level), Measure(set, 1, level, chunk, reps)});
      rows.push_back({"grouped-" + std::to_string(level),
                      Measure(set, set.element_bytes, level, chunk, reps)});
    }
    for (const Row& row : rows) {
      std::printf("%-13s %-12s %6.3f %9.2f %9.2f %7.2fx %7.2fx %7.2fx\n", set.name.c_str(),
                  row.method.c_str(), row.r.ratio, row.r.encode_gbs, row.r.decode_gbs,
                  UploadSpeedup(rows[0].r, row.r, links[0]),
                  UploadSpeedup(rows[0].r, row.r, links[1]),
                  UploadSpeedup(rows[0].r, row.r, links[2]));
      if (json) {
        std::fprintf(json,
                     "{\"set\":\"%s\",\"method\":\"%s\",\"bytes\":%zu,\"chunk\":%lu,"
                     "\"ratio\":%.4f,\"encode_gbs\":%.3f,\"decode_gbs\":%.3f}\n",
                     set.name.c_str(), row.method.c_str(), set.bytes.size(),
                     static_cast<unsigned long>(chunk), row.r.ratio, row.r.encode_gbs,
                     row.r.decode_gbs);
      }
    }
  }
  if (json) std::fclose(json);
  return 0;
}
