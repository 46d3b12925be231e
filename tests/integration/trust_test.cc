// The trust model against the real daemon (issue 10): memory the daemon touches for a client is
// leased for the whole operation, sessions live and die with their connection, client memory
// can never crash the daemon, the daemon adopts no memory it did not create, and a job belongs
// to the uid that created it. Each case failed on the daemon before these guarantees.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "as_uid.h"
#include "harness.h"
#include "raw_session.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

// A [rows, 4] float32 shard of item `item` saved from one fresh extent by `raw` as a world-1
// checkpoint; waits until it is COMMITTED.
void SaveOneRank(Raw& raw, const std::string& job, uint64_t step, const std::string& item,
                 uint64_t rows) {
  v1::Extent e = raw.Reserve(rows * 16);
  v1::SaveRequest req = raw.SaveOf(job, step, 0, 1, item, rows);
  v1::MemRef* m = req.mutable_shards(0)->mutable_data();
  m->set_extent_id(e.id());
  m->set_length(rows * 16);
  grpc::Status s = raw.Save(req);
  REQUIRE(s.ok());
  v1::WaitRequest w;
  w.set_job(job);
  w.set_step(step);
  w.set_timeout_ms(20000);
  v1::CheckpointStatus st;
  REQUIRE(raw.Call([&](grpc::ClientContext* c) { return raw.stub->Wait(c, w, &st); }).ok());
}

v1::LoadRequest LoadInto(Raw& raw, const std::string& job, uint64_t step, const std::string& item,
                         v1::MemRef dest) {
  v1::LoadRequest req;
  req.set_session_id(raw.hello.session_id());
  req.set_job(job);
  req.set_step(step);
  v1::LoadItemRequest* it = req.add_items();
  it->set_item(item);
  *it->mutable_dest() = dest;
  return req;
}

grpc::Status ReserveWithin(Raw& raw, uint64_t bytes, uint32_t timeout_ms) {
  v1::ReserveExtentsRequest req;
  req.set_session_id(raw.hello.session_id());
  req.add_sizes_bytes(bytes);
  req.set_timeout_ms(timeout_ms);
  v1::ReserveExtentsResponse resp;
  return raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReserveExtents(c, req, &resp); });
}

constexpr uint64_t kArenaBytes = 64ull << 20;  // the harness default
constexpr uint64_t kCapacity = kArenaBytes - 4096;

}  // namespace

TEST_CASE("trust: a load's destination extent stays leased when the client releases it",
          "[integration]") {
  // One uid asks for the whole arena here: its share (uid_arena_share_percent) is off.
  Daemon d({.extra_flags = {"--debug_load_delay_ms=1500", "--uid_arena_share_percent=100"}});
  Raw a(d), b(d);
  a.Attach();
  b.Attach();
  SaveOneRank(a, "lease", 1, "w", 65536);  // 1 MiB
  v1::Extent dest = a.Reserve(1 << 20);
  v1::MemRef ref;
  ref.set_extent_id(dest.id());
  ref.set_length(1 << 20);
  v1::LoadRequest load = LoadInto(a, "lease", 1, "w", ref);
  auto loading = std::async(std::launch::async, [&] {
    v1::LoadResponse resp;
    return a.Call([&](grpc::ClientContext* c) { return a.stub->Load(c, load, &resp); });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The client lets go of its destination mid-load (or dies: the same path)...
  v1::ReleaseExtentsRequest rel;
  rel.set_session_id(a.hello.session_id());
  rel.add_extent_ids(dest.id());
  v1::ReleaseExtentsResponse rr;
  REQUIRE(a.Call([&](grpc::ClientContext* c) { return a.stub->ReleaseExtents(c, rel, &rr); }).ok());
  // ...and another client asks for the whole arena: those bytes must not be handed out while
  // the load still writes them.
  grpc::Status early = ReserveWithin(b, kCapacity, 200);
  INFO(early.error_message());
  CHECK(early.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(loading.get().ok());
  // The load finished: the lease ended and the bytes came back.
  CHECK(ReserveWithin(b, kCapacity, 5000).ok());
}

TEST_CASE("trust: the same extent twice in one release is INVALID_ARGUMENT, not a crash",
          "[integration]") {
  Daemon d;
  Raw raw(d);
  raw.Attach();
  v1::Extent e = raw.Reserve(4096);
  v1::ReleaseExtentsRequest rel;
  rel.set_session_id(raw.hello.session_id());
  rel.add_extent_ids(e.id());
  rel.add_extent_ids(e.id());
  v1::ReleaseExtentsResponse rr;
  grpc::Status s =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReleaseExtents(c, rel, &rr); });
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Contains("named twice"));
  SaveCommitted(d, "alive", 1, 3);  // the daemon is still up and working
  CHECK(VerifyInProcess(d, "alive", 1, 3).empty());
}

TEST_CASE("trust: a session ends with its client process, promptly", "[integration]") {
  // One uid takes the whole arena here: its share (uid_arena_share_percent) is off.
  Daemon d({.extra_flags = {"--uid_arena_share_percent=100"}});
  Child holder(TestClientArgs(d, "allocate", {"--job", "x", "--bytes", std::to_string(kCapacity)}));
  REQUIRE(holder.WaitForLine("allocated", 20000));
  Raw raw(d);
  raw.Attach();
  CHECK(ReserveWithin(raw, 4096, 100).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto t0 = std::chrono::steady_clock::now();
  holder.Kill9();
  // The kernel closes the dead client's socket; its Attach stream ends and so does its session.
  REQUIRE(ReserveWithin(raw, kCapacity, 5000).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
}

TEST_CASE("trust: a session is not tied to a pid (a client in another pid namespace keeps it)",
          "[integration]") {
  // --mount-proc: the namespace's own /proc, so the rank's /proc/self names its own threads (a
  // sanitized build's leak checker suspends them through it; with the host's /proc it cannot).
  const std::vector<std::string> unshare = {"/usr/bin/unshare", "--pid", "--fork", "--mount-proc"};
  std::vector<std::string> probe = unshare;
  probe.push_back("true");
  if (geteuid() != 0 || RunCommand(probe).exit_code != 0) {
    WARN("not run: needs root and unshare --pid --mount-proc");
    return;
  }
  Daemon d;
  // The rank sits in its own pid namespace (as in a sidecar deployment): the pid it sees for
  // itself means nothing to the daemon. It stays connected 1.5 s, then saves and commits.
  std::vector<std::string> argv = unshare;
  for (const std::string& a :
       TestClientArgs(d, "save",
                      {"--job", "pidns", "--step", "1", "--rank", "0", "--world", "1", "--idle-ms",
                       "1500", "--wait-committed"})) {
    argv.push_back(a);
  }
  CommandResult r = RunCommand(argv);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("committed"));
}

TEST_CASE("trust: a region truncated by its owner fails cleanly on save and on load",
          "[integration]") {
  Daemon d({.extra_flags = {"--debug_flush_delay_ms=800"}});
  Raw raw(d);
  raw.Attach();
  TestShm shm(1 << 20, "trunc");
  v1::RegisterRegionRequest reg;
  reg.set_session_id(raw.hello.session_id());
  reg.set_kind(v1::SHM);
  reg.set_shm_name(shm.name);
  reg.set_size_bytes(1 << 20);
  v1::RegisterRegionResponse rr;
  REQUIRE(
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->RegisterRegion(c, reg, &rr); }).ok());
  v1::SaveRequest save = raw.SaveOf("trunc", 1, 0, 1, "w", 65536);
  v1::MemRef* m = save.mutable_shards(0)->mutable_data();
  m->set_region_id(rr.region_id());
  m->set_length(1 << 20);
  REQUIRE(raw.Save(save).ok());
  // Staged; the flush starts 800 ms later. The owner shrinks the region meanwhile.
  int fd = shm_open(shm.name.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 0) == 0);
  v1::WaitRequest w;
  w.set_job("trunc");
  w.set_step(1);
  w.set_timeout_ms(20000);
  v1::CheckpointStatus st;
  grpc::Status waited = raw.Call([&](grpc::ClientContext* c) { return raw.stub->Wait(c, w, &st); });
  INFO(waited.error_message());
  CHECK(waited.error_code() == grpc::StatusCode::ABORTED);
  CHECK_THAT(waited.error_message(), Contains("vanished") || Contains("Bad address"));
  // A load into the shrunk region: a clear error naming it, no signal.
  SaveOneRank(raw, "trunc", 2, "w", 65536);
  v1::MemRef dest;
  dest.set_region_id(rr.region_id());
  dest.set_length(1 << 20);
  v1::LoadRequest load = LoadInto(raw, "trunc", 2, "w", dest);
  v1::LoadResponse resp;
  grpc::Status loaded =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->Load(c, load, &resp); });
  CHECK(loaded.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(loaded.error_message(), Contains("shrank"));
  close(fd);
  SaveCommitted(d, "alive", 1, 3);
  CHECK(VerifyInProcess(d, "alive", 1, 3).empty());
}

TEST_CASE("trust: the daemon's own arena cannot be registered as a region", "[integration]") {
  Daemon d;
  Raw raw(d);
  raw.Attach();
  ArenaAnswer arena = AskArena(d.socket(), raw.hello.session_id());
  REQUIRE(arena.status == 0);
  close(arena.fd);
  v1::RegisterRegionRequest reg;
  reg.set_session_id(raw.hello.session_id());
  reg.set_kind(v1::SHM);
  reg.set_shm_name(arena.segment());
  reg.set_size_bytes(4096);
  v1::RegisterRegionResponse rr;
  grpc::Status s =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->RegisterRegion(c, reg, &rr); });
  CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
}

TEST_CASE("trust: the arena socket gives a session's uid its segment, and nothing else",
          "[integration]") {
  Daemon d;
  Raw raw(d);
  raw.Attach();
  const std::string& session = raw.hello.session_id();
  // The session's own uid: the descriptor of the segment Hello named, which nobody opens by name.
  ArenaAnswer ok = AskArena(d.socket(), session);
  REQUIRE(ok.status == 0);
  REQUIRE(ok.fd >= 0);
  struct stat by_fd, by_name;
  REQUIRE(fstat(ok.fd, &by_fd) == 0);
  close(ok.fd);
  REQUIRE(stat(("/dev/shm" + ok.segment()).c_str(), &by_name) == 0);
  CHECK(by_fd.st_ino == by_name.st_ino);
  CHECK((by_name.st_mode & 0777) == 0600);
  CHECK(static_cast<uint64_t>(by_fd.st_size) == raw.hello.arena_bytes());
  // The only uid: its segment gets the whole arena, faulted in the background.
  ArenaAnswer later;
  for (int i = 0; i < 100 && !later.resident(); ++i) {
    if (later.fd >= 0) close(later.fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    later = AskArena(d.socket(), session);
  }
  CHECK(later.resident());
  CHECK(later.segment() == ok.segment());
  if (later.fd >= 0) close(later.fd);
  // Lies: an unknown session, an oversized request.
  ArenaAnswer unknown = AskArena(d.socket(), "no-such-session");
  CHECK(unknown.status == static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  CHECK(unknown.fd == -1);
  CHECK_THAT(unknown.message, Contains("unknown session"));
  ArenaAnswer huge = AskArena(d.socket(), std::string(4096, 'x'));
  CHECK(huge.status == static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  CHECK(huge.fd == -1);
  // Clients that connect and say nothing delay nobody, and are sent away after the server's 1 s.
  std::vector<std::future<ArenaAnswer>> silent;
  for (int i = 0; i < 20; ++i) {
    silent.push_back(std::async(
        std::launch::async, [&] { return AskArena(d.socket(), "", /*send_and_shutdown=*/false); }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto t0 = std::chrono::steady_clock::now();
  ArenaAnswer after = AskArena(d.socket(), session);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
  CHECK(after.status == 0);
  if (after.fd >= 0) close(after.fd);
  for (auto& f : silent) {
    ArenaAnswer a = f.get();
    CHECK(a.status == static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
    CHECK(a.fd == -1);
  }
  // A session that ended gets nothing.
  raw.Detach();
  ArenaAnswer ended;
  for (int i = 0; i < 50; ++i) {
    ended = AskArena(d.socket(), session);
    if (ended.status != 0) break;
    if (ended.fd >= 0) close(ended.fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(ended.status == static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  d.Stop();
  CHECK(!PathExists(d.socket() + ".arena"));  // removed at stop
}

TEST_CASE("trust: a restarted daemon never adopts an arena someone else could have written",
          "[integration]") {
  Daemon d({.extra_flags = {"--debug_flush_delay_ms=60000"}});
  auto ranks = SaveRanksConcurrently(d, "adopt", 1, 7, /*hold=*/false);
  for (auto& r : ranks) r->Wait();
  const std::string arena = d.ArenaName();
  REQUIRE(!arena.empty());
  d.Kill9();
  // Someone widened the segment's permissions while the daemon was down.
  REQUIRE(chmod(("/dev/shm" + arena).c_str(), 0666) == 0);
  d.Restart({});
  CHECK_THAT(d.Log(), Contains("not adopting the journaled staging arena"));
  CommandResult st = RunCtl(d, {"status", "adopt", "1"});
  INFO(st.output);
  CHECK_THAT(st.output, Contains("ABORTED"));
  CHECK(d.ArenaName() != arena);  // ckptctl's Hello made a new segment
  shm_unlink(arena.c_str());
}

TEST_CASE("trust: waits can never starve reservations", "[integration]") {
  // One uid holds every waiter thread here: its share of them (uid_share_percent) is off.
  Daemon d({.extra_flags = {"--waiters_max=8", "--uid_share_percent=100"}});
  Raw raw(d);
  raw.Attach();
  // A checkpoint that will wait for a second rank for ever, and 8 clients waiting on it.
  v1::Extent e = raw.Reserve(4096);
  v1::SaveRequest save = raw.SaveOf("starve", 1, 0, 2, "w", 256);
  v1::MemRef* m = save.mutable_shards(0)->mutable_data();
  m->set_extent_id(e.id());
  m->set_length(4096);
  REQUIRE(raw.Save(save).ok());
  std::vector<std::future<grpc::Status>> waits;
  for (int i = 0; i < 8; ++i) {
    waits.push_back(std::async(std::launch::async, [&] {
      v1::WaitRequest w;
      w.set_job("starve");
      w.set_step(1);
      w.set_timeout_ms(3000);
      v1::CheckpointStatus st;
      return raw.Call([&](grpc::ClientContext* c) { return raw.stub->Wait(c, w, &st); });
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  CHECK(ReserveWithin(raw, 4096, 1000).ok());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1000));
  for (auto& w : waits) CHECK(w.get().error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
}

TEST_CASE("trust: sessions per uid are capped, unattached ones expire", "[integration]") {
  Daemon d;
  auto stub = v1::Checkpoint::NewStub(
      grpc::CreateChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials()));
  grpc::Status last;
  int opened = 0;
  for (int i = 0; i < 1100 && last.ok(); ++i) {
    grpc::ClientContext c;
    v1::HelloRequest req;
    v1::HelloResponse resp;
    last = stub->Hello(&c, req, &resp);
    opened += last.ok();
  }
  CHECK(opened == 1024);
  CHECK(last.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(last.error_message(), Contains("kSessionsPerUidMax"));
  // None was attached: they end after 10 s and Hello works again.
  std::this_thread::sleep_for(std::chrono::milliseconds(11500));
  grpc::ClientContext c;
  v1::HelloRequest req;
  v1::HelloResponse resp;
  CHECK(stub->Hello(&c, req, &resp).ok());
}

namespace {

// Runs as uid 65534: root's job is out of reach, its own job works. Throws naming the first
// check that failed.
// A daemon whose socket is open to group 65534 (nogroup), for a second uid (65534) to connect.
const DaemonConfig kNogroupSocket{.extra_flags = {"--socket_mode=0660", "--socket_group=65534"}};

// Opens the test's temp dir above the daemon's state dir to others (traverse only); the daemon
// itself lets the socket's group through its state dir (0710) to the sockets, nothing more.
void LetThroughTempDir(const Daemon& d) {
  const std::string parent = d.state_dir().substr(0, d.state_dir().rfind('/'));
  REQUIRE(chmod(parent.c_str(), 0711) == 0);
}

// Runs the child body `name` (as_uid.h) with `args` as uid/gid 65534; "" when it went as
// expected, else what went wrong there.
std::string RunAsNobody(const std::string& name, const std::vector<std::string>& args) {
  return ExecAsUid(65534, 65534, name, args).Finish();
}

void AsOtherUid(const std::string& sock) {
  Raw other(sock);
  other.Attach();
  auto expect = [](grpc::Status s, grpc::StatusCode want, const char* what) {
    if (s.error_code() != want) {
      throw std::runtime_error(std::string(what) + ": " + std::to_string(s.error_code()) + " " +
                               s.error_message());
    }
  };
  v1::InspectRequest ir;
  ir.set_job("root-job");
  ir.set_step(1);
  v1::InspectResponse iresp;
  expect(other.Call([&](grpc::ClientContext* c) { return other.stub->Inspect(c, ir, &iresp); }),
         grpc::StatusCode::PERMISSION_DENIED, "inspect");
  v1::DeleteRequest dr;
  dr.set_job("root-job");
  dr.set_step(1);
  v1::DeleteResponse dresp;
  expect(other.Call([&](grpc::ClientContext* c) { return other.stub->Delete(c, dr, &dresp); }),
         grpc::StatusCode::PERMISSION_DENIED, "delete");
  v1::Extent e = other.Reserve(4096);
  v1::SaveRequest save = other.SaveOf("root-job", 2, 0, 1, "w", 256);
  save.mutable_shards(0)->mutable_data()->set_extent_id(e.id());
  save.mutable_shards(0)->mutable_data()->set_length(4096);
  expect(other.Save(save), grpc::StatusCode::PERMISSION_DENIED, "save into root's job");
  save.set_job("nobody-job");
  expect(other.Save(save), grpc::StatusCode::OK, "save its own job");
}
std::string AsOtherUidChild(const std::vector<std::string>& args, int /*gate_fd*/) {
  if (args.size() != 1) return "trust-other-uid: 1 argument";
  AsOtherUid(args[0]);
  return "";
}
CKPTD_AS_UID_CHILD("trust-other-uid", AsOtherUidChild);

}  // namespace

TEST_CASE("trust: a job belongs to the uid that created it", "[integration]") {
  if (geteuid() != 0) {
    WARN("not run: needs root to act as a second uid");
    return;
  }
  // The socket open to group 65534 (nogroup): the daemon lets that group pass through its state
  // dir (0710) to the socket, and nothing more. (The test's temp dir above it is opened here.)
  Daemon d(kNogroupSocket);
  LetThroughTempDir(d);
  const std::string sock = d.socket();
  struct stat st;
  REQUIRE(stat(d.state_dir().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0710);
  CHECK(st.st_gid == 65534);
  REQUIRE(stat(d.data_dir().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  REQUIRE(stat(sock.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  CHECK(st.st_gid == 65534);
  SaveCommitted(d, "root-job", 1, 3);
  CHECK(RunAsNobody("trust-other-uid", {sock}) == "");
  // Root is an admin: it may list and read the other uid's job; `ckptctl ls` shows owners.
  CommandResult ls = RunCtl(d, {"ls"});
  INFO(ls.output);
  CHECK_THAT(ls.output, Contains("nobody-job"));
  CHECK_THAT(ls.output, Contains("65534"));
  CHECK(RunCtl(d, {"status", "nobody-job", "2"}).exit_code == 0);
}

namespace {

// As uid 65534, while root holds a reserved extent filled with 0xa5 at `offset`: root's segment
// cannot be opened by name nor fetched with root's session id; this uid's own segment is another
// object and holds none of root's bytes. Returns "" or what went wrong.
std::string ArenaAsOtherUid(const std::string& sock, const std::string& root_segment,
                            const std::string& root_session, uint64_t offset, uint64_t length) {
  if (shm_open(root_segment.c_str(), O_RDWR, 0) >= 0 || errno != EACCES) {
    return "root's segment opened by name (or not refused with EACCES)";
  }
  ArenaAnswer stolen = AskArena(sock, root_session);
  if (stolen.status != static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION) || stolen.fd >= 0) {
    return "root's session id yielded status " + std::to_string(stolen.status);
  }
  Raw other(sock);
  other.Attach();
  ArenaAnswer mine = AskArena(sock, other.hello.session_id());
  if (mine.status != 0 || mine.fd < 0) return "own segment refused: " + mine.message;
  if (mine.segment() == root_segment) return "granted root's segment";
  struct stat st;
  if (fstat(mine.fd, &st) != 0 || st.st_uid != 0 || (st.st_mode & 0777) != 0600) {
    return "own segment is not the daemon's 0600 file";
  }
  void* p = mmap(nullptr, other.hello.arena_bytes(), PROT_READ, MAP_SHARED, mine.fd, 0);
  close(mine.fd);
  if (p == MAP_FAILED) return "mmap of own segment failed";
  const auto* b = static_cast<const uint8_t*>(p);
  size_t seen = 0;
  for (uint64_t i = 0; i < length; ++i) seen += b[offset + i] == 0xa5;
  munmap(p, other.hello.arena_bytes());
  if (seen != 0) return std::to_string(seen) + " of root's staged bytes visible";
  return "";
}
std::string ArenaAsOtherUidChild(const std::vector<std::string>& a, int /*gate_fd*/) {
  if (a.size() != 5) return "trust-arena-other-uid: 5 arguments";
  return ArenaAsOtherUid(a[0], a[1], a[2], std::stoull(a[3]), std::stoull(a[4]));
}
CKPTD_AS_UID_CHILD("trust-arena-other-uid", ArenaAsOtherUidChild);

}  // namespace

TEST_CASE("trust: a uid maps only its own staging arena", "[integration]") {
  if (geteuid() != 0) {
    WARN("not run: needs root to act as a second uid");
    return;
  }
  Daemon d(kNogroupSocket);
  LetThroughTempDir(d);
  Raw root(d);
  root.Attach();
  const v1::Extent e = root.Reserve(1 << 20);
  ArenaAnswer fd = AskArena(d.socket(), root.hello.session_id());
  REQUIRE(fd.status == 0);
  void* p = mmap(nullptr, root.hello.arena_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  close(fd.fd);
  REQUIRE(p != MAP_FAILED);
  std::memset(static_cast<uint8_t*>(p) + e.offset(), 0xa5, e.length());
  const std::string root_segment = fd.segment();
  CHECK(RunAsNobody("trust-arena-other-uid",
                    {d.socket(), root_segment, root.hello.session_id(), std::to_string(e.offset()),
                     std::to_string(e.length())}) == "");
  // Root's bytes are untouched, and root's segment gave up nothing to the other uid.
  CHECK(static_cast<uint8_t*>(p)[e.offset() + e.length() - 1] == 0xa5);
  munmap(p, root.hello.arena_bytes());
}

// A load into a sparse region (ftruncate'd, never written: what ckptd.empty() hands out) while
// /dev/shm is full: the daemon's first touch of each page must allocate it, which fails with
// SIGBUS. Runs in a private mount namespace whose /dev/shm is a 96 MiB tmpfs (the daemon's
// 64 MiB arena is prefaulted there first), as a child run of this binary; needs root.
namespace {

// Runs the hidden cases tagged `tag` of this binary in a private mount namespace whose /dev/shm
// is a 96 MiB tmpfs (the daemon's 64 MiB arena fits, little else). Needs root.
void RunWithSmallShm(const std::string& tag) {
  if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
    WARN("not run: needs root and /usr/bin/unshare for a private /dev/shm");
    return;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  CommandResult r =
      RunCommand({"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                  "mount -t tmpfs -o size=96m,mode=1777 tmpfs /dev/shm && "
                  "CKPTD_IT_SPARSE_CHILD=1 exec \"$0\" \"$1\"",
                  self, tag},
                 180);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("All tests passed"));
}

// Fills what is left of /dev/shm.
void FillShm() {
  int fd = open("/dev/shm/filler", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  std::vector<char> chunk(1 << 20, 'x');
  while (write(fd, chunk.data(), chunk.size()) > 0) {
  }
  while (write(fd, chunk.data(), 4096) > 0) {
  }
  close(fd);
}

}  // namespace

TEST_CASE("trust: a load into a sparse region on a full /dev/shm fails cleanly", "[integration]") {
  RunWithSmallShm("[sparse-child]");
}

TEST_CASE("trust: staging memory on a full /dev/shm is RESOURCE_EXHAUSTED, never a signal",
          "[integration]") {
  RunWithSmallShm("[arena-full-child]");
}

TEST_CASE("trust (child of the case above): the arena on a full /dev/shm",
          "[.][arena-full-child]") {
  REQUIRE(getenv("CKPTD_IT_SPARSE_CHILD") != nullptr);  // only inside the private /dev/shm
  // A 160 MiB arena on a 96 MiB /dev/shm: its pages cannot all be had.
  // (One uid asks for most of the arena: its share, uid_arena_share_percent, is off.)
  Daemon d({.staging_bytes_max = 160ull << 20, .extra_flags = {"--uid_arena_share_percent=100"}});
  Raw raw(d);
  raw.Attach();
  // The background faulting of the first segment gives up with a warning, not a crash.
  for (int i = 0; i < 100 && d.Log().find("pre-faulting the staging arena") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK_THAT(d.Log(), Contains("pre-faulting the staging arena"));
  v1::ReserveExtentsRequest req;
  req.set_session_id(raw.hello.session_id());
  req.add_sizes_bytes(150 << 20);
  req.set_timeout_ms(100);
  v1::ReserveExtentsResponse resp;
  grpc::Status full =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReserveExtents(c, req, &resp); });
  INFO(full.error_message());
  CHECK(full.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(full.error_message(), Contains("/dev/shm"));
  // Nothing was kept: a reservation that fits in the pages there are succeeds, and saves work.
  req.set_sizes_bytes(0, 16 << 20);
  grpc::Status fits =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReserveExtents(c, req, &resp); });
  INFO(fits.error_message());
  CHECK(fits.ok());
  SaveCommitted(d, "alive", 1, 3);
  CHECK(VerifyInProcess(d, "alive", 1, 3).empty());
}

TEST_CASE("trust (child of the case above): sparse region, full /dev/shm", "[.][sparse-child]") {
  REQUIRE(getenv("CKPTD_IT_SPARSE_CHILD") != nullptr);  // only inside the private /dev/shm
  Daemon d;
  Raw raw(d);
  raw.Attach();
  SaveOneRank(raw, "sparse", 1, "w", 1 << 20);  // 16 MiB, committed before /dev/shm fills
  TestShm shm(16 << 20, "sparse");              // sparse: no page allocated yet
  // Full before the region is registered: the daemon's populating of its pages at registration
  // fails (it is best effort), so the region stays sparse and the load's copy meets the SIGBUS.
  FillShm();
  v1::RegisterRegionRequest reg;
  reg.set_session_id(raw.hello.session_id());
  reg.set_kind(v1::SHM);
  reg.set_shm_name(shm.name);
  reg.set_size_bytes(16 << 20);
  v1::RegisterRegionResponse rr;
  REQUIRE(
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->RegisterRegion(c, reg, &rr); }).ok());
  v1::MemRef dest;
  dest.set_region_id(rr.region_id());
  dest.set_length(16 << 20);
  v1::LoadRequest load = LoadInto(raw, "sparse", 1, "w", dest);
  v1::LoadResponse resp;
  grpc::Status loaded =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->Load(c, load, &resp); });
  INFO(loaded.error_message());
  CHECK(loaded.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(loaded.error_message(), Contains("full tmpfs"));
  // The daemon is up; with space back the same load succeeds.
  unlink("/dev/shm/filler");
  grpc::Status again =
      raw.Call([&](grpc::ClientContext* c) { return raw.stub->Load(c, load, &resp); });
  INFO(again.error_message());
  CHECK(again.ok());
  SaveCommitted(d, "alive", 1, 3);
  CHECK(VerifyInProcess(d, "alive", 1, 3).empty());
}
