// The metrics endpoint against the real daemon: scraped over HTTP during and after a 4-rank save
// and its loads, the counts and bytes checked against what the clients saw; levels; a bad
// address or a port in use stops the start with an error naming the option.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <regex>
#include <string>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kSeed = 31;

// The port the daemon logged ("metrics on http://127.0.0.1:PORT/metrics").
int MetricsPort(const Daemon& d) {
  std::smatch m;
  const std::string log = d.Log();
  const std::regex re(R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)");
  INFO(log);
  REQUIRE(std::regex_search(log, m, re));
  return std::stoi(m[1]);
}

// GET /metrics over loopback; the body.
std::string Scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  REQUIRE(write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  REQUIRE_THAT(out, Contains("200 OK"));
  return out.substr(out.find("\r\n\r\n") + 4);
}

// The value of the sample `series` (name{labels} exactly as exported, labels sorted); -1 when
// absent.
double Sample(const std::string& body, const std::string& series) {
  size_t at = 0;
  while ((at = body.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || body[at - 1] == '\n') return std::stod(body.substr(at + series.size() + 1));
    at += series.size();
  }
  return -1;
}

}  // namespace

TEST_CASE("metrics: a scrape counts the saves, commits, loads and bytes the clients saw",
          "[integration]") {
  Daemon d(DaemonConfig{.extra_flags = {"--metrics_address=0"}});
  const int port = MetricsPort(d);
  const std::string job = "metrics-job";
  auto client = d.Connect();
  uint64_t staged = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    auto res = SaveRank(*client, job, 1, r, 4, kSeed);
    REQUIRE(res.ok());
    staged += res->bytes_staged;
  }
  REQUIRE(client->WaitCommitted(job, 1, 30000).ok());
  ckptd::LoadResult loaded;
  REQUIRE(VerifyCheckpoint(*client, job, 1, kSeed, {}, 4, false, &loaded).ok());
  REQUIRE(loaded.bytes_from_ram > 0);
  CHECK(absl::IsNotFound(VerifyCheckpoint(*client, job, 7, kSeed, {}, 4, false)));

  const std::string body = Scrape(port);
  INFO(body);
  const std::string j = "ckpt_job=\"" + job + "\"";
  CHECK(Sample(body, "ckptd_saves_total{" + j + ",code=\"OK\"}") == 4);
  CHECK(Sample(body, "ckptd_staged_bytes_total{" + j + "}") == static_cast<double>(staged));
  CHECK(Sample(body, "ckptd_checkpoints_total{" + j + ",outcome=\"committed\"}") == 1);
  CHECK(Sample(body, "ckptd_checkpoint_seconds_count{outcome=\"committed\"}") == 1);
  CHECK(Sample(body, "ckptd_loads_total{" + j + ",code=\"OK\"}") >= 1);
  CHECK(Sample(body, "ckptd_loads_total{" + j + ",code=\"NOT_FOUND\"}") >= 1);
  CHECK(Sample(body, "ckptd_load_bytes_total{" + j + ",tier=\"ram\"}") ==
        static_cast<double>(loaded.bytes_from_ram));
  CHECK(Sample(body, "ckptd_rpc_duration_seconds_count{code=\"OK\",method=\"Save\"}") == 4);
  CHECK(Sample(body, "ckptd_rpc_duration_seconds_count{code=\"OK\",method=\"Hello\"}") >= 1);
  CHECK(Sample(body, "ckptd_flush_bytes_total{tier=\"local\"}") >= static_cast<double>(staged));
  CHECK(Sample(body, "ckptd_flush_seconds_total{tier=\"local\"}") > 0);
  // Levels, read at the scrape.
  CHECK(Sample(body, "ckptd_sessions") >= 1);
  CHECK(Sample(body, "ckptd_ram_tier_checkpoints") == 1);
  CHECK(Sample(body, "ckptd_ram_tier_bytes{state=\"hot\"}") > 0);
  CHECK(Sample(body, "ckptd_arena_capacity_bytes") > 0);
  CHECK(Sample(body, "ckptd_checkpoints_in_flight") == 0);
  CHECK(Sample(body, "ckptd_queued_calls{pool=\"load\"}") == 0);

  // A checkpoint in flight is a level; its abort is counted by outcome.
  REQUIRE(SaveRank(*client, job, 2, 0, 4, kSeed).ok());
  {
    const std::string during = Scrape(port);
    CHECK(Sample(during, "ckptd_checkpoints_in_flight") == 1);  // rank 0 of 4 staged
  }
  REQUIRE(client->Abort(job, 2, "test").ok());
  const std::string after = Scrape(port);
  CHECK(Sample(after, "ckptd_checkpoints_total{" + j + ",outcome=\"aborted\"}") == 1);
}

TEST_CASE("metrics: a bad metrics_address or a port in use stops the start, naming it",
          "[integration]") {
  Daemon a(DaemonConfig{.extra_flags = {"--metrics_address=:0"}});
  const int port = MetricsPort(a);
  Daemon b;
  b.Restart({"--metrics_address=127.0.0.1:" + std::to_string(port)}, /*wait_ready=*/false);
  CHECK(b.WaitExit(20000) == 1);
  CHECK_THAT(b.Log(), Contains("cannot listen on 127.0.0.1:" + std::to_string(port)));
  b.Restart({"--metrics_address=localhost:http"}, /*wait_ready=*/false);
  CHECK(b.WaitExit(20000) == 1);
  CHECK_THAT(b.Log(), Contains("metrics_address") && Contains("expected PORT"));
  // Still served by the first daemon.
  CHECK_THAT(Scrape(port), Contains("ckptd_arena_capacity_bytes"));
}
