// Save staging time against the number of items (issue 33 §2: validation was quadratic in items x
// shards; a Save of 100,000 items took about 3 minutes to stage). Starts its own daemon, then for
// each item count saves rank 0 of a world-2 checkpoint (so nothing is flushed meanwhile) whose
// items are [1, 4] float32 tensors, all in one arena extent, and times the Save RPC: the daemon's
// validation, extent take-over and synced journal write, which is what the trainer waits for.
//
//   ckptd_bench_save_validate --daemon build/ckptd [--items 1000,100000] [--reps 3]
//
// Prints one JSON object per save and a summary: the median time per item at each count and the
// ratio of the largest count's per-item time to the smallest's (1.0: linear).
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ckptd/v1/ckptd.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace {

namespace v1 = ckptd::v1;

struct Config {
  std::string daemon = "build/ckptd";
  std::vector<uint64_t> items = {1000, 100000};
  int reps = 3;
};

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "save_validate_bench: %s\n", why.c_str());
  std::exit(1);
}

bool Connectable(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

pid_t StartDaemon(const Config& c, const std::string& dir) {
  pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    const std::string log = dir + "/ckptd.log";
    if (std::freopen(log.c_str(), "w", stdout) == nullptr) _exit(126);
    dup2(fileno(stdout), fileno(stderr));
    std::vector<std::string> args = {c.daemon, "--state_dir=" + dir,
                                     "--staging_bytes_max=268435456", "--flush_gate_ms=600000",
                                     "--staging_prefault=false"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const std::string sock = dir + "/ckptd.sock";
  for (int i = 0; i < 400 && !Connectable(sock); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!Connectable(sock)) Die("the daemon did not start; see " + dir + "/ckptd.log");
  return pid;
}

// The Save RPC of `items` items, in milliseconds.
double TimeSave(v1::Checkpoint::Stub& stub, const std::string& session, uint64_t items,
                const std::string& job) {
  v1::ReserveExtentsRequest rr;
  rr.set_session_id(session);
  rr.add_sizes_bytes(items * 16);
  v1::ReserveExtentsResponse rresp;
  grpc::ClientContext rc;
  if (grpc::Status s = stub.ReserveExtents(&rc, rr, &rresp); !s.ok()) {
    Die("ReserveExtents: " + s.error_message());
  }
  v1::SaveRequest req;
  req.set_session_id(session);
  req.set_job(job);
  req.set_step(1);
  req.set_rank(0);
  req.set_world_size(2);
  for (uint64_t k = 0; k < items; ++k) {
    v1::ShardSpec* s = req.add_shards();
    s->set_item("model.layers." + std::to_string(k) + ".mlp.weight");
    s->mutable_tensor()->set_dtype(v1::FLOAT32);
    s->mutable_tensor()->add_global_shape(1);
    s->mutable_tensor()->add_global_shape(4);
    v1::MemRef* m = s->mutable_data();
    m->set_extent_id(rresp.extents(0).id());
    m->set_offset(16 * k);
    m->set_length(16);
  }
  v1::SaveResponse resp;
  grpc::ClientContext c;
  const auto t = std::chrono::steady_clock::now();
  grpc::Status s = stub.Save(&c, req, &resp);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  if (!s.ok()) Die("Save of " + std::to_string(items) + " items: " + s.error_message());
  // Aborted so the next save has the arena and the open-checkpoint limits to itself.
  v1::AbortRequest ar;
  ar.set_job(job);
  ar.set_step(1);
  v1::CheckpointStatus st;
  grpc::ClientContext ac;
  (void)stub.Abort(&ac, ar, &st);
  return ms;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--daemon") {
      c.daemon = value;
    } else if (flag == "--items") {
      c.items.clear();
      for (absl::string_view part : absl::StrSplit(value, ',')) {
        uint64_t n = 0;
        if (!absl::SimpleAtoi(part, &n) || n == 0) Die("bad --items");
        c.items.push_back(n);
      }
    } else if (flag == "--reps") {
      if (!absl::SimpleAtoi(value, &c.reps) || c.reps < 1) Die("bad --reps");
    } else {
      Die("unknown flag " + flag);
    }
  }
  char tmpl[] = "/tmp/ckptd-svb-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp");
  const std::string dir = tmpl;
  const pid_t daemon = StartDaemon(c, dir);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto stub = v1::Checkpoint::NewStub(grpc::CreateCustomChannel(
      "unix:" + dir + "/ckptd.sock", grpc::InsecureChannelCredentials(), args));
  v1::HelloRequest hreq;
  hreq.set_client_name("save_validate_bench");
  v1::HelloResponse hello;
  grpc::ClientContext hc;
  if (grpc::Status s = stub->Hello(&hc, hreq, &hello); !s.ok()) Die("Hello: " + s.error_message());
  grpc::ClientContext attach_ctx;  // the session lives while this stream does
  v1::AttachRequest areq;
  areq.set_session_id(hello.session_id());
  auto attach = stub->Attach(&attach_ctx, areq);
  v1::SessionEvent ev;
  if (!attach->Read(&ev)) Die("Attach");

  std::vector<double> per_item_us;
  for (uint64_t items : c.items) {
    std::vector<double> ms;
    for (int rep = 0; rep < c.reps; ++rep) {
      const std::string job = "svb-" + std::to_string(items) + "-" + std::to_string(rep);
      ms.push_back(TimeSave(*stub, hello.session_id(), items, job));
      std::printf(
          "{\"bench\": \"save_validate\", \"items\": %llu, \"rep\": %d, \"save_ms\": %.1f}\n",
          static_cast<unsigned long long>(items), rep, ms.back());
    }
    per_item_us.push_back(Median(ms) * 1000.0 / static_cast<double>(items));
    std::printf(
        "{\"bench\": \"save_validate\", \"items\": %llu, \"median_save_ms\": %.1f, "
        "\"us_per_item\": %.2f}\n",
        static_cast<unsigned long long>(items), Median(ms), per_item_us.back());
  }
  std::printf(
      "{\"bench\": \"save_validate\", \"summary\": true, \"per_item_ratio_largest_to_smallest\": "
      "%.2f}\n",
      per_item_us.back() / per_item_us.front());
  attach_ctx.TryCancel();
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
