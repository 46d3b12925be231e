// Per-uid shares (issue 33 §2, docs/SECURITY.md "Per-uid shares"): one uid (the hog, 65534 in a
// forked child) holds a shared resource to its limit while another uid (the victim, root in this
// process) saves, waits for and loads a checkpoint; every victim call must answer within
// kVictimBoundMs. Each case failed on the daemon before the shares: the victim's call waited for
// the hog (the whole arena, 256 open checkpoints, every waiter thread, the arena socket's slots,
// the daemon's descriptors, every RPC thread busy validating 100,000 items).
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "raw_session.h"

namespace ckptd_it {
int FairShareHog(int argc, char** argv);
}  // namespace ckptd_it

using namespace ckptd_it;  // NOLINT(google-build-using-namespace): the harness
using Catch::Matchers::Contains;

namespace {

constexpr uint32_t kHogUid = 65534;
// What a victim call may take while the hog is at its limit (docs/SECURITY.md states it).
constexpr double kVictimBoundMs = 2000;

// The socket open to group 65534 for the hog; `flags` added.
DaemonConfig SharedSocket(std::vector<std::string> flags = {}) {
  flags.push_back("--socket_mode=0660");
  flags.push_back("--socket_group=65534");
  return DaemonConfig{.extra_flags = std::move(flags)};
}

void LetThroughTempDir(const Daemon& d) {
  const std::string parent = d.state_dir().substr(0, d.state_dir().rfind('/'));
  REQUIRE(chmod(parent.c_str(), 0711) == 0);
}

// A hog process as uid 65534: this binary exec'd with --fair-share-hog NAME SOCKET (FairShareHog
// below; exec'd, not only forked, so it shares no gRPC descriptor with this process). It takes
// its hold on the resource, reports, and keeps what it holds (threads, connections, sessions)
// until the Hog is destroyed. `out`: a file the hog may write results to.
class Hog {
 public:
  Hog(const std::string& name, const std::string& socket, const std::string& out = "") {
    int report[2], hold[2];
    REQUIRE(pipe(report) == 0);
    REQUIRE(pipe(hold) == 0);
    // Built before the fork: the forked copy of this multi-threaded process makes only
    // async-signal-safe calls until it execs (as_uid.h).
    std::vector<std::string> args = {
        "/proc/self/exe",          "--fair-share-hog",      name, socket,
        std::to_string(report[1]), std::to_string(hold[0]), out};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(report[0]);
      close(hold[1]);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      if (setgid(kHogUid) != 0 || setuid(kHogUid) != 0) _exit(3);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(report[1]);
    close(hold[0]);
    hold_fd_ = hold[1];
    char buf[4096];
    for (ssize_t n; (n = read(report[0], buf, sizeof buf)) > 0;) ready_.append(buf, n);
    close(report[0]);
  }
  ~Hog() {
    close(hold_fd_);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  // "" once the hog holds its resource; else what went wrong there.
  std::string error() const {
    return ready_.rfind("ready:", 0) == 0 ? ready_.substr(6) : "the hog died: " + ready_;
  }

 private:
  pid_t pid_ = -1;
  int hold_fd_ = -1;
  std::string ready_;
};

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// The victim's round: Hello (connect), Reserve, Save, Wait and Load of a fresh world-1
// checkpoint, each timed; returns "" when every call succeeded within kVictimBoundMs.
std::string VictimRound(const Daemon& d, const std::string& job) {
  std::string err;
  std::string times;
  auto check = [&](const char* what, const absl::Status& st, double ms) {
    times += std::string(what) + " " + std::to_string(static_cast<int>(ms)) + " ms, ";
    if (!st.ok()) err += std::string(what) + ": " + st.ToString() + "; ";
    if (ms > kVictimBoundMs) err += std::string(what) + " took " + std::to_string(ms) + " ms; ";
  };
  auto t = std::chrono::steady_clock::now();
  ckptd::ClientOptions o;
  o.socket_path = d.socket();
  o.rpc_timeout_ms = 10000;
  o.connect_timeout_ms = 10000;
  o.reserve_timeout_ms = 10000;
  o.client_name = "victim";
  auto client = ckptd::Client::Connect(o);
  check("hello", client.status(), MsSince(t));
  if (!client.ok()) return err + times;
  t = std::chrono::steady_clock::now();
  auto buf = (*client)->Allocate(64 << 10);
  check("reserve", buf.status(), MsSince(t));
  if (buf.ok()) (void)(*client)->Release(*buf);
  std::vector<float> data(16384);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 977);
  ckptd::TensorShard shard;
  shard.item = "w";
  shard.global_shape = {data.size()};
  shard.region = ckptd::Region::Whole();
  shard.data = data.data();
  shard.bytes = data.size() * sizeof(float);
  t = std::chrono::steady_clock::now();
  auto saved = (*client)->Save(job, 1, 0, 1, std::span(&shard, 1));
  check("save", saved.status(), MsSince(t));
  t = std::chrono::steady_clock::now();
  const absl::Status waited = (*client)->WaitCommitted(job, 1, 10000);
  check("wait", waited, MsSince(t));
  std::vector<float> back(data.size());
  ckptd::LoadTarget target;
  target.item = "w";
  target.region = ckptd::Region::Whole();
  target.dest = back.data();
  target.bytes = back.size() * sizeof(float);
  t = std::chrono::steady_clock::now();
  const absl::Status loaded = (*client)->Load(job, 1, 0, std::span(&target, 1)).status();
  check("load", loaded, MsSince(t));
  if (back != data) err += "load: wrong bytes; ";
  // The victim's latencies, in the test's output (ctest -V, or the binary with -s).
  std::printf("fair share: %s: victim %s\n", job.c_str(), times.c_str());
  return err;
}

// Calls `fn` on `n` threads at once and leaves them running (detached: the hog process ends
// with them).
void OnThreads(int n, const std::function<void()>& fn) {
  for (int i = 0; i < n; ++i) std::thread(fn).detach();
}

// Reserve `bytes` within `timeout_ms`.
grpc::Status ReserveWithin(Raw& raw, uint64_t bytes, uint32_t timeout_ms) {
  v1::ReserveExtentsRequest req;
  req.set_session_id(raw.hello.session_id());
  req.add_sizes_bytes(bytes);
  req.set_timeout_ms(timeout_ms);
  v1::ReserveExtentsResponse resp;
  return raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReserveExtents(c, req, &resp); });
}

// Saves rank 0 of a world-2 checkpoint (so it stays open) of a [rows, 4] float32 tensor.
grpc::Status OpenCheckpoint(Raw& raw, const std::string& job, uint64_t step) {
  v1::Extent e = raw.Reserve(4096);
  v1::SaveRequest req = raw.SaveOf(job, step, 0, 2, "w", 256);
  req.mutable_shards(0)->mutable_data()->set_extent_id(e.id());
  req.mutable_shards(0)->mutable_data()->set_length(4096);
  return raw.Save(req);
}

// Opens `n` raw connections to the unix socket `path` and returns them (sending nothing).
std::vector<int> ConnectMany(const std::string& path, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      break;
    }
    fds.push_back(fd);
  }
  return fds;
}

bool Root() {
  if (geteuid() == 0) return true;
  WARN("not run: needs root to act as a second uid");
  return false;
}

constexpr int kItems = 100000;
constexpr int kItemSaves = 4;  // as many as the old daemon had RPC threads

// --- the hogs (each returns "" once it holds its resource, else what went wrong) -------------

// Takes all the arena it can, 1 MiB at a time (the old daemon: all 64 MiB), then queues more
// blocking reservations than the daemon has waiter threads.
std::string HogArena(const std::string& sock, const std::string&) {
  auto* raw = new Raw(sock);  // kept for the process's life
  raw->Attach();
  grpc::Status last;
  while ((last = ReserveWithin(*raw, 1 << 20, 300)).ok()) {
  }
  OnThreads(100, [raw] { (void)ReserveWithin(*raw, 1 << 20, 20000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // Past its share it is refused naming the limit and the uid.
  const std::string& why = last.error_message();
  if (why.find("uid 65534") == std::string::npos ||
      why.find("uid_arena_share_percent") == std::string::npos) {
    return "the hog's arena share was not enforced: " + why;
  }
  return "";
}

// Opens checkpoints until refused: 16 jobs of 16 make the global limit of 256 (the old daemon
// let one uid take all of them).
std::string HogOpenCheckpoints(const std::string& sock, const std::string&) {
  auto* raw = new Raw(sock);
  raw->Attach();
  std::string refused;
  for (int job = 0; job < 16 && refused.empty(); ++job) {
    for (uint64_t step = 1; step <= 16; ++step) {
      grpc::Status s = OpenCheckpoint(*raw, "hog-" + std::to_string(job), step);
      if (!s.ok()) {
        refused = s.error_message();
        break;
      }
    }
  }
  if (refused.find("uid 65534") == std::string::npos ||
      refused.find("kOpenCheckpointsMax") == std::string::npos) {
    return "the hog's share was not enforced: " + refused;
  }
  return "";
}

// More Waits than the daemon's waiters_max (64), each for 20 s on a checkpoint that never
// completes.
std::string HogWaits(const std::string& sock, const std::string&) {
  auto* raw = new Raw(sock);
  raw->Attach();
  grpc::Status opened = OpenCheckpoint(*raw, "hog-wait", 1);
  if (!opened.ok()) return "open: " + opened.error_message();
  OnThreads(150, [raw] {
    v1::WaitRequest w;
    w.set_job("hog-wait");
    w.set_step(1);
    w.set_timeout_ms(20000);
    v1::CheckpointStatus st;
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    (void)raw->stub->Wait(&c, w, &st);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  return "";
}

// Connections to the arena socket that never send their session id: each held a slot (of 64)
// for a second, and the rest queued in the backlog ahead of everyone else's.
std::string HogArenaSocket(const std::string& sock, const std::string&) {
  auto* fds = new std::vector<int>(ConnectMany(sock + ".arena", 450));
  if (fds->size() < 400) return "only " + std::to_string(fds->size()) + " connections";
  return "";
}

// Connections to the main socket, held.
std::string HogConnections(const std::string& sock, const std::string&) {
  auto* fds = new std::vector<int>(ConnectMany(sock, 400));
  if (fds->size() < 300) return "only " + std::to_string(fds->size()) + " connections";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  return "";
}

// kItemSaves Saves of kItems items at once, each on its own connection; each one's time (ms, or
// -1 for an error) is appended to `out` as "<i> <ms>" when it returns.
std::string HogItems(const std::string& sock, const std::string& out) {
  for (int i = 0; i < kItemSaves; ++i) {
    std::thread([sock, out, i] {
      int64_t ms = -1;
      try {
        Raw raw(sock);
        raw.Attach();
        // One extent holds the 16 bytes of every item (a [1, 4] float32 tensor each).
        v1::Extent e = raw.Reserve(uint64_t{kItems} * 16);
        v1::SaveRequest req;
        req.set_session_id(raw.hello.session_id());
        req.set_job("hog-items-" + std::to_string(i));
        req.set_step(1);
        req.set_rank(0);
        req.set_world_size(2);  // stays open: nothing is flushed
        for (int k = 0; k < kItems; ++k) {
          v1::ShardSpec* s = req.add_shards();
          s->set_item("model.layers." + std::to_string(k) + ".weight");
          s->mutable_tensor()->set_dtype(v1::FLOAT32);
          s->mutable_tensor()->add_global_shape(1);
          s->mutable_tensor()->add_global_shape(4);
          v1::MemRef* m = s->mutable_data();
          m->set_extent_id(e.id());
          m->set_offset(uint64_t{16} * k);
          m->set_length(16);
        }
        const auto t = std::chrono::steady_clock::now();
        v1::SaveResponse resp;
        grpc::ClientContext c;
        c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
        if (raw.stub->Save(&c, req, &resp).ok()) ms = static_cast<int64_t>(MsSince(t));
        std::FILE* f = std::fopen(out.c_str(), "a");
        if (f != nullptr) {
          std::fprintf(f, "%d %lld\n", i, static_cast<long long>(ms));
          std::fclose(f);
        }
        std::this_thread::sleep_for(std::chrono::hours(1));  // keeps its session
      } catch (const std::exception&) {
      }
    }).detach();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the saves are under way
  return "";
}

}  // namespace

// The hog process (main.cc): argv = exe --fair-share-hog NAME SOCKET REPORT_FD HOLD_FD [OUT].
int ckptd_it::FairShareHog(int argc, char** argv) {
  if (argc < 6) return 2;
  const std::string name = argv[2], sock = argv[3], out = argc > 6 ? argv[6] : "";
  const int report = std::atoi(argv[4]), hold = std::atoi(argv[5]);
  const std::map<std::string, std::string (*)(const std::string&, const std::string&)> hogs = {
      {"arena", HogArena},
      {"open", HogOpenCheckpoints},
      {"waits", HogWaits},
      {"arena-socket", HogArenaSocket},
      {"connections", HogConnections},
      {"items", HogItems}};
  std::string err = "unknown hog " + name;
  if (auto it = hogs.find(name); it != hogs.end()) {
    try {
      err = it->second(sock, out);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  err = "ready:" + err;
  (void)!write(report, err.data(), err.size());
  close(report);
  char c;
  (void)!read(hold, &c, 1);  // until the test closes its end
  _exit(0);
}

TEST_CASE("fair share: a uid holding its arena share and queuing reservations stalls no other",
          "[integration][tenancy]") {
  if (!Root()) return;
  Daemon d(SharedSocket({"--reserve_timeout_ms=20000"}));
  LetThroughTempDir(d);
  Hog hog("arena", d.socket());
  const std::string hog_err = hog.error();
  const std::string err = VictimRound(d, "victim-arena");
  INFO(d.Log());
  CHECK(hog_err == "");
  CHECK(err == "");
}

TEST_CASE("fair share: a uid holding every open checkpoint it may leaves room for another",
          "[integration][tenancy]") {
  if (!Root()) return;
  Daemon d(SharedSocket());
  LetThroughTempDir(d);
  Hog hog("open", d.socket());
  const std::string hog_err = hog.error();
  const std::string err = VictimRound(d, "victim-open");
  INFO(d.Log());
  CHECK(hog_err == "");
  CHECK(err == "");
}

TEST_CASE("fair share: a flood of Waits from one uid leaves another's Wait a thread",
          "[integration][tenancy]") {
  if (!Root()) return;
  Daemon d(SharedSocket());
  LetThroughTempDir(d);
  Hog hog("waits", d.socket());
  REQUIRE(hog.error() == "");
  const std::string err = VictimRound(d, "victim-wait");
  INFO(d.Log());
  CHECK(err == "");
}

TEST_CASE("fair share: a flood of the arena socket from one uid delays no other uid's exchange",
          "[integration][tenancy]") {
  if (!Root()) return;
  Daemon d(SharedSocket());
  LetThroughTempDir(d);
  Hog hog("arena-socket", d.socket());
  REQUIRE(hog.error() == "");
  const std::string err = VictimRound(d, "victim-arena-socket");
  INFO(d.Log());
  CHECK(err == "");
}

TEST_CASE("fair share: a flood of connections from one uid leaves descriptors for another",
          "[integration][tenancy]") {
  if (!Root()) return;
  // The daemon runs with 256 descriptors (set here, inherited by its process).
  rlimit saved{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = 256;
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::unique_ptr<Daemon> d;
  try {
    d = std::make_unique<Daemon>(SharedSocket());
  } catch (...) {
    setrlimit(RLIMIT_NOFILE, &saved);
    throw;
  }
  REQUIRE(setrlimit(RLIMIT_NOFILE, &saved) == 0);
  LetThroughTempDir(*d);
  Hog hog("connections", d->socket());
  REQUIRE(hog.error() == "");
  const std::string err = VictimRound(*d, "victim-connections");
  INFO(d->Log());
  CHECK(err == "");
  CHECK_THAT(d->Log(), Contains("uid 65534 has"));
}

TEST_CASE("fair share: 100,000-item saves of one uid stage in seconds and stall no other uid",
          "[integration][tenancy]") {
  if (!Root()) return;
  Daemon d(SharedSocket({"--flush_gate_ms=600000"}));
  LetThroughTempDir(d);
  // Where the hog writes each save's time (it runs as another uid).
  const std::string out = d.state_dir() + "/../hog-items.txt";
  {
    std::FILE* f = std::fopen(out.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
    REQUIRE(chmod(out.c_str(), 0666) == 0);
  }
  Hog hog("items", d.socket(), out);
  REQUIRE(hog.error() == "");
  const std::string err = VictimRound(d, "victim-items");
  CHECK(err == "");
  // Each 100,000-item save stages in seconds (it took about 3 minutes when validation was
  // quadratic).
  const auto started = std::chrono::steady_clock::now();
  std::string times;
  while (MsSince(started) < 60000) {
    times = ReadFile(out);
    if (std::count(times.begin(), times.end(), '\n') >= kItemSaves) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO("save times (save ms): " << times);
  INFO(d.Log());
  std::istringstream in(times);
  int saves = 0;
  for (int i = 0, ms = 0; in >> i >> ms; ++saves) {
    CHECK(ms >= 0);
    CHECK(ms < 30000);
  }
  CHECK(saves == kItemSaves);
}
