#include "rpc/arena_fd_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "rpc/peer_listener.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<std::unique_ptr<ArenaFdServer>> ArenaFdServer::Listen(const std::string& path,
                                                                     uint32_t mode, int64_t gid,
                                                                     LookupFn lookup) {
  CKPTD_ASSIGN_OR_RETURN(int fd, ListenUnix(path, mode, gid));
  std::unique_ptr<ArenaFdServer> s(new ArenaFdServer());
  s->path_ = path;
  s->lookup_ = std::move(lookup);
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
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on {}: {}", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    // Blocking, with timeouts: one exchange at a time, each bounded (see the header).
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      spdlog::warn("accept on {}: {}; backing off", path_, std::strerror(errno));
      poll(&fds[1], 1, 100);
      continue;
    }
    Serve(fd);
    close(fd);
  }
}

namespace {

// Reads the request: at most `max` bytes, until the client shuts down its side.
absl::StatusOr<std::string> ReadRequest(int fd, size_t max) {
  std::string req;
  char buf[256];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        return absl::DeadlineExceededError("the client sent no complete session id in time");
      }
      return ErrnoStatus(errno, "reading the session id");
    }
    if (n == 0) return req;
    req.append(buf, static_cast<size_t>(n));
    if (req.size() > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("a session id has at most ", max, " bytes"));
    }
  }
}

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

void ArenaFdServer::Serve(int fd) {
  timeval tv{kIoTimeoutMs / 1000, (kIoTimeoutMs % 1000) * 1000};
  absl::StatusOr<uint32_t> uid = PeerUid(fd);
  if (!uid.ok() || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    spdlog::warn("arena socket: dropping a connection: {}",
                 uid.ok() ? std::strerror(errno) : uid.status().ToString());
    return;
  }
  absl::StatusOr<std::string> session = ReadRequest(fd, kSessionIdBytesMax);
  if (!session.ok()) {
    Reply(fd, session.status(), "", -1);
    return;
  }
  absl::StatusOr<ArenaGrant> g = lookup_(*uid, *session);
  if (!g.ok()) {
    spdlog::debug("arena socket: uid {}: {}", *uid, g.status().ToString());
    Reply(fd, g.status(), "", -1);
    return;
  }
  Reply(fd, absl::OkStatus(), absl::StrCat(g->name, " ", g->generation, " ", g->resident ? 1 : 0),
        g->fd);
}

}  // namespace ckptd
