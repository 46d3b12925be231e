// Raw gRPC sessions for integration tests that send requests the client library would refuse
// (or that must control exactly which RPCs run), and POSIX shm objects the test owns.
#pragma once

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "ckptd/v1/ckptd.grpc.pb.h"
#include "harness.h"

namespace ckptd_it {

namespace v1 = ::ckptd::v1;

// A raw session: Hello, then hand-built requests.
struct Raw {
  explicit Raw(const Daemon& d) : Raw(d.socket()) {}
  explicit Raw(const std::string& socket) {
    // Its own connection (gRPC would share one among the process's channels, and a forked
    // child acting as another uid would reuse its parent's — with the parent's credentials).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stub = v1::Checkpoint::NewStub(
        grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args));
    v1::HelloRequest req;
    req.set_pid(static_cast<uint32_t>(getpid()));
    req.set_client_name("raw-test");
    grpc::Status s = Call([&](grpc::ClientContext* c) { return stub->Hello(c, req, &hello); });
    if (!s.ok()) throw std::runtime_error("Hello: " + s.error_message());
  }
  template <typename Fn>
  grpc::Status Call(Fn&& fn) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return fn(&c);
  }
  v1::Extent Reserve(uint64_t bytes) {
    v1::ReserveExtentsRequest req;
    req.set_session_id(hello.session_id());
    req.add_sizes_bytes(bytes);
    v1::ReserveExtentsResponse resp;
    grpc::Status s =
        Call([&](grpc::ClientContext* c) { return stub->ReserveExtents(c, req, &resp); });
    if (!s.ok() || resp.extents_size() != 1) {
      throw std::runtime_error("ReserveExtents: " + s.error_message());
    }
    return resp.extents(0);
  }
  // A float32 [rows, 4] tensor shard.
  v1::SaveRequest SaveOf(const std::string& job, uint64_t step, uint32_t rank, uint32_t world,
                         const std::string& item, uint64_t rows) {
    v1::SaveRequest req;
    req.set_session_id(hello.session_id());
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_world_size(world);
    v1::ShardSpec* s = req.add_shards();
    s->set_item(item);
    s->mutable_tensor()->set_dtype(v1::FLOAT32);
    s->mutable_tensor()->add_global_shape(rows);
    s->mutable_tensor()->add_global_shape(4);
    return req;
  }
  grpc::Status Save(const v1::SaveRequest& req) {
    v1::SaveResponse resp;
    return Call([&](grpc::ClientContext* c) { return stub->Save(c, req, &resp); });
  }
  // Opens the session's Attach stream (the session then lives until Detach or the channel
  // closes) and waits for its first event.
  void Attach() {
    attach_ctx = std::make_unique<grpc::ClientContext>();
    v1::AttachRequest req;
    req.set_session_id(hello.session_id());
    attach = stub->Attach(attach_ctx.get(), req);
    v1::SessionEvent ev;
    if (!attach->Read(&ev) || !ev.attached()) throw std::runtime_error("Attach failed");
  }
  void Detach() {
    if (attach_ctx == nullptr) return;
    attach_ctx->TryCancel();
    v1::SessionEvent ev;
    while (attach->Read(&ev)) {
    }
    (void)attach->Finish();
    attach.reset();
    attach_ctx.reset();
  }
  ~Raw() { Detach(); }
  std::unique_ptr<v1::Checkpoint::Stub> stub;
  v1::HelloResponse hello;
  std::unique_ptr<grpc::ClientContext> attach_ctx;
  std::unique_ptr<grpc::ClientReader<v1::SessionEvent>> attach;
};

// One exchange with the daemon's arena socket (`socket` + ".arena"), as a client that may lie:
// sends `request` and returns the status byte, the message and the descriptor received (-1 if
// none; the caller closes it). status -1: the socket could not be reached or answered nothing.
struct ArenaAnswer {
  int status = -1;
  std::string message;  // on OK: "<segment name> <generation> <0|1: fully resident>"
  int fd = -1;
  std::string segment() const { return message.substr(0, message.find(' ')); }
  bool resident() const { return !message.empty() && message.back() == '1'; }
};
inline ArenaAnswer AskArena(const std::string& socket, const std::string& request,
                            bool send_and_shutdown = true) {
  ArenaAnswer a;
  const std::string path = socket + ".arena";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (s >= 0) close(s);
    return a;
  }
  if (send_and_shutdown) {
    (void)!send(s, request.data(), request.size(), MSG_NOSIGNAL);
    shutdown(s, SHUT_WR);
  }
  char buf[2048];
  iovec iov{buf, sizeof buf};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  ssize_t n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
  close(s);
  if (n < 1) return a;
  a.status = buf[0];
  a.message.assign(buf + 1, static_cast<size_t>(n - 1));
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_type == SCM_RIGHTS) std::memcpy(&a.fd, CMSG_DATA(c), sizeof(int));
  }
  return a;
}

// A POSIX shm object of `bytes` the test owns.
struct TestShm {
  explicit TestShm(uint64_t bytes, const std::string& tag = "region") {
    name = "/ckptd-it-" + std::to_string(getpid()) + "-" + tag;
    int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    close(fd);
  }
  ~TestShm() { shm_unlink(name.c_str()); }
  std::string name;
};

}  // namespace ckptd_it
