// ckptd_testclient: one training rank as its own process, for the integration tests.
//
//   save   --socket S --job J --step N --rank R --world W [--seed K] [--wait-committed]
//          [--hold]        saves rank R's part of the test state dict; prints "staged" (flushed)
//                          once Save returns; --hold then sleeps until killed.
//   load   --socket S --job J --step N|latest [--items a,b] [--world W] [--seed K] [--no-objects]
//                          loads with a fresh client, verifies bit-exact; prints "verified".
//          [--idle-ms T]   stays connected T ms before saving (its session must live on)
//   allocate --socket S --bytes N
//                          allocates an arena buffer of N bytes, prints "allocated", sleeps
//                          until killed (the daemon must free it when this process dies).
//   golden-write --socket S --job J --step N [--world W] [--seed K]
//                          saves all ranks from this one process and waits for COMMITTED.
// Exit codes: 0 ok, 1 the operation or the verification failed (message on stderr), 2 usage.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ckptd/client.h"
#include "rank_io.h"

namespace {

int Usage(const std::string& why) {
  std::cerr << "ckptd_testclient: " << why << "\n"
            << "usage: ckptd_testclient save|load|golden-write --socket S --job J --step N ...\n";
  return 2;
}

int Fail(const std::string& what, const absl::Status& s) {
  std::cerr << "ckptd_testclient: " << what << ": " << absl::StatusCodeToString(s.code()) << ": "
            << s.message() << "\n";
  return 1;
}

struct Args {
  std::map<std::string, std::string> kv;
  std::map<std::string, bool> flags;
  uint64_t Num(const std::string& k, uint64_t def) const {
    auto it = kv.find(k);
    uint64_t v = def;
    if (it != kv.end() && !absl::SimpleAtoi(it->second, &v)) {
      std::cerr << "ckptd_testclient: --" << k << " needs a number\n";
      std::exit(2);
    }
    return v;
  }
  std::string Str(const std::string& k) const {
    auto it = kv.find(k);
    return it == kv.end() ? "" : it->second;
  }
};

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) return false;
    s = s.substr(2);
    if (s == "wait-committed" || s == "hold" || s == "no-objects") {
      a->flags[s] = true;
    } else if (i + 1 < argc) {
      a->kv[s] = argv[++i];
    } else {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<ckptd::Client>> Connect(const Args& a) {
  ckptd::ClientOptions o;
  o.socket_path = a.Str("socket");
  o.rpc_timeout_ms = 30000;
  o.client_name = "ckptd_testclient/" + std::to_string(getpid());
  return ckptd::Client::Connect(o);
}

int Allocate(const Args& a) {
  auto client = Connect(a);
  if (!client.ok()) return Fail("connect", client.status());
  auto buf = (*client)->Allocate(a.Num("bytes", 4096));
  if (!buf.ok()) return Fail("allocate", buf.status());
  std::printf("allocated\n");
  std::fflush(stdout);
  for (;;) pause();
}

int Save(const Args& a) {
  auto client = Connect(a);
  if (!client.ok()) return Fail("connect", client.status());
  const std::string job = a.Str("job");
  const uint64_t step = a.Num("step", 1);
  const uint32_t rank = static_cast<uint32_t>(a.Num("rank", 0));
  const uint32_t world = static_cast<uint32_t>(a.Num("world", 4));
  if (a.Num("idle-ms", 0) > 0) usleep(static_cast<useconds_t>(a.Num("idle-ms", 0) * 1000));
  auto r = ckptd_it::SaveRank(**client, job, step, rank, world, a.Num("seed", 1));
  if (!r.ok()) return Fail("save", r.status());
  std::printf("staged %s\n", ckptd::CheckpointStateName(r->state));
  std::fflush(stdout);
  if (a.flags.count("hold")) {
    for (;;) pause();
  }
  if (a.flags.count("wait-committed")) {
    absl::Status s = (*client)->WaitCommitted(job, step, 60000);
    if (!s.ok()) return Fail("wait", s);
    std::printf("committed\n");
  }
  return 0;
}

int Load(const Args& a) {
  auto client = Connect(a);
  if (!client.ok()) return Fail("connect", client.status());
  std::optional<uint64_t> step;
  if (a.Str("step") != "latest") step = a.Num("step", 1);
  std::vector<std::string> items;
  if (!a.Str("items").empty()) items = absl::StrSplit(a.Str("items"), ',');
  absl::Status s = ckptd_it::VerifyCheckpoint(**client, a.Str("job"), step, a.Num("seed", 1), items,
                                              static_cast<uint32_t>(a.Num("world", 4)),
                                              !a.flags.count("no-objects") && items.empty());
  if (!s.ok()) return Fail("verify", s);
  std::printf("verified\n");
  return 0;
}

int GoldenWrite(const Args& a) {
  auto client = Connect(a);
  if (!client.ok()) return Fail("connect", client.status());
  const std::string job = a.Str("job");
  const uint64_t step = a.Num("step", 1);
  const uint32_t world = static_cast<uint32_t>(a.Num("world", 4));
  for (uint32_t rank = 0; rank < world; ++rank) {
    auto r = ckptd_it::SaveRank(**client, job, step, rank, world, a.Num("seed", 1));
    if (!r.ok()) return Fail("save", r.status());
  }
  absl::Status s = (*client)->WaitCommitted(job, step, 60000);
  if (!s.ok()) return Fail("wait", s);
  std::printf("committed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("missing command");
  Args a;
  if (!Parse(argc, argv, &a)) return Usage("bad arguments");
  if (a.Str("socket").empty() || a.Str("job").empty()) return Usage("--socket and --job needed");
  const std::string cmd = argv[1];
  if (cmd == "save") return Save(a);
  if (cmd == "allocate") return Allocate(a);
  if (cmd == "load") return Load(a);
  if (cmd == "golden-write") return GoldenWrite(a);
  return Usage("unknown command " + cmd);
}
