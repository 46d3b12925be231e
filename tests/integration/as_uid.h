// A child process of the integration tests that runs as another uid: this binary, forked and
// exec'd as `exe --as-uid-child NAME GATE_FD RESULT_FD ARGS...` (main.cc calls RunChild), which
// runs the body registered under NAME (CKPTD_AS_UID_CHILD). Exec'd, never only forked: the test
// process runs gRPC's threads, and a forked copy of a multi-threaded process may find a lock held
// by a thread that does not exist in it (malloc's, gRPC's executor's) and hang for ever (a forked
// tenancy child hung CI for 900 s). Between fork and exec the child makes only async-signal-safe
// calls on memory prepared before the fork.
//
// Owner: the test that constructs it. Its end: Finish() (or the destructor, which kills it). The
// child's own alarm ends it if it hangs, so a hang is a failure, not a timeout of the suite.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace ckptd_it {

// A body a child runs: its arguments and the gate's descriptor (-1 without a gate; read it to
// EOF to wait for the parent); returns its report ("" when all went as expected).
using ChildBody = std::string (*)(const std::vector<std::string>& args, int gate_fd);

inline std::map<std::string, ChildBody>& ChildBodies() {
  static std::map<std::string, ChildBody> bodies;
  return bodies;
}
inline bool RegisterChild(const char* name, ChildBody body) {
  ChildBodies()[name] = body;
  return true;
}
// Registers `body` (a function of ChildBody's type) as the child body `name`.
#define CKPTD_AS_UID_CHILD(name, body) \
  [[maybe_unused]] static const bool kChildRegistered_##body = ::ckptd_it::RegisterChild(name, body)

// The exec'd child: argv = exe --as-uid-child NAME GATE_FD RESULT_FD ARGS...
inline int RunChild(int argc, char** argv) {
  alarm(120);  // a hang is a failure the parent reports, never the suite's timeout
  if (argc < 5) return 2;
  const int gate_fd = std::atoi(argv[3]);
  const int result_fd = std::atoi(argv[4]);
  std::string out;
  auto it = ChildBodies().find(argv[2]);
  if (it == ChildBodies().end()) {
    out = std::string("no child body named ") + argv[2];
  } else {
    try {
      out = it->second(std::vector<std::string>(argv + 5, argv + argc), gate_fd);
    } catch (const std::exception& e) {
      out = e.what();
    }
  }
  (void)!write(result_fd, out.data(), out.size());
  return 0;
}

// A gate several children wait at, opened at once by the parent: every child holds only the
// read end (the write end is close-on-exec), so the parent's close of the write end is the last
// and all children see EOF together.
class Gate {
 public:
  Gate() {
    if (pipe2(fds_, O_CLOEXEC) != 0) throw std::runtime_error("pipe for the gate failed");
  }
  ~Gate() {
    Open();
    close(fds_[0]);
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  void Open() {
    if (fds_[1] >= 0) close(fds_[1]);
    fds_[1] = -1;
  }
  int read_fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
};

// Runs the child body `name` with `args` as `uid` (gid `gid`) and collects its report.
class ExecAsUid {
 public:
  ExecAsUid(uint32_t uid, uint32_t gid, const std::string& name,
            const std::vector<std::string>& args, const Gate* gate = nullptr) {
    int result[2];
    if (pipe(result) != 0) throw std::runtime_error("pipe for the result failed");
    const int gate_fd = gate != nullptr ? gate->read_fd() : -1;
    if (gate_fd >= 0) fcntl(gate_fd, F_SETFD, 0);  // inherited by the exec'd child
    // Everything the child needs is built here, before the fork.
    std::vector<std::string> all = {"/proc/self/exe", "--as-uid-child", name,
                                    std::to_string(gate_fd), std::to_string(result[1])};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    static const char kSetuidFailed[] = "setuid failed";
    static const char kExecFailed[] = "exec failed";
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      close(result[0]);
      if (setgid(gid) != 0 || setuid(uid) != 0) {
        (void)!write(result[1], kSetuidFailed, sizeof kSetuidFailed - 1);
        _exit(3);
      }
      execv(argv[0], argv.data());
      (void)!write(result[1], kExecFailed, sizeof kExecFailed - 1);
      _exit(127);
    }
    if (gate_fd >= 0) fcntl(gate_fd, F_SETFD, FD_CLOEXEC);
    close(result[1]);
    result_fd_ = result[0];
  }
  ~ExecAsUid() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      Finish();
    }
  }
  ExecAsUid(const ExecAsUid&) = delete;
  ExecAsUid& operator=(const ExecAsUid&) = delete;

  // What the child reported; a child that died reports that too.
  std::string Finish() {
    std::string out;
    char buf[512];
    for (ssize_t n; (n = read(result_fd_, buf, sizeof buf)) > 0;) out.append(buf, n);
    close(result_fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (WIFSIGNALED(status)) {
      out += "the child was killed by signal " + std::to_string(WTERMSIG(status)) +
             (WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
    } else if (out.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      out = "the child exited " + std::to_string(WEXITSTATUS(status));
    }
    return out;
  }

 private:
  pid_t pid_ = -1;
  int result_fd_ = -1;
};

}  // namespace ckptd_it
