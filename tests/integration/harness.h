// Integration-test harness: runs the real ckptd binary on a private temp state dir and socket,
// and runs ckptctl / ckptd_testclient as child processes. Failures throw std::runtime_error
// (Catch reports the message, including the daemon's log where it helps).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckptd/client.h"

namespace ckptd_it {

// A unique directory /tmp/ckptd-it-XXXXXX (short: a unix socket path must fit in 107 bytes),
// removed with everything under it when destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct DaemonConfig {
  std::string state_dir;  // empty: a fresh temp dir owned by the Daemon
  std::string data_dir;   // empty: the daemon's default (<state_dir>/data)
  uint64_t staging_bytes_max = 64ull << 20;
  std::vector<std::string> extra_flags;  // "--name=value"
};

class Daemon {
 public:
  // Starts the daemon and waits until a client can connect (20 s).
  explicit Daemon(DaemonConfig config = {});
  // Kills it (SIGKILL), removes its shm segments and its temp dir.
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // SIGTERM and wait up to timeout_ms for exit; past it SIGKILL and false (log kept).
  bool Stop(int timeout_ms = 45000);
  void Kill9();  // SIGKILL and reap
  // Starts again on the same state dir with `extra_flags` replacing the previous extra flags.
  // With wait_ready false it returns once the process is started (a daemon expected to die
  // before it serves, e.g. at a crash point of recovery: see WaitExit).
  void Restart(std::vector<std::string> extra_flags, bool wait_ready = true);
  // Waits up to timeout_ms for the daemon to exit by itself (e.g. at its --debug_crash_at
  // point): its exit status (128 + signal when killed), or -1 when it is still running.
  int WaitExit(int timeout_ms);
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  const std::string& state_dir() const { return state_dir_; }
  std::string data_dir() const;
  std::string socket() const { return state_dir_ + "/ckptd.sock"; }
  std::string log_path() const { return state_dir_ + "/ckptd.log"; }
  std::string Log() const;
  // The newest staging arena segment the daemon logged ("/ckptd-xxxxxxxx-arena-u<uid>-..."; ""
  // before a client first connected).
  std::string ArenaName() const;

  std::unique_ptr<ckptd::Client> Connect(int rpc_timeout_ms = 30000) const;

 private:
  void Start(bool wait_ready = true);
  void WaitReady();
  void RemoveShmSegments();

  DaemonConfig config_;
  std::unique_ptr<TempDir> owned_dir_;
  std::string state_dir_;
  pid_t pid_ = -1;
  std::vector<std::string> shm_seen_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs argv[0] with the rest as arguments (no shell), collecting stdout+stderr.
CommandResult RunCommand(const std::vector<std::string>& argv, int timeout_s = 60);
CommandResult RunCtl(const Daemon& d, std::vector<std::string> args);
CommandResult RunTestClient(const Daemon& d, const std::string& cmd, std::vector<std::string> args);

// A child process whose stdout is read line by line (a rank saving in the background).
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv);
  ~Child();  // SIGKILL if still running
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // Reads output until a line starting with `prefix` appears; false on EOF or timeout.
  bool WaitForLine(const std::string& prefix, int timeout_ms);
  int Wait();  // exit status (128 + signal when killed)
  void Kill9();
  const std::string& output() const { return out_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string out_;
  size_t scanned_ = 0;
  int status_ = -1;
};

std::vector<std::string> TestClientArgs(const Daemon& d, const std::string& cmd,
                                        std::vector<std::string> args);

// 4 testclient ranks save (job, step) concurrently and wait until each printed "staged".
// Returns the children (still running when `hold`).
std::vector<std::unique_ptr<Child>> SaveRanksConcurrently(const Daemon& d, const std::string& job,
                                                          uint64_t step, uint64_t seed, bool hold,
                                                          uint32_t world = 4);

// Verifies the whole state dict of (job, step) with a fresh client in this process; "" if
// bit-exact, else the error.
std::string VerifyInProcess(const Daemon& d, const std::string& job, uint64_t step, uint64_t seed,
                            const std::vector<std::string>& items = {});

// Saves all 4 ranks of (job, step) from this process and waits for COMMITTED; throws on error.
void SaveCommitted(const Daemon& d, const std::string& job, uint64_t step, uint64_t seed);

std::string ReadFile(const std::string& path);
void CopyTree(const std::string& from, const std::string& to);
bool PathExists(const std::string& path);
// Overwrites every byte of `d`'s arena segment after its header page (the RAM tier's hot copies
// with them); throws when the segment cannot be opened or written.
void CorruptArenaSegment(const Daemon& d);
std::string StepDir(uint64_t step);  // "step-%020d"

// A POSIX shm object mapped here, removed when destroyed.
class Shm {
 public:
  explicit Shm(uint64_t bytes) : bytes_(bytes) {
    static std::atomic<int> next{0};
    name_ = "/ckptd-it-shm-" + std::to_string(getpid()) + "-" + std::to_string(next++);
    int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) throw std::runtime_error("shm_open " + name_);
    const bool sized = ftruncate(fd, static_cast<off_t>(bytes)) == 0;
    data_ = sized ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (data_ == MAP_FAILED) {
      shm_unlink(name_.c_str());
      throw std::runtime_error("sizing or mapping " + name_);
    }
  }
  ~Shm() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  Shm(const Shm&) = delete;
  Shm& operator=(const Shm&) = delete;
  const std::string& name() const { return name_; }
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace ckptd_it
