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

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
    if (absl::Status admitted = Admit(fd, c); !admitted.ok()) {
      close(fd);
      continue;
    }
    spdlog::debug("connection {} from {} (fd {})", c.connection, DescribeCaller(c), fd);
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

namespace {

// The inode of socket `fd`, 0 when it is not an open socket.
uint64_t SocketInode(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

}  // namespace

void PeerListener::PruneLocked() {
  absl::erase_if(by_fd_, [](const auto& entry) {
    const uint64_t ino = SocketInode(entry.first);
    return ino == 0 || ino != entry.second.ino;
  });
}

absl::Status PeerListener::Admit(int fd, const Caller& c) {
  const uint64_t ino = SocketInode(fd);
  absl::MutexLock lock(&mu_);
  by_fd_.erase(fd);  // the closed connection that had this number: no call of it is left
  auto count_uid = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t n = 0;
    for (const auto& [other_fd, conn] : by_fd_) n += conn.caller.uid == c.uid;
    return n;
  };
  uint64_t mine = count_uid();
  if (mine >= options_.uid_connections_max || by_fd_.size() >= options_.connections_max) {
    PruneLocked();
    mine = count_uid();
  }
  absl::Status refused = absl::OkStatus();
  if (mine >= options_.uid_connections_max) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "uid ", c.uid, " has ", mine, " connections open on ", options_.path, "; its share is ",
        options_.uid_connections_max, " (uid_share_percent of connections_max): connection ",
        c.connection, " (pid ", c.pid, ") closed"));
  } else if (by_fd_.size() >= options_.connections_max) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        by_fd_.size(), " connections are open on ", options_.path, " (connections_max): uid ",
        c.uid, "'s connection ", c.connection, " (pid ", c.pid, ") closed"));
  }
  if (!refused.ok()) {
    // A flood is logged once a second, not once a connection.
    const int64_t now_s = absl::ToUnixSeconds(absl::Now());
    if (now_s != last_refusal_log_s_) {
      spdlog::warn("{} ({} more refused since the last such message)", refused.ToString(),
                   refusals_unlogged_);
      last_refusal_log_s_ = now_s;
      refusals_unlogged_ = 0;
    } else {
      ++refusals_unlogged_;
    }
    return refused;
  }
  by_fd_[fd] = Conn{c, ino};
  return absl::OkStatus();
}

absl::StatusOr<Caller> PeerListener::Lookup(const std::string& peer) const {
  int fd = -1;
  if (peer.rfind("fd:", 0) == 0 && absl::SimpleAtoi(peer.substr(3), &fd)) {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it != by_fd_.end()) return it->second.caller;
  }
  return absl::PermissionDeniedError(
      absl::StrCat("connection \"", peer, "\" did not come through the daemon's socket"));
}

}  // namespace ckptd
