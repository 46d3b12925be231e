// The floor of a verified restore from RAM: the least work any loader must do to copy a rank's
// share of a hot checkpoint into its destination and check every checksum block it uses, done
// in a tight loop by T threads at once (T = the ranks loading), with ckptd's own kernels and no
// daemon, RPC, plan or lock around them. restore_bench.py runs it beside its memcpy bar and the
// real loads, in the same rounds, so each RAM-tier miss can be set against what the bytes cost.
//
// The state is S bytes of rows of 16 KiB (restore_bench's float32 [rows, 4096] tensors). Layouts:
//   memcpy     each thread copies its contiguous S/T bytes (restore_bench's bar, here as threads);
//   same       each thread copies its contiguous S/T bytes and checksums every 4 KiB block of
//              them in the same pass (CopyAndBlockCrcs: the loader's one-pass kernel);
//   columns    each thread copies column quarter t of every row: runs of 16 KiB / T at a stride
//              of 16 KiB into a contiguous destination, each run checksummed in the same pass
//              (restore_bench's 4-rank resharded case; with T = 4 a run is one 4 KiB block).
// Every thread's destination is faulted in before the clock, as restore_bench's are.
// Prints one JSON line per repetition and layout: {"layout", "threads", "bytes", "seconds"}.
//   ckptd_bench_restore_bound --threads T --mib M [--reps N] [--layouts memcpy,same,columns]
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "format/crc32c.h"

namespace {

constexpr size_t kRowBytes = 16 << 10;  // one row of restore_bench's [rows, 4096] float32
constexpr uint32_t kBlock = 4096;       // the daemon's default checksum_block_bytes

using Clock = std::chrono::steady_clock;

struct Span {
  Clock::time_point start, end;
};

// Thread `t` of `threads` does its share of `layout` from `src` into `dst` (its own buffer).
void Work(const std::string& layout, const uint8_t* src, size_t bytes, uint8_t* dst, int t,
          int threads, std::vector<uint32_t>& crcs) {
  const size_t share = bytes / threads;
  if (layout == "memcpy") {
    std::memcpy(dst, src + t * share, share);
  } else if (layout == "same") {
    ckptd::CopyAndBlockCrcs(dst, src + t * share, share, kBlock, crcs.data());
  } else {  // columns
    const size_t run = kRowBytes / threads;
    const size_t rows = bytes / kRowBytes;
    for (size_t r = 0; r < rows; ++r) {
      ckptd::CopyAndBlockCrcs(dst + r * run, src + r * kRowBytes + t * run, run, kBlock,
                              crcs.data() + (r * run) / kBlock);
    }
  }
}

double Run(const std::string& layout, const std::vector<uint8_t>& src,
           std::vector<std::vector<uint8_t>>& dsts, int threads) {
  std::vector<Span> spans(threads);
  std::barrier start(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<uint32_t> crcs(dsts[t].size() / kBlock + 1);
      start.arrive_and_wait();
      spans[t].start = Clock::now();
      Work(layout, src.data(), src.size(), dsts[t].data(), t, threads, crcs);
      spans[t].end = Clock::now();
    });
  }
  for (auto& th : pool) th.join();
  Clock::time_point first = spans[0].start, last = spans[0].end;
  for (const Span& s : spans) {
    first = std::min(first, s.start);
    last = std::max(last, s.end);
  }
  return std::chrono::duration<double>(last - first).count();
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  int reps = 1;
  size_t mib = 1024;
  std::string layouts = "memcpy,same,columns";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--mib")
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--layouts")
      layouts = argv[i + 1];
    else {
      std::fprintf(stderr, "ckptd_bench_restore_bound: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads < 1 || threads > 64 || kRowBytes % threads != 0 || reps < 1 || mib < 1) {
    std::fprintf(stderr,
                 "ckptd_bench_restore_bound: --threads 1..64 dividing 16384, --reps >= 1\n");
    return 2;
  }
  const size_t bytes = (mib << 20) / (kRowBytes * threads) * (kRowBytes * threads);
  std::vector<uint8_t> src(bytes, 1);
  std::vector<std::vector<uint8_t>> dsts(threads, std::vector<uint8_t>(bytes / threads, 0));
  for (int r = 0; r < reps; ++r) {
    size_t from = 0;
    while (from <= layouts.size()) {
      size_t to = layouts.find(',', from);
      if (to == std::string::npos) to = layouts.size();
      const std::string layout = layouts.substr(from, to - from);
      from = to + 1;
      if (layout != "memcpy" && layout != "same" && layout != "columns") {
        std::fprintf(stderr, "ckptd_bench_restore_bound: unknown layout '%s'\n", layout.c_str());
        return 2;
      }
      const double s = Run(layout, src, dsts, threads);
      std::printf(
          "{\"bench\": \"restore_bound\", \"layout\": \"%s\", \"threads\": %d, \"bytes\": %zu, "
          "\"seconds\": %.4f}\n",
          layout.c_str(), threads, bytes, s);
      std::fflush(stdout);
    }
  }
  return 0;
}
