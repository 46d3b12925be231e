#include "s3_harness.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ckptd/status.h"
#include "pugixml.hpp"

#ifndef CKPTD_FAULT_PROXY_PY
#error "CKPTD_FAULT_PROXY_PY must name tests/s3/fault_proxy.py"
#endif

namespace ckptd::testing {
namespace {

// `n` distinct free loopback ports: each is bound until all are chosen (released one by one, the
// kernel may hand the same port out twice), then released; another process could still take one
// before weed does, which Start answers by starting again on new ports.
absl::StatusOr<std::vector<uint16_t>> FreePorts(size_t n) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  absl::Status s;
  while (ports.size() < n && s.ok()) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      s = ErrnoStatus(errno, "socket");
      break;
    }
    fds.push_back(fd);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      s = ErrnoStatus(errno, "bind 127.0.0.1:0");
      break;
    }
    ports.push_back(ntohs(addr.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!s.ok()) return s;
  return ports;
}

// The last `max_bytes` of a log, for an error message that CI prints (the file is gone by then).
std::string LogTail(const std::string& path, size_t max_bytes = 1500) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

// Starts argv in a new process group, stdout+stderr to `log`.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return ErrnoStatus(errno, "fork");
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, 0);
    execvp(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: no race with a kill before the child ran
  return pid;
}

// SIGTERM to the group, SIGKILL after `grace_ms`, then reap.
void KillGroup(pid_t pid, int grace_ms) {
  if (pid <= 0) return;
  kill(-pid, SIGTERM);
  absl::Time deadline = absl::Now() + absl::Milliseconds(grace_ms);
  while (absl::Now() < deadline) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) {
      kill(-pid, SIGKILL);  // anything it left in the group
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(-pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct ReadState {
  const std::string* body;
  size_t at;
};

size_t ReadBody(char* out, size_t size, size_t n, void* arg) {
  auto* st = static_cast<ReadState*>(arg);
  size_t take = std::min(size * n, st->body->size() - st->at);
  std::memcpy(out, st->body->data() + st->at, take);
  st->at += take;
  return take;
}

absl::StatusOr<HttpResult> Request(const std::string& method, const std::string& url,
                                   const std::string& body, bool sign, int timeout_ms,
                                   const std::string& ca_path = "") {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK) return absl::InternalError("curl_global_init");
  CURL* e = curl_easy_init();
  if (e == nullptr) return absl::InternalError("curl_easy_init");
  HttpResult result;
  ReadState rs{&body, 0};
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  CURLcode rc = CURLE_OK;
  auto set = [&](CURLoption o, auto v) {
    if (rc == CURLE_OK) rc = curl_easy_setopt(e, o, v);
  };
  set(CURLOPT_URL, url.c_str());
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  set(CURLOPT_HTTPHEADER, headers);
  set(CURLOPT_WRITEFUNCTION, &Append);
  set(CURLOPT_WRITEDATA, static_cast<void*>(&result.body));
  if (!ca_path.empty()) set(CURLOPT_CAINFO, ca_path.c_str());
  if (sign) {
    set(CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    set(CURLOPT_USERNAME, kWeedAccessKey);
    set(CURLOPT_PASSWORD, kWeedSecretKey);
  }
  if (method == "PUT") {
    set(CURLOPT_UPLOAD, 1L);
    set(CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body.size()));
    set(CURLOPT_READFUNCTION, &ReadBody);
    set(CURLOPT_READDATA, static_cast<void*>(&rs));
  } else if (method != "GET") {
    set(CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  if (rc == CURLE_OK) rc = curl_easy_perform(e);
  if (rc == CURLE_OK) rc = curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &result.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(e);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(method, " ", url, ": ", curl_easy_strerror(rc)));
  }
  return result;
}

}  // namespace

std::string FindWeed() {
  const char* env = std::getenv("CKPTD_WEED");
  if (env != nullptr && *env != '\0') return access(env, X_OK) == 0 ? env : "";
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/weed");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::StatusOr<HttpResult> SignedRequest(const std::string& method, const std::string& url,
                                         const std::string& body) {
  return Request(method, url, body, true, 30'000);
}

absl::StatusOr<std::unique_ptr<WeedServer>> WeedServer::Start(const std::string& dir,
                                                              uint32_t ready_timeout_ms) {
  std::unique_ptr<WeedServer> w(new WeedServer());
  w->weed_ = FindWeed();
  if (w->weed_.empty()) return absl::NotFoundError("no `weed` binary (CKPTD_WEED or PATH)");
  w->dir_ = dir;
  w->owned_ = true;
  CKPTD_RETURN_IF_ERROR(w->PickPorts());
  // The identities file: only these credentials are accepted, so every request is really
  // signed and checked.
  std::ofstream cfg(dir + "/s3.json");
  cfg << R"({"identities":[{"name":"ckptd-test","credentials":[{"accessKey":")" << kWeedAccessKey
      << R"(","secretKey":")" << kWeedSecretKey
      << R"("}],"actions":["Admin","Read","Write","List","Tagging"]}]})";
  cfg.close();
  if (!cfg) return absl::InternalError(absl::StrCat("writing ", dir, "/s3.json"));
  // A port taken by another process between FreePorts and weed's bind makes weed exit at start
  // (tests run in parallel): start again on new ports, a few times.
  absl::Status launched;
  for (int attempt = 0; attempt < kStartAttempts; ++attempt) {
    if (attempt > 0) CKPTD_RETURN_IF_ERROR(w->PickPorts());
    launched = w->Launch(ready_timeout_ms);
    if (launched.ok() || !w->exited_at_start_) break;
  }
  CKPTD_RETURN_IF_ERROR(launched);
  return w;
}

// New ports and an empty data dir: data a failed earlier start left (its raft state names other
// ports) would keep this one from becoming ready.
absl::Status WeedServer::PickPorts() {
  std::error_code ec;
  std::filesystem::remove_all(dir_ + "/data", ec);
  std::filesystem::create_directories(dir_ + "/data", ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir_, ": ", ec.message()));
  CKPTD_ASSIGN_OR_RETURN(std::vector<uint16_t> ports, FreePorts(kN));
  std::copy(ports.begin(), ports.end(), ports_);
  endpoint_ = absl::StrCat("http://127.0.0.1:", ports_[kS3]);
  return absl::OkStatus();
}

absl::Status WeedServer::Launch(uint32_t ready_timeout_ms) {
  auto port = [this](Port p) { return std::to_string(ports_[p]); };
  std::vector<std::string> argv = {
      weed_, "server", "-dir=" + dir_ + "/data", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
      "-master.port=" + port(kMaster), "-master.port.grpc=" + port(kMasterGrpc),
      "-volume.port=" + port(kVolume), "-volume.port.grpc=" + port(kVolumeGrpc), "-filer",
      "-filer.port=" + port(kFiler), "-filer.port.grpc=" + port(kFilerGrpc),
      "-filer.localSocket=" + FilerSocket(), "-s3", "-s3.port=" + port(kS3),
      "-s3.port.grpc=" + port(kS3Grpc), "-s3.port.iceberg=0", "-s3.port.lance=0",
      "-s3.config=" + dir_ + "/s3.json",
      // virtual-host addressing: <bucket>.localhost (curl resolves
      // every *.localhost to loopback itself)
      "-s3.domainName=localhost", "-master.volumeSizeLimitMB=64", "-volume.max=0"};
  exited_at_start_ = false;
  CKPTD_ASSIGN_OR_RETURN(pid_, Spawn(argv, dir_ + "/weed.log"));
  // Ready when the gateway accepts a signed bucket creation (the filer behind it is up too).
  absl::Time deadline = absl::Now() + absl::Milliseconds(ready_timeout_ms);
  absl::Status last = absl::UnavailableError("not tried");
  while (absl::Now() < deadline) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      RemoveSockets();
      exited_at_start_ = true;
      return absl::UnavailableError(absl::StrCat("weed exited at start; ", dir_,
                                                 "/weed.log ends:\n", LogTail(dir_ + "/weed.log")));
    }
    last = CreateBucket(kWeedBucket);
    if (last.ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(200));
  }
  KillGroup(pid_, 2000);
  pid_ = -1;
  RemoveSockets();
  return absl::UnavailableError(absl::StrCat("weed not ready after ", ready_timeout_ms, " ms (",
                                             last.message(), "); see ", dir_, "/weed.log"));
}

absl::StatusOr<std::unique_ptr<WeedServer>> WeedServer::Attach(const std::string& dir) {
  std::ifstream in(dir + "/state");
  std::unique_ptr<WeedServer> w(new WeedServer());
  w->dir_ = dir;
  bool read = static_cast<bool>(in >> w->endpoint_ >> w->pid_);
  for (uint16_t& port : w->ports_) read = read && static_cast<bool>(in >> port);
  if (!read) return absl::NotFoundError(absl::StrCat("no weed state in ", dir, "/state"));
  CKPTD_RETURN_IF_ERROR(w->CreateBucket(kWeedBucket));
  return w;
}

absl::Status WeedServer::WriteState() const {
  std::ofstream out(dir_ + "/state");
  out << endpoint_ << " " << pid_;
  for (uint16_t port : ports_) out << " " << port;
  out << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("writing ", dir_, "/state"));
  return absl::OkStatus();
}

void WeedServer::StopShared(const std::string& dir) {
  std::ifstream in(dir + "/state");
  WeedServer w;
  bool read = static_cast<bool>(in >> w.endpoint_ >> w.pid_);
  for (uint16_t& port : w.ports_) read = read && static_cast<bool>(in >> port);
  if (read && w.pid_ > 0 && kill(-w.pid_, SIGTERM) == 0) {
    // Not our child (its starter exited): wait for the group to be gone, bounded.
    for (int i = 0; i < 150 && kill(-w.pid_, 0) == 0; ++i) usleep(20'000);
    kill(-w.pid_, SIGKILL);
    for (int i = 0; i < 100 && kill(-w.pid_, 0) == 0; ++i) usleep(20'000);
  }
  if (read) w.RemoveSockets();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

WeedServer::~WeedServer() {
  if (owned_) Stop().IgnoreError();
}

absl::Status WeedServer::Stop() {
  if (!owned_) return absl::FailedPreconditionError("an attached weed is not ours to stop");
  KillGroup(pid_, 3000);
  pid_ = -1;
  RemoveSockets();
  return absl::OkStatus();
}

// Unix sockets need short paths (108 bytes with the NUL), and a build dir deep in a CI checkout
// is too long for one: weed died at start with "bind: invalid argument". So the filer's local
// socket lives in /tmp, named by its port as weed names its own.
std::string WeedServer::FilerSocket() const {
  return absl::StrCat("/tmp/ckptd-weed-filer-", ports_[kFiler], ".sock");
}

// weed leaves its gRPC sockets (/tmp/seaweedfs-<server>-<port>.sock) behind when killed; machines
// are reused, so the ones of our ports go with the server.
void WeedServer::RemoveSockets() const {
  unlink(FilerSocket().c_str());
  for (uint16_t port : ports_) {
    for (const char* kind : {"master-grpc", "volume-grpc", "filer-grpc", "s3", "s3-grpc"}) {
      unlink(absl::StrCat("/tmp/seaweedfs-", kind, "-", port, ".sock").c_str());
    }
  }
}

absl::Status WeedServer::Restart(uint32_t ready_timeout_ms) {
  if (!owned_) return absl::FailedPreconditionError("an attached weed is not ours to restart");
  if (pid_ > 0) CKPTD_RETURN_IF_ERROR(Stop());
  return Launch(ready_timeout_ms);
}

absl::Status WeedServer::CreateBucket(const std::string& bucket) {
  CKPTD_ASSIGN_OR_RETURN(HttpResult r, Request("PUT", endpoint_ + "/" + bucket, "", true, 5000));
  if (r.status == 200 || r.body.find("BucketAlreadyOwnedByYou") != std::string::npos ||
      r.body.find("BucketAlreadyExists") != std::string::npos) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("create bucket ", bucket, ": HTTP ", r.status, " ", r.body.substr(0, 200)));
}

absl::StatusOr<std::vector<std::string>> WeedServer::ListUploads(const std::string& bucket,
                                                                 const std::string& prefix) {
  CKPTD_ASSIGN_OR_RETURN(
      HttpResult r,
      SignedRequest("GET", absl::StrCat(endpoint_, "/", bucket, "?prefix=", prefix, "&uploads=")));
  if (r.status != 200) {
    return absl::InternalError(absl::StrCat("ListMultipartUploads: HTTP ", r.status, " ", r.body));
  }
  pugi::xml_document doc;
  if (!doc.load_buffer(r.body.data(), r.body.size())) {
    return absl::InternalError("ListMultipartUploads: not XML: " + r.body);
  }
  std::vector<std::string> keys;
  for (pugi::xml_node u : doc.child("ListMultipartUploadsResult").children("Upload")) {
    keys.emplace_back(u.child_value("Key"));
  }
  return keys;
}

absl::StatusOr<TestCa> MakeTestCa(const std::string& dir,
                                  const std::vector<std::string>& dns_names) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", dir, ": ", ec.message()));
  TestCa ca{dir + "/ca.pem", dir + "/server.pem", dir + "/server.key"};
  std::string san = "subjectAltName=IP:127.0.0.1";
  for (const std::string& name : dns_names) absl::StrAppend(&san, ",DNS:", name);
  std::ofstream ext(dir + "/server.ext");
  ext << san << "\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n";
  ext.close();
  if (!ext) return absl::InternalError(absl::StrCat("writing ", dir, "/server.ext"));
  const std::vector<std::string> ec_key = {"-newkey", "ec", "-pkeyopt",
                                           "ec_paramgen_curve:prime256v1", "-nodes"};
  std::vector<std::vector<std::string>> steps = {
      {"openssl", "req", "-x509", "-days", "2", "-subj", "/CN=ckptd test CA", "-keyout",
       dir + "/ca.key", "-out", ca.ca_path},
      {"openssl", "req", "-subj", "/CN=localhost", "-keyout", ca.key_path, "-out",
       dir + "/server.csr"},
      {"openssl", "x509", "-req", "-days", "2", "-in", dir + "/server.csr", "-CA", ca.ca_path,
       "-CAkey", dir + "/ca.key", "-CAcreateserial", "-extfile", dir + "/server.ext", "-out",
       ca.cert_path}};
  steps[0].insert(steps[0].begin() + 2, ec_key.begin(), ec_key.end());
  steps[1].insert(steps[1].begin() + 2, ec_key.begin(), ec_key.end());
  for (const std::vector<std::string>& argv : steps) {
    const std::string log = dir + "/openssl.log";
    CKPTD_ASSIGN_OR_RETURN(pid_t pid, Spawn(argv, log));
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::ifstream in(log);
      std::stringstream out;
      out << in.rdbuf();
      return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " failed: ", out.str()));
    }
  }
  return ca;
}

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(uint16_t upstream_port) {
  return Launch(upstream_port, nullptr);
}

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::StartTls(uint16_t upstream_port,
                                                                 const TestCa& ca) {
  return Launch(upstream_port, &ca);
}

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Launch(uint16_t upstream_port,
                                                               const TestCa* tls) {
  std::unique_ptr<FaultProxy> p(new FaultProxy());
  char tmpl[] = "/tmp/ckptd-fault-proxy.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return ErrnoStatus(errno, "mkdtemp");
  const std::string dir = tmpl;
  const std::string port_file = dir + "/port";
  const char* python = std::getenv("PYTHON");
  std::vector<std::string> argv = {python != nullptr && *python != '\0' ? python : "python3",
                                   CKPTD_FAULT_PROXY_PY,
                                   "--upstream-port",
                                   std::to_string(upstream_port),
                                   "--port-file",
                                   port_file};
  if (tls != nullptr) {
    argv.insert(argv.end(), {"--tls-cert", tls->cert_path, "--tls-key", tls->key_path});
    p->ca_path_ = tls->ca_path;
  }
  CKPTD_ASSIGN_OR_RETURN(p->pid_, Spawn(argv, dir + "/proxy.log"));
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      p->port_ = static_cast<uint16_t>(port);
      p->endpoint_ = tls != nullptr ? absl::StrCat("https://localhost:", port)
                                    : absl::StrCat("http://127.0.0.1:", port);
      std::filesystem::remove_all(dir);
      return p;
    }
    if (waitpid(p->pid_, nullptr, WNOHANG) == p->pid_) {
      p->pid_ = -1;
      return absl::UnavailableError("fault_proxy.py exited at start; see " + dir + "/proxy.log");
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::UnavailableError("fault_proxy.py did not report its port within 10 s");
}

FaultProxy::~FaultProxy() { KillGroup(pid_, 2000); }

absl::StatusOr<std::string> FaultProxy::Control(const std::string& query) {
  CKPTD_ASSIGN_OR_RETURN(
      HttpResult r, Request("GET", endpoint_ + "/__fault?" + query, "", false, 5000, ca_path_));
  if (r.status != 200) return absl::InternalError("fault proxy control: " + r.body);
  return r.body;
}

absl::Status FaultProxy::Arm(const std::string& mode, uint32_t count, double fraction,
                             const std::string& match, uint32_t delay_ms) {
  char* m = curl_easy_escape(nullptr, match.c_str(), static_cast<int>(match.size()));
  if (m == nullptr) return absl::InternalError("curl_easy_escape");
  std::string q = absl::StrCat("mode=", mode, "&count=", count, "&fraction=", fraction,
                               "&delay_ms=", delay_ms, "&match=", m);
  curl_free(m);
  return Control(q).status();
}

absl::Status FaultProxy::RefuseConditionalPuts(bool refuse) {
  return Control(refuse ? "conditional=501" : "conditional=pass").status();
}

absl::StatusOr<uint64_t> FaultProxy::Injected() {
  CKPTD_ASSIGN_OR_RETURN(std::string body, Control("stats=1"));
  return std::stoull(body);
}

}  // namespace ckptd::testing
