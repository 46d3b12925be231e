// The S3 plugin as the daemon opens it: registered in a StorageRegistry under "s3"
// (ckptd/storage_registry.h), a URI "s3://bucket[/prefix]", and the settings the daemon passes
// from its remote_s3_* options.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckptd/storage_registry.h"
#include "s3_env.h"
#include "storage/s3/s3_storage.h"

namespace ckptd {
namespace {

absl::Status OpenWith(const StorageRegistry& registry,
                      std::map<std::string, std::string> settings) {
  return registry.Open("s3://bucket/prefix", StorageContext{nullptr, std::move(settings)}).status();
}

TEST_CASE("the s3 plugin refuses a setting it does not know or cannot parse", "[s3]") {
  StorageRegistry registry;
  REQUIRE(RegisterS3Storage(registry).ok());
  CHECK(absl::IsAlreadyExists(RegisterS3Storage(registry)));
  absl::Status unknown = OpenWith(
      registry, {{"endpoint", "http://127.0.0.1:1"}, {"read_cached_through_cache", "true"}});
  CHECK(absl::IsInvalidArgument(unknown));
  CHECK(unknown.message().find("read_cached_through_cache") != absl::string_view::npos);
  CHECK(absl::IsInvalidArgument(OpenWith(registry, {{"path_style", "maybe"}})));
  CHECK(absl::IsInvalidArgument(OpenWith(registry, {{"part_size_bytes", "8MiB"}})));
  // Every setting parses, and S3Options::Validate refuses the options before any request: the
  // endpoint is missing.
  CHECK(absl::IsInvalidArgument(OpenWith(registry, {{"region", "eu-west-1"}})));
}

TEST_CASE("the s3 plugin opens s3://bucket/prefix with the daemon's settings", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  // The daemon's way to credentials: the environment (LoadS3Credentials).
  setenv("AWS_ACCESS_KEY_ID", testing::kWeedAccessKey, 1);
  setenv("AWS_SECRET_ACCESS_KEY", testing::kWeedSecretKey, 1);
  StorageRegistry registry;
  REQUIRE(RegisterS3Storage(registry).ok());
  const std::string prefix = testing::UniquePrefix();
  auto s3 = registry.Open(absl::StrCat("s3://", testing::kWeedBucket, "/", prefix, "/"),
                          StorageContext{nullptr,
                                         {{"endpoint", weed->endpoint()},
                                          {"region", testing::kWeedRegion},
                                          {"path_style", "true"},
                                          {"tls_verify", "true"},
                                          {"part_size_bytes", "5242880"},
                                          {"parts_in_flight", "4"}}});
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  REQUIRE(s3.ok());
  REQUIRE((*s3)->PutAtomic("job/x", "bytes").ok());
  // The URI's path is the key prefix: the same object through NewS3Storage with that prefix.
  S3Options direct = testing::TestOptions("");
  direct.prefix = prefix;
  auto same = NewS3Storage(direct);
  REQUIRE(same.ok());
  auto back = (*same)->Get("job/x");
  REQUIRE(back.ok());
  CHECK(*back == "bytes");
}

}  // namespace
}  // namespace ckptd
