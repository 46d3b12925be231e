// ckptd-demo: the README walkthrough's client. Saves a small multi-rank "model" (each rank a
// process-local loop iteration here: its row block of every tensor), waits for the daemon to
// commit, then loads everything back with a fresh client and checks it bit-exact.
//
//   ckptd-demo [--socket PATH] [--job NAME] [--step N] [--ranks R] [--rows N]
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ckptd/client.h"

namespace {

struct Args {
  std::string socket, job = "demo-run", step = "1";
  uint32_t ranks = 4;
  uint64_t rows = 1024;
};

std::vector<float> GlobalTensor(const std::string& name, uint64_t n) {
  std::mt19937 gen(static_cast<uint32_t>(std::hash<std::string>{}(name)));
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

int Fail(const char* what, const absl::Status& st) {
  std::fprintf(stderr, "ckptd-demo: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--socket")
      a.socket = v;
    else if (k == "--job")
      a.job = v;
    else if (k == "--step")
      a.step = v;
    else if (k == "--ranks")
      a.ranks = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--rows")
      a.rows = std::stoull(v);
    else {
      std::fprintf(stderr,
                   "usage: ckptd-demo [--socket P] [--job J] [--step N] [--ranks R] "
                   "[--rows N]\n");
      return 2;
    }
  }
  const uint64_t step = std::stoull(a.step), cols = 256;
  const std::vector<std::string> names = {"model.embed.weight", "model.layers.0.mlp.fc1.weight",
                                          "optim.state.model.embed.weight.exp_avg"};
  ckptd::ClientOptions opts;
  opts.socket_path = a.socket;
  opts.client_name = "ckptd-demo";
  auto client = ckptd::Client::Connect(opts);
  if (!client.ok()) return Fail("connect", client.status());
  const uint64_t block = a.rows / a.ranks;
  for (uint32_t r = 0; r < a.ranks; ++r) {
    std::vector<std::vector<float>> keep;
    std::vector<ckptd::TensorShard> shards;
    for (const std::string& n : names) {
      std::vector<float> g = GlobalTensor(n, a.rows * cols);
      keep.emplace_back(g.begin() + r * block * cols, g.begin() + (r + 1) * block * cols);
      ckptd::TensorShard s;
      s.item = n;
      s.dtype = ckptd::DType::kFloat32;
      s.global_shape = {a.rows, cols};
      s.region = ckptd::Region::Box({r * block, 0}, {block, cols});
      s.data = keep.back().data();
      s.bytes = keep.back().size() * sizeof(float);
      shards.push_back(s);
    }
    std::vector<ckptd::ObjectShard> objs = {
        {"extra.rng", true, "rng-state-of-rank-" + std::to_string(r)}};
    auto saved = (*client)->Save(a.job, step, r, a.ranks, shards, objs);
    if (!saved.ok()) return Fail("save", saved.status());
    std::printf("rank %u staged %llu bytes\n", r,
                static_cast<unsigned long long>(saved->bytes_staged));
  }
  if (auto st = (*client)->WaitCommitted(a.job, step, 60000); !st.ok()) return Fail("wait", st);
  std::printf("checkpoint %s/%llu COMMITTED\n", a.job.c_str(),
              static_cast<unsigned long long>(step));
  auto reader = ckptd::Client::Connect(opts);
  if (!reader.ok()) return Fail("connect", reader.status());
  uint64_t from_ram = 0, from_storage = 0;
  for (const std::string& n : names) {
    std::vector<float> out(a.rows * cols);
    ckptd::LoadTarget t{n, ckptd::Region::Whole(), out.data(), out.size() * sizeof(float)};
    auto loaded = (*reader)->Load(a.job, std::nullopt, 0, {&t, 1});
    if (!loaded.ok()) return Fail("load", loaded.status());
    from_ram += loaded->bytes_from_ram;
    from_storage += loaded->bytes_read;
    if (std::memcmp(out.data(), GlobalTensor(n, out.size()).data(), t.bytes) != 0) {
      std::fprintf(stderr, "ckptd-demo: %s differs from what was saved\n", n.c_str());
      return 1;
    }
  }
  std::printf(
      "loaded %zu tensors of step %llu back: bit-exact (%llu bytes from the RAM tier, %llu "
      "read from storage)\n",
      names.size(), static_cast<unsigned long long>(step),
      static_cast<unsigned long long>(from_ram), static_cast<unsigned long long>(from_storage));
  return 0;
}
