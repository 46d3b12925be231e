// The staging arena's mapping in this process: the descriptor fetched over the arena socket,
// mapped, optionally page-locked for CUDA (arena_mapping.h).
#include "arena_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "cuda_host.h"

namespace ckptd::internal {

namespace {

// What the arena socket grants: the segment's descriptor (the caller owns it), name and whether
// every page of it is resident. (The grant's generation is not needed: within one daemon
// instance a uid's segment never changes.)
struct ArenaGrant {
  int fd = -1;
  std::string name;
  bool resident = false;
};

// Connects to the daemon's arena socket, sends the session id and receives the grant.
absl::StatusOr<ArenaGrant> FetchArenaFd(const std::string& arena_socket,
                                        const std::string& session_id) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (arena_socket.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("arena socket path ", arena_socket, " is ",
                                                   arena_socket.size(), " bytes, longer than ",
                                                   sizeof addr.sun_path - 1));
  }
  std::memcpy(addr.sun_path, arena_socket.c_str(), arena_socket.size() + 1);
  int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return ErrnoStatus(errno, "socket(AF_UNIX)");
  auto fail = [sock](absl::Status st) {
    (void)close(sock);  // already failing
    return st;
  };
  timeval tv{5, 0};  // the daemon answers within its own 1 s limits
  if (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
    return fail(ErrnoStatus(errno, "setsockopt(SO_RCVTIMEO)"));
  }
  if (connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    return fail(absl::UnavailableError(
        absl::StrCat("connecting to the arena socket ", arena_socket, ": ", std::strerror(err))));
  }
  if (send(sock, session_id.data(), session_id.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(session_id.size()) ||
      shutdown(sock, SHUT_WR) != 0) {
    return fail(ErrnoStatus(errno, absl::StrCat("sending the session id to ", arena_socket)));
  }
  char reply[1100];
  iovec iov{reply, sizeof reply};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  if (n < 0) return fail(ErrnoStatus(errno, absl::StrCat("reading from ", arena_socket)));
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    }
  }
  (void)close(sock);  // the exchange is complete
  const bool truncated = (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
  if (n < 1 || truncated || (reply[0] == 0) != (fd >= 0) || reply[0] > 16) {
    if (fd >= 0) (void)close(fd);
    return absl::InternalError(
        absl::StrCat("malformed answer from the arena socket ", arena_socket));
  }
  const std::string text(reply + 1, static_cast<size_t>(n - 1));
  if (reply[0] != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply[0]),
                        absl::StrCat("the daemon refused the arena: ", text));
  }
  // "<name> <generation> <0|1>"
  ArenaGrant g;
  g.fd = fd;
  const size_t a = text.find(' ');
  const size_t b = a == std::string::npos ? a : text.find(' ', a + 1);
  if (b == std::string::npos || b + 2 != text.size() ||
      (text[b + 1] != '0' && text[b + 1] != '1')) {
    (void)close(fd);
    return absl::InternalError(
        absl::StrCat("malformed grant \"", text, "\" from the arena socket ", arena_socket));
  }
  g.name = text.substr(0, a);
  g.resident = text[b + 1] == '1';
  return g;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ArenaMapping>> ArenaMapping::Map(const std::string& arena_socket,
                                                                const std::string& session_id,
                                                                uint64_t bytes, bool pin_for_cuda) {
  if (bytes == 0) return absl::InternalError("daemon announced an empty staging arena");
  absl::StatusOr<ArenaGrant> got = FetchArenaFd(arena_socket, session_id);
  if (!got.ok()) return got.status();
  return MapFd(got->fd, got->name, bytes, got->resident, pin_for_cuda);
}

absl::StatusOr<std::shared_ptr<ArenaMapping>> ArenaMapping::MapFd(int fd,
                                                                  const std::string& shm_name,
                                                                  uint64_t bytes, bool populate,
                                                                  bool pin_for_cuda) {
  if (bytes == 0) {
    (void)close(fd);  // already failing
    return absl::InternalError("daemon announced an empty staging arena");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    (void)close(fd);  // already failing; the fstat error is the one to report
    return ErrnoStatus(err, absl::StrCat("fstat(", shm_name, ")"));
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < bytes) {
    (void)close(fd);
    return absl::InternalError(absl::StrCat("arena ", shm_name, " has ", st.st_size,
                                            " bytes, the daemon announced ", bytes));
  }
  // MAP_POPULATE when the daemon faulted the whole segment in: this maps its pages into this
  // process now, so the first save's copy does not take a page fault per 4 KiB (a stall of its
  // own). Not otherwise: populating would allocate the pages of ranges other uids hold.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  int mmap_err = errno;
  // The mapping keeps the object alive; the descriptor is not needed past mmap.
  if (close(fd) != 0 && base != MAP_FAILED) {
    int err = errno;
    (void)munmap(base, bytes);
    return ErrnoStatus(err, absl::StrCat("close(", shm_name, ")"));
  }
  if (base == MAP_FAILED) {
    return ErrnoStatus(mmap_err, absl::StrCat("mmap(", shm_name, ", ", bytes, " bytes)"));
  }
  std::shared_ptr<ArenaMapping> mapping(
      new ArenaMapping(shm_name, static_cast<uint8_t*>(base), bytes));
  if (pin_for_cuda) {
    absl::Status pinned = CudaHostRegister(base, bytes, absl::StrCat("arena ", shm_name));
    if (!pinned.ok()) return pinned;  // the mapping's destructor unmaps it
    mapping->pinned_for_cuda_ = true;
  }
  if (populate || pin_for_cuda) {
    absl::MutexLock lock(&mapping->mu_);
    mapping->populated_bytes_ = bytes;
  } else {
    mapping->StartPopulating();
  }
  return mapping;
}

void ArenaMapping::StartPopulating() {
  // CKPTD_ARENA_POPULATE=0 turns it off (bench/first_save_bench.py measures both ways).
  const char* env = std::getenv("CKPTD_ARENA_POPULATE");
  if (env != nullptr && std::string(env) == "0") return;
  creator_pid_ = getpid();
  populator_ = std::make_unique<std::thread>([this] { PopulateLoop(); });
}

uint64_t ArenaMapping::populated_bytes() const {
  absl::MutexLock lock(&mu_);
  return populated_bytes_;
}

void ArenaMapping::PopulateLoop() {
  constexpr uint64_t kChunkBytes = 2 << 20;
  constexpr absl::Duration kPass = absl::Milliseconds(20);
  constexpr absl::Duration kPopulateIdle = absl::Seconds(10);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<bool> done((bytes_ + kChunkBytes - 1) / kChunkBytes);
  std::vector<unsigned char> in_core(kChunkBytes / page);
  size_t left = done.size();
  absl::Time progressed = absl::Now();
  while (left > 0) {
    for (size_t c = 0; c < done.size(); ++c) {
      if (done[c]) continue;
      const uint64_t off = c * kChunkBytes, len = std::min(kChunkBytes, bytes_ - off);
      // mincore of a shared file mapping says whether the file has the page, mapped here or not.
      if (mincore(base_ + off, len, in_core.data()) != 0) return;  // unexpected: the copies fault
      const size_t pages = (len + page - 1) / page;
      if (!std::all_of(in_core.begin(), in_core.begin() + static_cast<ptrdiff_t>(pages),
                       [](unsigned char v) { return (v & 1) != 0; })) {
        continue;
      }
      // EINVAL: a kernel before 5.14 (no MADV_POPULATE_WRITE); the copies fault the pages.
      if (madvise(base_ + off, len, MADV_POPULATE_WRITE) != 0) return;
      done[c] = true;
      --left;
      progressed = absl::Now();
      absl::MutexLock lock(&mu_);
      populated_bytes_ += len;
      if (stop_) return;
    }
    absl::MutexLock lock(&mu_);
    if (left == 0 || absl::Now() - progressed > kPopulateIdle) return;
    stop_cv_.WaitWithTimeout(&mu_, kPass);
    if (stop_) return;
  }
}

ArenaMapping::~ArenaMapping() {
  if (populator_ != nullptr) {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      stop_cv_.SignalAll();
    }
    if (getpid() == creator_pid_) {
      populator_->join();
    } else {
      (void)populator_.release();  // a forked child: the thread is the parent's, not ours
    }
  }
  // Unpinned before unmapping: CUDA must not keep a registration of pages that are gone.
  if (pinned_for_cuda_) CudaHostUnregister(base_, absl::StrCat("arena ", name_));
  if (munmap(base_, bytes_) != 0) {
    // Nothing to return to; leaking the mapping is the only consequence.
    std::fprintf(stderr, "ckptd client: munmap(%s): %s\n", name_.c_str(), std::strerror(errno));
  }
}

absl::StatusOr<uint8_t*> ArenaMapping::At(uint64_t offset, uint64_t length) const {
  if (offset > bytes_ || length > bytes_ - offset) {
    return absl::InternalError(absl::StrCat("daemon named arena bytes [", offset, ", +", length,
                                            ") outside the ", bytes_, "-byte arena ", name_));
  }
  return base_ + offset;
}

}  // namespace ckptd::internal
