#include "harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "testclient/rank_io.h"

namespace ckptd_it {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void Throw(const std::string& what) { throw std::runtime_error(what); }

std::vector<char*> CArgv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const std::string& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// waitpid with a deadline; -1 on timeout.
int WaitPid(pid_t pid, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return DecodeStatus(status);
    if (r < 0) return -1;
    if (Clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// fork + exec with stdout/stderr on a pipe; returns the read end.
pid_t SpawnPiped(const std::vector<std::string>& argv, int* read_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) Throw(absl::StrCat("pipe: ", std::strerror(errno)));
  std::vector<char*> cargv = CArgv(argv);
  pid_t pid = fork();
  if (pid < 0) Throw(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a killed test process
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  *read_fd = fds[0];
  return pid;
}

}  // namespace

// --- files ----------------------------------------------------------------------------------

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void CopyTree(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

void CorruptArenaSegment(const Daemon& d) {
  const std::string path = "/dev/shm" + d.ArenaName();
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) throw std::runtime_error("opening " + path + ": " + std::strerror(errno));
  struct stat st {};
  const bool sized = fstat(fd, &st) == 0;
  std::vector<char> junk(1 << 20, 0x5A);
  bool written = sized;
  for (off_t off = 4096; written && off < st.st_size; off += static_cast<off_t>(junk.size())) {
    const size_t n = std::min<size_t>(junk.size(), static_cast<size_t>(st.st_size - off));
    written = pwrite(fd, junk.data(), n, off) == static_cast<ssize_t>(n);
  }
  close(fd);
  if (!written) throw std::runtime_error("overwriting " + path);
}

bool PathExists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

std::string StepDir(uint64_t step) { return absl::StrFormat("step-%020d", step); }

TempDir::TempDir() {
  char tmpl[] = "/tmp/ckptd-it-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Throw(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

// --- the daemon -----------------------------------------------------------------------------

Daemon::Daemon(DaemonConfig config) : config_(std::move(config)) {
  if (config_.state_dir.empty()) {
    owned_dir_ = std::make_unique<TempDir>();
    state_dir_ = owned_dir_->path() + "/state";
  } else {
    state_dir_ = config_.state_dir;
  }
  fs::create_directories(state_dir_);
  Start();
}

Daemon::~Daemon() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    WaitPid(pid_, 10000);
    pid_ = -1;
  }
  RemoveShmSegments();
}

std::string Daemon::data_dir() const {
  return config_.data_dir.empty() ? state_dir_ + "/data" : config_.data_dir;
}

std::string Daemon::Log() const { return ReadFile(log_path()); }

std::string Daemon::ArenaName() const {
  static const std::regex re("arena (/ckptd-[0-9a-f]+-arena-u[0-9]+-[0-9a-f]+)");
  std::string log = Log();
  std::string last;
  for (std::sregex_iterator it(log.begin(), log.end(), re), end; it != end; ++it) {
    last = (*it)[1];
  }
  return last;
}

void Daemon::RemoveShmSegments() {
  std::string arena = ArenaName();
  if (arena.empty()) return;
  // Everything with this daemon's prefix ("ckptd-xxxxxxxx-"), the arena included.
  std::string prefix = arena.substr(1, arena.rfind("arena-") - 1);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) shm_unlink(("/" + name).c_str());
  }
}

void Daemon::Start(bool wait_ready) {
  std::vector<std::string> argv = {CKPTD_BIN, "--state_dir=" + state_dir_,
                                   absl::StrCat("--staging_bytes_max=", config_.staging_bytes_max)};
  if (!config_.data_dir.empty()) argv.push_back("--data_dir=" + config_.data_dir);
  for (const std::string& f : config_.extra_flags) argv.push_back(f);
  std::vector<char*> cargv = CArgv(argv);
  const std::string log = log_path();
  {
    std::ofstream mark(log, std::ios::app);
    mark << "=== harness: starting";
    for (const std::string& a : argv) mark << " " << a;
    mark << "\n";
  }
  pid_t pid = fork();
  if (pid < 0) Throw(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a killed test process
    int fd = open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  pid_ = pid;
  if (wait_ready) WaitReady();
}

void Daemon::WaitReady() {
  auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string last;
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      Throw(absl::StrCat("ckptd exited with ", DecodeStatus(status), " before it was ready; log:\n",
                         Log()));
    }
    if (PathExists(socket())) {
      ckptd::ClientOptions o;
      o.socket_path = socket();
      o.connect_timeout_ms = 500;
      o.rpc_timeout_ms = 2000;
      auto c = ckptd::Client::Connect(o);
      if (c.ok()) return;
      last = c.status().ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Throw(absl::StrCat("ckptd not ready after 20 s (", last, "); log:\n", Log()));
}

bool Daemon::Stop(int timeout_ms) {
  if (pid_ <= 0) return true;
  kill(pid_, SIGTERM);
  int rc = WaitPid(pid_, timeout_ms);
  if (rc < 0) {
    std::ofstream(log_path(), std::ios::app)
        << "=== harness: no exit " << timeout_ms << " ms after SIGTERM: SIGKILL\n";
    kill(pid_, SIGKILL);
    WaitPid(pid_, 10000);
    pid_ = -1;
    return false;
  }
  pid_ = -1;
  return true;
}

void Daemon::Kill9() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitPid(pid_, 10000);
  pid_ = -1;
}

void Daemon::Restart(std::vector<std::string> extra_flags, bool wait_ready) {
  if (pid_ > 0 && !Stop()) {
    Throw(absl::StrCat("ckptd did not exit within 45 s of SIGTERM; log:\n", Log()));
  }
  config_.extra_flags = std::move(extra_flags);
  Start(wait_ready);
}

int Daemon::WaitExit(int timeout_ms) {
  if (pid_ <= 0) return -1;
  int rc = WaitPid(pid_, timeout_ms);
  if (rc >= 0) pid_ = -1;
  return rc;
}

std::unique_ptr<ckptd::Client> Daemon::Connect(int rpc_timeout_ms) const {
  ckptd::ClientOptions o;
  o.socket_path = socket();
  o.rpc_timeout_ms = rpc_timeout_ms;
  o.client_name = "integration-test";
  auto c = ckptd::Client::Connect(o);
  if (!c.ok()) Throw(absl::StrCat("Connect: ", c.status().ToString(), "; log:\n", Log()));
  return std::move(*c);
}

// --- child processes ------------------------------------------------------------------------

CommandResult RunCommand(const std::vector<std::string>& argv, int timeout_s) {
  CommandResult r;
  int fd = -1;
  pid_t pid = SpawnPiped(argv, &fd);
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) {
      kill(pid, SIGKILL);
      r.output += "\n[harness: killed after timeout]";
      break;
    }
    if (poll(&p, 1, left) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  r.exit_code = WaitPid(pid, 10000);
  return r;
}

CommandResult RunCtl(const Daemon& d, std::vector<std::string> args) {
  std::vector<std::string> argv = {CKPTCTL_BIN, "--socket", d.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

std::vector<std::string> TestClientArgs(const Daemon& d, const std::string& cmd,
                                        std::vector<std::string> args) {
  std::vector<std::string> argv = {CKPTD_TESTCLIENT_BIN, cmd, "--socket", d.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

CommandResult RunTestClient(const Daemon& d, const std::string& cmd,
                            std::vector<std::string> args) {
  return RunCommand(TestClientArgs(d, cmd, std::move(args)));
}

Child::Child(const std::vector<std::string>& argv) { pid_ = SpawnPiped(argv, &fd_); }

Child::~Child() {
  if (pid_ > 0 && status_ < 0) {
    kill(pid_, SIGKILL);
    WaitPid(pid_, 10000);
  }
  if (fd_ >= 0) close(fd_);
}

bool Child::WaitForLine(const std::string& prefix, int timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    // Complete lines not yet scanned.
    size_t nl;
    while ((nl = out_.find('\n', scanned_)) != std::string::npos) {
      std::string line = out_.substr(scanned_, nl - scanned_);
      scanned_ = nl + 1;
      if (line.rfind(prefix, 0) == 0) return true;
    }
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0 || fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) {
      close(fd_);
      fd_ = -1;
      continue;
    }
    out_.append(buf, static_cast<size_t>(n));
  }
}

int Child::Wait() {
  if (status_ >= 0) return status_;
  if (fd_ >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd_, buf, sizeof buf)) > 0) out_.append(buf, static_cast<size_t>(n));
    close(fd_);
    fd_ = -1;
  }
  status_ = WaitPid(pid_, 60000);
  return status_;
}

void Child::Kill9() {
  if (status_ >= 0) return;
  kill(pid_, SIGKILL);
  status_ = WaitPid(pid_, 10000);
}

std::vector<std::unique_ptr<Child>> SaveRanksConcurrently(const Daemon& d, const std::string& job,
                                                          uint64_t step, uint64_t seed, bool hold,
                                                          uint32_t world) {
  std::vector<std::unique_ptr<Child>> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    std::vector<std::string> args = {"--job",   job,
                                     "--step",  std::to_string(step),
                                     "--rank",  std::to_string(r),
                                     "--world", std::to_string(world),
                                     "--seed",  std::to_string(seed)};
    if (hold) args.push_back("--hold");
    ranks.push_back(std::make_unique<Child>(TestClientArgs(d, "save", args)));
  }
  for (uint32_t r = 0; r < world; ++r) {
    if (!ranks[r]->WaitForLine("staged", 30000)) {
      ranks[r]->Kill9();
      Throw(absl::StrCat("rank ", r, " of ", job, "/", step, " did not print staged; output:\n",
                         ranks[r]->output(), "\ndaemon log:\n", d.Log()));
    }
  }
  return ranks;
}

std::string VerifyInProcess(const Daemon& d, const std::string& job, uint64_t step, uint64_t seed,
                            const std::vector<std::string>& items) {
  auto client = d.Connect();
  absl::Status s = VerifyCheckpoint(*client, job, step, seed, items, 4, items.empty());
  return s.ok() ? "" : s.ToString();
}

void SaveCommitted(const Daemon& d, const std::string& job, uint64_t step, uint64_t seed) {
  auto client = d.Connect();
  for (uint32_t r = 0; r < 4; ++r) {
    auto res = SaveRank(*client, job, step, r, 4, seed);
    if (!res.ok()) Throw(absl::StrCat("save rank ", r, ": ", res.status().ToString()));
  }
  absl::Status s = client->WaitCommitted(job, step, 30000);
  if (!s.ok())
    Throw(absl::StrCat("WaitCommitted ", job, "/", step, ": ", s.ToString(), "; log:\n", d.Log()));
}

}  // namespace ckptd_it
