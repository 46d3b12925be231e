// The peer tier (docs/PEERS.md "Replication") against real daemons on loopback: three daemons
// stand for three nodes sharing a directory as the store, each with a peer listener (mutual TLS,
// certificates made by integration/peer_certs.sh), registered on the store. A checkpoint spanning
// nodes a and b commits; each node's part is copied to its next node on the ring (a -> b,
// b -> c), and the manifest names each blob's node and peers. Node b is then lost (killed, its
// state dir gone) and the store's copies of its blobs are lost too: a replacement daemon with the
// same node id and an empty state dir loads the checkpoint bit-exact, node b's blobs from node
// c's peer store, counted in bytes_read_peer.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "ckptd/v1/manifest.pb.h"
#include "harness.h"
#include "multi_node.h"
#include "peer_certs.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

namespace {

constexpr char kJob[] = "peer-job";

const std::string& Certs() { return PeerCerts(); }

std::vector<std::string> Flags(const std::string& shared, const std::string& node, int replicas = 1,
                               const std::string& policy = "local+remote",
                               const std::vector<std::string>& extra = {}) {
  const std::string& c = Certs();
  std::vector<std::string> f = {"--remote_dir=" + shared,
                                "--tier_policy=" + policy,
                                "--node_id=" + node,
                                "--cluster_poll_ms=50",
                                "--upload_retry_max_ms=1000",
                                "--peer_listen_addr=127.0.0.1:0",
                                "--peer_tls_ca_path=" + c + "/ca.pem",
                                "--peer_tls_cert_path=" + c + "/" + node + ".pem",
                                "--peer_tls_key_path=" + c + "/" + node + ".key",
                                "--peer_bytes_max=67108864",
                                "--peer_replicas=" + std::to_string(replicas)};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// The whole first tensor of the state dict, as one load target, and the bytes it loads into.
struct WholeTensor {
  const TensorItem& t = StateDict().front();
  std::vector<uint8_t> got =
      std::vector<uint8_t>(ElementCount(t.shape) * ckptd::DTypeSize(t.dtype));
  std::vector<ckptd::LoadTarget> targets = {
      {t.name, ckptd::Region::Box(std::vector<uint64_t>(t.shape.size(), 0), t.shape), got.data(),
       got.size()}};
  WholeTensor() = default;
  WholeTensor(const WholeTensor&) = delete;
  WholeTensor& operator=(const WholeTensor&) = delete;
};

// The header record of a manifest (docs/BLOB_FORMAT.md: 8 bytes of magic, then a record: its
// length and masked crc32c, 4 bytes each, little-endian, and the ManifestHeader).
ckptd::v1::ManifestHeader ManifestHeaderOf(const std::string& shared, uint64_t step) {
  const std::string bytes = ReadFile(shared + "/" + kJob + "/" + StepDir(step) + "/manifest.ckm");
  REQUIRE(bytes.size() >= 16);
  uint32_t len = 0;
  for (int i = 3; i >= 0; --i) len = len << 8 | static_cast<uint8_t>(bytes[8 + i]);
  REQUIRE(bytes.size() >= 16 + len);
  ckptd::v1::ManifestHeader h;
  REQUIRE(h.ParseFromArray(bytes.data() + 16, static_cast<int>(len)));
  return h;
}

// Ranks 0-1 saved through node a and 2-3 through node b as step 1 of kJob (`seed`'s bytes), under
// `policy`, and committed on both.
void SaveAcrossAB(Daemon& a, Daemon& b, int seed,
                  ckptd::TierPolicy policy = ckptd::TierPolicy::kLocalAndPeer) {
  auto ca = ConnectNode(a, 2, policy);
  auto cb = ConnectNode(b, 2, policy);
  REQUIRE(ca != nullptr);
  REQUIRE(cb != nullptr);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, seed).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, seed).ok());
  for (auto* cl : {ca.get(), cb.get()}) {
    absl::Status committed = cl->WaitCommitted(kJob, 1, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << a.Log() << "\nnode b:\n" << b.Log());
    REQUIRE(committed.ok());
  }
}

// Node b is lost: killed, its state dir gone; and the store's copies of its blobs (ranks 2 and 3)
// are lost too, so that they can come from its peers alone.
void LoseNodeB(std::unique_ptr<Daemon>& b, const std::string& shared) {
  const std::string state = b->state_dir();
  REQUIRE(kill(b->pid(), SIGKILL) == 0);
  b->WaitExit(10000);
  b.reset();
  std::filesystem::remove_all(state);
  for (const char* blob : {"r00002.blob", "r00003.blob"}) {
    REQUIRE(std::filesystem::remove(shared + "/" + kJob + "/" + StepDir(1) + "/" + blob));
  }
}

}  // namespace

TEST_CASE("peers: a lost node's part is restored from its peer, with the store's copy gone",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = Flags(shared, "node-a")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = Flags(shared, "node-b")});
  auto c = std::make_unique<Daemon>(DaemonConfig{.extra_flags = Flags(shared, "node-c")});
  for (const char* n : {"node-a", "node-b", "node-c"}) {
    CHECK(std::filesystem::exists(shared + "/.ckptd-peers/" + n));
  }
  SaveAcrossAB(*a, *b, 83, ckptd::TierPolicy::kLocalAndRemote);
  // Placement: the ring of registered ids, each node's part on the next node.
  const ckptd::v1::ManifestHeader m = ManifestHeaderOf(shared, 1);
  REQUIRE(m.blobs_size() == 4);
  for (const auto& blob : m.blobs()) {
    INFO("blob " << blob.name());
    const bool on_a = blob.id() < 2;
    CHECK(blob.node() == (on_a ? "node-a" : "node-b"));
    REQUIRE(blob.peers_size() == 1);
    CHECK(blob.peers(0) == (on_a ? "node-b" : "node-c"));
  }
  // The jobs the store lists are unaffected by the registry beside them; the status names the
  // peers holding copies.
  CommandResult ls = RunCtl(*a, {"ls"});
  INFO(ls.output);
  CHECK(ls.output.find(".ckptd-peers") == std::string::npos);
  CommandResult st = RunCtl(*a, {"status", kJob, "1"});
  INFO(st.output);
  CHECK(st.output.find("peer (node-b, node-c)") != std::string::npos);

  LoseNodeB(b, shared);
  // Its replacement: the same node id, an empty state dir.
  Daemon b2(DaemonConfig{.extra_flags = Flags(shared, "node-b")});
  CHECK(VerifyInProcess(b2, kJob, 1, 83) == "");
  // The whole first tensor: node a's rows from the store, node b's from node c's peer store.
  WholeTensor w;
  const TensorItem& t = w.t;
  std::vector<uint8_t>& got = w.got;
  const std::vector<ckptd::LoadTarget>& targets = w.targets;
  auto r = b2.Connect()->Load(kJob, 1, 0, targets);
  INFO(b2.Log());
  REQUIRE(r.ok());
  CHECK(r->bytes_read_peer > 0);
  CHECK(r->bytes_read_peer + r->bytes_read_remote == r->bytes_read);
  CHECK(got == GlobalBytes(t, 83));
  // With node c gone too, node b's blobs are nowhere: the load fails, naming what is missing,
  // and gives no wrong byte.
  REQUIRE(kill(c->pid(), SIGKILL) == 0);
  c->WaitExit(10000);
  Daemon b3(DaemonConfig{.extra_flags = Flags(shared, "node-b")});
  auto lost = b3.Connect()->Load(kJob, 1, 0, targets);
  INFO(lost.status().ToString());
  CHECK_FALSE(lost.ok());
}

// Issue 35 §5: a peer that is down when a part is copied is skipped for the next node on the ring,
// and a part with fewer copies than asked is published all the same, logged as degraded. Node c
// is registered, then dies before the save: with peer_replicas = 2, node a's part goes to b only
// (c refused), node b's part to a only (c refused, then a); a lost node b is restored from a.
TEST_CASE("peers: a peer that is down is skipped for the next node, too few copies is degraded",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = Flags(shared, "node-a", 2)});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = Flags(shared, "node-b", 2)});
  {
    Daemon c(DaemonConfig{.extra_flags = Flags(shared, "node-c", 2)});
    REQUIRE(kill(c.pid(), SIGKILL) == 0);
    c.WaitExit(10000);
  }
  REQUIRE(std::filesystem::exists(shared + "/.ckptd-peers/node-c"));  // registered, and down
  auto ca = ConnectNode(*a, 2);
  auto cb = ConnectNode(*b, 2);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 87).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 87).ok());
  for (auto* cl : {ca.get(), cb.get()}) {
    absl::Status committed = cl->WaitCommitted(kJob, 1, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << a->Log() << "\nnode b:\n" << b->Log());
    REQUIRE(committed.ok());
  }
  const ckptd::v1::ManifestHeader m = ManifestHeaderOf(shared, 1);
  for (const auto& blob : m.blobs()) {
    INFO("blob " << blob.name());
    REQUIRE(blob.peers_size() == 1);
    CHECK(blob.peers(0) == (blob.id() < 2 ? "node-b" : "node-a"));
  }
  for (Daemon* d : {a.get(), b.get()}) {
    INFO(d->Log());
    CHECK(d->Log().find("to node-c failed, trying the next node") != std::string::npos);
    CHECK(d->Log().find("has 1 of 2 peer copies (degraded)") != std::string::npos);
  }
  LoseNodeB(b, shared);
  Daemon b2(DaemonConfig{.extra_flags = Flags(shared, "node-b", 2)});
  CHECK(VerifyInProcess(b2, kJob, 1, 87) == "");
}

// Issue 35 §1: committed at the peer tier (tier_policy local+peer). Each node's ranks stay on its
// local storage, its part goes to its peer on the ring, and the store receives the control files
// alone (parts, decision, manifest): no blob. A node loads the other node's ranks from peers and
// nothing from the store; node b is lost (its state dir gone), and its replacement loads every
// rank from the others: node b's blobs from node c's peer store, node a's from node a itself
// (their peer copy was on the lost node b).
TEST_CASE("peers: committed at the peer tier, no blob goes to the store, and a lost node resumes",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node) { return Flags(shared, node, 1, "local+peer"); };
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-a")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-b")});
  auto c = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-c")});
  auto ca = ConnectNode(*a, 2, ckptd::TierPolicy::kDefault);
  auto cb = ConnectNode(*b, 2, ckptd::TierPolicy::kLocalAndPeer);
  REQUIRE(ca != nullptr);
  REQUIRE(cb != nullptr);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 91).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 91).ok());
  for (auto* cl : {ca.get(), cb.get()}) {
    absl::Status committed = cl->WaitCommitted(kJob, 1, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << a->Log() << "\nnode b:\n" << b->Log());
    REQUIRE(committed.ok());
  }
  // The store: the manifest, the parts and the decision; no blob.
  const std::string step_dir = shared + "/" + kJob + "/" + StepDir(1);
  for (const auto& e : std::filesystem::recursive_directory_iterator(step_dir)) {
    INFO(e.path());
    CHECK(e.path().extension() != ".blob");
  }
  const ckptd::v1::ManifestHeader m = ManifestHeaderOf(shared, 1);
  CHECK(m.blobs_on_nodes());
  for (const auto& blob : m.blobs()) {
    INFO("blob " << blob.name());
    REQUIRE(blob.peers_size() == 1);
    CHECK(blob.peers(0) == (blob.id() < 2 ? "node-b" : "node-c"));
  }
  auto st = ca->GetStatus(kJob, 1);
  REQUIRE(st.ok());
  CHECK(st->tiers.local_part);
  CHECK_FALSE(st->tiers.local);
  CHECK_FALSE(st->tiers.remote);
  CommandResult ctl = RunCtl(*a, {"status", kJob, "1"});
  INFO(ctl.output);
  CHECK(ctl.output.find("local (this node's part)") != std::string::npos);
  CHECK(ctl.output.find("peer (node-b, node-c; this node's part on node-b)") != std::string::npos);

  // Every rank on node a: its own from local storage, node b's from peers; none from the store.
  WholeTensor w;
  const TensorItem& t = w.t;
  std::vector<uint8_t>& got = w.got;
  const std::vector<ckptd::LoadTarget>& targets = w.targets;
  auto here = a->Connect()->Load(kJob, 1, 0, targets);
  INFO(a->Log());
  REQUIRE(here.ok());
  CHECK(here->bytes_read_remote == 0);
  CHECK(here->bytes_read_peer > 0);
  CHECK(got == GlobalBytes(t, 91));

  // Node a killed and restarted on its state dir: its part stays (recovery neither removes it
  // nor takes its copy of the manifest for a local checkpoint), and loads read it from there.
  a->Kill9();
  a->Restart(flags("node-a"));
  REQUIRE(std::filesystem::exists(a->data_dir() + "/" + kJob + "/" + StepDir(1) + "/r00000.blob"));
  auto restarted = a->Connect()->GetStatus(kJob, 1);
  REQUIRE(restarted.ok());
  CHECK(restarted->state == ckptd::CheckpointState::kCommitted);
  CHECK(restarted->tiers.local_part);
  CHECK_FALSE(restarted->tiers.local);
  std::fill(got.begin(), got.end(), 0);
  auto again = a->Connect()->Load(kJob, 1, 0, targets);
  INFO(a->Log());
  REQUIRE(again.ok());
  CHECK(again->bytes_read_remote == 0);
  CHECK(got == GlobalBytes(t, 91));

  // Node b lost; its replacement (same id, empty state dir) learns the checkpoint from the
  // store's control files and reads every blob from the surviving nodes.
  const std::string b_state = b->state_dir();
  REQUIRE(kill(b->pid(), SIGKILL) == 0);
  b->WaitExit(10000);
  b.reset();
  std::filesystem::remove_all(b_state);
  Daemon b2(DaemonConfig{.extra_flags = flags("node-b")});
  std::fill(got.begin(), got.end(), 0);
  auto there = b2.Connect()->Load(kJob, 1, 0, targets);
  INFO(b2.Log());
  REQUIRE(there.ok());
  CHECK(there->bytes_read_remote == 0);
  CHECK(there->bytes_read_peer == there->bytes_read);
  CHECK(got == GlobalBytes(t, 91));
  CHECK(VerifyInProcess(b2, kJob, 1, 91) == "");
  {
    // Node a now lies: a byte of its own blob flipped on its disk. Its peer copy was on the lost
    // node b, so node a alone serves it: the reader's checksums reject it and the load fails,
    // naming the blob, with no wrong byte handed out.
    const std::string blob = a->data_dir() + "/" + kJob + "/" + StepDir(1) + "/r00000.blob";
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekg(64);
    const char c = static_cast<char>(f.get());
    f.seekp(64);
    f.put(static_cast<char>(c ^ 0x5a));
    f.close();
    Daemon b3(DaemonConfig{.extra_flags = flags("node-b")});
    auto lied = b3.Connect()->Load(kJob, 1, 0, targets);
    INFO(lied.status().ToString() << "\n" << b3.Log());
    CHECK_FALSE(lied.ok());
    CHECK(lied.status().message().find("r00000.blob") != std::string_view::npos);
  }
  // Verify reads the checkpoint across the nodes (tier "peer"): node a's own blob is damaged,
  // and it is the only one serving it, so that block is reported, naming the tier and the blob;
  // every other blob verifies from node a and node c.
  CommandResult verify = RunCtl(b2, {"verify", kJob, "1"});
  INFO(verify.output << "\n" << b2.Log());
  CHECK(verify.exit_code != 0);
  CHECK(verify.output.find("BAD tier=peer") != std::string::npos);
  CHECK(verify.output.find("blob=r00000.blob") != std::string::npos);
  CHECK(verify.output.find("blob=r00001.blob") == std::string::npos);
  CommandResult wrong = RunCtl(*a, {"verify", "one-node-missing", "1", "--tier", "peer"});
  CHECK(wrong.exit_code != 0);

  // A Save under local+peer through one daemon is refused, naming the policy.
  auto single = ConnectNode(*a, 0, ckptd::TierPolicy::kLocalAndPeer);
  REQUIRE(single != nullptr);
  absl::Status refused = SaveRank(*single, "one-node", 1, 0, 1, 91).status();
  INFO(refused.ToString());
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.message().find("span nodes") != std::string_view::npos);
}

// Issue 35 §5: a node part that cannot get its peer copies does not commit at the peer tier. With
// peer_replicas = 2 and one other node, node a's part has one copy of two: it is copied again at
// every step, the status says so, and the coordinator's stage timeout aborts the checkpoint on
// every node, naming the peers missing.
TEST_CASE("peers: a part short of its peer copies is not committed at the peer tier",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node) {
    return Flags(shared, node, 2, "local+peer", {"--stage_timeout_ms=3000"});
  };
  Daemon a(DaemonConfig{.extra_flags = flags("node-a")});
  Daemon b(DaemonConfig{.extra_flags = flags("node-b")});
  auto ca = ConnectNode(a, 2, ckptd::TierPolicy::kDefault);
  auto cb = ConnectNode(b, 2, ckptd::TierPolicy::kDefault);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 93).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 93).ok());
  auto waiting = WaitForWaiting(*ca, kJob, 1, "to 2 peers (retried)", 10000);
  INFO(a.Log());
  CHECK(waiting.ok());
  for (auto* cl : {ca.get(), cb.get()}) {
    absl::Status gone = cl->WaitCommitted(kJob, 1, 30000);
    REQUIRE_FALSE(gone.ok());
    auto st = cl->GetStatus(kJob, 1);
    REQUIRE(st.ok());
    CHECK(st->state == ckptd::CheckpointState::kAborted);
    INFO(st->error);
    CHECK(st->error.find("stage timeout") != std::string::npos);
  }
  auto st = ca->GetStatus(kJob, 1);
  REQUIRE(st.ok());
  CHECK(st->error.find("copying this node's part to 2 peers") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(shared + "/" + kJob + "/" + StepDir(1) + "/manifest.ckm"));
}

// Issue 35 §1: the store's cadence at the peer tier (remote_every). Nodes a and b commit steps 1
// and 2 under local+peer with remote_every = 2: step 1 stays off the store, step 2 is copied
// there after its commit, each node its own blobs (Wait(remote) on each node waits for its own),
// and the store's copy alone then serves a node that lost its peers; latest --durable store
// answers step 2 while step 3 (committed at the peer tier only) is newer.
TEST_CASE("peers: remote_every copies every N-th step committed at the peer tier to the store",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node) {
    return Flags(shared, node, 1, "local+peer", {"--remote_every=2"});
  };
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-a")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-b")});
  auto ca = ConnectNode(*a, 2, ckptd::TierPolicy::kDefault);
  auto cb = ConnectNode(*b, 2, ckptd::TierPolicy::kDefault);
  for (uint64_t step : {1u, 2u, 3u}) {
    for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, step, r, 4, 95 + step).ok());
    for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, step, r, 4, 95 + step).ok());
    for (auto* cl : {ca.get(), cb.get()}) REQUIRE(cl->WaitCommitted(kJob, step, 30000).ok());
  }
  // Step 1: no upload (Wait(remote) says why); step 2: each node's own blobs, then durable.
  auto none = ca->Wait(kJob, 1, ckptd::WaitFor::kRemote, 5000);
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(none.status().message().find("remote_every") != std::string_view::npos);
  for (auto* cl : {ca.get(), cb.get()}) {
    auto up = cl->Wait(kJob, 2, ckptd::WaitFor::kRemote, 30000);
    INFO(up.status().ToString() << "\n" << a->Log() << "\n" << b->Log());
    REQUIRE(up.ok());
    CHECK(up->tiers.remote);
    CHECK(up->tiers.local_part);
  }
  auto blobs_on_store = [&](uint64_t step) {
    int n = 0;
    for (const auto& e :
         std::filesystem::directory_iterator(shared + "/" + kJob + "/" + StepDir(step))) {
      n += e.path().extension() == ".blob" ? 1 : 0;
    }
    return n;
  };
  CHECK(blobs_on_store(1) == 0);
  CHECK(blobs_on_store(2) == 4);
  CommandResult uploaded = RunCtl(*a, {"status", kJob, "2"});
  INFO(uploaded.output);
  CHECK(uploaded.output.find("remote (this node's part)") != std::string::npos);
  // latest never answers a checkpoint that survives less than asked: step 3 is on peers, step 2
  // on the store too.
  CHECK(ca->Latest(kJob).value_or(0) == 3);
  CHECK(ca->Latest(kJob, ckptd::Durability::kPeer).value_or(0) == 3);
  CHECK(ca->Latest(kJob, ckptd::Durability::kStore).value_or(0) == 2);
  CommandResult latest = RunCtl(*b, {"latest", kJob, "--durable", "store"});
  INFO(latest.output);
  CHECK(latest.output == "2\n");
  // Both nodes lost: a fresh node reads step 2 from the store alone, bit-exact.
  for (auto* d : {a.get(), b.get()}) {
    REQUIRE(kill(d->pid(), SIGKILL) == 0);
    d->WaitExit(10000);
  }
  Daemon c(DaemonConfig{.extra_flags = flags("node-c")});
  CHECK(c.Connect()->Latest(kJob, ckptd::Durability::kStore).value_or(0) == 2);
  CHECK(VerifyInProcess(c, kJob, 2, 97) == "");
  WholeTensor w;
  const TensorItem& t = w.t;
  std::vector<uint8_t>& got = w.got;
  const std::vector<ckptd::LoadTarget>& targets = w.targets;
  auto r = c.Connect()->Load(kJob, 2, 0, targets);
  INFO(c.Log());
  REQUIRE(r.ok());
  CHECK(r->bytes_read_remote == r->bytes_read);
  CHECK(got == GlobalBytes(t, 97));
}

// Every node of a checkpoint must save it under the same policy: node a's part (local+remote, its
// blobs on the store) and node b's (local+peer, its blobs on its node and peers) make no
// checkpoint, and the coordinator aborts it naming both.
TEST_CASE("peers: parts saved under local+remote and local+peer are aborted by the coordinator",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  Daemon a(DaemonConfig{.extra_flags = Flags(shared, "node-a", 1, "local+remote")});
  Daemon b(DaemonConfig{.extra_flags = Flags(shared, "node-b", 1, "local+peer")});
  auto ca = ConnectNode(a, 2, ckptd::TierPolicy::kDefault);
  auto cb = ConnectNode(b, 2, ckptd::TierPolicy::kDefault);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 99).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 99).ok());
  for (auto* cl : {ca.get(), cb.get()}) {
    REQUIRE_FALSE(cl->WaitCommitted(kJob, 1, 30000).ok());
    auto st = cl->GetStatus(kJob, 1);
    REQUIRE(st.ok());
    INFO(st->error);
    CHECK(st->state == ckptd::CheckpointState::kAborted);
    CHECK(st->error.find("give every rank the same tier policy") != std::string::npos);
  }
}

// Crash points on the commit at the peer tier: node a (the coordinator) is killed right after its
// COMMITTED row, before its copy of the manifest beside its part and before its upload
// (remote_every = 1) is tracked. After its restart the checkpoint is COMMITTED with its part,
// loads bit-exact with nothing from the store, and its upload resumes from the store's manifest.
TEST_CASE("peers: a node killed right after its commit at the peer tier keeps it and uploads it",
          "[integration][peer][multinode][crash]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node, std::vector<std::string> extra) {
    extra.push_back("--remote_every=1");
    return Flags(shared, node, 1, "local+peer", extra);
  };
  Daemon a(DaemonConfig{.extra_flags = flags("node-a", {"--debug_crash_at=cluster.committed:1"})});
  Daemon b(DaemonConfig{.extra_flags = flags("node-b", {})});
  auto ca = ConnectNode(a, 2, ckptd::TierPolicy::kDefault);
  auto cb = ConnectNode(b, 2, ckptd::TierPolicy::kDefault);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 101).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 101).ok());
  const int rc = a.WaitExit(30000);
  INFO(a.Log());
  REQUIRE(rc >= 0);
  REQUIRE(a.Log().find("crash point cluster.committed reached") != std::string::npos);
  ca.reset();
  REQUIRE(cb->WaitCommitted(kJob, 1, 30000).ok());
  a.Restart(flags("node-a", {}));
  auto client = a.Connect();
  auto st = client->GetStatus(kJob, 1);
  REQUIRE(st.ok());
  CHECK(st->state == ckptd::CheckpointState::kCommitted);
  CHECK(st->tiers.local_part);
  WholeTensor w;
  auto loaded = client->Load(kJob, 1, 0, w.targets);
  INFO(a.Log());
  REQUIRE(loaded.ok());
  CHECK(loaded->bytes_read_remote == 0);
  CHECK(w.got == GlobalBytes(w.t, 101));
  for (auto* cl : {client.get(), cb.get()}) {
    auto up = cl->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000);
    INFO(up.status().ToString() << "\n" << a.Log());
    CHECK(up.ok());
  }
  CHECK(client->Latest(kJob, ckptd::Durability::kStore).value_or(0) == 1);
}

namespace {

// `ckptctl status JOB 1` on `d` until its output has `want` (repair runs every 100 ms here);
// the last output, whether it appeared or not.
std::string StatusUntil(Daemon& d, const std::string& want, int timeout_ms = 20000) {
  std::string out;
  for (int waited = 0; waited < timeout_ms; waited += 100) {
    out = RunCtl(d, {"status", kJob, "1"}).output;
    if (out.find(want) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return out;
}

void Lose(std::unique_ptr<Daemon>& d) {
  const std::string state = d->state_dir();
  REQUIRE(kill(d->pid(), SIGKILL) == 0);
  d->WaitExit(10000);
  d.reset();
  std::filesystem::remove_all(state);
}

}  // namespace

// Issue 35 §2 (docs/PEERS.md "Repair"): a peer that leaves is replaced. Node a's part of a
// checkpoint committed at the peer tier is on node b; b is lost, and a copies its part to the
// next node, c, within a few repair intervals, recording the new holder on the store. Then a is
// lost too: c alone still serves every rank (a's part through the record, b's through the
// manifest), so a replacement of a loads the whole checkpoint bit-exact, from peers only.
TEST_CASE("peers: repair copies a node's part to the next node once its peer is lost",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node) {
    return Flags(shared, node, 1, "local+peer", {"--peer_repair_interval_ms=100"});
  };
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-a")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-b")});
  auto c = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-c")});
  SaveAcrossAB(*a, *b, 97);
  const std::string record = shared + "/" + kJob + "/" + StepDir(1) + "/cluster/node-a.copies";
  // Healthy: the part is where the manifest says, and nothing was recorded.
  std::string healthy = StatusUntil(*a, "this node's part on node-b");
  INFO(healthy);
  CHECK(healthy.find("this node's part on node-b") != std::string::npos);
  CHECK(healthy.find("degraded") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(record));

  Lose(b);
  std::string repaired = StatusUntil(*a, "this node's part on node-c");
  INFO(repaired << "\n" << a->Log());
  REQUIRE(repaired.find("this node's part on node-c") != std::string::npos);
  CHECK(repaired.find("degraded") == std::string::npos);
  CHECK(a->Log().find("copied again: on node-c") != std::string::npos);
  REQUIRE(std::filesystem::exists(record));

  // Node a lost as well: node c holds both parts.
  Lose(a);
  Daemon a2(DaemonConfig{.extra_flags = flags("node-a")});
  WholeTensor w;
  auto r = a2.Connect()->Load(kJob, 1, 0, w.targets);
  INFO(a2.Log());
  REQUIRE(r.ok());
  CHECK(r->bytes_read_remote == 0);
  CHECK(r->bytes_read_peer == r->bytes_read);
  CHECK(w.got == GlobalBytes(w.t, 97));
  CHECK(VerifyInProcess(a2, kJob, 1, 97) == "");
}

// The part is degraded while no node can take it: node a's only peer, b, is lost and there is no
// other node; the status says so, naming the lost holder. b comes back (restarted on its state
// dir: a peer store is memory only, so it holds nothing): a copies its part to b again, and it is
// no longer degraded. The new copy is dropped by the checkpoint's Delete.
TEST_CASE("peers: a part with no node to take its copy is degraded until one comes back",
          "[integration][peer][multinode]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node) {
    return Flags(shared, node, 1, "local+peer", {"--peer_repair_interval_ms=100"});
  };
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-a")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-b")});
  SaveAcrossAB(*a, *b, 98);
  {
    // A record of node a's holders that lies (not a NodeCopies of node a): readers skip it and
    // take the manifest's holders, so node b still loads node a's blobs, bit-exact.
    std::ofstream(shared + "/" + kJob + "/" + StepDir(1) + "/cluster/node-a.copies")
        << "not a record";
    WholeTensor w;
    auto r = b->Connect()->Load(kJob, 1, 0, w.targets);
    INFO(b->Log());
    REQUIRE(r.ok());
    CHECK(w.got == GlobalBytes(w.t, 98));
    CHECK(b->Log().find("is not a record of node node-a") != std::string::npos);
  }
  b->Kill9();
  std::string degraded = StatusUntil(*a, "degraded: 0 of 1 peer copies");
  INFO(degraded << "\n" << a->Log());
  REQUIRE(degraded.find("this node's part on no peer; degraded: 0 of 1 peer copies; lost: "
                        "node-b") != std::string::npos);
  b->Restart(flags("node-b"));
  std::string back = StatusUntil(*a, "this node's part on node-b)");
  INFO(back << "\n" << a->Log());
  REQUIRE(back.find("this node's part on node-b)") != std::string::npos);
  CHECK(back.find("degraded") == std::string::npos);
  CHECK(a->Log().find("copied again: on node-b") != std::string::npos);

  // A restart of node a reads where its copies are from the store's record, and keeps checking.
  a->Kill9();
  a->Restart(flags("node-a"));
  std::string restarted = StatusUntil(*a, "this node's part on node-b)");
  INFO(restarted << "\n" << a->Log());
  CHECK(restarted.find("this node's part on node-b)") != std::string::npos);

  // The Delete drops the copy repair placed (b's peer store holds none of a's afterwards).
  CommandResult del = RunCtl(*a, {"rm", kJob, "1"});
  INFO(del.output);
  REQUIRE(del.exit_code == 0);
  CHECK(RunCtl(*a, {"status", kJob, "1"}).output.find("this node's part") == std::string::npos);
}

TEST_CASE(
    "peers: with failure domains a node's part goes to another domain before its ring "
    "neighbour",
    "[integration][peer][multinode]") {
  TempDir dir;
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directories(shared);
  // Nodes a and b share rack1 and are ring neighbours; c is the only node of rack2.
  auto flags = [&](const std::string& node, const std::string& rack) {
    return Flags(shared, node, 1, "local+remote", {"--peer_failure_domain=" + rack});
  };
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-a", "rack1")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-b", "rack1")});
  auto c = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-c", "rack2")});
  SaveAcrossAB(*a, *b, 89, ckptd::TierPolicy::kLocalAndRemote);
  const ckptd::v1::ManifestHeader m = ManifestHeaderOf(shared, 1);
  REQUIRE(m.blobs_size() == 4);
  for (const auto& blob : m.blobs()) {
    INFO("blob " << blob.name() << " of node " << blob.node());
    REQUIRE(blob.peers_size() == 1);
    CHECK(blob.peers(0) == "node-c");  // not node-b (a's ring neighbour, its own rack)
  }
  // A domain that is not a name is refused at start, naming the option.
  CommandResult bad =
      RunCommand({CKPTD_BIN, "--state_dir=" + dir.path() + "/bad", "--peer_failure_domain=a/b"});
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("peer_failure_domain") != std::string::npos);
}

// Deltas at the peer tier (docs/USER_GUIDE.md "Deltas"): step 2 repeats step 1's bytes, so each
// node's step 2 shares its step-1 blobs (hard links named after step 1) and writes nothing new;
// the shared files are copied to the peers like any blob, and a lost node's replacement loads
// step 2 from its peers bit-exact.
TEST_CASE("peers: a delta checkpoint's shared blobs are copied to peers and restored from them",
          "[integration][peer][multinode][deltas]") {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/shared");
  const std::string shared = dir.path() + "/shared";
  auto flags = [&](const std::string& node) {
    return Flags(shared, node, 1, "local+peer", {"--deltas=true"});
  };
  auto a = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-a")});
  auto b = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-b")});
  auto c = std::make_unique<Daemon>(DaemonConfig{.extra_flags = flags("node-c")});
  auto ca = ConnectNode(*a, 2, ckptd::TierPolicy::kLocalAndPeer);
  auto cb = ConnectNode(*b, 2, ckptd::TierPolicy::kLocalAndPeer);
  REQUIRE(ca != nullptr);
  REQUIRE(cb != nullptr);
  for (uint64_t step : {1u, 2u}) {
    for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, step, r, 4, 93).ok());
    for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, step, r, 4, 93).ok());
    for (auto* cl : {ca.get(), cb.get()}) {
      absl::Status committed = cl->WaitCommitted(kJob, step, 30000);
      INFO(committed.ToString() << "\nnode a:\n" << a->Log() << "\nnode b:\n" << b->Log());
      REQUIRE(committed.ok());
    }
  }
  const ckptd::v1::ManifestHeader m = ManifestHeaderOf(shared, 2);
  int shared_blobs = 0;
  for (const auto& blob : m.blobs()) {
    INFO("blob " << blob.name());
    if (!blob.has_written_at_step()) continue;
    ++shared_blobs;
    CHECK(blob.written_at_step() == 1);
    CHECK(blob.peers_size() == 1);
  }
  CHECK(shared_blobs >= 2);  // at least one per node
  CHECK(std::filesystem::exists(a->data_dir() + "/" + kJob + "/" + StepDir(2) +
                                "/r00000-s00000000000000000001.blob"));

  // Node b lost; its replacement reads step 2 from the surviving nodes, nothing from the store.
  const std::string b_state = b->state_dir();
  REQUIRE(kill(b->pid(), SIGKILL) == 0);
  b->WaitExit(10000);
  b.reset();
  std::filesystem::remove_all(b_state);
  Daemon b2(DaemonConfig{.extra_flags = flags("node-b")});
  WholeTensor w;
  auto there = b2.Connect()->Load(kJob, 2, 0, w.targets);
  INFO(b2.Log());
  REQUIRE(there.ok());
  CHECK(there->bytes_read_remote == 0);
  CHECK(there->bytes_read_peer == there->bytes_read);
  CHECK(w.got == GlobalBytes(w.t, 93));
  CHECK(VerifyInProcess(b2, kJob, 2, 93) == "");
}
