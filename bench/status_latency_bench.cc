// GetStatus and Wait latency during a save storm (issue 17: "with the fsync convoy gone,
// GetStatus/Wait p99 during a save storm improves"). Against one running daemon: `--savers`
// clients each save many small single-rank checkpoints back to back (every Save journals a synced
// row; every commit writes a manifest and a synced index row), while one more client, on its own
// thread, alternates GetStatus of the newest step a saver started and Wait (WAIT_FOR_COMMITTED) of
// a checkpoint that committed before the storm, and records each call's latency.
//
//   ckptd_bench_status_latency --socket PATH [--label NAME] [--savers 4] [--seconds 10]
//                              [--tensor_kib 64] [--round 0]
//
// Each saver keeps at most 4 of its checkpoints in flight (it waits for the oldest to commit).
// Prints one JSON object: saves done, probe calls and their p50/p99/max latency in microseconds.
// bench/status_latency.sh runs it against two daemons interleaved (baseline and new).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "ckptd/client.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string socket;
  std::string label = "ckptd";
  uint64_t savers = 4;
  uint64_t seconds = 10;
  uint64_t tensor_kib = 64;
  uint64_t round = 0;
};

constexpr uint64_t kWindow = 4;

struct Saver {
  std::atomic<uint64_t> next_step{1};  // the step it saves next (the probe reads step - 1)
  uint64_t saves = 0;
  uint64_t errors = 0;
};

std::string JobOf(const Config& c, uint64_t saver) {
  return "storm-r" + std::to_string(c.round) + "-s" + std::to_string(saver);
}

void SaveStorm(const Config& c, uint64_t id, std::atomic<bool>* stop, Saver* out) {
  auto client = ckptd::Client::Connect({.socket_path = c.socket});
  if (!client.ok()) {
    std::fprintf(stderr, "saver %llu: %s\n", static_cast<unsigned long long>(id),
                 client.status().ToString().c_str());
    ++out->errors;
    return;
  }
  std::vector<float> data(c.tensor_kib * 256, 1.0f + static_cast<float>(id));
  const std::string job = JobOf(c, id);
  while (!stop->load()) {
    const uint64_t step = out->next_step.load();
    std::vector<ckptd::TensorShard> shards;
    for (int t = 0; t < 4; ++t) {
      shards.push_back({"w" + std::to_string(t),
                        ckptd::DType::kFloat32,
                        {data.size()},
                        ckptd::Region::Whole(),
                        data.data(),
                        data.size() * 4});
    }
    auto saved = (*client)->Save(job, step, 0, 1, shards);
    out->next_step.store(step + 1);
    if (!saved.ok()) {
      if (out->errors++ == 0) {
        std::fprintf(stderr, "saver %llu: %s\n", static_cast<unsigned long long>(id),
                     saved.status().ToString().c_str());
      }
      continue;
    }
    ++out->saves;
    // At most kWindow checkpoints of this saver in flight (the daemon's open-checkpoint limit
    // is per job): wait for the oldest before saving on.
    if (step > kWindow) (*client)->WaitCommitted(job, step - kWindow, 60000).IgnoreError();
  }
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

int Run(const Config& c) {
  auto probe = ckptd::Client::Connect({.socket_path = c.socket});
  if (!probe.ok()) {
    std::fprintf(stderr, "probe: %s\n", probe.status().ToString().c_str());
    return 1;
  }
  // A committed checkpoint for Wait to answer at once (a Wait that queues is the convoy).
  const std::string still = "still-r" + std::to_string(c.round);
  std::vector<float> one(1024, 2.0f);
  std::vector<ckptd::TensorShard> shard{
      {"w", ckptd::DType::kFloat32, {one.size()}, ckptd::Region::Whole(), one.data(), 4096}};
  if (!(*probe)->Save(still, 1, 0, 1, shard).ok() ||
      !(*probe)->WaitCommitted(still, 1, 60000).ok()) {
    std::fprintf(stderr, "probe: the committed checkpoint did not commit\n");
    return 1;
  }
  std::atomic<bool> stop{false};
  std::vector<Saver> savers(c.savers);
  std::vector<std::thread> threads;
  for (uint64_t s = 0; s < c.savers; ++s) {
    threads.emplace_back(SaveStorm, std::cref(c), s, &stop, &savers[s]);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the storm is under way
  std::vector<double> status_us, wait_us;
  uint64_t probe_errors = 0;
  const auto end = Clock::now() + std::chrono::seconds(c.seconds);
  for (uint64_t i = 0; Clock::now() < end; ++i) {
    const uint64_t s = i % c.savers;
    const uint64_t step = savers[s].next_step.load();
    auto a = Clock::now();
    // The newest step: usually being saved (pending), sometimes already committed.
    auto st = (*probe)->GetStatus(JobOf(c, s), step > 1 ? step - 1 : 1);
    auto b = Clock::now();
    auto w = (*probe)->Wait(still, 1, ckptd::WaitFor::kCommitted, 10000);
    auto d = Clock::now();
    if (!w.ok()) ++probe_errors;
    if (!st.ok() && !absl::IsNotFound(st.status())) ++probe_errors;
    status_us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    wait_us.push_back(std::chrono::duration<double, std::micro>(d - b).count());
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  uint64_t saves = 0, save_errors = 0;
  for (const Saver& s : savers) saves += s.saves, save_errors += s.errors;
  std::printf(
      "{\"label\": \"%s\", \"round\": %llu, \"savers\": %llu, \"seconds\": %llu, "
      "\"saves\": %llu, \"save_errors\": %llu, \"probe_errors\": %llu, \"status_calls\": %zu, "
      "\"status_p50_us\": %.0f, \"status_p99_us\": %.0f, \"status_max_us\": %.0f, "
      "\"wait_p50_us\": %.0f, \"wait_p99_us\": %.0f, \"wait_max_us\": %.0f}\n",
      c.label.c_str(), static_cast<unsigned long long>(c.round),
      static_cast<unsigned long long>(c.savers), static_cast<unsigned long long>(c.seconds),
      static_cast<unsigned long long>(saves), static_cast<unsigned long long>(save_errors),
      static_cast<unsigned long long>(probe_errors), status_us.size(), Percentile(status_us, 0.5),
      Percentile(status_us, 0.99), Percentile(status_us, 1.0), Percentile(wait_us, 0.5),
      Percentile(wait_us, 0.99), Percentile(wait_us, 1.0));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], v = argv[i + 1];
    uint64_t n = 0;
    bool num = absl::SimpleAtoi(v, &n);
    if (flag == "--socket") {
      c.socket = v;
    } else if (flag == "--label") {
      c.label = v;
    } else if (flag == "--savers" && num && n > 0) {
      c.savers = n;
    } else if (flag == "--seconds" && num && n > 0) {
      c.seconds = n;
    } else if (flag == "--tensor_kib" && num && n > 0) {
      c.tensor_kib = n;
    } else if (flag == "--round" && num) {
      c.round = n;
    } else {
      std::fprintf(stderr, "bad flag %s %s\n", flag.c_str(), v.c_str());
      return 2;
    }
  }
  if (c.socket.empty()) {
    std::fprintf(stderr, "--socket is required\n");
    return 2;
  }
  return Run(c);
}
