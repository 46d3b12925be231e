// What verifying a restore costs against copying it: crc32c of every 4 KiB block of 1 GiB
// (BlockCrcsInto), a memcpy of the same bytes, both window by window (256 KiB: checksum, then
// copy while the bytes are in cache), and both in one pass (CopyAndBlockCrcs, the loader's
// kernel for RAM-tier copies), on this thread. Prints one JSON
// line per repetition (seconds). bench/RESULTS.md "Restores from the RAM tier" uses it.
//   ckptd_bench_verify_copy [--reps N] [--mib M]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "format/crc32c.h"

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  size_t mib = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
  }
  constexpr uint32_t kBlock = 4096;
  constexpr size_t kWindow = 256 << 10;
  const size_t n = mib << 20;
  std::vector<uint8_t> src(n, 1), dst(n, 0);
  std::vector<uint32_t> crcs(n / kBlock);
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    ckptd::BlockCrcsInto(src.data(), n, kBlock, crcs.data());
    const double crc = Since(t0);
    t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), n);
    const double copy = Since(t0);
    t0 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < n; off += kWindow) {
      ckptd::BlockCrcsInto(src.data() + off, kWindow, kBlock, crcs.data() + off / kBlock);
      std::memcpy(dst.data() + off, src.data() + off, kWindow);
    }
    const double windowed = Since(t0);
    t0 = std::chrono::steady_clock::now();
    ckptd::CopyAndBlockCrcs(dst.data(), src.data(), n, kBlock, crcs.data());
    const double fused = Since(t0);
    std::printf(
        "{\"bench\": \"verify_copy\", \"bytes\": %zu, \"crc_s\": %.4f, \"memcpy_s\": %.4f, "
        "\"windowed_s\": %.4f, \"fused_s\": %.4f, \"crc_over_memcpy\": %.3f, "
        "\"fused_over_memcpy\": %.3f}\n",
        n, crc, copy, windowed, fused, crc / copy, fused / copy);
  }
  return 0;
}
