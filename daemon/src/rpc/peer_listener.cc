#include "rpc/peer_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<int> ListenUnix(const std::string& path, uint32_t mode, int64_t gid) {
  ListenOptions o{path, mode, gid};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (o.path.empty() || o.path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("socket path \"", o.path, "\" must be 1..",
                                                   sizeof addr.sun_path - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, o.path.c_str(), o.path.size() + 1);
  struct stat st;
  if (lstat(o.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(o.path, " exists and is not a socket; not removing it"));
    }
    if (unlink(o.path.c_str()) != 0) return ErrnoStatus(errno, absl::StrCat("unlink ", o.path));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket(AF_UNIX)");
  absl::Status err = absl::OkStatus();
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    err = ErrnoStatus(errno, absl::StrCat("bind ", o.path));
  } else if (chmod(o.path.c_str(), o.mode) != 0) {
    // The mode and group are set before listen(), so nobody connects through wider permissions.
    err = ErrnoStatus(errno, absl::StrCat("chmod ", o.path));
  } else if (o.gid >= 0 &&
             chown(o.path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(o.gid)) != 0) {
    err = ErrnoStatus(errno, absl::StrCat("chown ", o.path, " to gid ", o.gid));
  } else if (listen(fd, 512) != 0) {
    err = ErrnoStatus(errno, absl::StrCat("listen ", o.path));
  }
  if (!err.ok()) {
    close(fd);
    return err;
  }
  return fd;
}

absl::StatusOr<uint32_t> PeerUid(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoStatus(errno, "getsockopt(SO_PEERCRED)");
  }
  return cred.uid;
}

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(const ListenOptions& o) {
  CKPTD_ASSIGN_OR_RETURN(int fd, ListenUnix(o.path, o.mode, o.gid));
  std::unique_ptr<PeerListener> l(new PeerListener());
  l->options_ = o;
  l->listen_fd_ = fd;
  l->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (l->stop_fd_ < 0) return ErrnoStatus(errno, "eventfd");
  return l;
}

PeerListener::~PeerListener() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void PeerListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void PeerListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  CKPTD_CHECK(write(stop_fd_, &one, sizeof one) == sizeof one);
  thread_.join();
  unlink(options_.path.c_str());
}

Caller PeerListener::Identify(int fd) {
  Caller c;
  c.connection = next_connection_.fetch_add(1);
  ucred cred{};
  socklen_t len = sizeof cred;
  // Every AF_UNIX stream socket has peer credentials; a failure leaves uid "nobody"-like values
  // that own nothing.
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    c.uid = cred.uid;
    c.gid = cred.gid;
    c.pid = cred.pid;
  } else {
    c.uid = c.gid = static_cast<uint32_t>(-1);
  }
  c.admin = c.uid == 0 || (options_.admin_gid >= 0 && c.gid == options_.admin_gid);
  if (!c.admin && options_.admin_gid >= 0) {
    std::vector<gid_t> groups(256);
    socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) == 0) {
      for (size_t i = 0; i < glen / sizeof(gid_t); ++i) {
        c.admin |= groups[i] == static_cast<gid_t>(options_.admin_gid);
      }
    }
  }
  return c;
}

void PeerListener::AcceptLoop(grpc::Server* server) {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll on {}: {}", options_.path, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      spdlog::warn("accept on {}: {}; backing off", options_.path, std::strerror(errno));
      poll(&fds[1], 1, 100);  // out of descriptors: wait for connections to close
      continue;
    }
    Caller c = Identify(fd);
    {
      absl::MutexLock lock(&mu_);
      by_fd_[fd] = c;  // replaces the closed connection that had this number
    }
    spdlog::debug("connection {} from {} (fd {})", c.connection, DescribeCaller(c), fd);
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

absl::StatusOr<Caller> PeerListener::Lookup(const std::string& peer) const {
  int fd = -1;
  if (peer.rfind("fd:", 0) == 0 && absl::SimpleAtoi(peer.substr(3), &fd)) {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it != by_fd_.end()) return it->second;
  }
  return absl::PermissionDeniedError(
      absl::StrCat("connection \"", peer, "\" did not come through the daemon's socket"));
}

}  // namespace ckptd
