// docs/OPERATIONS.md "S3 storage plugin" promises that no plain-HTTP test reaches, against a real
// SeaweedFS:
// - S3 over TLS with virtual-host addressing: a TLS-terminating proxy (fault_proxy.py --tls-cert)
//   in front of the store, with a certificate authority the test makes with openssl; the plugin
//   reaches https://<bucket>.localhost:<port> (curl resolves *.localhost to loopback), verifies
//   the certificate against ca_path, and every operation works; a CA that did not sign the
//   store's certificate (or the system CAs) is UNAVAILABLE naming the endpoint and the CA file;
//   tls_verify=false connects anyway.
// - PutIfAbsent on a store that answers 501 NotImplemented to If-None-Match (the proxy answers
//   so): the HEAD-then-PUT fallback still creates once and answers ALREADY_EXISTS after.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "s3_env.h"

namespace ckptd {
namespace {

using testing::FaultProxy;
using testing::TestCa;
using testing::TestOptions;

// A fresh directory under /tmp, removed at the end of the test.
class TmpDir {
 public:
  TmpDir() {
    char tmpl[] = "/tmp/ckptd-s3-tls.XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    path_ = tmpl;
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TestCa MakeCa(const std::string& dir) {
  auto ca =
      testing::MakeTestCa(dir, {"localhost", absl::StrCat(testing::kWeedBucket, ".localhost")});
  INFO(ca.status().ToString());
  REQUIRE(ca.ok());
  return *ca;
}

std::string Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

}  // namespace

TEST_CASE("S3 over TLS with virtual-host addressing through a CA made by the test", "[s3][tls]") {
  CKPTD_REQUIRE_WEED(weed);
  TmpDir dir;
  const TestCa ca = MakeCa(dir.path() + "/ca");
  auto proxy = FaultProxy::StartTls(weed->s3_port(), ca);
  INFO(proxy.status().ToString());
  REQUIRE(proxy.ok());
  S3Options o = TestOptions((*proxy)->endpoint());
  REQUIRE(absl::StartsWith(o.endpoint, "https://localhost:"));
  o.path_style = false;  // https://ckptd-test.localhost:<port>/<prefix>/<key>
  o.ca_path = ca.ca_path;
  auto opened = NewS3Storage(o);
  INFO(opened.status().ToString());
  REQUIRE(opened.ok());
  Storage& s3 = **opened;

  REQUIRE(s3.PutAtomic("job/step-1/manifest", "manifest bytes").ok());
  CHECK(*s3.Get("job/step-1/manifest") == "manifest bytes");
  REQUIRE(s3.PutIfAbsent("job/step-1/cluster/decision", "commit").ok());
  CHECK(absl::IsAlreadyExists(s3.PutIfAbsent("job/step-1/cluster/decision", "abort")));
  // A blob of two parts and a tail: a multipart upload, then ranged reads.
  const std::string blob = Bytes(2 * o.part_size_bytes + 12345, 5);
  auto w = s3.CreateBlob("job/step-1/r00000.blob");
  REQUIRE(w.ok());
  IoSlice in{const_cast<char*>(blob.data()), blob.size(), 0};
  REQUIRE((*w)->Write(std::span(&in, 1)).ok());
  REQUIRE((*w)->Sync().ok());
  auto r = s3.OpenBlob("job/step-1/r00000.blob");
  REQUIRE(r.ok());
  CHECK((*r)->size_bytes() == blob.size());
  std::string back(blob.size(), '\0');
  IoSlice out{back.data(), back.size(), 0};
  REQUIRE((*r)->Read(std::span(&out, 1)).ok());
  CHECK(back == blob);
  CHECK(*s3.List("job/step-1") == std::vector<std::string>{"cluster", "manifest", "r00000.blob"});
  // The same bucket, path-style over plain HTTP straight to the store: the objects are there.
  auto direct = testing::SignedRequest(
      "GET", absl::StrCat(weed->endpoint(), "/", o.bucket, "/", o.prefix, "/job/step-1/manifest"));
  REQUIRE(direct.ok());
  CHECK(direct->status == 200);
  CHECK(direct->body == "manifest bytes");
  REQUIRE(s3.RemoveAll("job").ok());
  CHECK(s3.List("job")->empty());
}

TEST_CASE("S3 over TLS: a CA that did not sign the store's certificate is a clear error",
          "[s3][tls]") {
  CKPTD_REQUIRE_WEED(weed);
  TmpDir dir;
  const TestCa ca = MakeCa(dir.path() + "/ca");
  const TestCa other = MakeCa(dir.path() + "/other");
  auto proxy = FaultProxy::StartTls(weed->s3_port(), ca);
  REQUIRE(proxy.ok());
  S3Options o = TestOptions((*proxy)->endpoint());
  o.path_style = false;
  SECTION("another CA file") {
    o.ca_path = other.ca_path;
    auto s = NewS3Storage(o);
    INFO(s.status().ToString());
    REQUIRE(absl::IsUnavailable(s.status()));
    const std::string msg(s.status().message());
    CHECK(absl::StrContains(msg, (*proxy)->endpoint()));
    CHECK(absl::StrContains(msg, o.bucket));
    CHECK(absl::StrContains(msg, "certificate"));
    CHECK(absl::StrContains(msg, other.ca_path));
    CHECK_FALSE(absl::StrContains(msg, "gave up"));  // not retried: it cannot pass
  }
  SECTION("the system's CAs") {
    auto s = NewS3Storage(o);
    INFO(s.status().ToString());
    REQUIRE(absl::IsUnavailable(s.status()));
    CHECK(absl::StrContains(s.status().message(), (*proxy)->endpoint()));
    CHECK(absl::StrContains(s.status().message(), "system's CA certificates"));
  }
  SECTION("tls_verify=false connects anyway") {
    o.ca_path = other.ca_path;
    o.tls_verify = false;
    auto s = NewS3Storage(o);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    REQUIRE((*s)->PutAtomic("x", "y").ok());
    REQUIRE((*s)->RemoveAll("x").ok());
  }
}

TEST_CASE("S3 PutIfAbsent on a store without conditional PUT: the HEAD-then-PUT fallback",
          "[s3][fault]") {
  CKPTD_REQUIRE_WEED(weed);
  auto proxy = FaultProxy::Start(weed->s3_port());
  REQUIRE(proxy.ok());
  REQUIRE((*proxy)->RefuseConditionalPuts(true).ok());
  auto opened = NewS3Storage(TestOptions((*proxy)->endpoint()));
  REQUIRE(opened.ok());
  Storage& s3 = **opened;
  REQUIRE(s3.PutIfAbsent("j/decision", "first").ok());
  CHECK(*(*proxy)->Injected() == 1);  // the conditional PUT was refused once, then remembered
  CHECK(absl::IsAlreadyExists(s3.PutIfAbsent("j/decision", "second")));
  CHECK(*s3.Get("j/decision") == "first");
  REQUIRE(s3.PutIfAbsent("j/other", "x").ok());
  CHECK(*s3.Get("j/other") == "x");
  CHECK(*(*proxy)->Injected() == 1);
  REQUIRE(s3.RemoveAll("j").ok());
}

}  // namespace ckptd
