#include "rpc/arena_fd_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "rpc/peer_listener.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<std::unique_ptr<ArenaFdServer>> ArenaFdServer::Listen(const std::string& path,
                                                                     uint32_t mode, int64_t gid,
                                                                     LookupFn lookup,
                                                                     size_t uid_connections_max) {
  CKPTD_ASSIGN_OR_RETURN(int fd, ListenUnix(path, mode, gid));
  std::unique_ptr<ArenaFdServer> s(new ArenaFdServer());
  s->path_ = path;
  s->lookup_ = std::move(lookup);
  s->uid_connections_max_ = std::clamp<size_t>(uid_connections_max, 1, kConnectionsMax);
  s->listen_fd_ = fd;
  s->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) return ErrnoStatus(errno, "eventfd");
  return s;
}

ArenaFdServer::~ArenaFdServer() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void ArenaFdServer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ArenaFdServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  CKPTD_CHECK(write(stop_fd_, &one, sizeof one) == sizeof one);
  thread_.join();
  unlink(path_.c_str());
}

void ArenaFdServer::Loop() {
  std::vector<Conn> conns;
  while (true) {
    // The listening socket, the stop event, then every connection waiting for its request.
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (conns.size() >= kConnectionsMax) fds[0].events = 0;  // full: let them queue
    auto now = std::chrono::steady_clock::now();
    int timeout_ms = -1;
    for (const Conn& c : conns) {
      fds.push_back({c.fd, POLLIN, 0});
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(c.deadline - now);
      int ms = static_cast<int>(std::max<int64_t>(left.count(), 0));
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on {}: {}", path_, std::strerror(errno));
      break;
    }
    if (fds[1].revents != 0) break;
    const size_t polled = conns.size();  // fds[2 + i] is conns[i] for i < polled
    if (fds[0].revents != 0) Accept(&conns);
    now = std::chrono::steady_clock::now();
    std::vector<Conn> open;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const bool ready = i < polled && fds[2 + i].revents != 0;
      if ((ready && !ReadMore(c)) || (!ready && now >= c.deadline && Expire(c))) {
        close(c.fd);
      } else {
        open.push_back(std::move(c));
      }
    }
    conns = std::move(open);
  }
  for (const Conn& c : conns) close(c.fd);
}

namespace {
void Reply(int fd, const absl::Status& st, const std::string& text, int attach_fd);
}  // namespace

void ArenaFdServer::Accept(std::vector<Conn>* conns) {
  int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
      spdlog::warn("accept on {}: {}", path_, std::strerror(errno));
    }
    return;
  }
  absl::StatusOr<uint32_t> uid = PeerUid(fd);
  if (!uid.ok()) {
    spdlog::warn("arena socket: dropping a connection: {}", uid.status().ToString());
    close(fd);
    return;
  }
  const size_t mine = static_cast<size_t>(
      std::count_if(conns->begin(), conns->end(), [&](const Conn& c) { return c.uid == *uid; }));
  if (mine >= uid_connections_max_) {
    Reply(fd,
          absl::ResourceExhaustedError(absl::StrCat(
              "uid ", *uid, " has ", mine, " exchanges in progress on ", path_, "; its share is ",
              uid_connections_max_, " (uid_share_percent of ", kConnectionsMax, "); retry later")),
          "", -1);
    close(fd);
    return;
  }
  conns->push_back(Conn{
      fd, *uid, "", std::chrono::steady_clock::now() + std::chrono::milliseconds(kIoTimeoutMs)});
}

namespace {

void Reply(int fd, const absl::Status& st, const std::string& text, int attach_fd) {
  std::string msg(1, static_cast<char>(st.code()));
  if (st.ok()) {
    msg.append(text);
  } else {
    msg.append(std::string(st.message().substr(0, 1024)));
  }
  iovec iov{msg.data(), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (attach_fd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &attach_fd, sizeof(int));
  }
  if (sendmsg(fd, &mh, MSG_NOSIGNAL) < 0) {
    spdlog::debug("arena socket: reply not sent: {}", std::strerror(errno));
  }
}

}  // namespace

bool ArenaFdServer::ReadMore(Conn& c) {
  char buf[256];
  while (true) {
    ssize_t n = recv(c.fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return true;  // more to come
      return false;                      // the client went away
    }
    if (n == 0) {  // the client shut down its side: the request is complete
      Answer(c);
      return false;
    }
    c.request.append(buf, static_cast<size_t>(n));
    if (c.request.size() > kSessionIdBytesMax) {
      Reply(c.fd,
            absl::InvalidArgumentError(
                absl::StrCat("a session id has at most ", kSessionIdBytesMax, " bytes")),
            "", -1);
      return false;
    }
  }
}

bool ArenaFdServer::Expire(Conn& c) {
  Reply(c.fd,
        absl::DeadlineExceededError(
            absl::StrCat("no complete session id within ", kIoTimeoutMs, " ms")),
        "", -1);
  return true;
}

void ArenaFdServer::Answer(const Conn& c) {
  absl::StatusOr<ArenaGrant> g = lookup_(c.uid, c.request);
  if (!g.ok()) {
    spdlog::debug("arena socket: uid {}: {}", c.uid, g.status().ToString());
    Reply(c.fd, g.status(), "", -1);
    return;
  }
  Reply(c.fd, absl::OkStatus(), absl::StrCat(g->name, " ", g->generation, " ", g->resident ? 1 : 0),
        g->fd);
}

}  // namespace ckptd
