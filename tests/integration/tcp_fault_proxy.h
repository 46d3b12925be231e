// A TCP proxy with faults, for the peer channel's tests (docs/PEERS.md "Failures between peers"):
// it listens on 127.0.0.1 and forwards each connection to a target port (a daemon's peer
// listener), and on command resets the connections, slows the link (a bandwidth cap and a delay)
// or stalls it (stops forwarding without closing: no FIN, no RST, the bytes stay in the sockets'
// buffers). Placed between two daemons by advertising its address as one daemon's peer address
// (peer_advertise_addr), or in-process between a peer client and a peer server
// (tests/unit/peer/peer_channel_test.cc).
//
// Who owns what: the proxy owns its listening socket, its accept thread, and per connection both
// sockets and one pump thread; all end with the proxy (its destructor closes every socket and
// joins every thread) or, for one connection, when either side closes or a reset ends it. When a
// side dies the proxy closes the other (a FIN, or an RST after a reset); a stalled connection
// stays open until the stall is lifted, the proxy resets it, or the proxy ends.
//
// Buffers: each proxied socket's kernel buffers are kept small (SO_RCVBUF, SO_SNDBUF) so that a
// stall or a slow link pushes back on the sender within about a hundred KiB, as a real slow hop
// would, instead of hiding megabytes in the proxy's sockets.
//
// Thread safety: every method from any thread.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckptd_it {

class TcpFaultProxy {
 public:
  // Forwards 127.0.0.1:port() to 127.0.0.1:target_port.
  explicit TcpFaultProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) throw std::runtime_error("tcp proxy: socket");
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof a;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listen_fd_, 64) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(listen_fd_);
      throw std::runtime_error("tcp proxy: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpFaultProxy() {
    stopping_ = true;
    acceptor_.join();
    std::list<std::unique_ptr<Conn>> conns;
    {
      absl::MutexLock lock(&mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) c->pump.join();  // each sees stopping_ and closes its sockets
    close(listen_fd_);
  }
  TcpFaultProxy(const TcpFaultProxy&) = delete;
  TcpFaultProxy& operator=(const TcpFaultProxy&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  // Bytes per second forwarded per connection and direction (0: no cap).
  void SetBandwidth(uint64_t bytes_per_s) { bandwidth_ = bytes_per_s; }
  // A delay before each forwarded read (a long link's latency, per hop).
  void SetDelay(std::chrono::milliseconds delay) { delay_ms_ = delay.count(); }
  // Stops (true) or resumes (false) forwarding on every connection, new ones included; the
  // sockets stay open.
  void Stall(bool on) { stalled_ = on; }
  // Stalls once `bytes` more bytes went towards the target (counted over every connection).
  void StallAfter(uint64_t bytes) { ArmAfter(bytes, Arm::kStall); }
  // Resets every connection (RST both ways) once `bytes` more bytes went towards the target; once.
  void ResetAfter(uint64_t bytes) { ArmAfter(bytes, Arm::kReset); }
  // Resets every open connection now.
  void ResetAll() { ++reset_epoch_; }
  // Forgets a StallAfter or ResetAfter that has not fired.
  void Disarm() { ArmAfter(0, Arm::kNone); }

  uint64_t connections() const { return accepted_; }
  uint64_t resets() const { return resets_; }
  uint64_t bytes_up() {
    absl::MutexLock lock(&mu_);
    return bytes_up_;
  }

 private:
  enum class Arm { kNone, kStall, kReset };
  struct Conn {
    int client = -1;
    int target = -1;
    std::thread pump;
  };

  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }
  static void SmallBuffers(int fd) {
    const int bytes = 64 * 1024;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  // Closes with an RST (linger 0) when `reset`, else with a FIN.
  static void Close(int fd, bool reset) {
    if (fd < 0) return;
    if (reset) {
      const linger l{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(fd);
  }

  void ArmAfter(uint64_t bytes, Arm what) {
    absl::MutexLock lock(&mu_);
    arm_at_ = bytes_up_ + bytes;
    arm_ = what;
  }
  // Counts `n` bytes sent towards the target and fires an armed fault whose count is reached.
  void CountUp(uint64_t n) {
    absl::MutexLock lock(&mu_);
    bytes_up_ += n;
    if (arm_ != Arm::kNone && bytes_up_ >= arm_at_) {
      if (arm_ == Arm::kStall) stalled_ = true;
      if (arm_ == Arm::kReset) ++reset_epoch_;
      arm_ = Arm::kNone;
    }
  }

  void AcceptLoop() {
    while (!stopping_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      SmallBuffers(c);
      if (t >= 0) SmallBuffers(t);
      sockaddr_in a = Loopback(target_port_);
      if (t < 0 || connect(t, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        Close(t, false);
        Close(c, true);
        continue;
      }
      ++accepted_;
      absl::MutexLock lock(&mu_);
      auto conn = std::make_unique<Conn>();
      conn->client = c;
      conn->target = t;
      Conn* raw = conn.get();
      conn->pump = std::thread([this, raw] { Pump(raw); });
      conns_.push_back(std::move(conn));
    }
  }

  // Forwards one direction's readable bytes (at most one buffer); false when that side closed.
  bool Forward(int from, int to, bool up) {
    char buf[16 * 1024];
    const ssize_t n = recv(from, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (const int64_t d = delay_ms_.load(); d > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(d));
    }
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t w = send(to, buf + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      sent += w;
    }
    if (up) CountUp(static_cast<uint64_t>(n));
    if (const uint64_t bw = bandwidth_.load(); bw > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(n) * 1'000'000 /
                                                            static_cast<int64_t>(bw)));
    }
    return true;
  }

  void Pump(Conn* c) {
    const uint64_t epoch = reset_epoch_;
    bool reset = false;
    while (!stopping_) {
      if (reset_epoch_ != epoch) {
        reset = true;
        ++resets_;
        break;
      }
      if (stalled_) {  // nothing read: the senders' buffers fill and they block
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      pollfd p[2] = {{c->client, POLLIN, 0}, {c->target, POLLIN, 0}};
      if (poll(p, 2, 20) <= 0) continue;
      if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && !Forward(c->client, c->target, true)) {
        break;
      }
      if ((p[1].revents & (POLLIN | POLLHUP | POLLERR)) && !Forward(c->target, c->client, false)) {
        break;
      }
    }
    Close(c->client, reset || stopping_);
    Close(c->target, reset || stopping_);
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stalled_{false};
  std::atomic<uint64_t> bandwidth_{0};
  std::atomic<int64_t> delay_ms_{0};
  std::atomic<uint64_t> reset_epoch_{0};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> resets_{0};
  absl::Mutex mu_;
  uint64_t bytes_up_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arm_at_ ABSL_GUARDED_BY(mu_) = 0;
  Arm arm_ ABSL_GUARDED_BY(mu_) = Arm::kNone;
  std::list<std::unique_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;  // last: started once every member it reads is built
};

}  // namespace ckptd_it
