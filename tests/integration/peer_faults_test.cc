// Faults on the link between two daemons' peer listeners (docs/PEERS.md "Failures between
// peers"), against real daemons committing at the peer tier (local+peer, one copy per part): node
// b's listener is reached only through a TCP fault proxy (tests/integration/tcp_fault_proxy.h;
// node b advertises the proxy's address), nodes a and c directly. Node a's part goes to node b
// first (the ring a -> b -> c). Each step of one job is saved across a (ranks 0-1) and b (ranks
// 2-3) with a fault on the link:
//   1. stalled (nothing forwarded, nothing closed): node a's copy to b is abandoned after
//      peer_stall_timeout_ms (1 s here) and goes to node c; the checkpoint commits within a
//      bound, not after the 10-minute call deadline;
//   2. reset early in the copy: node a's copy goes to node c;
//   3. slow (128 KiB/s and 5 ms per read, for a part of about 24 KiB): node a's copy completes on
//      node b.
// In each case the checkpoint is COMMITTED on both nodes, node a's part on the store names the
// node that holds its copy, node a's status names that node among its peers and no blob on no
// peer, `latest --durable peer` answers it, and it loads bit-exact on node a and on node b.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ckptd/v1/cluster.pb.h"
#include "harness.h"
#include "multi_node.h"
#include "peer_certs.h"
#include "tcp_fault_proxy.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

namespace {

constexpr char kJob[] = "peer-faults";

// A TCP port of 127.0.0.1 free now (node b's listener takes it; the proxy forwards to it).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> Flags(const std::string& shared, const std::string& node,
                               const std::string& listen, const std::string& advertise = "") {
  const std::string& c = PeerCerts();
  std::vector<std::string> f = {"--remote_dir=" + shared,
                                "--tier_policy=local+peer",
                                "--node_id=" + node,
                                "--cluster_poll_ms=50",
                                "--peer_listen_addr=" + listen,
                                "--peer_tls_ca_path=" + c + "/ca.pem",
                                "--peer_tls_cert_path=" + c + "/" + node + ".pem",
                                "--peer_tls_key_path=" + c + "/" + node + ".key",
                                "--peer_bytes_max=67108864",
                                "--peer_replicas=1",
                                "--peer_repair_interval_ms=0",
                                "--peer_stall_timeout_ms=1000"};
  if (!advertise.empty()) f.push_back("--peer_advertise_addr=" + advertise);
  return f;
}

// The peers node a's part of `step` names on the store ("" when it is not published or does
// not parse).
std::string PartHolder(const std::string& shared, uint64_t step) {
  const std::string path = shared + "/" + kJob + "/" + StepDir(step) + "/cluster/node-a.part";
  if (!PathExists(path)) return "";
  ckptd::v1::NodePart part;
  if (!part.ParseFromString(ReadFile(path))) return "";
  std::string holders;
  for (const std::string& n : part.replica_nodes()) holders += (holders.empty() ? "" : ",") + n;
  return holders;
}

// Saves `step` across a and b and checks it as the top says; `holder` is the node that must
// hold node a's copy. Returns the seconds to COMMITTED on both.
double SaveAndCheck(const Daemon& a, const Daemon& b, const std::string& shared, uint64_t step,
                    const std::string& holder) {
  const int seed = 100 + static_cast<int>(step);
  auto ca = ConnectNode(a, 2, ckptd::TierPolicy::kLocalAndPeer);
  auto cb = ConnectNode(b, 2, ckptd::TierPolicy::kLocalAndPeer);
  REQUIRE(ca != nullptr);
  REQUIRE(cb != nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, step, r, 4, seed).ok());
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, step, r, 4, seed).ok());
  for (auto* cl : {ca.get(), cb.get()}) {
    absl::Status committed = cl->WaitCommitted(kJob, step, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << a.Log() << "\nnode b:\n" << b.Log());
    REQUIRE(committed.ok());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(PartHolder(shared, step) == holder);
  auto st = ca->GetStatus(kJob, step);
  REQUIRE(st.ok());
  INFO("step " << step << " peers on node a's status: " << st->tiers.peer_nodes.size());
  CHECK(st->tiers.local_part);
  CHECK(st->tiers.blobs_without_peer_copy == 0);
  CHECK(std::find(st->tiers.peer_nodes.begin(), st->tiers.peer_nodes.end(), holder) !=
        st->tiers.peer_nodes.end());
  auto latest = ca->Latest(kJob, ckptd::Durability::kPeer);
  REQUIRE(latest.ok());
  CHECK(*latest == step);
  CHECK(VerifyInProcess(a, kJob, step, seed) == "");
  CHECK(VerifyInProcess(b, kJob, step, seed) == "");
  return s;
}

}  // namespace

TEST_CASE(
    "peers: a stalled, a reset and a slow link between two daemons - right status, exact bytes",
    "[integration][peer][multinode][fault]") {
  TempDir dir;
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directories(shared);
  const int b_port = FreePort();
  TcpFaultProxy proxy(b_port);
  Daemon a(DaemonConfig{.extra_flags = Flags(shared, "node-a", "127.0.0.1:0")});
  Daemon b(
      DaemonConfig{.extra_flags = Flags(shared, "node-b", "127.0.0.1:" + std::to_string(b_port),
                                        proxy.address())});
  Daemon c(DaemonConfig{.extra_flags = Flags(shared, "node-c", "127.0.0.1:0")});

  // 1. Stalled: abandoned after the 1 s stall timeout, copied to node c.
  proxy.Stall(true);
  const double stalled_s = SaveAndCheck(a, b, shared, 1, "node-c");
  INFO(a.Log());
  CHECK(stalled_s < 15.0);
  CHECK(a.Log().find("(peer_stall_timeout_ms)") != std::string::npos);

  // 2. Reset (the link back, then reset after 4 KiB towards b: in the handshake or mid-copy, a
  // part here is about 24 KiB): copied to node c.
  proxy.Stall(false);
  proxy.ResetAll();
  proxy.ResetAfter(4096);
  SaveAndCheck(a, b, shared, 2, "node-c");
  CHECK(proxy.resets() >= 1);

  // 3. Slow: the copy completes on node b. Node a restarts first, so that its channel to b is
  // a new one, not one still backing off the resets above (which would fail the copy at once).
  proxy.Disarm();
  a.Restart(Flags(shared, "node-a", "127.0.0.1:0"));
  proxy.SetBandwidth(128 << 10);
  proxy.SetDelay(std::chrono::milliseconds(5));
  SaveAndCheck(a, b, shared, 3, "node-b");
}
