// Soak (hidden: `make soak`, or ckptd_integration_tests "[soak]"): 64 concurrent clients — 16
// jobs of 4 ranks, each rank its own connection and session — save, wait, verify bit-exact and
// delete in a loop for CKPTD_SOAK_SECONDS (default 120) against the real daemon. Passes when no
// request fails, no byte is wrong, and after a warm-up (the first quarter) the daemon's resident
// memory and open file descriptors stay flat. Prints the numbers bench/RESULTS.md records.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

namespace {

constexpr uint32_t kJobs = 16;
constexpr uint32_t kWorld = 4;
// RSS may grow this much after warm-up (allocator noise, caches reaching their bounds).
constexpr uint64_t kRssGrowthAllowedKiB = 24 * 1024;

uint64_t RssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

size_t OpenFds(pid_t pid) {
  std::error_code ec;
  auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
  return ec ? 0 : static_cast<size_t>(std::distance(it, std::filesystem::directory_iterator{}));
}

struct Sample {
  double at_s;
  uint64_t rss_kib;
  size_t fds;
};

}  // namespace

TEST_CASE("soak: 64 clients save, verify and delete, no errors, RSS and fds flat", "[.][soak]") {
  const char* env = std::getenv("CKPTD_SOAK_SECONDS");
  const int seconds = env != nullptr ? std::max(10, std::atoi(env)) : 120;
  DaemonConfig cfg;
  cfg.staging_bytes_max = 256ull << 20;
  Daemon d(cfg);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> committed{0}, verified{0}, deleted{0};
  absl::Mutex errors_mu;  // guards errors until the threads are joined
  std::vector<std::string> errors;
  auto fail = [&](std::string what) {
    absl::MutexLock lock(&errors_mu);
    if (errors.size() < 20) errors.push_back(std::move(what));
    stop = true;
  };

  // Each job's 4 ranks meet at a barrier per step; rank 0 also waits, verifies and deletes.
  std::vector<std::unique_ptr<std::barrier<>>> barriers;
  for (uint32_t j = 0; j < kJobs; ++j) barriers.push_back(std::make_unique<std::barrier<>>(kWorld));
  std::vector<std::atomic<bool>> job_done(kJobs);
  auto client_loop = [&](uint32_t j, uint32_t rank) {
    const std::string job = absl::StrCat("soak-", j);
    std::unique_ptr<ckptd::Client> c = d.Connect();
    for (uint64_t step = 1;; ++step) {
      // Every rank of the job agrees whether to go on (stop is read by rank 0 only).
      if (rank == 0) job_done[j] = stop.load();
      barriers[j]->arrive_and_wait();
      if (job_done[j]) return;
      const uint64_t seed = j * 1000003 + step;
      auto saved = SaveRank(*c, job, step, rank, kWorld, seed);
      if (!saved.ok())
        fail(absl::StrCat(job, "/", step, " rank ", rank, ": ", saved.status().ToString()));
      barriers[j]->arrive_and_wait();
      if (rank != 0 || !saved.ok()) continue;
      absl::Status st = c->WaitCommitted(job, step, 60000);
      if (!st.ok()) {
        fail(absl::StrCat(job, "/", step, " commit: ", st.ToString()));
        continue;
      }
      ++committed;
      st = VerifyCheckpoint(*c, job, step, seed, {}, kWorld, true);
      if (!st.ok()) {
        fail(absl::StrCat(job, "/", step, " verify: ", st.ToString()));
        continue;
      }
      ++verified;
      if (step > 2) {
        st = c->Delete(job, step - 2);
        if (!st.ok()) fail(absl::StrCat(job, "/", step - 2, " delete: ", st.ToString()));
        ++deleted;
      }
    }
  };

  std::vector<Sample> samples;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (uint32_t j = 0; j < kJobs; ++j) {
    for (uint32_t r = 0; r < kWorld; ++r) threads.emplace_back(client_loop, j, r);
  }
  while (!stop) {
    double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    samples.push_back({at, RssKiB(d.pid()), OpenFds(d.pid())});
    if (at >= seconds) break;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  stop = true;
  for (auto& t : threads) t.join();

  for (const std::string& e : errors) UNSCOPED_INFO(e);
  CHECK(errors.empty());
  // After warm-up: the first sample past a quarter of the run is the baseline.
  const double warm = seconds / 4.0;
  auto base =
      std::find_if(samples.begin(), samples.end(), [&](const Sample& s) { return s.at_s >= warm; });
  REQUIRE(base != samples.end());
  uint64_t rss_max = 0;
  size_t fds_max = 0;
  for (auto it = base; it != samples.end(); ++it) {
    rss_max = std::max(rss_max, it->rss_kib);
    fds_max = std::max(fds_max, it->fds);
  }
  const Sample& last = samples.back();
  const std::string summary =
      absl::StrCat("soak: ", kJobs * kWorld, " clients, ", seconds, " s: ", committed.load(),
                   " checkpoints committed, ", verified.load(), " verified bit-exact, ",
                   deleted.load(), " deleted; daemon RSS ", samples.front().rss_kib / 1024,
                   " MiB at start, ", base->rss_kib / 1024, " MiB after warm-up, max ",
                   rss_max / 1024, " MiB, ", last.rss_kib / 1024, " MiB at end; fds ", base->fds,
                   " after warm-up, max ", fds_max, ", ", last.fds, " at end");
  WARN(summary);
  CHECK(committed.load() > 0);
  CHECK(rss_max <= base->rss_kib + kRssGrowthAllowedKiB);
  CHECK(fds_max <= base->fds + 16);
}
