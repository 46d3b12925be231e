// The s3 test binary's main: Catch2, plus two modes for the ctest fixture that shares one weed
// server between the test processes ctest starts:
//   ckptd_s3_tests --start-weed DIR   starts weed (data in DIR), writes DIR/state, exits 0
//   ckptd_s3_tests --stop-weed DIR    stops the weed that DIR/state names
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "catch_session.h"
#include "s3_env.h"

namespace ckptd::testing {
namespace {

std::unique_ptr<WeedServer>& Shared() {
  static std::unique_ptr<WeedServer> weed;
  return weed;
}

}  // namespace

WeedServer* SharedWeed() {
  static bool tried = false;
  if (!tried) {
    tried = true;
    const char* shared = std::getenv("CKPTD_S3_SHARED");
    if (shared != nullptr && *shared != '\0') {
      auto w = WeedServer::Attach(shared);
      if (!w.ok()) FAIL("attaching to the shared weed: " << w.status().ToString());
      Shared() = std::move(*w);
    } else if (!FindWeed().empty()) {
      std::string dir =
          absl::StrCat(std::filesystem::temp_directory_path().string(), "/ckptd-s3-", getpid());
      auto w = WeedServer::Start(dir);
      if (!w.ok()) FAIL("starting weed: " << w.status().ToString());
      Shared() = std::move(*w);
    }
  }
  return Shared().get();
}

std::string UniquePrefix() {
  static std::mt19937_64 rng{std::random_device{}()};
  return absl::StrCat("t-", getpid(), "-", rng() % 1000000000);
}

S3Options TestOptions(const std::string& endpoint) {
  S3Options o;
  o.endpoint = endpoint.empty() ? SharedWeed()->endpoint() : endpoint;
  o.bucket = kWeedBucket;
  o.prefix = UniquePrefix();
  o.region = kWeedRegion;
  o.part_size_bytes = s3_limits::kPartSizeMinBytes;
  o.parts_in_flight = 4;
  o.get_in_flight = 4;
  o.retries_max = 4;
  o.backoff_base_ms = 10;
  o.backoff_max_ms = 100;
  o.connect_timeout_ms = 2000;
  o.request_timeout_ms = 30'000;
  o.credentials = S3Credentials{kWeedAccessKey, kWeedSecretKey, ""};
  return o;
}

}  // namespace ckptd::testing

int main(int argc, char** argv) {
  using ckptd::testing::WeedServer;
  if (argc == 3 && std::strcmp(argv[1], "--start-weed") == 0) {
    if (ckptd::testing::FindWeed().empty()) {
      std::cout << "no weed binary: the s3 tests will skip (or fail in CI)\n";
      return 0;
    }
    auto w = WeedServer::Start(argv[2]);
    if (!w.ok()) {
      std::cerr << w.status().ToString() << "\n";
      return 1;
    }
    if (absl::Status s = (*w)->WriteState(); !s.ok()) {
      std::cerr << s.ToString() << "\n";
      return 1;
    }
    std::cout << "weed at " << (*w)->endpoint() << "\n";
    (*w)->Detach();  // keeps running for the other test processes
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--stop-weed") == 0) {
    WeedServer::StopShared(argv[2]);
    return 0;
  }
  int rc = ckptd::testing::RunCatchSession(argc, argv);
  ckptd::testing::Shared().reset();
  return rc;
}
