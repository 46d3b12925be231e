// The S3 plugin's failure handling, through fault_proxy.py in front of a real SeaweedFS:
// retried 5xx / SlowDown / resets / timeouts, UNAVAILABLE once the retries are spent, aborted
// multipart uploads, and a store that goes away and comes back.
#include <atomic>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "s3_env.h"

namespace ckptd {
namespace {

using testing::FaultProxy;
using testing::TestOptions;

std::unique_ptr<FaultProxy> Proxy(testing::WeedServer* weed) {
  auto p = FaultProxy::Start(weed->s3_port());
  REQUIRE(p.ok());
  return std::move(*p);
}

std::unique_ptr<Storage> Open(const S3Options& o) {
  auto s = NewS3Storage(o);
  REQUIRE(s.ok());
  return std::move(*s);
}

TEST_CASE("S3 faults: transient failures are retried until they pass", "[s3][fault]") {
  CKPTD_REQUIRE_WEED(weed);
  auto proxy = Proxy(weed);
  S3Options o = TestOptions(proxy->endpoint());
  o.request_timeout_ms = 1000;
  auto storage = Open(o);
  const char* modes[] = {"500", "503", "slowdown", "reset", "delay"};
  for (const char* mode : modes) {
    DYNAMIC_SECTION(mode) {
      REQUIRE(proxy->Arm(mode, 3, 0, "PUT", 3000).ok());  // delay: beyond the request timeout
      REQUIRE(storage->PutAtomic("x", "payload").ok());
      CHECK(*proxy->Injected() == 3);
      REQUIRE(proxy->Disarm().ok());
      CHECK(*storage->Get("x") == "payload");
    }
  }
  SECTION("a multipart upload whose parts fail now and then") {
    REQUIRE(proxy->Arm("503", 2, 0.2, "partNumber").ok());
    std::string data(3 * o.part_size_bytes + 99, 'q');
    for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(i / 4096);
    auto w = storage->CreateBlob("big.blob");
    REQUIRE(w.ok());
    IoSlice s{data.data(), data.size(), 0};
    REQUIRE((*w)->Write(std::span<const IoSlice>(&s, 1)).ok());
    REQUIRE((*w)->Sync().ok());
    CHECK(*proxy->Injected() >= 2);
    REQUIRE(proxy->Disarm().ok());
    CHECK(*storage->Get("big.blob") == data);
  }
}

TEST_CASE("S3 faults: spent retries are UNAVAILABLE naming endpoint, bucket and key",
          "[s3][fault]") {
  CKPTD_REQUIRE_WEED(weed);
  auto proxy = Proxy(weed);
  S3Options o = TestOptions(proxy->endpoint());
  auto storage = Open(o);
  REQUIRE(proxy->Arm("503", 0, 1.0).ok());
  absl::Status s = storage->PutAtomic("job/manifest", "m");
  REQUIRE(absl::IsUnavailable(s));
  std::string msg(s.message());
  CHECK(absl::StrContains(msg, proxy->endpoint()));
  CHECK(absl::StrContains(msg, o.bucket));
  CHECK(absl::StrContains(msg, o.prefix + "/job/manifest"));
  CHECK(absl::StrContains(msg, "503"));
  CHECK(*proxy->Injected() == o.retries_max + 1);
  CHECK(absl::IsUnavailable(storage->Get("job/manifest").status()));
}

TEST_CASE("S3 faults: a multipart upload that fails is aborted, no parts left", "[s3][fault]") {
  CKPTD_REQUIRE_WEED(weed);
  auto proxy = Proxy(weed);
  S3Options o = TestOptions(proxy->endpoint());
  auto storage = Open(o);
  std::string data(3 * o.part_size_bytes, 'z');
  auto w = storage->CreateBlob("failing.blob");
  REQUIRE(w.ok());
  // The first part goes through, every later one fails.
  REQUIRE(proxy->Arm("500", 0, 0).ok());
  IoSlice first{data.data(), o.part_size_bytes, 0};
  REQUIRE((*w)->Write(std::span<const IoSlice>(&first, 1)).ok());
  REQUIRE(weed->ListUploads(o.bucket, o.prefix)->size() == 1);
  REQUIRE(proxy->Arm("500", 0, 1.0, "partNumber").ok());
  IoSlice rest{data.data() + o.part_size_bytes, 2 * o.part_size_bytes, o.part_size_bytes};
  CHECK(absl::IsUnavailable((*w)->Write(std::span<const IoSlice>(&rest, 1))));
  REQUIRE(proxy->Disarm().ok());
  CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());
  CHECK_FALSE(*storage->Exists("failing.blob"));
  CHECK(absl::IsFailedPrecondition((*w)->Sync()));
}

TEST_CASE("S3 faults: CopyBlobsFrom retries parts that fail now and then, bit-exact",
          "[s3][fault]") {
  CKPTD_REQUIRE_WEED(weed);
  auto proxy = Proxy(weed);
  S3Options o = TestOptions(proxy->endpoint());
  auto storage = Open(o);
  std::string data(6 * o.part_size_bytes + 99, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  testing::MemoryReader src(data);
  REQUIRE(proxy->Arm("500", 2, 0.2, "partNumber").ok());
  std::atomic<uint64_t> progress{0};
  std::vector<BlobCopy> copies = {{"copied.blob", &src}};
  REQUIRE(storage->CopyBlobsFrom(copies, &progress, nullptr).ok());
  REQUIRE(proxy->Disarm().ok());
  CHECK(*proxy->Injected() >= 1);
  auto got = storage->Get("copied.blob");
  REQUIRE(got.ok());
  CHECK(*got == data);
}

TEST_CASE("S3 faults: a store stopped and restarted is survived by a later call", "[s3][fault]") {
  CKPTD_REQUIRE_WEED(shared);
  // Its own weed: stopping the shared one would fail the tests running beside this one.
  const std::string dir =
      absl::StrCat(std::filesystem::temp_directory_path().string(), "/ckptd-s3-restart-", getpid());
  std::filesystem::remove_all(dir);
  auto weed = testing::WeedServer::Start(dir);
  REQUIRE(weed.ok());
  S3Options o = TestOptions((*weed)->endpoint());
  o.retries_max = 2;
  auto storage = Open(o);
  REQUIRE(storage->PutAtomic("before", "1").ok());
  REQUIRE((*weed)->Stop().ok());
  CHECK(absl::IsUnavailable(storage->PutAtomic("during", "2")));
  REQUIRE((*weed)->Restart().ok());
  CHECK(storage->PutAtomic("after", "3").ok());
  CHECK(*storage->Get("before") == "1");
  CHECK(*storage->Get("after") == "3");
  weed->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckptd
