// A real S3 store for tests: SeaweedFS's `weed server` on loopback with SigV4 credentials (and
// virtual-host addressing for <bucket>.localhost), and a fault-injecting HTTP(S) proxy
// (fault_proxy.py) to put in front of it. Reusable by any test binary
// (link ckptd_s3_harness); it never talks to anything but 127.0.0.1.
//
// WeedServer::Start launches weed in its own process group on free loopback ports, waits
// (bounded) until its S3 gateway answers signed requests, and creates the test bucket; Stop kills
// the process group. A server can be shared by several test processes: `ckptd_s3_tests
// --start-weed DIR` starts one and writes DIR/state, and processes that find CKPTD_S3_SHARED=DIR
// in their environment attach to it (ctest runs every test case in its own process; the s3
// tests' fixture starts one weed for all of them).
//
// Thread safety: none; one thread drives a harness object.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::testing {

inline constexpr char kWeedAccessKey[] = "AKIDCKPTDTEST0000001";
inline constexpr char kWeedSecretKey[] = "ckptd-test-secret-not-a-real-one";
inline constexpr char kWeedBucket[] = "ckptd-test";
inline constexpr char kWeedRegion[] = "us-east-1";
// The SeaweedFS version deploy/setup.sh installs and these tests were written against.
inline constexpr char kWeedVersion[] = "4.48";

// The `weed` binary: $CKPTD_WEED, else the first `weed` on PATH; empty if none.
std::string FindWeed();

class WeedServer {
 public:
  // Starts weed with its data in `dir` (created). Bounded: UNAVAILABLE naming the log file if it
  // is not ready within `ready_timeout_ms`.
  static absl::StatusOr<std::unique_ptr<WeedServer>> Start(const std::string& dir,
                                                           uint32_t ready_timeout_ms = 60'000);
  // Attaches to the server whose state `--start-weed` wrote in `dir` (not owned: Stop and the
  // destructor leave it running).
  static absl::StatusOr<std::unique_ptr<WeedServer>> Attach(const std::string& dir);
  ~WeedServer();

  // http://127.0.0.1:<s3 port>
  const std::string& endpoint() const { return endpoint_; }
  uint16_t s3_port() const { return ports_[kS3]; }
  bool owned() const { return owned_; }
  // Writes DIR/state for Attach.
  absl::Status WriteState() const;
  // Leaves the server running when this object goes (`--start-weed`: the other test processes
  // attach to it; `--stop-weed` stops it). Was: the object leaked on purpose, which
  // LeakSanitizer reported at exit, failing the fixture under make test's ASan tier.
  void Detach() { owned_ = false; }
  // Stops the server DIR/state names (not our child: `--start-weed` exited), removes the sockets
  // it leaves in /tmp, and DIR. Quiet when there is none.
  static void StopShared(const std::string& dir);

  // Kills the process group (SIGTERM, then SIGKILL after 3 s) and reaps it. Owned only.
  absl::Status Stop();
  // Starts it again on the same ports and data (after Stop). Owned only.
  absl::Status Restart(uint32_t ready_timeout_ms = 60'000);

  // Creates `bucket` (an existing one is fine).
  absl::Status CreateBucket(const std::string& bucket);
  // Multipart uploads in progress in `bucket` whose key starts with `prefix`.
  absl::StatusOr<std::vector<std::string>> ListUploads(const std::string& bucket,
                                                       const std::string& prefix);

 private:
  enum Port { kMaster, kMasterGrpc, kVolume, kVolumeGrpc, kFiler, kFilerGrpc, kS3, kS3Grpc, kN };
  WeedServer() = default;
  static constexpr int kStartAttempts = 3;
  absl::Status PickPorts();
  absl::Status Launch(uint32_t ready_timeout_ms);
  std::string FilerSocket() const;
  void RemoveSockets() const;

  std::string weed_;
  std::string dir_;
  std::string endpoint_;
  uint16_t ports_[kN] = {};
  pid_t pid_ = -1;  // also the process group
  bool owned_ = false;
  bool exited_at_start_ = false;  // the last Launch saw weed exit before it was ready
};

// One signed request (curl, SigV4 with the harness credentials) to `url`: HTTP status and body.
struct HttpResult {
  long status = 0;
  std::string body;
};
absl::StatusOr<HttpResult> SignedRequest(const std::string& method, const std::string& url,
                                         const std::string& body = "");

// A certificate authority made for one test with the `openssl` command, and a server certificate
// it signed (EC P-256, valid two days).
struct TestCa {
  std::string ca_path;    // the CA certificate (PEM): what a client trusts (S3Options::ca_path)
  std::string cert_path;  // the server certificate (PEM), for the names given
  std::string key_path;   // its private key (PEM)
};
// Writes them under `dir` (created). `dns_names` become the certificate's subjectAltName DNS
// entries (with IP 127.0.0.1). INTERNAL naming the command and its output if openssl fails.
absl::StatusOr<TestCa> MakeTestCa(const std::string& dir,
                                  const std::vector<std::string>& dns_names);

// fault_proxy.py on a free loopback port in front of 127.0.0.1:<upstream_port>. It forwards
// requests byte for byte (Host kept, so SigV4 still verifies) unless a fault is armed.
class FaultProxy {
 public:
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(uint16_t upstream_port);
  // The same speaking HTTPS with `ca`'s server certificate (a TLS-terminating proxy in front of
  // the plain-HTTP store); endpoint() is then https://localhost:<port>.
  static absl::StatusOr<std::unique_ptr<FaultProxy>> StartTls(uint16_t upstream_port,
                                                              const TestCa& ca);
  ~FaultProxy();

  const std::string& endpoint() const { return endpoint_; }
  uint16_t port() const { return port_; }

  // Arms a fault for requests whose "METHOD /path?query" contains `match` (empty: all): `mode`
  // is "500", "503", "slowdown" (503 + SlowDown XML), "reset" (TCP RST after reading the
  // request) or "delay" (forward after `delay_ms`). It hits the next `count` matching requests,
  // and then each later one with probability `fraction`. "none" disarms.
  absl::Status Arm(const std::string& mode, uint32_t count, double fraction = 0,
                   const std::string& match = "", uint32_t delay_ms = 0);
  absl::Status Disarm() { return Arm("none", 0); }
  // refuse: every PUT carrying If-None-Match is answered 501 NotImplemented (a store without
  // conditional writes), whatever else is armed; false forwards them again.
  absl::Status RefuseConditionalPuts(bool refuse);
  // Faults injected since the start.
  absl::StatusOr<uint64_t> Injected();

 private:
  FaultProxy() = default;
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Launch(uint16_t upstream_port,
                                                            const TestCa* tls);
  absl::StatusOr<std::string> Control(const std::string& query);

  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string endpoint_;
  std::string ca_path_;  // TLS: the CA the control requests trust
};

}  // namespace ckptd::testing
