// Several checkpoints of one job in flight (docs/USER_GUIDE.md "Several checkpoints in flight"),
// against a real daemon: a later step that commits first stays `latest` when an earlier one
// commits after it (Latest, load of latest, ckptctl latest, and across a restart); a save that
// finds the arena full waits with its reason visible (the ckptd_reserve_waiting metric, the
// daemon's log), goes on when the first checkpoint's staging frees, and times out with an error
// naming the budget; retention never touches a checkpoint in flight.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;  // NOLINT(google-build-using-namespace): the harness
using Catch::Matchers::Contains;

namespace {

// Saves rank `rank` of the 4 ranks of (job, step) with the harness's payload for `seed`.
void SaveRank(const Daemon& d, const std::string& job, uint64_t step, uint32_t rank,
              uint64_t seed) {
  auto client = d.Connect();
  RankPayload p = MakeRankPayload(rank, 4, seed);
  absl::Status st = client->Save(job, step, rank, 4, p.tensors, p.objects).status();
  INFO(st.ToString());
  REQUIRE(st.ok());
}

uint64_t LatestStep(const Daemon& d, const std::string& job) {
  auto client = d.Connect();
  absl::StatusOr<uint64_t> step = client->Latest(job);
  INFO(step.status().ToString());
  REQUIRE(step.ok());
  return *step;
}

bool Eventually(const std::function<bool()>& done, int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// GET /metrics of `d` (started with --metrics_address=0: the port is in its log); the body.
std::string ScrapeMetrics(const Daemon& d) {
  std::smatch m;
  const std::string log = d.Log();
  INFO(log);
  REQUIRE(std::regex_search(log, m, std::regex(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)")));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(m[1])));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  REQUIRE(write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// One rank's save of `bytes` of float32 as item "w" (a whole 1-rank checkpoint).
absl::Status SaveBig(const Daemon& d, const std::string& job, uint64_t step,
                     const std::vector<float>& data) {
  auto client = d.Connect();
  ckptd::TensorShard t;
  t.item = "w";
  t.global_shape = {data.size()};
  t.region = ckptd::Region::Box({0}, {data.size()});
  t.data = data.data();
  t.bytes = data.size() * sizeof(float);
  return client->Save(job, step, 0, 1, std::span(&t, 1), {}).status();
}

}  // namespace

TEST_CASE("in flight: steps 2 and 3 commit while step 1 waits, latest stays the highest step",
          "[integration]") {
  Daemon d;
  // Step 1 stays in flight: 3 of its 4 ranks staged (and flushed), rank 3 not yet.
  for (uint32_t r = 0; r < 3; ++r) SaveRank(d, "order", 1, r, 11);
  SaveCommitted(d, "order", 2, 12);
  SaveCommitted(d, "order", 3, 13);
  auto client = d.Connect();
  auto s1 = client->GetStatus("order", 1);
  REQUIRE(s1.ok());
  CHECK(s1->state != ckptd::CheckpointState::kCommitted);
  CHECK(LatestStep(d, "order") == 3);

  // Step 1 commits after step 3: it is committed and loadable, and latest stays 3.
  SaveRank(d, "order", 1, 3, 11);
  REQUIRE(client->WaitCommitted("order", 1, 30000).ok());
  CHECK(LatestStep(d, "order") == 3);
  CHECK(VerifyInProcess(d, "order", 1, 11) == "");
  CommandResult latest = RunCtl(d, {"latest", "order"});
  INFO(latest.output);
  CHECK(latest.exit_code == 0);
  CHECK_THAT(latest.output, Contains("3"));
  CHECK_THAT(latest.output, !Contains("1\n"));

  // Across a restart (recovery rebuilds nothing of "latest": it is the highest COMMITTED step).
  d.Restart({});
  CHECK(LatestStep(d, "order") == 3);
  CHECK(VerifyInProcess(d, "order", 3, 13) == "");
}

TEST_CASE("in flight: a save that finds the arena full waits with its reason, then proceeds",
          "[integration]") {
  // 64 MiB arena, no RAM tier (persisted staging is freed), every flush held 2 s: step 1's 40 MiB
  // stay staged for 2 s, so step 2's 40 MiB wait for them.
  Daemon d(
      DaemonConfig{.staging_bytes_max = 64ull << 20,
                   .extra_flags = {"--ram_tier_keep_per_job=0", "--uid_arena_share_percent=100",
                                   "--debug_flush_delay_ms=2000", "--reserve_timeout_ms=20000",
                                   "--metrics_address=0"}});
  const std::vector<float> a(10u << 20, 1.5f), b(10u << 20, 2.5f);
  REQUIRE(SaveBig(d, "wait", 1, a).ok());
  absl::Status second;
  const auto started = std::chrono::steady_clock::now();
  std::thread saver([&] { second = SaveBig(d, "wait", 2, b); });
  // The wait is visible while it lasts: the metric names the budget, the log says what holds it.
  const bool logged = Eventually(
      [&] { return d.Log().find("waits for the staging arena's bytes") != std::string::npos; },
      10000);
  const std::string metrics = ScrapeMetrics(d);
  saver.join();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO(d.Log());
  CHECK(logged);
  CHECK_THAT(d.Log(), Contains("staged and not yet persisted (the flush queue)"));
  CHECK_THAT(metrics, Contains("ckptd_reserve_waiting{budget=\"arena_bytes\"} 1"));
  CHECK_THAT(metrics, Contains("ckptd_reserve_waiting_bytes 41943040"));
  REQUIRE(second.ok());
  CHECK(waited > 0.5);  // it did wait for step 1's flush
  auto client = d.Connect();
  REQUIRE(client->WaitCommitted("wait", 1, 30000).ok());
  REQUIRE(client->WaitCommitted("wait", 2, 30000).ok());
  CHECK(LatestStep(d, "wait") == 2);
  const std::string after = ScrapeMetrics(d);
  CHECK_THAT(after, Contains("ckptd_reserve_waiting{budget=\"arena_bytes\"} 0"));
  CHECK_THAT(after, Contains("ckptd_arena_prefault_left_bytes 0"));  // the arena is faulted in
}

TEST_CASE("in flight: a save that cannot get arena space in time fails naming the budget",
          "[integration]") {
  Daemon d(
      DaemonConfig{.staging_bytes_max = 64ull << 20,
                   .extra_flags = {"--ram_tier_keep_per_job=0", "--uid_arena_share_percent=100",
                                   "--debug_flush_delay_ms=4000", "--reserve_timeout_ms=500"}});
  const std::vector<float> a(10u << 20, 1.5f), b(10u << 20, 2.5f);
  REQUIRE(SaveBig(d, "late", 1, a).ok());
  absl::Status second = SaveBig(d, "late", 2, b);
  INFO(second.ToString());
  CHECK(absl::IsResourceExhausted(second));
  CHECK_THAT(std::string(second.message()), Contains("staging arena full"));
  CHECK_THAT(std::string(second.message()), Contains("reserve_timeout_ms"));
  CHECK_THAT(std::string(second.message()),
             Contains("41943040 staged and not yet persisted (the flush queue)"));
  // Never a silent drop: step 1 still commits, step 2 does not exist.
  auto client = d.Connect();
  REQUIRE(client->WaitCommitted("late", 1, 30000).ok());
  CHECK(absl::IsNotFound(client->GetStatus("late", 2).status()));
  CHECK(LatestStep(d, "late") == 1);
}

TEST_CASE("in flight: retention keeps the newest and never touches a checkpoint in flight",
          "[integration][retention]") {
  Daemon d(DaemonConfig{.extra_flags = {"--keep_local=1", "--gc_interval_ms=3600000"}});
  for (uint32_t r = 0; r < 3; ++r) SaveRank(d, "keep", 1, r, 21);  // in flight
  SaveCommitted(d, "keep", 2, 22);
  SaveCommitted(d, "keep", 3, 23);
  CommandResult gc = RunCtl(d, {"gc"});
  INFO(gc.output << "\nlog:\n" << d.Log());
  REQUIRE(gc.exit_code == 0);
  auto client = d.Connect();
  CHECK(absl::IsNotFound(client->GetStatus("keep", 2).status()));  // older than the newest: gone
  CHECK(client->GetStatus("keep", 1).ok());                        // in flight: untouched
  SaveRank(d, "keep", 1, 3, 21);
  REQUIRE(client->WaitCommitted("keep", 1, 30000).ok());
  CHECK(VerifyInProcess(d, "keep", 1, 21) == "");  // it committed whole
  CHECK(LatestStep(d, "keep") == 3);
  // Now committed and older than the newest, it goes at the next collection; 3 stays.
  REQUIRE(RunCtl(d, {"gc"}).exit_code == 0);
  CHECK(absl::IsNotFound(client->GetStatus("keep", 1).status()));
  CHECK(VerifyInProcess(d, "keep", 3, 23) == "");
}
