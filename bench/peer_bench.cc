// The peer channel's sender, by hand (docs/PEERS.md), and its benchmark.
//
//   ckptd_peer_bench bench --certs DIR [--bytes N] [--rounds R]
//       PutBlob of N bytes (default 1 GiB) to an in-process peer listener over loopback (mutual
//       TLS, receiver-side block checks, the copy kept in its store), against a raw TCP copy of
//       the same bytes over loopback into a buffer of the same size, in the same run; the best of
//       R rounds each (default 5). DIR holds ca.pem and node-a/node-b .pem/.key
//       (tests/integration/peer_certs.sh makes them).
//   ckptd_peer_bench hello|put|get|drop --addr HOST:PORT --node ID --peer_node ID --ca F
//       --cert F --key F [--job J --step S --blob B --bytes N --seed X --block_bytes B]
//       [--corrupt] [--die_after BYTES] [--stall_after BYTES --stall_ms MS]
//       One call against a daemon's peer listener (the [peer] integration tests drive these).
//       put sends N bytes made from the seed; get reads them back and checks them bit by bit;
//       --corrupt flips a byte after computing the checksums; --die_after SIGKILLs this process
//       once that many bytes are sent; --stall_after prints "STALLING" and sleeps mid-stream.
//       Prints "OK ..." or "ERROR <code> <message>"; exits 0 or the status code.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "format/crc32c.h"
#include "peer/peer_client.h"
#include "peer/peer_server.h"

namespace {

using Clock = std::chrono::steady_clock;

std::map<std::string, std::string> ParseFlags(int argc, char** argv, int first) {
  std::map<std::string, std::string> f;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) continue;
    a = a.substr(2);
    if (auto eq = a.find('='); eq != std::string::npos) {
      f[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      f[a] = argv[++i];
    } else {
      f[a] = "1";
    }
  }
  return f;
}

uint64_t U64(const std::map<std::string, std::string>& f, const std::string& k, uint64_t def) {
  auto it = f.find(k);
  uint64_t v = def;
  if (it != f.end() && !absl::SimpleAtoi(it->second, &v)) {
    std::fprintf(stderr, "--%s: not a number\n", k.c_str());
    std::exit(2);
  }
  return v;
}

std::string Str(const std::map<std::string, std::string>& f, const std::string& k,
                const std::string& def = "") {
  auto it = f.find(k);
  return it == f.end() ? def : it->second;
}

void Fill(char* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (uint64_t i = 0; i < n; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t v = x * 0x2545f4914f6cdd1dULL;
    std::memcpy(p + i, &v, std::min<uint64_t>(8, n - i));
  }
}

int Report(const absl::Status& st) {
  if (st.ok()) return 0;
  std::printf("ERROR %d %s\n", static_cast<int>(st.code()), std::string(st.message()).c_str());
  std::fflush(stdout);
  return static_cast<int>(st.code());
}

// --- the raw TCP baseline -----------------------------------------------------------------------

// Copies `src` over a loopback TCP connection into `dst` (receiver in another thread); seconds.
double RawTcpCopy(const std::vector<char>& src, std::vector<char>& dst) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(ls, 1) != 0 || getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("raw tcp listen");
    std::exit(1);
  }
  const auto start = Clock::now();
  std::thread receiver([&] {
    int c = accept(ls, nullptr, nullptr);
    uint64_t got = 0;
    while (got < dst.size()) {
      ssize_t r = recv(c, dst.data() + got, dst.size() - got, 0);
      if (r <= 0) break;
      got += static_cast<uint64_t>(r);
    }
    char ack = 1;
    (void)!send(c, &ack, 1, 0);
    close(c);
  });
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("raw tcp connect");
    std::exit(1);
  }
  for (uint64_t at = 0; at < src.size();) {
    const uint64_t n = std::min<uint64_t>(ckptd::limits::kPeerChunkBytes, src.size() - at);
    ssize_t w = send(s, src.data() + at, n, 0);
    if (w <= 0) {
      std::perror("raw tcp send");
      std::exit(1);
    }
    at += static_cast<uint64_t>(w);
  }
  char ack = 0;
  (void)!recv(s, &ack, 1, 0);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  receiver.join();
  close(s);
  close(ls);
  return secs;
}

int Bench(const std::map<std::string, std::string>& f) {
  const std::string dir = Str(f, "certs");
  const uint64_t bytes = U64(f, "bytes", ckptd::limits::kGiB);
  const uint64_t rounds = U64(f, "rounds", 5);
  const uint32_t block = static_cast<uint32_t>(U64(f, "block_bytes", 1 << 20));
  if (dir.empty()) {
    std::fprintf(stderr, "bench: --certs DIR is required (tests/integration/peer_certs.sh)\n");
    return 2;
  }
  ckptd::peer::ServerOptions so{
      .listen_addr = "127.0.0.1:0",
      .node_id = "node-b",
      .tls = {dir + "/ca.pem", dir + "/node-b.pem", dir + "/node-b.key"},
      .store = {.bytes_max = 2 * bytes + ckptd::limits::kMiB,
                .streams_per_node_max = 8,
                .inflight_bytes_per_node_max = 2 * bytes + ckptd::limits::kMiB,
                .connections_per_node_max = ckptd::limits::kPeerConnectionsPerNodeMax}};
  auto server = ckptd::peer::Server::Start(so, nullptr);
  if (!server.ok()) return Report(server.status());
  auto client = ckptd::peer::Client::Connect(ckptd::peer::ClientOptions{
      .address = absl::StrCat("127.0.0.1:", (*server)->port()),
      .self_node_id = "node-a",
      .peer_node_id = "node-b",
      .tls = {dir + "/ca.pem", dir + "/node-a.pem", dir + "/node-a.key"},
      .chunk_bytes = U64(f, "chunk_bytes", ckptd::limits::kPeerChunkBytes)});
  if (!client.ok()) return Report(client.status());
  if (auto h = (*client)->Hello(); !h.ok()) return Report(h.status());
  std::vector<char> src(bytes);
  std::vector<char> dst(bytes);
  Fill(src.data(), bytes, 7);
  // The block crcs come with the blob, as the manifest has them: not part of the copy's cost.
  std::vector<ckptd::peer::Span> spans{{0, bytes, ckptd::BlockCrcs(src.data(), bytes, block)}};
  double best_put = 1e30;
  double best_raw = 1e30;
  for (uint64_t r = 0; r < rounds; ++r) {
    best_raw = std::min(best_raw, RawTcpCopy(src, dst));
    const auto start = Clock::now();
    auto put = (*client)->PutBlob("bench", r, "blob-0", src, block, spans);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    if (!put.ok()) return Report(put.status());
    best_put = std::min(best_put, secs);
    if (auto d = (*client)->DropBlobs("bench", r); !d.ok()) return Report(d.status());
  }
  const double gib = static_cast<double>(bytes) / static_cast<double>(ckptd::limits::kGiB);
  std::printf("peer_bench: %.2f GiB, best of %llu rounds, loopback, block %u bytes\n", gib,
              static_cast<unsigned long long>(rounds), block);
  std::printf("  raw TCP copy        %7.2f GiB/s\n", gib / best_raw);
  std::printf("  PutBlob (mTLS, gRPC, checked, stored) %7.2f GiB/s\n", gib / best_put);
  std::printf("  ratio PutBlob / raw TCP: %.2fx (goal >= 0.9x)\n", best_raw / best_put);
  (*server)->Stop();
  return 0;
}

// --- one call against a daemon ------------------------------------------------------------------

int Call(const std::string& cmd, const std::map<std::string, std::string>& f) {
  ckptd::peer::ClientOptions o{.address = Str(f, "addr"),
                               .self_node_id = Str(f, "node"),
                               .peer_node_id = Str(f, "peer_node"),
                               .tls = {Str(f, "ca"), Str(f, "cert"), Str(f, "key")},
                               .call_timeout = absl::Seconds(U64(f, "timeout_s", 30))};
  const uint64_t die_after = U64(f, "die_after", 0);
  const uint64_t stall_after = U64(f, "stall_after", 0);
  const uint64_t stall_ms = U64(f, "stall_ms", 0);
  o.chunk_bytes = U64(f, "chunk_bytes", 256 * 1024);
  if (die_after > 0 || stall_after > 0) {
    o.after_chunk = [=](uint64_t sent) {
      if (die_after > 0 && sent >= die_after) raise(SIGKILL);
      if (stall_after > 0 && sent >= stall_after) {
        std::printf("STALLING\n");
        std::fflush(stdout);
        std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
      }
    };
  }
  auto client = ckptd::peer::Client::Connect(o);
  if (!client.ok()) return Report(client.status());
  const std::string job = Str(f, "job", "job");
  const uint64_t step = U64(f, "step", 1);
  const std::string blob = Str(f, "blob", "blob-0");
  const uint64_t bytes = U64(f, "bytes", 1 << 20);
  const uint64_t seed = U64(f, "seed", 1);
  if (cmd == "hello") {
    auto h = (*client)->Hello();
    if (!h.ok()) return Report(h.status());
    std::printf("OK node=%s used=%llu reserved=%llu blobs=%llu max=%llu\n", h->node_id().c_str(),
                static_cast<unsigned long long>(h->peer_bytes_used()),
                static_cast<unsigned long long>(h->peer_bytes_reserved()),
                static_cast<unsigned long long>(h->blobs_held()),
                static_cast<unsigned long long>(h->peer_bytes_max()));
    return 0;
  }
  if (cmd == "put") {
    std::vector<char> data(bytes);
    Fill(data.data(), bytes, seed);
    const uint32_t block = static_cast<uint32_t>(U64(f, "block_bytes", 64 * 1024));
    std::vector<ckptd::peer::Span> spans{{0, bytes, ckptd::BlockCrcs(data.data(), bytes, block)}};
    if (f.contains("corrupt")) data[bytes / 2] ^= 0x5a;
    auto put = (*client)->PutBlob(job, step, blob, data, block, spans);
    if (!put.ok()) return Report(put.status());
    std::printf("OK stored=%llu dedup=%d\n", static_cast<unsigned long long>(put->bytes_stored),
                put->deduplicated ? 1 : 0);
    return 0;
  }
  if (cmd == "get") {
    std::vector<char> got(bytes);
    std::vector<char> want(bytes);
    Fill(want.data(), bytes, seed);
    if (absl::Status st = (*client)->GetBlob(Str(f, "origin", o.self_node_id), job, step, blob, 0,
                                             std::span<char>(got.data(), got.size()));
        !st.ok()) {
      return Report(st);
    }
    if (got != want) return Report(absl::DataLossError("the bytes read back differ"));
    std::printf("OK bit-exact %llu bytes\n", static_cast<unsigned long long>(bytes));
    return 0;
  }
  if (cmd == "drop") {
    auto d = (*client)->DropBlobs(job, step);
    if (!d.ok()) return Report(d.status());
    std::printf("OK dropped=%llu freed=%llu\n", static_cast<unsigned long long>(d->blobs_dropped()),
                static_cast<unsigned long long>(d->bytes_freed()));
    return 0;
  }
  std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s bench|hello|put|get|drop --flags (see the source)\n", argv[0]);
    return 2;
  }
  const std::string cmd = argv[1];
  const auto flags = ParseFlags(argc, argv, 2);
  const int rc = cmd == "bench" ? Bench(flags) : Call(cmd, flags);
  // gRPC 1.51 frees a TLS channel's endpoint buffers on its asynchronous shutdown, which a
  // process exiting right after its last call outruns: LeakSanitizer then reports gRPC's read
  // buffer (576 bytes from grpc_slice_buffer_add_indexed) as this tool's leak. Every object of
  // ours is gone by now, and the peer code itself is checked by the daemon's and the unit
  // tests' own exits; so this one-shot tool ends without running exit handlers.
  std::fflush(nullptr);
  std::_Exit(rc);
}
