// The replication path in one process, over real gRPC on loopback with mutual TLS (certificates
// made by tests/integration/peer_certs.sh): a Replicator (node a, its part in a memory store)
// copies to two peer Servers (nodes b and c), registered on a shared memory store, and reads the
// copies back through Clients. It runs under ThreadSanitizer (make test-tsan: unit.peer), so the
// replicator, the peer client's stall watch, the peer server and its store are raced there: copies
// from several threads at once, reads, repair passes and drops meanwhile.
//
// Node b is reached through a TCP fault proxy (tests/integration/tcp_fault_proxy.h) where a case
// needs faults on the link (docs/PEERS.md "Failures between peers"): a link reset mid-copy (the
// copy goes to node c, and the retry completes on b; b keeps nothing of the broken copy), a slow
// link (the copy completes, taking the time the cap implies), and a stalled link (no progress:
// the call is cancelled after the stall timeout, naming peer_stall_timeout_ms, the copy goes to
// node c, and node b's listener frees the stalled put by its keepalive). Every copy read back is
// bit-exact.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/peer.pb.h"
#include "format/names.h"
#include "peer/peer_server.h"
#include "peer/replicator.h"
#include "storage/memory/memory_storage.h"
#include "tcp_fault_proxy.h"

namespace ckptd::peer {
namespace {

using ckptd_it::TcpFaultProxy;
using Clock = std::chrono::steady_clock;

constexpr char kJob[] = "chan";

// The CA and node certificates a, b, c, made once per test process (removed at its exit).
struct CertDir {
  CertDir() {
    const char* tmp = std::getenv("CKPTD_TEST_TMP");
    path = std::string(tmp ? tmp : "/tmp") + "/peer-chan-" + std::to_string(getpid());
    std::filesystem::create_directories(path);
    const std::string sh = std::string("/bin/sh ") + CKPTD_PEER_CERTS_SH + " ";
    REQUIRE(std::system((sh + "ca " + path + " ca").c_str()) == 0);
    for (const char* n : {"node-a", "node-b", "node-c"}) {
      REQUIRE(std::system((sh + "node " + path + " ca " + n).c_str()) == 0);
    }
  }
  ~CertDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

const std::string& Certs() {
  static const CertDir dir;
  return dir.path;
}

TlsFiles TlsOf(const std::string& node) {
  const std::string& c = Certs();
  return TlsFiles{.ca_path = c + "/ca.pem",
                  .cert_path = c + "/" + node + ".pem",
                  .key_path = c + "/" + node + ".key"};
}

void Register(Storage& shared, const std::string& node, const std::string& address) {
  v1::PeerRegistration reg;
  reg.set_node_id(node);
  reg.set_address(address);
  REQUIRE(
      shared.PutAtomic(std::string(kPeerRegistryDir) + "/" + node, reg.SerializeAsString()).ok());
}

std::unique_ptr<Server> StartServer(const std::string& node, uint64_t stall_timeout_ms) {
  absl::StatusOr<std::unique_ptr<Server>> s =
      Server::Start(ServerOptions{.listen_addr = "127.0.0.1:0",
                                  .node_id = node,
                                  .tls = TlsOf(node),
                                  .store = {.bytes_max = 256ull << 20,
                                            .streams_per_node_max = 16,
                                            .inflight_bytes_per_node_max = 1ull << 30,
                                            .connections_per_node_max = 8},
                                  .stall_timeout_ms = stall_timeout_ms},
                    nullptr);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  return *std::move(s);
}

// Node a's local storage: a memory store whose blob readers record the largest read asked of
// them (a copy streams its blob: no read is larger than a chunk).
class LocalStore : public MemoryStorage {
 public:
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<BlobReader>> r = MemoryStorage::OpenBlob(path);
    if (!r.ok()) return r;
    return std::unique_ptr<BlobReader>(new Counted(*std::move(r), &largest_read_));
  }
  uint64_t largest_read() const { return largest_read_.load(); }

 private:
  class Counted : public BlobReader {
   public:
    Counted(std::unique_ptr<BlobReader> r, std::atomic<uint64_t>* largest)
        : r_(std::move(r)), largest_(largest) {}
    absl::Status Read(std::span<const IoSlice> slices) override {
      for (const IoSlice& s : slices) {
        uint64_t seen = largest_->load();
        while (s.len > seen && !largest_->compare_exchange_weak(seen, s.len)) {
        }
      }
      return r_->Read(slices);
    }
    uint64_t size_bytes() const override { return r_->size_bytes(); }

   private:
    std::unique_ptr<BlobReader> r_;
    std::atomic<uint64_t>* largest_;
  };
  std::atomic<uint64_t> largest_read_{0};
};

// Bytes of blob `name` of `step`: a pattern of its own.
std::string BlobBytes(uint64_t step, const std::string& name, size_t size) {
  std::string b(size, '\0');
  uint32_t x = static_cast<uint32_t>(step * 7919 + name.size() * 31 + name.back());
  for (char& c : b) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return b;
}

// Node a with its part's blobs in local memory, nodes b and c listening; b through a proxy when
// asked. Each step's part is two blobs of `blob_bytes`.
struct Rig {
  explicit Rig(bool proxy_b, uint64_t stall_timeout_ms = 30'000, size_t blob_bytes = 1536 * 1024)
      : blob_bytes(blob_bytes) {
    b = StartServer("node-b", stall_timeout_ms);
    c = StartServer("node-c", stall_timeout_ms);
    if (proxy_b) proxy = std::make_unique<TcpFaultProxy>(b->port());
    Register(shared, "node-a", "127.0.0.1:1");  // never dialled: no node copies to itself
    Register(shared, "node-b", proxy ? proxy->address() : absl::StrCat("127.0.0.1:", b->port()));
    Register(shared, "node-c", absl::StrCat("127.0.0.1:", c->port()));
    absl::StatusOr<std::unique_ptr<Replicator>> r =
        Replicator::Start(ReplicatorOptions{.node_id = "node-a",
                                            .advertise_addr = "127.0.0.1:1",
                                            .tls = TlsOf("node-a"),
                                            .stall_timeout = absl::Milliseconds(stall_timeout_ms)},
                          &local, &shared);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    a = *std::move(r);
  }
  ~Rig() {
    a.reset();
    proxy.reset();  // its connections reset: the servers' calls on them end
    b->Stop(200);
    c->Stop(200);
  }
  // The part's blobs (name, size).
  std::vector<std::pair<std::string, uint64_t>> Blobs() const {
    return {{"r00000.blob", blob_bytes}, {"r00001.blob", blob_bytes}};
  }
  // Writes the blobs of steps [1, steps] to node a's local storage (from the test's thread).
  void WriteParts(uint64_t steps) {
    for (uint64_t step = 1; step <= steps; ++step) {
      for (const auto& [name, size] : Blobs()) {
        const std::string bytes = BlobBytes(step, name, size);
        auto w = local.CreateBlob(absl::StrCat(CheckpointDir(kJob, step), "/", name));
        REQUIRE(w.ok());
        const IoSlice s{const_cast<char*>(bytes.data()), bytes.size(), 0};
        REQUIRE((*w)->Write({&s, 1}).ok());
        REQUIRE((*w)->Sync().ok());
      }
    }
  }
  absl::StatusOr<std::vector<std::string>> Replicate(uint64_t step, uint32_t replicas) {
    return a->Replicate(kJob, step, CheckpointDir(kJob, step), Blobs(), replicas);
  }
  // "" when `node` serves both blobs of `step` bit-exact (its copies, read over the channel).
  std::string ReadBack(const std::string& node, uint64_t step) {
    absl::StatusOr<std::shared_ptr<Client>> cl = a->ClientFor(node);
    if (!cl.ok()) return cl.status().ToString();
    for (const char* name : {"r00000.blob", "r00001.blob"}) {
      std::string got(blob_bytes, '\0');
      absl::Status st = (*cl)->GetBlob("node-a", kJob, step, name, 0, {got.data(), got.size()});
      if (!st.ok()) return st.ToString();
      if (got != BlobBytes(step, name, blob_bytes)) {
        return absl::StrCat(node, " served other bytes for ", name, " of step ", step);
      }
    }
    return "";
  }
  // Waits until `server` has no put in flight (its reservations are freed).
  static bool WaitNoPutInFlight(Server& server, std::chrono::milliseconds patience) {
    const auto until = Clock::now() + patience;
    while (server.store().usage().bytes_reserved > 0 && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return server.store().usage().bytes_reserved == 0;
  }

  const size_t blob_bytes;
  LocalStore local;
  MemoryStorage shared;
  std::unique_ptr<Server> b;
  std::unique_ptr<Server> c;
  std::unique_ptr<TcpFaultProxy> proxy;
  std::unique_ptr<Replicator> a;
};

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("peer channel: copies from several threads, reads, repair and drops race cleanly",
          "[unit][peer]") {
  Rig rig(/*proxy_b=*/false, 30'000, 256 * 1024);
  constexpr uint64_t kSteps = 6;
  rig.WriteParts(kSteps);
  REQUIRE(rig.Replicate(1, 2).ok());
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kSteps + 1);
  for (uint64_t step = 2; step <= kSteps; ++step) {
    threads.emplace_back([&rig, &errors, step] {
      absl::StatusOr<std::vector<std::string>> took = rig.Replicate(step, 2);
      if (!took.ok() || took->size() != 2) {
        errors[step] = absl::StrCat("step ", step, ": ", took.status().ToString(), " ",
                                    took.ok() ? took->size() : 0, " copies");
      }
    });
  }
  // Meanwhile: repair passes over step 1's watched part, step 1 copied again (deduplicated) and
  // read back.
  threads.emplace_back([&rig] {
    rig.a->Watch(PeerTier::Part{.job = kJob,
                                .step = 1,
                                .dir = CheckpointDir(kJob, 1),
                                .blobs = rig.Blobs(),
                                .replicas = 2,
                                .holders = {"node-b", "node-c"}});
    for (int i = 0; i < 3; ++i) rig.a->RepairPass();
  });
  threads.emplace_back([&rig, &errors] {
    absl::StatusOr<std::vector<std::string>> took = rig.Replicate(1, 2);
    if (!took.ok() || took->size() != 2) errors[0] = "step 1 again: " + took.status().ToString();
  });
  threads.emplace_back([&rig, &errors] {
    for (int i = 0; i < 3 && errors[1].empty(); ++i) errors[1] = rig.ReadBack("node-c", 1);
  });
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) CHECK(e.empty());
  for (uint64_t step = 1; step <= kSteps; ++step) {
    CHECK(rig.ReadBack("node-b", step) == "");
    CHECK(rig.ReadBack("node-c", step) == "");
  }
  // Reads of one step while its copies are dropped: each read is whole or NOT_FOUND.
  std::thread reader([&rig] {
    for (int i = 0; i < 4; ++i) {
      const std::string r = rig.ReadBack("node-b", 2);
      CHECK((r.empty() || r.find("NOT_FOUND") != std::string::npos));
    }
  });
  rig.a->Drop(kJob, 2, {"node-b", "node-c"});
  reader.join();
  CHECK(rig.b->store().Held("node-a", kJob, 2).empty());
  CHECK(rig.c->store().Held("node-a", kJob, 2).empty());
  // A holder that lost a watched part gets it again from a repair pass.
  rig.c->store().Drop("node-a", kJob, 1);
  rig.a->RepairPass();
  CHECK(rig.c->store().Held("node-a", kJob, 1).size() == 2);
  std::optional<PeerTier::Copies> copies = rig.a->CopiesOf(kJob, 1);
  REQUIRE(copies.has_value());
  CHECK(copies->degraded.empty());
}

TEST_CASE(
    "peer channel: a link reset mid-copy - the copy goes to the next node, the retry completes",
    "[unit][peer][fault]") {
  Rig rig(/*proxy_b=*/true);
  rig.WriteParts(2);
  rig.proxy->ResetAfter(512 * 1024);  // mid-way through the first blob
  absl::StatusOr<std::vector<std::string>> took = rig.Replicate(1, 1);
  REQUIRE(took.ok());
  CHECK(*took == std::vector<std::string>{"node-c"});
  CHECK(rig.proxy->resets() >= 1);
  // Node b keeps nothing of the broken copy, and frees its reservation.
  CHECK(Rig::WaitNoPutInFlight(*rig.b, std::chrono::seconds(10)));
  CHECK(rig.b->store().Held("node-a", kJob, 1).empty());
  CHECK(rig.ReadBack("node-c", 1) == "");
  // Two copies asked: the reset leaves one (degraded); the retry, as the cluster thread makes at
  // its next poll, places the second on node b (c deduplicates).
  rig.proxy->ResetAfter(256 * 1024);
  took = rig.Replicate(2, 2);
  REQUIRE(took.ok());
  CHECK(*took == std::vector<std::string>{"node-c"});
  const std::vector<std::string> both = {"node-b", "node-c"};
  const auto until = Clock::now() + std::chrono::seconds(10);
  do {  // at each poll, as the cluster thread would: the channel may first back off the reset
    took = rig.Replicate(2, 2);
    REQUIRE(took.ok());
    if (*took == both) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (Clock::now() < until);
  CHECK(*took == both);
  CHECK(rig.ReadBack("node-b", 2) == "");
  CHECK(rig.ReadBack("node-c", 2) == "");
}

TEST_CASE("peer channel: a slow link - the copy completes, at the link's pace",
          "[unit][peer][fault]") {
  Rig rig(/*proxy_b=*/true, /*stall_timeout_ms=*/5000, /*blob_bytes=*/1024 * 1024);
  rig.WriteParts(1);
  rig.proxy->SetBandwidth(2 << 20);  // 2 MiB/s: the part's 2 MiB take about a second
  rig.proxy->SetDelay(std::chrono::milliseconds(1));
  const auto t0 = Clock::now();
  absl::StatusOr<std::vector<std::string>> took = rig.Replicate(1, 1);
  const double s = SecondsSince(t0);
  REQUIRE(took.ok());
  CHECK(*took == std::vector<std::string>{"node-b"});
  CHECK(s >= 0.7);  // the cap held
  INFO("2 MiB over a 2 MiB/s link in " << s << " s");
  CHECK(rig.ReadBack("node-b", 1) == "");
}

TEST_CASE("peer channel: a stalled link - the call is abandoned after peer_stall_timeout_ms",
          "[unit][peer][fault]") {
  Rig rig(/*proxy_b=*/true, /*stall_timeout_ms=*/800);
  rig.WriteParts(2);
  rig.proxy->StallAfter(300 * 1024);
  auto t0 = Clock::now();
  absl::StatusOr<std::vector<std::string>> took = rig.Replicate(1, 1);
  double s = SecondsSince(t0);
  REQUIRE(took.ok());
  CHECK(*took == std::vector<std::string>{"node-c"});
  CHECK(s < 5.0);  // one stall timeout, then node c; not the 10 minutes of kPeerCallTimeoutMs
  CHECK(rig.ReadBack("node-c", 1) == "");
  // The stalled put on node b is freed by its listener's keepalive, the link still stalled.
  CHECK(Rig::WaitNoPutInFlight(*rig.b, std::chrono::seconds(10)));
  CHECK(rig.b->store().Held("node-a", kJob, 1).empty());

  // A call on a stalled link names the option; so does a read.
  absl::StatusOr<std::shared_ptr<Client>> cl = rig.a->ClientFor("node-b");
  REQUIRE(cl.ok());
  std::string data(64 * 1024, 'x');
  t0 = Clock::now();
  absl::StatusOr<PutResult> put =
      (*cl)->PutBlob(kJob, 5, "r00000.blob", {data.data(), data.size()}, 4096);
  s = SecondsSince(t0);
  INFO(put.status().ToString());
  CHECK(put.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(put.status().message()).find("peer_stall_timeout_ms") != std::string::npos);
  CHECK(s < 4.0);
  std::string got(4096, '\0');
  absl::Status read = (*cl)->GetBlob("node-a", kJob, 1, "r00000.blob", 0, {got.data(), got.size()});
  CHECK(read.code() == absl::StatusCode::kDeadlineExceeded);

  // The link back: its stuck connections reset, a new connection carries the next copy (retried
  // as the cluster thread would, at each poll: the channel may first back off the reset).
  rig.proxy->Stall(false);
  rig.proxy->ResetAll();
  const auto until = Clock::now() + std::chrono::seconds(10);
  do {
    took = rig.Replicate(2, 1);
    REQUIRE(took.ok());
    if (*took == std::vector<std::string>{"node-b"}) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (Clock::now() < until);
  CHECK(*took == std::vector<std::string>{"node-b"});
  CHECK(rig.ReadBack("node-b", 2) == "");
}

}  // namespace ckptd::peer

namespace ckptd::peer {

TEST_CASE("peer channel: a copy streams its blob - memory for one chunk, whatever its size",
          "[unit][peer]") {
  Rig rig(/*proxy_b=*/false, 30'000, /*blob_bytes=*/5 * limits::kPeerChunkBytes + 12345);
  rig.WriteParts(1);
  absl::StatusOr<std::vector<std::string>> took = rig.Replicate(1, 2);
  REQUIRE(took.ok());
  CHECK(took->size() == 2);
  CHECK(rig.local.largest_read() <= limits::kPeerChunkBytes);
  CHECK(rig.ReadBack("node-b", 1) == "");
  CHECK(rig.ReadBack("node-c", 1) == "");
}

}  // namespace ckptd::peer
