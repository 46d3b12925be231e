// Resharded versus same-layout load of one checkpoint through a running daemon (issue 3), side by
// side in one run: 4 ranks save float32 tensors as row blocks; then each layout is loaded by its
// ranks concurrently (one client and thread per rank). The daemon reads with O_DIRECT, so every
// load is cold with respect to the page cache (the bench also drops the cache when it may).
//
//   ckptd_bench_reshard_load --socket PATH --daemon_pid PID [--tensors N] [--rows R] [--reps K]
//
// Prints one JSON object per (layout, repetition): wall time, bytes the ranks asked for, bytes
// the daemon's planner says it read and needed (4 KiB-rounded), and the daemon's device reads
// from /proc/PID/io (read_bytes).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "ckptd/client.h"

namespace {

using ckptd::Region;
using Clock = std::chrono::steady_clock;

struct Config {
  std::string socket;
  std::string daemon_pid;
  uint64_t tensors = 32;
  uint64_t rows = 1024;
  uint64_t cols = 4096;
  int reps = 3;
};

uint64_t DeviceReadBytes(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/io");
  std::string key;
  uint64_t v = 0;
  while (in >> key >> v) {
    if (key == "read_bytes:") return v;
  }
  return 0;
}

void DropCaches() {
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f) f << "3\n";  // best effort: needs root
}

std::string Name(uint64_t t) { return "layer" + std::to_string(t) + ".w"; }

// Region of rank `r` of `world` for a layout: row blocks or column blocks.
Region Block(const Config& c, bool by_cols, uint32_t world, uint32_t r) {
  if (by_cols) {
    uint64_t c0 = c.cols * r / world, c1 = c.cols * (r + 1) / world;
    return Region::Box({0, c0}, {c.rows, c1 - c0});
  }
  uint64_t r0 = c.rows * r / world, r1 = c.rows * (r + 1) / world;
  return Region::Box({r0, 0}, {r1 - r0, c.cols});
}

int Save(const Config& c, const std::string& job) {
  std::vector<float> data(c.rows * c.cols);
  std::mt19937 rng(1);
  for (float& f : data) f = static_cast<float>(rng());
  for (uint32_t rank = 0; rank < 4; ++rank) {
    auto client = ckptd::Client::Connect({.socket_path = c.socket});
    if (!client.ok()) return 1;
    Region r = Block(c, false, 4, rank);
    const float* p = data.data() + r.offsets[0] * c.cols;
    std::vector<ckptd::TensorShard> shards;
    for (uint64_t t = 0; t < c.tensors; ++t) {
      shards.push_back(
          {Name(t), ckptd::DType::kFloat32, {c.rows, c.cols}, r, p, r.lengths[0] * c.cols * 4});
    }
    auto saved = (*client)->Save(job, 1, rank, 4, shards);
    if (!saved.ok()) {
      std::fprintf(stderr, "save: %s\n", saved.status().ToString().c_str());
      return 1;
    }
  }
  auto client = ckptd::Client::Connect({.socket_path = c.socket});
  absl::Status st = (*client)->WaitCommitted(job, 1, 600000);
  if (!st.ok()) std::fprintf(stderr, "commit: %s\n", st.ToString().c_str());
  return st.ok() ? 0 : 1;
}

struct Totals {
  uint64_t asked = 0, read = 0, needed_aligned = 0;
  bool ok = true;
};

// One rank loads its block of every tensor, 4 tensors per call to bound arena use.
void LoadRank(const Config& c, ckptd::Client* client, const std::string& job, bool by_cols,
              uint32_t world, uint32_t rank, Totals* out) {
  Region r = Block(c, by_cols, world, rank);
  uint64_t bytes = r.lengths[0] * r.lengths[1] * 4;
  std::vector<std::vector<uint8_t>> bufs(4, std::vector<uint8_t>(bytes));
  for (uint64_t t = 0; t < c.tensors; t += 4) {
    std::vector<ckptd::LoadTarget> targets;
    for (uint64_t k = t; k < std::min(t + 4, c.tensors); ++k) {
      targets.push_back({Name(k), r, bufs[k - t].data(), bytes});
    }
    auto res = client->Load(job, 1, rank, targets);
    if (!res.ok()) {
      std::fprintf(stderr, "load: %s\n", res.status().ToString().c_str());
      out->ok = false;
      return;
    }
    out->asked += bytes * targets.size();
    out->read += res->bytes_read;
    out->needed_aligned += res->bytes_needed_aligned;
  }
}

int RunLayout(const Config& c, const std::string& job, const char* name, bool by_cols,
              uint32_t world, int rep) {
  DropCaches();
  std::vector<Totals> totals(world);
  // Clients connect before and close after the timed part: a client's close waits for its
  // connection watcher (up to 100 ms), which is not load time.
  std::vector<std::unique_ptr<ckptd::Client>> clients;
  for (uint32_t r = 0; r < world; ++r) {
    auto client = ckptd::Client::Connect({.socket_path = c.socket, .rpc_timeout_ms = 600000});
    if (!client.ok()) return 1;
    clients.push_back(*std::move(client));
  }
  uint64_t dev0 = DeviceReadBytes(c.daemon_pid);
  auto a = Clock::now();
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back(LoadRank, std::cref(c), clients[r].get(), std::cref(job), by_cols, world,
                         r, &totals[r]);
  }
  for (std::thread& t : threads) t.join();
  double s = std::chrono::duration<double>(Clock::now() - a).count();
  uint64_t dev = DeviceReadBytes(c.daemon_pid) - dev0;
  Totals sum;
  for (const Totals& t : totals) {
    sum.ok = sum.ok && t.ok;
    sum.asked += t.asked, sum.read += t.read, sum.needed_aligned += t.needed_aligned;
  }
  if (!sum.ok) return 1;
  std::printf(
      "{\"layout\": \"%s\", \"ranks\": %u, \"rep\": %d, \"seconds\": %.3f, "
      "\"bytes_asked\": %llu, \"bytes_read\": %llu, \"bytes_needed_aligned\": %llu, "
      "\"device_read_bytes\": %llu}\n",
      name, world, rep, s, static_cast<unsigned long long>(sum.asked),
      static_cast<unsigned long long>(sum.read),
      static_cast<unsigned long long>(sum.needed_aligned), static_cast<unsigned long long>(dev));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], v = argv[i + 1];
    uint64_t n = 0;
    bool num = absl::SimpleAtoi(v, &n) && n > 0;
    if (flag == "--socket") {
      c.socket = v;
    } else if (flag == "--daemon_pid") {
      c.daemon_pid = v;
    } else if (flag == "--tensors" && num) {
      c.tensors = n;
    } else if (flag == "--rows" && num) {
      c.rows = n;
    } else if (flag == "--reps" && num) {
      c.reps = static_cast<int>(n);
    } else {
      std::fprintf(stderr, "bad flag %s %s\n", flag.c_str(), v.c_str());
      return 2;
    }
  }
  if (c.socket.empty() || c.daemon_pid.empty()) {
    std::fprintf(stderr, "--socket and --daemon_pid are required\n");
    return 2;
  }
  const std::string job = "reshard-bench";
  if (Save(c, job) != 0) return 1;
  for (int rep = 0; rep < c.reps; ++rep) {
    // Interleaved so drift on a noisy machine hits every layout alike.
    if (RunLayout(c, job, "same_rows4", false, 4, rep) != 0) return 1;
    if (RunLayout(c, job, "rows4_to_rows2", false, 2, rep) != 0) return 1;
    if (RunLayout(c, job, "rows4_to_rows3", false, 3, rep) != 0) return 1;
    if (RunLayout(c, job, "rows4_to_cols4", true, 4, rep) != 0) return 1;
  }
  return 0;
}
