// The peer channel between daemons (docs/PEERS.md) against a real daemon's listener on loopback:
// mutual TLS with certificates this test makes with the openssl command
// (integration/peer_certs.sh: a CA, per-node certificates, an expired one, one from another CA),
// the node id checked against the certificate, every block checked at the receiver, the budget
// and the per-node limits. The sender is ckptd_peer_bench (bench/peer_bench.cc), a process of
// its own, so that it can be killed mid-stream.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <regex>
#include <thread>

#include "harness.h"
#include "peer_certs.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

// The certificates (peer_certs.h).
const std::string& Certs() { return PeerCerts(); }

std::vector<std::string> PeerFlags(const std::string& node, std::vector<std::string> more = {}) {
  const std::string& c = Certs();
  std::vector<std::string> f{"--node_id=" + node, "--peer_listen_addr=127.0.0.1:0",
                             "--peer_tls_ca_path=" + c + "/ca.pem",
                             "--peer_tls_cert_path=" + c + "/" + node + ".pem",
                             "--peer_tls_key_path=" + c + "/" + node + ".key"};
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

// A daemon serving the peer channel as node-b; its port from its log.
struct PeerDaemon {
  explicit PeerDaemon(std::vector<std::string> more = {"--peer_bytes_max=67108864"})
      : d(DaemonConfig{.extra_flags = PeerFlags("node-b", std::move(more))}) {
    std::smatch m;
    const std::string log = d.Log();
    static const std::regex kPort("peer channel on \\S+ \\(port ([0-9]+)");
    REQUIRE(std::regex_search(log, m, kPort));
    port = m[1].str();
  }
  Daemon d;
  std::string port;
};

// ckptd_peer_bench `cmd` against `p` as `node` (its certificate from `cert_dir`).
std::vector<std::string> ToolArgs(const PeerDaemon& p, const std::string& cmd,
                                  std::vector<std::string> more, const std::string& node = "node-a",
                                  const std::string& cert_dir = "") {
  const std::string dir = cert_dir.empty() ? Certs() : cert_dir;
  // Its own certificate for node-b; node-a's for any other id (a lie, for node-c).
  const std::string cert = node == "node-b" ? "node-b" : "node-a";
  std::vector<std::string> argv{CKPTD_PEER_BENCH_BIN,
                                cmd,
                                "--addr=127.0.0.1:" + p.port,
                                "--node=" + node,
                                "--peer_node=node-b",
                                "--ca=" + dir + "/ca.pem",
                                "--cert=" + dir + "/" + cert + ".pem",
                                "--key=" + dir + "/" + cert + ".key",
                                "--timeout_s=20"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

CommandResult Tool(const PeerDaemon& p, const std::string& cmd, std::vector<std::string> more = {},
                   const std::string& node = "node-a", const std::string& cert_dir = "") {
  CommandResult r = RunCommand(ToolArgs(p, cmd, std::move(more), node, cert_dir), 60);
  UNSCOPED_INFO(cmd << ": " << r.output);
  return r;
}

constexpr int kDataLoss = 15;
constexpr int kResourceExhausted = 8;
constexpr int kPermissionDenied = 7;
constexpr int kUnavailable = 14;
constexpr int kNotFound = 5;

// Waits (5 s) until the daemon holds nothing and has nothing arriving.
bool HoldsNothing(const PeerDaemon& p) {
  for (int i = 0; i < 50; ++i) {
    CommandResult h = Tool(p, "hello");
    if (h.output.find("used=0 reserved=0 blobs=0") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace

TEST_CASE("peer: a blob round-trips bit-exact over mutual TLS, again deduplicated, then dropped",
          "[integration][peer]") {
  PeerDaemon p;
  CommandResult put = Tool(p, "put", {"--bytes=3145733", "--seed=5", "--step=7"});
  REQUIRE(put.exit_code == 0);
  CHECK_THAT(put.output, Contains("OK stored=3145733 dedup=0"));
  CommandResult get = Tool(p, "get", {"--bytes=3145733", "--seed=5", "--step=7"});
  REQUIRE(get.exit_code == 0);
  CHECK_THAT(get.output, Contains("OK bit-exact"));
  CHECK_THAT(Tool(p, "hello").output, Contains("node=node-b used=3145733 reserved=0 blobs=1"));
  CHECK_THAT(Tool(p, "put", {"--bytes=3145733", "--seed=5", "--step=7"}).output,
             Contains("dedup=1"));
  // The same name with other bytes: a blob is immutable.
  CHECK(Tool(p, "put", {"--bytes=3145733", "--seed=6", "--step=7"}).exit_code == 6);
  // Only the origin drops its copies.
  CHECK_THAT(Tool(p, "drop", {"--step=7"}, "node-b").output, Contains("dropped=0"));
  CHECK_THAT(Tool(p, "drop", {"--step=7"}).output, Contains("OK dropped=1 freed=3145733"));
  CHECK(Tool(p, "get", {"--bytes=3145733", "--step=7"}).exit_code == kNotFound);
}

TEST_CASE("peer: a certificate of another CA, or a CA that did not sign the daemon's, is refused",
          "[integration][peer]") {
  PeerDaemon p;
  // The sender trusts both CAs but presents a certificate of the other one, which the daemon
  // does not trust: the handshake fails.
  std::vector<std::string> foreign = ToolArgs(p, "put", {"--bytes=65536"});
  const std::string other = Certs() + "/other";
  REQUIRE(RunCommand({"/bin/sh", "-c",
                      "cat " + Certs() + "/ca.pem " + other + "/ca.pem > " + other + "/both.pem"})
              .exit_code == 0);
  for (std::string& a : foreign) {
    if (a.rfind("--ca=", 0) == 0) a = "--ca=" + other + "/both.pem";
    if (a.rfind("--cert=", 0) == 0) a = "--cert=" + other + "/node-a.pem";
    if (a.rfind("--key=", 0) == 0) a = "--key=" + other + "/node-a.key";
  }
  CommandResult r = RunCommand(foreign);
  INFO(r.output);
  CHECK(r.exit_code == kUnavailable);
  // The sender trusts only the other CA: it refuses the daemon's certificate.
  CommandResult wrong_ca = Tool(p, "put", {"--bytes=65536"}, "node-a", other);
  CHECK(wrong_ca.exit_code == kUnavailable);
  CHECK(HoldsNothing(p));
}

TEST_CASE("peer: a node id its certificate does not name is PERMISSION_DENIED naming both",
          "[integration][peer]") {
  PeerDaemon p;
  for (const char* cmd : {"hello", "put", "drop", "get"}) {
    CommandResult r = Tool(p, cmd, {"--bytes=4096"}, "node-c");
    CHECK(r.exit_code == kPermissionDenied);
    CHECK_THAT(r.output, Contains("\"node-c\"") && Contains("node-a"));
  }
  CHECK(HoldsNothing(p));
}

TEST_CASE("peer: a missing, expired, foreign or mismatched certificate stops the daemon at start",
          "[integration][peer]") {
  TempDir dir;
  const std::string c = Certs();
  auto start = [&](const std::string& node, std::vector<std::string> flags) {
    std::vector<std::string> argv{CKPTD_BIN, "--state_dir=" + dir.path() + "/" + node,
                                  "--staging_bytes_max=16777216", "--node_id=" + node,
                                  "--peer_listen_addr=127.0.0.1:0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    CommandResult r = RunCommand(argv, 30);
    UNSCOPED_INFO(r.output);
    CHECK(r.exit_code != 0);
    return r.output;
  };
  const std::string ca = "--peer_tls_ca_path=" + c + "/ca.pem";
  auto cert = [&](const std::string& f) { return "--peer_tls_cert_path=" + f; };
  auto key = [&](const std::string& f) { return "--peer_tls_key_path=" + f; };
  CHECK_THAT(start("n1", {ca, key(c + "/node-a.key")}), Contains("peer_tls_cert_path"));
  CHECK_THAT(start("n2", {ca, cert(c + "/nope.pem"), key(c + "/node-a.key")}),
             Contains(c + "/nope.pem") && Contains("cannot read"));
  CHECK_THAT(start("node-old", {ca, cert(c + "/node-old.pem"), key(c + "/node-old.key")}),
             Contains(c + "/node-old.pem") && Contains("expired"));
  CHECK_THAT(start("node-a", {ca, cert(c + "/other/node-a.pem"), key(c + "/other/node-a.key")}),
             Contains(c + "/other/node-a.pem") && Contains("not signed by a CA"));
  CHECK_THAT(start("node-a", {ca, cert(c + "/node-a.pem"), key(c + "/node-b.key")}),
             Contains(c + "/node-b.key") && Contains("not the key"));
  CHECK_THAT(start("node-c", {ca, cert(c + "/node-a.pem"), key(c + "/node-a.key")}),
             Contains("not this daemon's node id \"node-c\""));
  CHECK_THAT(start("node-a", {"--peer_tls_ca_path=" + c + "/node-a.key", cert(c + "/node-a.pem"),
                              key(c + "/node-a.key")}),
             Contains(c + "/node-a.key") && Contains("no PEM certificate"));
}

TEST_CASE("peer: a corrupted block is DATA_LOSS naming it and nothing is stored",
          "[integration][peer]") {
  PeerDaemon p;
  CommandResult r = Tool(p, "put", {"--bytes=1048576", "--corrupt", "--step=3", "--blob=b7"});
  CHECK(r.exit_code == kDataLoss);
  CHECK_THAT(r.output, Contains("job job step 3 blob b7 from node node-a") && Contains("block 8") &&
                           Contains("crc32c mismatch"));
  CHECK(HoldsNothing(p));
  CHECK(Tool(p, "get", {"--bytes=1048576", "--step=3", "--blob=b7"}).exit_code == kNotFound);
}

TEST_CASE("peer: past peer_bytes_max a put is RESOURCE_EXHAUSTED, and with none it is refused",
          "[integration][peer]") {
  PeerDaemon p({"--peer_bytes_max=2097152"});
  CommandResult r = Tool(p, "put", {"--bytes=3145728"});
  CHECK(r.exit_code == kResourceExhausted);
  CHECK_THAT(r.output, Contains("peer_bytes_max = 2097152"));
  CHECK(HoldsNothing(p));
  PeerDaemon off(std::vector<std::string>{});
  CHECK(Tool(off, "put", {"--bytes=4096"}).exit_code == 9);  // FAILED_PRECONDITION
}

TEST_CASE("peer: a sender killed mid-stream leaves nothing stored", "[integration][peer]") {
  PeerDaemon p;
  CommandResult r = Tool(p, "put", {"--bytes=8388608", "--die_after=2097152"});
  CHECK(r.exit_code == 128 + 9);
  CHECK(HoldsNothing(p));
  // The retry is not refused as a put in flight.
  CHECK(Tool(p, "put", {"--bytes=8388608"}).exit_code == 0);
  CHECK(Tool(p, "get", {"--bytes=8388608"}).exit_code == 0);
}

TEST_CASE("peer: streams and bytes in flight per node are bounded, naming limit and node",
          "[integration][peer]") {
  PeerDaemon p({"--peer_bytes_max=67108864", "--peer_streams_per_node_max=2",
                "--peer_inflight_bytes_per_node_max=5242880"});
  // 4 MiB in flight, held open.
  Child a1(ToolArgs(p, "put",
                    {"--bytes=4194304", "--blob=a1", "--stall_after=262144", "--stall_ms=8000"}));
  REQUIRE(a1.WaitForLine("STALLING", 10000));
  CommandResult bytes = Tool(p, "put", {"--bytes=2097152", "--blob=a2"});
  CHECK(bytes.exit_code == kResourceExhausted);
  CHECK_THAT(bytes.output, Contains("peer_inflight_bytes_per_node_max") && Contains("node-a"));
  Child a3(ToolArgs(p, "put",
                    {"--bytes=524288", "--blob=a3", "--stall_after=262144", "--stall_ms=8000"}));
  REQUIRE(a3.WaitForLine("STALLING", 10000));
  CommandResult streams = Tool(p, "put", {"--bytes=4096", "--blob=a4"});
  CHECK(streams.exit_code == kResourceExhausted);
  CHECK_THAT(streams.output, Contains("peer_streams_per_node_max = 2") && Contains("node-a"));
  a1.Kill9();
  a3.Kill9();
  CHECK(HoldsNothing(p));
  CHECK(Tool(p, "put", {"--bytes=4096", "--blob=a4"}).exit_code == 0);
}
