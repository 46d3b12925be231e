// The peer registry's cost on the store (peer/replicator.h): a refresh is one listing of the
// registry, and a node's registration is read only when this daemon talks to that node (its
// address, cached for kRegistryRefresh) — not a read of every registration on every refresh,
// which over N nodes is N^2 requests to the store (bench/placement_sim_bench.cc). A registration
// that is missing or not one of its node is UNAVAILABLE naming the node and the file.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ckptd/v1/peer.pb.h"
#include "format/names.h"
#include "peer/replicator.h"
#include "storage/memory/memory_storage.h"

namespace ckptd::peer {
namespace {

// A memory store that counts the requests a refresh makes.
class CountingStorage : public MemoryStorage {
 public:
  absl::StatusOr<std::string> Get(const std::string& path) override {
    ++gets;
    return MemoryStorage::Get(path);
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    ++lists;
    return MemoryStorage::List(dir);
  }
  int gets = 0;
  int lists = 0;
};

void Register(Storage& store, const std::string& node, const std::string& address,
              const std::string& domain = "") {
  v1::PeerRegistration reg;
  reg.set_node_id(node);
  reg.set_address(address);
  reg.set_failure_domain(domain);
  REQUIRE(
      store.PutAtomic(std::string(kPeerRegistryDir) + "/" + node, reg.SerializeAsString()).ok());
}

// A self-signed certificate of `node` (its own CA) made with the openssl command, for a
// replicator whose ClientFor must load TLS files (it sets up a channel; nothing is sent). The
// files are removed with it.
struct SelfSignedTls {
  explicit SelfSignedTls(const std::string& node) {
    char tmpl[] = "/tmp/ckptd-registry-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    const std::string cmd =
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
        "-nodes -days 30 -keyout " +
        dir + "/key.pem -out " + dir + "/cert.pem -subj /CN=" + node +
        " -addext subjectAltName=DNS:" + node + " 2>/dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    files = TlsFiles{
        .ca_path = dir + "/cert.pem", .cert_path = dir + "/cert.pem", .key_path = dir + "/key.pem"};
  }
  ~SelfSignedTls() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
  TlsFiles files;
};

}  // namespace

TEST_CASE("peer registry: a refresh lists the registry and reads only the nodes talked to",
          "[unit][peer]") {
  MemoryStorage local;
  CountingStorage shared;
  for (int i = 0; i < 200; ++i) {
    Register(shared, "node-" + std::to_string(1000 + i), "127.0.0.1:" + std::to_string(20000 + i));
  }
  ReplicatorOptions o;
  o.node_id = "node-0999";
  o.advertise_addr = "127.0.0.1:19999";
  auto r = Replicator::Start(o, &local, &shared);
  REQUIRE(r.ok());
  shared.gets = shared.lists = 0;

  auto ids = (*r)->Registry(/*fresh=*/true);
  REQUIRE(ids.ok());
  CHECK(ids->size() == 201);  // this node registered itself at Start
  CHECK(std::is_sorted(ids->begin(), ids->end()));
  CHECK(shared.lists == 1);
  CHECK(shared.gets == 0);  // no registration read for a refresh
  REQUIRE((*r)->Registry().ok());
  CHECK(shared.lists == 1);  // cached

  auto address = (*r)->AddressOf("node-1007");
  REQUIRE(address.ok());
  CHECK(*address == "127.0.0.1:20007");
  CHECK(shared.gets == 1);
  REQUIRE((*r)->AddressOf("node-1007").ok());
  CHECK(shared.gets == 1);  // cached for kRegistryRefresh

  // Not registered, and a registration that names another node: UNAVAILABLE, naming it.
  auto missing = (*r)->AddressOf("node-7777");
  CHECK(absl::IsUnavailable(missing.status()));
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("node-7777") && Catch::Contains("not registered"));
  Register(shared, "node-liar", "127.0.0.1:1");
  v1::PeerRegistration other;
  other.set_node_id("node-1000");
  other.set_address("127.0.0.1:2");
  REQUIRE(shared.PutAtomic(std::string(kPeerRegistryDir) + "/node-liar", other.SerializeAsString())
              .ok());
  auto liar = (*r)->AddressOf("node-liar");
  CHECK(absl::IsUnavailable(liar.status()));
  CHECK_THAT(std::string(liar.status().message()),
             Catch::Contains("node-liar") && Catch::Contains("not a peer registration"));
}

TEST_CASE("peer registry: a node with a failure domain places its copies in other domains first",
          "[unit][peer]") {
  MemoryStorage local;
  CountingStorage shared;
  // Rack-major names: the ring after node r1-a runs through its own rack first.
  for (const char* n : {"r1-b", "r1-c", "r1-d"}) Register(shared, n, "127.0.0.1:1", "rack1");
  for (const char* n : {"r2-a", "r2-b"}) Register(shared, n, "127.0.0.1:2", "rack2");
  Register(shared, "r3-a", "127.0.0.1:3", "rack3");
  ReplicatorOptions o;
  o.node_id = "r1-a";
  o.advertise_addr = "127.0.0.1:9";
  o.failure_domain = "rack1";
  auto r = Replicator::Start(o, &local, &shared);
  REQUIRE(r.ok());
  auto me = (*r)->Lookup("r1-a");  // what Start registered
  REQUIRE(me.ok());
  CHECK(me->failure_domain == "rack1");
  auto ids = (*r)->Registry(/*fresh=*/true);
  REQUIRE(ids.ok());
  CHECK((*r)->Candidates(*ids) ==
        std::vector<std::string>{"r2-a", "r3-a", "r1-b", "r1-c", "r1-d", "r2-b"});
  // Without a domain of its own: the ring order, and no registration read for it.
  o.node_id = "r1-z";
  o.failure_domain = "";
  auto plain = Replicator::Start(o, &local, &shared);
  REQUIRE(plain.ok());
  shared.gets = 0;
  CHECK((*plain)->Candidates(*ids) ==
        std::vector<std::string>{"r2-a", "r2-b", "r3-a", "r1-a", "r1-b", "r1-c", "r1-d"});
  CHECK(shared.gets == 0);
}

TEST_CASE("peer registry: a node registered again at a new address is seen once the cache ages",
          "[unit][peer]") {
  MemoryStorage local;
  MemoryStorage shared;
  Register(shared, "node-b", "127.0.0.1:20001");
  ReplicatorOptions o;
  o.node_id = "node-a";
  o.advertise_addr = "127.0.0.1:20000";
  SelfSignedTls certs("node-a");
  o.tls = certs.files;
  auto r = Replicator::Start(o, &local, &shared);
  REQUIRE(r.ok());
  auto first = (*r)->ClientFor("node-b");
  REQUIRE(first.ok());
  CHECK((*first)->options().address == "127.0.0.1:20001");

  // node-b restarts elsewhere: within the cache's age the old address stands (no read) ...
  Register(shared, "node-b", "127.0.0.1:20002");
  auto cached = (*r)->AddressOf("node-b");
  REQUIRE(cached.ok());
  CHECK(*cached == "127.0.0.1:20001");
  // ... and a lookup older than its max_age (a tiny one here, for kRegistryRefresh) reads the
  // registration again, which AddressOf and ClientFor then answer from.
  auto aged = (*r)->Lookup("node-b", absl::Nanoseconds(1));
  REQUIRE(aged.ok());
  CHECK(aged->address == "127.0.0.1:20002");
  auto address = (*r)->AddressOf("node-b");
  REQUIRE(address.ok());
  CHECK(*address == "127.0.0.1:20002");
  auto second = (*r)->ClientFor("node-b");
  REQUIRE(second.ok());
  CHECK(second->get() != first->get());  // a new client, connected to the new address
  CHECK((*second)->options().address == "127.0.0.1:20002");
  CHECK((*first)->options().address == "127.0.0.1:20001");  // the old one lives on with its caller
  auto again = (*r)->ClientFor("node-b");
  REQUIRE(again.ok());
  CHECK(again->get() == second->get());  // shared while the address holds
}

TEST_CASE("peer registry: a registration that does not parse is listed but has no address",
          "[unit][peer]") {
  MemoryStorage local;
  MemoryStorage shared;
  Register(shared, "node-b", "127.0.0.1:20001");
  const std::string junk_path = std::string(kPeerRegistryDir) + "/node-junk";
  const std::string junk = "\xff\xff\xff\xff not a proto";  // wire type 7: no parse
  REQUIRE(shared.PutAtomic(junk_path, junk).ok());
  v1::PeerRegistration probe;
  REQUIRE_FALSE(probe.ParseFromString(junk));
  ReplicatorOptions o;
  o.node_id = "node-a";
  o.advertise_addr = "127.0.0.1:20000";
  SelfSignedTls certs("node-a");
  o.tls = certs.files;
  auto r = Replicator::Start(o, &local, &shared);
  REQUIRE(r.ok());

  // Listed: a refresh reads no registration, so it cannot tell.
  auto ids = (*r)->Registry(/*fresh=*/true);
  REQUIRE(ids.ok());
  CHECK(*ids == std::vector<std::string>{"node-a", "node-b", "node-junk"});
  // Its address: UNAVAILABLE naming the node and the file; never cached as an answer.
  for (int i = 0; i < 2; ++i) {
    auto junk = (*r)->AddressOf("node-junk");
    CHECK(absl::IsUnavailable(junk.status()));
    CHECK_THAT(std::string(junk.status().message()),
               Catch::Contains("node-junk") && Catch::Contains(junk_path) &&
                   Catch::Contains("not a peer registration"));
  }
  // So no client for it (the replicator moves on to the next candidate: Replicate, Drop), while
  // a node registered properly has one.
  auto client = (*r)->ClientFor("node-junk");
  CHECK(absl::IsUnavailable(client.status()));
  CHECK_THAT(std::string(client.status().message()), Catch::Contains(junk_path));
  REQUIRE((*r)->ClientFor("node-b").ok());
}

}  // namespace ckptd::peer
