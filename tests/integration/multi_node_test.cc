// Checkpoints that span nodes (docs/OPERATIONS.md "Checkpoints that span nodes"), against real
// daemons: each daemon stands for one node (its own state dir, socket and arena) and the shared
// tier is a directory (the posix plugin on a shared file system) or, in remote_s3_test.cc, a real
// S3 store. 4 ranks saved over two daemons commit once, only when both nodes' parts are on the
// shared tier; every daemon learns COMMITTED from the store; a third daemon with an empty state dir
// loads the checkpoint in another layout from the store alone. A node killed before its part is
// durable holds the commit back until it restarts; the coordinator's stage timeout and Abort
// abort every node; what the other nodes may not do (abort, commit partial) is refused. A late
// node holding only the highest rank holds the commit back until its part is there.
#include "multi_node.h"

#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

namespace {

constexpr char kJob[] = "span-job";

std::vector<std::string> NodeFlags(const std::string& shared, const std::string& node,
                                   std::vector<std::string> more = {}) {
  std::vector<std::string> f = {"--remote_dir=" + shared, "--tier_policy=local+remote",
                                "--node_id=" + node, "--cluster_poll_ms=50",
                                "--upload_retry_max_ms=1000"};
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

// The directory standing for the shared file system.
std::string SharedDir(const TempDir& dir) {
  std::filesystem::create_directories(dir.path() + "/shared");
  return dir.path() + "/shared";
}

std::string ManifestOnShared(const std::string& shared, uint64_t step) {
  return shared + "/" + kJob + "/" + StepDir(step) + "/manifest.ckm";
}

// Two daemons standing for two nodes on one shared directory.
struct TwoNodes {
  TempDir dir;
  std::string shared = SharedDir(dir);
  Daemon a{DaemonConfig{.extra_flags = NodeFlags(shared, "node-a")}};
  Daemon b{DaemonConfig{.extra_flags = NodeFlags(shared, "node-b")}};
};

}  // namespace

TEST_CASE("spanning nodes: 4 ranks over two daemons commit once both parts are on the shared tier",
          "[integration][multinode]") {
  TwoNodes nodes;
  const std::string& shared = nodes.shared;
  Daemon& a = nodes.a;
  Daemon& b = nodes.b;
  auto ca = ConnectNode(a, 2);
  auto cb = ConnectNode(b, 2);

  // Node a's ranks alone: persisted and published, but not committed.
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 71).ok());
  auto waiting = WaitForWaiting(*ca, kJob, 1, "ranks [2, 3]", 20000);
  INFO(a.Log());
  REQUIRE(waiting.ok());
  CHECK(waiting->state == ckptd::CheckpointState::kPersisting);
  CHECK(waiting->local_world_size == 2);
  CHECK(waiting->missing_ranks == std::vector<uint32_t>{2, 3});
  REQUIRE(waiting->nodes.size() >= 1);
  CHECK(waiting->nodes[0].node == "node-a");
  CHECK(waiting->nodes[0].coordinator);
  CHECK(waiting->nodes[0].part_durable);
  CHECK(std::filesystem::exists(shared + "/" + kJob + "/" + StepDir(1) + "/cluster/node-a.part"));
  CHECK_FALSE(std::filesystem::exists(ManifestOnShared(shared, 1)));
  CommandResult st = RunCtl(a, {"status", kJob, "1"});
  CHECK(st.output.find("node-a") != std::string::npos);
  CHECK(st.output.find("coordinator") != std::string::npos);
  CHECK(st.output.find("ranks [2, 3]") != std::string::npos);

  // Node b's ranks: the coordinator merges both parts and commits; b learns it from the store.
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 71).ok());
  for (auto* c : {ca.get(), cb.get()}) {
    absl::Status committed = c->WaitCommitted(kJob, 1, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << a.Log() << "\nnode b:\n" << b.Log());
    REQUIRE(committed.ok());
    auto done = c->GetStatus(kJob, 1);
    REQUIRE(done.ok());
    CHECK(done->state == ckptd::CheckpointState::kCommitted);
    CHECK(done->tiers.remote);
    CHECK_FALSE(done->tiers.local);  // each node holds only its own blobs: read from the store
  }
  CHECK(std::filesystem::exists(ManifestOnShared(shared, 1)));
  // The local copies (a node's own blobs) go right after the COMMITTED row.
  for (const Daemon* d : {&a, &b}) {
    const std::string local = d->data_dir() + "/" + kJob + "/" + StepDir(1);
    for (int i = 0; i < 100 && std::filesystem::exists(local); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK_FALSE(std::filesystem::exists(local));
  }
  CHECK(VerifyInProcess(a, kJob, 1, 71) == "");
  CHECK(VerifyInProcess(b, kJob, 1, 71) == "");

  // A third node with an empty state dir loads it from the store alone, in another layout.
  Daemon c(DaemonConfig{.extra_flags = {"--remote_dir=" + shared, "--node_id=node-c"}});
  CHECK(VerifyInProcess(c, kJob, 1, 71) == "");
  CHECK(CheckPartialLoadFromStore(c, kJob, 1, 71) == "");
}

// Issue 33 §5: every other spanning-nodes test puts ranks 2 and 3 on the late node, so a merge
// accepting parts one rank short (the highest) was never tried. Node a holds ranks 0..2, the late
// node b only rank 3: nothing commits (and no manifest is written) until b's part is there.
TEST_CASE("spanning nodes: a late node holding only the highest rank holds the commit back",
          "[integration][multinode]") {
  TwoNodes nodes;
  auto ca = ConnectNode(nodes.a, 3);
  auto cb = ConnectNode(nodes.b, 1);
  REQUIRE(ca != nullptr);
  REQUIRE(cb != nullptr);
  for (uint32_t r : {0u, 1u, 2u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 91).ok());
  auto waiting = WaitForWaiting(*ca, kJob, 1, "ranks [3]", 20000);
  INFO(nodes.a.Log());
  REQUIRE(waiting.ok());
  CHECK(waiting->state == ckptd::CheckpointState::kPersisting);
  CHECK(waiting->missing_ranks == std::vector<uint32_t>{3});
  // Several merge attempts (cluster_poll_ms=50) later, still not committed.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto still = ca->GetStatus(kJob, 1);
  REQUIRE(still.ok());
  CHECK(still->state == ckptd::CheckpointState::kPersisting);
  CHECK_FALSE(std::filesystem::exists(ManifestOnShared(nodes.shared, 1)));
  REQUIRE(SaveRank(*cb, kJob, 1, 3, 4, 91).ok());
  for (auto* c : {ca.get(), cb.get()}) {
    absl::Status committed = c->WaitCommitted(kJob, 1, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << nodes.a.Log() << "\nnode b:\n" << nodes.b.Log());
    REQUIRE(committed.ok());
  }
  CHECK(VerifyInProcess(nodes.a, kJob, 1, 91) == "");
  CHECK(VerifyInProcess(nodes.b, kJob, 1, 91) == "");
}

TEST_CASE(
    "store catalog: a daemon that runs already learns of the checkpoints other nodes commit "
    "when a client asks about their job",
    "[integration][multinode]") {
  TwoNodes nodes;
  // Node c runs from before the job's first checkpoint (a spare node): nothing to adopt at start.
  Daemon c(DaemonConfig{.extra_flags = {"--remote_dir=" + nodes.shared, "--node_id=node-c"}});
  auto cc = c.Connect();
  CHECK(absl::IsNotFound(cc->Latest(kJob).status()));
  auto ca = ConnectNode(nodes.a, 2);
  auto cb = ConnectNode(nodes.b, 2);
  auto save_over_a_and_b = [&](uint64_t step, uint64_t seed) {
    for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, step, r, 4, seed).ok());
    for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, step, r, 4, seed).ok());
    REQUIRE(ca->WaitCommitted(kJob, step, 30000).ok());
    // Past the interval within which a job scanned once is not scanned again
    // (limits::kDiscoveryMinIntervalMs).
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };

  save_over_a_and_b(1, 81);
  // "latest" on c: the step a and b committed, adopted from the store when asked.
  auto latest = cc->Latest(kJob);
  INFO(latest.status().ToString() << "\n" << c.Log());
  REQUIRE(latest.ok());
  CHECK(*latest == 1);
  auto listed = cc->ListCheckpoints(kJob);
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK(listed->front().state == ckptd::CheckpointState::kCommitted);
  CHECK(listed->front().tiers.remote);
  CHECK_FALSE(listed->front().tiers.local);
  CHECK(c.Log().find("adopted checkpoint " + std::string(kJob) + "/1") != std::string::npos);

  // A newer one: a Load of "latest" on c loads it (not the step c knew), bit-exact, from the
  // store alone.
  save_over_a_and_b(2, 82);
  const TensorItem& t = StateDict().front();
  std::vector<uint8_t> got(ElementCount(t.shape) * ckptd::DTypeSize(t.dtype));
  std::vector<ckptd::LoadTarget> targets = {
      {t.name, ckptd::Region::Box(std::vector<uint64_t>(t.shape.size(), 0), t.shape), got.data(),
       got.size()}};
  auto loaded = cc->Load(kJob, std::nullopt, 0, targets);
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 2);
  CHECK(loaded->bytes_read_remote == loaded->bytes_read);
  CHECK(got == GlobalBytes(t, 82));

  // A step asked for by number that c has no row of is looked for even within the interval:
  // Status and a load of it on c.
  save_over_a_and_b(3, 83);
  auto st = cc->GetStatus(kJob, 3);
  REQUIRE(st.ok());
  CHECK(st->state == ckptd::CheckpointState::kCommitted);
  CHECK(VerifyInProcess(c, kJob, 3, 83) == "");
  // ckptctl on c lists the job (ListJobs scans every job of the store).
  CommandResult ls = RunCtl(c, {"ls"});
  CHECK(ls.output.find(kJob) != std::string::npos);
  // A step nobody committed is still NOT_FOUND (after a scan found nothing).
  CHECK(absl::IsNotFound(cc->GetStatus(kJob, 99).status()));
}

TEST_CASE(
    "spanning nodes: a node killed before its part is durable holds the commit back until "
    "it restarts",
    "[integration][multinode][crash]") {
  TempDir dir;
  const std::string shared = SharedDir(dir);
  Daemon a(DaemonConfig{.extra_flags = NodeFlags(shared, "node-a")});
  // Node b flushes slowly: it is killed with its ranks staged (journaled, in its arena) and no
  // part on the store.
  Daemon b(
      DaemonConfig{.extra_flags = NodeFlags(shared, "node-b", {"--debug_flush_delay_ms=60000"})});
  auto ca = ConnectNode(a, 2);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 2, r, 4, 72).ok());
  {
    auto cb = ConnectNode(b, 2);
    for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 2, r, 4, 72).ok());
  }
  b.Kill9();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  auto held = ca->GetStatus(kJob, 2);
  REQUIRE(held.ok());
  CHECK(held->state == ckptd::CheckpointState::kPersisting);
  CHECK(held->missing_ranks == std::vector<uint32_t>{2, 3});
  CHECK_FALSE(std::filesystem::exists(ManifestOnShared(shared, 2)));

  // Restarted (no delay), b resumes its ranks from the arena, publishes, and a commits.
  b.Restart(NodeFlags(shared, "node-b"));
  absl::Status done = ca->WaitCommitted(kJob, 2, 30000);
  INFO(done.ToString() << "\nnode a:\n" << a.Log() << "\nnode b:\n" << b.Log());
  REQUIRE(done.ok());
  auto cb = ConnectNode(b, 2);
  REQUIRE(cb->WaitCommitted(kJob, 2, 30000).ok());
  CHECK(VerifyInProcess(b, kJob, 2, 72) == "");
}

TEST_CASE(
    "spanning nodes: the coordinator's stage timeout and Abort abort every node, the other "
    "nodes may not decide",
    "[integration][multinode][abort]") {
  TempDir dir;
  const std::string shared = SharedDir(dir);
  Daemon a(DaemonConfig{.extra_flags = NodeFlags(shared, "node-a", {"--stage_timeout_ms=3000"})});
  Daemon b(DaemonConfig{.extra_flags = NodeFlags(shared, "node-b")});
  auto ca = ConnectNode(a, 2);
  auto cb = ConnectNode(b, 2);

  SECTION("stage timeout: a node's part never comes") {
    for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 3, r, 4, 73).ok());
    REQUIRE(SaveRank(*cb, kJob, 3, 2, 4, 73).ok());  // rank 3 never saves
    // The other node may neither abort nor commit partial: only the coordinator decides.
    auto refused = cb->Abort(kJob, 3, "from b");
    CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(refused.status().message().find("coordinator") != std::string_view::npos);
    auto partial = cb->Commit(kJob, 3, /*partial=*/true);
    CHECK(partial.status().code() == absl::StatusCode::kFailedPrecondition);
    absl::Status gone = ca->WaitCommitted(kJob, 3, 20000);
    INFO(gone.ToString() << "\n" << a.Log());
    REQUIRE_FALSE(gone.ok());
    auto st = ca->GetStatus(kJob, 3);
    REQUIRE(st.ok());
    CHECK(st->state == ckptd::CheckpointState::kAborted);
    CHECK(st->error.find("stage timeout") != std::string::npos);
    CHECK(st->error.find("[2, 3]") != std::string::npos);
  }
  SECTION(
      "Abort on the coordinator, both nodes' parts published but one rank short: every node "
      "aborts") {
    for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 4, r, 4, 74).ok());
    REQUIRE(WaitForWaiting(*ca, kJob, 4, "ranks [2, 3]", 20000).ok());
    for (uint32_t r : {2u}) REQUIRE(SaveRank(*cb, kJob, 4, r, 4, 74).ok());
    auto aborted = ca->Abort(kJob, 4, "operator said so");
    INFO(aborted.status().ToString() << "\n" << a.Log());
    REQUIRE(aborted.ok());
    // b sees the decision on the store.
    ckptd::CheckpointState state = ckptd::CheckpointState::kUnspecified;
    std::string error;
    for (int i = 0; i < 200 && state != ckptd::CheckpointState::kAborted; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      auto st = cb->GetStatus(kJob, 4);
      if (st.ok()) {
        state = st->state;
        error = st->error;
      }
    }
    INFO(b.Log());
    CHECK(state == ckptd::CheckpointState::kAborted);
    CHECK(error.find("aborted by the coordinator (node node-a)") != std::string::npos);
    CHECK(error.find("operator said so") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(ManifestOnShared(shared, 4)));
  }
}

TEST_CASE("spanning nodes: a partial commit on the coordinator commits the parts there are",
          "[integration][multinode]") {
  TwoNodes nodes;
  Daemon& a = nodes.a;
  Daemon& b = nodes.b;
  auto ca = ConnectNode(a, 2);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 8, r, 4, 78).ok());
  REQUIRE(WaitForWaiting(*ca, kJob, 8, "ranks [2, 3]", 20000).ok());
  auto partial = ca->Commit(kJob, 8, /*partial=*/true);
  INFO(partial.status().ToString() << "\n" << a.Log());
  REQUIRE(partial.ok());
  REQUIRE(ca->WaitCommitted(kJob, 8, 30000).ok());
  auto st = ca->GetStatus(kJob, 8);
  REQUIRE(st.ok());
  CHECK(st->partial);
  // Node b's ranks come after the decision: it publishes, reads the commit, and records it too
  // (its ranks are not in the manifest; their journal rows go).
  auto cb = ConnectNode(b, 2);
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 8, r, 4, 78).ok());
  absl::Status committed = cb->WaitCommitted(kJob, 8, 30000);
  INFO(committed.ToString() << "\n" << b.Log());
  REQUIRE(committed.ok());
  auto sb = cb->GetStatus(kJob, 8);
  REQUIRE(sb.ok());
  CHECK(sb->partial);
  CHECK(RunCtl(b, {"inspect", kJob, "8"}).exit_code == 0);
}

TEST_CASE("spanning nodes: bad configurations are refused naming what is wrong",
          "[integration][multinode]") {
  TempDir dir;
  const std::string shared = SharedDir(dir);
  SECTION("no shared tier: the local policy") {
    Daemon a;
    ckptd::ClientOptions o;
    o.socket_path = a.socket();
    o.local_world_size = 2;
    auto c = ckptd::Client::Connect(o);
    REQUIRE(c.ok());
    auto saved = SaveRank(**c, kJob, 5, 0, 4, 75);
    CHECK(saved.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(saved.status().message().find("spans nodes") != std::string_view::npos);
    CHECK(saved.status().message().find("local+remote") != std::string_view::npos);
  }
  SECTION("local_world_size above world_size") {
    Daemon a(DaemonConfig{.extra_flags = NodeFlags(shared, "node-a")});
    auto c = ConnectNode(a, 8);
    auto saved = SaveRank(*c, kJob, 5, 0, 4, 75);
    CHECK(saved.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(saved.status().message().find("local_world_size 8 is above world_size 4") !=
          std::string_view::npos);
  }
  SECTION("two daemons with one node_id: the second's part is refused, naming it") {
    Daemon a(DaemonConfig{.extra_flags = NodeFlags(shared, "node-a")});
    Daemon b(DaemonConfig{.extra_flags = NodeFlags(shared, "node-a")});
    auto ca = ConnectNode(a, 2);
    auto cb = ConnectNode(b, 2);
    for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 6, r, 4, 76).ok());
    REQUIRE(WaitForWaiting(*ca, kJob, 6, "ranks [2, 3]", 20000).ok());
    for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 6, r, 4, 76).ok());
    auto refused = WaitForWaiting(*cb, kJob, 6, "node_id", 20000);
    INFO(b.Log());
    REQUIRE(refused.ok());
    CHECK(refused->waiting_for.find("another daemon of this job has node_id \"node-a\"") !=
          std::string::npos);
  }
  SECTION("a node_id that cannot name a file") {
    CommandResult r = RunCommand(
        {CKPTD_BIN, "--state_dir=" + dir.path() + "/s", "--node_id=a/b", "--remote_dir=" + shared});
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("option node_id = \"a/b\"") != std::string::npos);
  }
}

// A shared file system without RENAME_NOREPLACE: the node parts and the decision go through the
// link(2) fallback (forced by remote_dir_link_fallback on any file system), and the checkpoint
// commits exactly as with renameat2 — rank 3 alone on the late node.
TEST_CASE("spanning nodes: a shared file system without RENAME_NOREPLACE commits by link()",
          "[integration][multinode]") {
  TempDir dir;
  const std::string shared = SharedDir(dir);
  const std::vector<std::string> fallback = {"--remote_dir_link_fallback=true"};
  Daemon a(DaemonConfig{.extra_flags = NodeFlags(shared, "node-a", fallback)});
  Daemon b(DaemonConfig{.extra_flags = NodeFlags(shared, "node-b", fallback)});
  CHECK(a.Log().find("link() fallback") != std::string::npos);
  auto ca = ConnectNode(a, 3);
  auto cb = ConnectNode(b, 1);
  REQUIRE((ca && cb));
  for (uint32_t r : {0u, 1u, 2u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 73).ok());
  REQUIRE(WaitForWaiting(*ca, kJob, 1, "ranks [3]", 20000).ok());
  REQUIRE(SaveRank(*cb, kJob, 1, 3, 4, 73).ok());
  for (auto* c : {ca.get(), cb.get()}) {
    absl::Status committed = c->WaitCommitted(kJob, 1, 30000);
    INFO(committed.ToString() << "\nnode a:\n" << a.Log() << "\nnode b:\n" << b.Log());
    REQUIRE(committed.ok());
  }
  const std::string cluster = shared + "/" + kJob + "/" + StepDir(1) + "/cluster";
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(cluster)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"decision", "node-a.part", "node-b.part"});  // no temps
  CHECK(std::filesystem::hard_link_count(cluster + "/decision") == 1);
  CHECK(std::filesystem::exists(ManifestOnShared(shared, 1)));
  CHECK(VerifyInProcess(a, kJob, 1, 73) == "");
  CHECK(VerifyInProcess(b, kJob, 1, 73) == "");
}

// Issue 33 §3: SIGTERM abandoned a node part's publication in flight. Node b's copies to the
// shared tier are slowed (--debug_upload_delay_ms on every 4 KiB chunk) and SIGTERM arrives
// before its part is published: b drains the publication within shutdown_grace_s and exits 0,
// and the coordinator, finding b's part, commits a checkpoint that loads bit-exact.
TEST_CASE("spanning nodes: SIGTERM during a node part's publication drains it",
          "[integration][multinode]") {
  TempDir dir;
  const std::string shared = SharedDir(dir);
  Daemon a{DaemonConfig{.extra_flags = NodeFlags(shared, "node-a")}};
  Daemon b{DaemonConfig{
      .extra_flags = NodeFlags(
          shared, "node-b",
          {"--debug_upload_delay_ms=100", "--upload_chunk_bytes=4096", "--shutdown_grace_s=60"})}};
  auto ca = ConnectNode(a, 2);
  auto cb = ConnectNode(b, 2);
  REQUIRE(ca != nullptr);
  REQUIRE(cb != nullptr);
  for (uint32_t r : {0u, 1u}) REQUIRE(SaveRank(*ca, kJob, 1, r, 4, 61).ok());
  for (uint32_t r : {2u, 3u}) REQUIRE(SaveRank(*cb, kJob, 1, r, 4, 61).ok());
  const std::string part = shared + "/" + kJob + "/" + StepDir(1) + "/cluster/node-b.part";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // b's copy under way
  REQUIRE_FALSE(std::filesystem::exists(part));
  REQUIRE(kill(b.pid(), SIGTERM) == 0);
  const int rc = b.WaitExit(60000);
  INFO("node b:\n" << b.Log());
  CHECK(rc == 0);
  CHECK(std::filesystem::exists(part));
  CHECK(b.Log().find("shutdown: draining") != std::string::npos);
  absl::Status committed = ca->WaitCommitted(kJob, 1, 30000);
  INFO(committed.ToString() << "\nnode a:\n" << a.Log());
  REQUIRE(committed.ok());
  CHECK(VerifyInProcess(a, kJob, 1, 61) == "");
}
