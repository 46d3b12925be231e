// Ownership between uids (issue 33 §1, docs/SECURITY.md "Ownership"), against real daemons and
// real uids (the test runs as root and acts as uids 60001 and 60002 in forked children; root is
// an admin, so every uid that matters here is another): a job's owner is claimed once, atomically,
// by its first save; the owner travels with the data — a daemon that adopts a checkpoint from the
// shared store, or from its manifest after its index is lost, keeps the recorded owner, mapped to
// its own uids by number or by name — and no byte or metadata of another uid's job leaves the
// daemon through an adoption. Each case failed on the daemon before (both racing uids committed;
// the adopting daemon handed the first uid to ask the bytes, then owned the job itself).
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "as_uid.h"
#include "harness.h"
#include "raw_session.h"

using namespace ckptd_it;

namespace {

constexpr uint32_t kUidA = 60001;
constexpr uint32_t kUidB = 60002;
constexpr uint64_t kRows = 64;  // a [64, 4] float32 item: 1 KiB
constexpr uint64_t kBytes = kRows * 16;

// The socket open to group 65534, which both test uids run as (neither is an admin).
std::vector<std::string> TenantFlags(std::vector<std::string> more = {}) {
  std::vector<std::string> f = {"--socket_mode=0660", "--socket_group=65534"};
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

// A daemon whose socket the test uids reach (its temp dir opened to traverse).
std::unique_ptr<Daemon> TenantDaemon(std::vector<std::string> more = {}) {
  auto d = std::make_unique<Daemon>(DaemonConfig{.extra_flags = TenantFlags(std::move(more))});
  const std::string parent = d->state_dir().substr(0, d->state_dir().rfind('/'));
  REQUIRE(chmod(parent.c_str(), 0711) == 0);
  return d;
}

std::string Failed(const std::string& what, const grpc::Status& s) {
  return what + ": " + std::to_string(s.error_code()) + " " + s.error_message();
}

// A raw session of the calling uid with its arena segment mapped.
struct Tenant {
  explicit Tenant(const std::string& socket) : raw(socket) {
    raw.Attach();
    ArenaAnswer a = AskArena(socket, raw.hello.session_id());
    if (a.status != 0 || a.fd < 0) throw std::runtime_error("arena fd: " + a.message);
    bytes = raw.hello.arena_bytes();
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
    close(a.fd);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the arena failed");
    arena = static_cast<uint8_t*>(p);
  }
  ~Tenant() { munmap(arena, bytes); }

  // A world-1 Save of item "w" ([kRows, 4] float32, every byte `fill`), staged in a new extent.
  // With `world` > 1: rank `rank` of a checkpoint spanning nodes (2 ranks a node), its item
  // "w<rank>".
  v1::SaveRequest Prepare(const std::string& job, uint64_t step, uint8_t fill, uint32_t rank = 0,
                          uint32_t world = 1) {
    v1::Extent e = raw.Reserve(kBytes);
    std::memset(arena + e.offset(), fill, kBytes);
    v1::SaveRequest req =
        raw.SaveOf(job, step, rank, world, world == 1 ? "w" : "w" + std::to_string(rank), kRows);
    if (world > 1) req.set_local_world_size(2);
    v1::MemRef* m = req.mutable_shards(0)->mutable_data();
    m->set_extent_id(e.id());
    m->set_length(kBytes);
    return req;
  }
  grpc::Status WaitFor(const std::string& job, uint64_t step, v1::WaitFor until) {
    v1::WaitRequest w;
    w.set_job(job);
    w.set_step(step);
    w.set_until(until);
    w.set_timeout_ms(15000);
    v1::CheckpointStatus st;
    return raw.Call([&](grpc::ClientContext* c) { return raw.stub->Wait(c, w, &st); });
  }
  // Saves (job, step) and waits until it is `until`; "" or what failed.
  std::string SaveDurable(const std::string& job, uint64_t step, uint8_t fill,
                          v1::WaitFor until = v1::WAIT_FOR_COMMITTED) {
    grpc::Status s = raw.Save(Prepare(job, step, fill));
    if (!s.ok()) return Failed("save " + job, s);
    s = WaitFor(job, step, until);
    return s.ok() ? "" : Failed("wait " + job, s);
  }
  grpc::Status Load(const std::string& job, uint64_t step, uint64_t* offset) {
    v1::Extent e = raw.Reserve(kBytes);
    std::memset(arena + e.offset(), 0, kBytes);
    *offset = e.offset();
    v1::LoadRequest req;
    req.set_session_id(raw.hello.session_id());
    req.set_job(job);
    req.set_step(step);
    v1::LoadItemRequest* it = req.add_items();
    it->set_item("w");
    it->mutable_dest()->set_extent_id(e.id());
    it->mutable_dest()->set_length(kBytes);
    v1::LoadResponse resp;
    return raw.Call([&](grpc::ClientContext* c) { return raw.stub->Load(c, req, &resp); });
  }
  // Loads item "w" of (job, step): "" when every byte is `fill`.
  std::string LoadCheck(const std::string& job, uint64_t step, uint8_t fill) {
    uint64_t offset = 0;
    grpc::Status s = Load(job, step, &offset);
    if (!s.ok()) return Failed("load " + job, s);
    for (uint64_t i = 0; i < kBytes; ++i) {
      if (arena[offset + i] != fill)
        return "load " + job + ": byte " + std::to_string(i) + " wrong";
    }
    return "";
  }

  Raw raw;
  uint8_t* arena = nullptr;
  uint64_t bytes = 0;
};

bool NeedsRoot() {
  if (geteuid() == 0) return false;
  WARN("not run: needs root to act as other uids");
  return true;
}

// A child running `commands` as `uid` against daemon `d` (as_uid.h; TenantChild below runs
// them). Its report: "" when all went as expected, else what did not ("denied" from a race that
// was refused).
ExecAsUid StartAs(uint32_t uid, const Daemon& d, const std::vector<std::string>& commands,
                  const Gate* gate = nullptr) {
  std::vector<std::string> args = {d.socket()};
  args.insert(args.end(), commands.begin(), commands.end());
  return ExecAsUid(uid, 65534, "tenant", args, gate);
}
std::string RunAs(uint32_t uid, const Daemon& d, const std::vector<std::string>& commands) {
  return StartAs(uid, d, commands).Finish();
}

}  // namespace

TEST_CASE("tenancy: two uids racing the first saves of a job name: one owns it, one is refused",
          "[integration][tenancy]") {
  if (NeedsRoot()) return;
  auto d = TenantDaemon();
  Raw root(*d);
  for (int i = 0; i < 8; ++i) {
    const std::string job = "race-" + std::to_string(i);
    // Both ways: which uid is started first (and saves step 1) alternates.
    const uint32_t first = i % 2 == 0 ? kUidA : kUidB;
    const uint32_t second = i % 2 == 0 ? kUidB : kUidA;
    // Each prepares its session and extent, then both save at once when released; the winner
    // loads its bytes back, the loser must be refused before anything is staged.
    Gate gate;
    ExecAsUid a = StartAs(first, *d, {"race " + job + " 1 0x11"}, &gate);
    ExecAsUid b = StartAs(second, *d, {"race " + job + " 2 0x22"}, &gate);
    gate.Open();
    const std::string ra = a.Finish();
    const std::string rb = b.Finish();
    INFO(job << ": uid " << first << " → \"" << ra << "\", uid " << second << " → \"" << rb
             << "\"");
    CHECK(((ra.empty() && rb == "denied") || (ra == "denied" && rb.empty())));
    // The loser staged nothing: the job has exactly one checkpoint, the winner's (root, an
    // admin, may list it).
    v1::ListCheckpointsRequest q;
    q.set_job(job);
    v1::ListCheckpointsResponse listed;
    REQUIRE(
        root.Call([&](grpc::ClientContext* c) { return root.stub->ListCheckpoints(c, q, &listed); })
            .ok());
    REQUIRE(listed.checkpoints_size() == 1);
    CHECK(listed.checkpoints(0).step() == (ra.empty() ? 1u : 2u));
    CHECK(listed.checkpoints(0).state() == v1::COMMITTED);
  }
}

namespace {

// The catalog and data calls a uid makes on another uid's job (one job each, so each is the
// first call about it on the adopting node: the adoption happens in that call). An op ending in
// "-absent" asks for step 99, which the job does not have: refused all the same (NOT_FOUND there
// would tell another uid which steps the job has).
const std::vector<std::string> kOps = {
    "load",          "inspect",        "status",         "list",
    "latest",        "verify",         "reshard",        "delete",
    "prefetch",      "load-absent",    "inspect-absent", "status-absent",
    "verify-absent", "reshard-absent", "delete-absent",  "prefetch-absent"};

grpc::Status CallOp(Tenant& t, const std::string& op_name, const std::string& job) {
  Raw& r = t.raw;
  const bool absent = op_name.ends_with("-absent");
  const std::string op = absent ? op_name.substr(0, op_name.size() - 7) : op_name;
  const uint64_t step = absent ? 99 : 1;
  if (op == "load") {
    uint64_t offset = 0;
    return t.Load(job, step, &offset);
  }
  if (op == "prefetch") {
    v1::PrefetchRequest q;
    q.set_job(job);
    q.set_step(step);
    v1::PrefetchResponse a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->Prefetch(c, q, &a); });
  }
  if (op == "inspect") {
    v1::InspectRequest q;
    q.set_job(job);
    q.set_step(step);
    v1::InspectResponse a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->Inspect(c, q, &a); });
  }
  if (op == "status") {
    v1::GetStatusRequest q;
    q.set_job(job);
    q.set_step(step);
    v1::CheckpointStatus a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->GetStatus(c, q, &a); });
  }
  if (op == "list") {
    v1::ListCheckpointsRequest q;
    q.set_job(job);
    v1::ListCheckpointsResponse a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->ListCheckpoints(c, q, &a); });
  }
  if (op == "latest") {
    v1::LatestRequest q;
    q.set_job(job);
    v1::LatestResponse a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->Latest(c, q, &a); });
  }
  if (op == "verify") {
    v1::VerifyRequest q;
    q.set_job(job);
    q.set_step(step);
    v1::VerifyResponse a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->Verify(c, q, &a); });
  }
  if (op == "reshard") {
    v1::ReshardRequest q;
    q.set_job(job);
    q.set_step(step);
    q.set_target_job("stolen-" + job);
    q.set_target_step(1);
    q.set_spec("consolidated");
    v1::CheckpointStatus a;
    return r.Call([&](grpc::ClientContext* c) { return r.stub->Reshard(c, q, &a); });
  }
  v1::DeleteRequest q;
  q.set_job(job);
  q.set_step(step);
  v1::DeleteResponse a;
  return r.Call([&](grpc::ClientContext* c) { return r.stub->Delete(c, q, &a); });
}

std::vector<std::string> SharedStoreFlags(const std::string& shared, const std::string& node,
                                          std::vector<std::string> more = {}) {
  std::vector<std::string> f = {"--remote_dir=" + shared, "--tier_policy=local+remote",
                                "--node_id=" + node, "--upload_retry_max_ms=1000"};
  f.insert(f.end(), more.begin(), more.end());
  return f;
}

std::string SharedDir(const TempDir& dir) {
  std::filesystem::create_directories(dir.path() + "/shared");
  return dir.path() + "/shared";
}

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> w;
  std::istringstream in(line);
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// One command of TenantChild: "" when it went as expected.
std::string RunTenantCommand(Tenant& t, int gate_fd, const std::string& line) {
  const std::vector<std::string> w = Words(line);
  auto arg = [&](size_t i) -> const std::string& {
    if (i >= w.size()) throw std::runtime_error("command \"" + line + "\": too few words");
    return w[i];
  };
  auto num = [&](size_t i) { return std::stoull(arg(i), nullptr, 0); };
  const std::string& op = arg(0);
  if (op == "save") {
    const bool remote = w.size() > 4 && w[4] == "remote";
    return t.SaveDurable(arg(1), num(2), static_cast<uint8_t>(num(3)),
                         remote ? v1::WAIT_FOR_REMOTE : v1::WAIT_FOR_COMMITTED);
  }
  if (op == "load") return t.LoadCheck(arg(1), num(2), static_cast<uint8_t>(num(3)));
  if (op == "upload-refused") {  // commits here; its upload is refused, naming the owner
    std::string err = t.SaveDurable(arg(1), num(2), static_cast<uint8_t>(num(3)));
    if (!err.empty()) return err;
    grpc::Status s = t.WaitFor(arg(1), num(2), v1::WAIT_FOR_REMOTE);
    if (s.error_code() != grpc::StatusCode::PERMISSION_DENIED) return Failed("wait remote", s);
    return s.error_message().find("belongs to uid 60001") == std::string::npos ? s.error_message()
                                                                               : "";
  }
  if (op == "remote-save-refused") {  // TIER_REMOTE: refused before anything is staged
    v1::SaveRequest req = t.Prepare(arg(1), num(2), static_cast<uint8_t>(num(3)));
    req.set_tier_policy(v1::TIER_REMOTE);
    grpc::Status s = t.raw.Save(req);
    return s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? "" : Failed("save", s);
  }
  if (op == "delete") {
    v1::DeleteRequest q;
    q.set_job(arg(1));
    q.set_step(num(2));
    v1::DeleteResponse a;
    grpc::Status s =
        t.raw.Call([&](grpc::ClientContext* c) { return t.raw.stub->Delete(c, q, &a); });
    return s.ok() ? "" : Failed("delete", s);
  }
  if (op == "refused-load") {
    uint64_t offset = 0;
    grpc::Status s = t.Load(arg(1), num(2), &offset);
    return s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? "" : Failed("load", s);
  }
  if (op == "race") {
    v1::SaveRequest req = t.Prepare(arg(1), num(2), static_cast<uint8_t>(num(3)));
    char c;
    if (gate_fd >= 0) (void)!read(gate_fd, &c, 1);  // EOF once the parent opens the gate
    grpc::Status s = t.raw.Save(req);
    if (s.error_code() == grpc::StatusCode::PERMISSION_DENIED) return "denied";
    if (!s.ok()) return Failed("save", s);
    s = t.WaitFor(arg(1), num(2), v1::WAIT_FOR_COMMITTED);
    if (!s.ok()) return Failed("wait", s);
    return t.LoadCheck(arg(1), num(2), static_cast<uint8_t>(num(3)));
  }
  if (op == "save-ops") {
    for (const std::string& o : kOps) {
      std::string err = t.SaveDurable("adopt-" + o, 1, 0x5a, v1::WAIT_FOR_REMOTE);
      if (!err.empty()) return err;
    }
    return "";
  }
  if (op == "refuse-ops") {
    std::string errors;
    for (const std::string& o : kOps) {
      grpc::Status s = CallOp(t, o, "adopt-" + o);
      if (s.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
        errors += Failed(o + " was not refused", s) + "\n";
      } else if (s.error_message().find("belongs to uid 60001") == std::string::npos) {
        errors += o + ": " + s.error_message() + "\n";
      }
    }
    return errors;
  }
  if (op == "save-ranks") {
    const auto first = static_cast<uint32_t>(num(2));
    for (uint32_t r = first; r < first + 2; ++r) {
      grpc::Status s = t.raw.Save(t.Prepare(arg(1), 1, 0x42, r, 4));
      if (!s.ok()) return Failed("save rank " + std::to_string(r), s);
    }
    return "";
  }
  if (op == "wait-aborted") {
    const std::string text = line.substr(line.find(arg(3)));
    grpc::Status s = t.WaitFor(arg(1), num(2), v1::WAIT_FOR_COMMITTED);
    if (s.error_code() != grpc::StatusCode::ABORTED) return Failed("wait", s);
    return s.error_message().find(text) == std::string::npos ? s.error_message() : "";
  }
  return "unknown command \"" + line + "\"";
}

// Two daemons of the test uids, nodes a and b, sharing a directory as the store.
struct TwoTenantNodes {
  TempDir dir;
  std::string shared = SharedDir(dir);
  std::pair<std::unique_ptr<Daemon>, std::unique_ptr<Daemon>> daemons{
      TenantDaemon(SharedStoreFlags(shared, "node-a")),
      TenantDaemon(SharedStoreFlags(shared, "node-b"))};
};

}  // namespace

TEST_CASE("tenancy: another uid's job adopted from the shared store gives nothing away",
          "[integration][tenancy]") {
  if (NeedsRoot()) return;
  TwoTenantNodes nodes;
  auto& [a, b] = nodes.daemons;
  // uid A saves one job per call on node a, durable on the store.
  REQUIRE(RunAs(kUidA, *a, {"save-ops"}) == "");
  // uid B asks node b, which has no row of these jobs: each call adopts the job from the store
  // with its recorded owner, then refuses.
  CHECK(RunAs(kUidB, *b, {"refuse-ops"}) == "");
  // The owner is the same on node b: it loads its bytes there, and its delete-refused job is
  // whole.
  CHECK(RunAs(kUidA, *b,
              {"load adopt-load 1 0x5a", "load adopt-delete 1 0x5a",
               "load adopt-reshard 1 0x5a"}) == "");
  CommandResult jobs = RunCtl(*b, {"ls"});
  INFO(jobs.output);
  CHECK(jobs.output.find("stolen-") == std::string::npos);
}

TEST_CASE(
    "tenancy: a job name claimed on a second node neither overwrites nor deletes the first "
    "owner's data on the store",
    "[integration][tenancy]") {
  if (NeedsRoot()) return;
  TwoTenantNodes nodes;
  const std::string& shared = nodes.shared;
  auto& [a, b] = nodes.daemons;
  REQUIRE(RunAs(kUidA, *a, {"save shared 1 0x61 remote"}) == "");
  REQUIRE(std::filesystem::exists(shared + "/shared/owner.ckj"));
  // Node b has not seen the job: uid B claims the name there and commits its step 1 locally,
  // but the store records the job as uid A's: B's upload is refused (never retried), a save
  // flushed straight to the store is refused before anything is staged, and B's delete of its
  // own step 1 leaves A's step 1 on the store.
  CHECK(RunAs(kUidB, *b, {"upload-refused shared 1 0x62", "remote-save-refused shared 2 0x62"}) ==
        "");
  CommandResult st = RunCtl(*b, {"status", "shared", "1"});
  INFO(st.output);
  CHECK(st.output.find("refused") != std::string::npos);
  CHECK(RunAs(kUidB, *b, {"delete shared 1"}) == "");
  CHECK(std::filesystem::exists(shared + "/shared/" + StepDir(1) + "/manifest.ckm"));
  CHECK_FALSE(std::filesystem::exists(shared + "/shared/" + StepDir(2)));
  // A third node reads uid A's bytes from the store, for uid A only.
  auto c = TenantDaemon(SharedStoreFlags(shared, "node-c"));
  CHECK(RunAs(kUidA, *c, {"load shared 1 0x61"}) == "");
  CHECK(RunAs(kUidB, *c, {"refused-load shared 1"}) == "");
}

TEST_CASE("tenancy: adoption from manifests after the index is lost keeps each job's owner",
          "[integration][tenancy]") {
  if (NeedsRoot()) return;
  auto d = TenantDaemon();
  REQUIRE(RunAs(kUidA, *d, {"save lost-a 1 0x3c"}) == "");
  REQUIRE(RunAs(kUidB, *d, {"save lost-b 1 0x4d"}) == "");
  REQUIRE(d->Stop());
  std::filesystem::remove_all(d->state_dir() + "/index");
  d->Restart(TenantFlags());
  CHECK(RunAs(kUidA, *d, {"load lost-a 1 0x3c", "refused-load lost-b 1"}) == "");
  CHECK(RunAs(kUidB, *d, {"load lost-b 1 0x4d"}) == "");
  CommandResult ls = RunCtl(*d, {"ls"});
  INFO(ls.output);
  CHECK(ls.output.find("60001") != std::string::npos);
  CHECK(ls.output.find("60002") != std::string::npos);
}

TEST_CASE("tenancy: three daemons on one store map the owner by number or by name",
          "[integration][tenancy]") {
  if (NeedsRoot()) return;
  TempDir dir;
  const std::string shared = SharedDir(dir);
  // alice is uid 60001 on node a and uid 60002 on node b; node c maps owners by number.
  const std::string map_a = dir.path() + "/owners-a";
  const std::string map_b = dir.path() + "/owners-b";
  std::ofstream(map_a) << "# name uid\nalice 60001\n";
  std::ofstream(map_b) << "alice 60002\n";
  auto a = TenantDaemon(SharedStoreFlags(shared, "node-a", {"--owner_map_file=" + map_a}));
  auto b = TenantDaemon(
      SharedStoreFlags(shared, "node-b", {"--owner_map=name", "--owner_map_file=" + map_b}));
  auto c = TenantDaemon(SharedStoreFlags(shared, "node-c"));
  REQUIRE(RunAs(kUidA, *a, {"save mapped 1 0x77 remote"}) == "");
  // Node b: alice is uid 60002 there; uid 60001 is someone else.
  CHECK(RunAs(kUidA, *b, {"refused-load mapped 1"}) == "");
  CHECK(RunAs(kUidB, *b, {"load mapped 1 0x77"}) == "");
  // Node c: the numeric uid.
  CHECK(RunAs(kUidB, *c, {"refused-load mapped 1"}) == "");
  CHECK(RunAs(kUidA, *c, {"load mapped 1 0x77"}) == "");
  // And node a itself still is the owner's.
  CHECK(RunAs(kUidA, *a, {"load mapped 1 0x77"}) == "");
}

TEST_CASE("tenancy: a checkpoint spanning nodes whose nodes have different owners aborts",
          "[integration][tenancy]") {
  if (NeedsRoot()) return;
  TempDir dir;
  const std::string shared = SharedDir(dir);
  const std::vector<std::string> quick = {"--cluster_poll_ms=50", "--stage_timeout_ms=3000"};
  auto a = TenantDaemon(SharedStoreFlags(shared, "node-a", quick));
  auto b = TenantDaemon(SharedStoreFlags(shared, "node-b", quick));
  // The job name is new on both nodes: uid A claims it on node a (ranks 0 and 1, the
  // coordinator's), uid B on node b (ranks 2 and 3).
  REQUIRE(RunAs(kUidA, *a, {"save-ranks split 0"}) == "");
  // Node a's part claimed the job on the store for uid A: node b's part is refused before it is
  // written, and node b aborts its ranks, naming the owner.
  REQUIRE(RunAs(kUidB, *b, {"save-ranks split 2", "wait-aborted split 1 belongs to uid 60001"}) ==
          "");
  CHECK_FALSE(std::filesystem::exists(shared + "/split/" + StepDir(1) + "/cluster/node-b.part"));
  // The coordinator never sees ranks 2 and 3: it aborts at the stage timeout.
  CHECK(RunAs(kUidA, *a, {"wait-aborted split 1 stage timeout"}) == "");
  CHECK_FALSE(std::filesystem::exists(shared + "/split/" + StepDir(1) + "/manifest.ckm"));
}

// The child body of StartAs (as_uid.h; args: SOCKET COMMAND...): runs each command, one line of
// words, on one session of its uid, and reports the first that did not go as expected. The
// commands:
//   save JOB STEP FILL [remote]      saves and waits until committed (or on the store)
//   load JOB STEP FILL               loads, every byte must be FILL
//   refused-load JOB STEP            a load must be refused (PERMISSION_DENIED)
//   race JOB STEP FILL               waits at the gate, saves; "denied" when refused, else
//                                    waits until committed and loads its bytes back
//   save-ops / refuse-ops            saves job "adopt-OP" for each of kOps (on the store) /
//                                    each call OP on "adopt-OP" must be refused as uid 60001's
//   upload-refused JOB STEP FILL     saves and commits; its upload must be refused (uid 60001's)
//   remote-save-refused JOB STEP FILL  a TIER_REMOTE save must be refused
//   delete JOB STEP                  deletes
//   save-ranks JOB FIRST             saves ranks FIRST and FIRST+1 of a 4-rank step 1
//   wait-aborted JOB STEP TEXT...    a wait must end ABORTED with TEXT in its message
namespace {
std::string TenantChild(const std::vector<std::string>& args, int gate_fd) {
  if (args.empty()) return "no socket";
  Tenant t(args[0]);
  std::string out;
  for (size_t i = 1; i < args.size() && out.empty(); ++i) {
    out = RunTenantCommand(t, gate_fd, args[i]);
  }
  return out;
}
CKPTD_AS_UID_CHILD("tenant", TenantChild);
}  // namespace
