// The storage registry (ckptd/storage_registry.h): URIs taken apart, plugins registered once per
// scheme, and an unknown scheme refused with the scheme and the known ones named.
#include "ckptd/storage_registry.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

namespace ckptd {
namespace {

// A factory that records what it was opened with and opens nothing (a Storage is not needed
// to test the registry).
struct Recorder {
  std::vector<StorageUri> opened;
  StorageFactory Factory(absl::Status answer) {
    return [this, answer](const StorageUri& uri,
                          const StorageContext&) -> absl::StatusOr<std::unique_ptr<Storage>> {
      opened.push_back(uri);
      return answer;
    };
  }
};

TEST_CASE("ParseStorageUri: schemes, bare paths and malformed URIs", "[unit]") {
  auto s3 = ParseStorageUri("s3://bucket/some/prefix");
  REQUIRE(s3.ok());
  CHECK(s3->scheme == "s3");
  CHECK(s3->location == "bucket/some/prefix");
  auto file = ParseStorageUri("file:///mnt/shared");
  REQUIRE(file.ok());
  CHECK(file->scheme == "file");
  CHECK(file->location == "/mnt/shared");
  auto path = ParseStorageUri("relative/dir");
  REQUIRE(path.ok());
  CHECK(path->scheme == "file");
  CHECK(path->location == "relative/dir");
  CHECK(absl::IsInvalidArgument(ParseStorageUri("").status()));
  CHECK(absl::IsInvalidArgument(ParseStorageUri("s3://").status()));
  CHECK(absl::IsInvalidArgument(ParseStorageUri("://x").status()));
  CHECK(absl::IsInvalidArgument(ParseStorageUri("S3://bucket").status()));
  CHECK(absl::IsInvalidArgument(ParseStorageUri("9p://x").status()));
}

TEST_CASE("StorageRegistry opens a store with the plugin of its scheme", "[unit]") {
  StorageRegistry registry;
  Recorder files, objects;
  REQUIRE(registry.Register("file", files.Factory(absl::UnavailableError("file"))).ok());
  REQUIRE(registry.Register("s3", objects.Factory(absl::UnavailableError("s3"))).ok());
  CHECK(registry.schemes() == std::vector<std::string>{"file", "s3"});

  // The plugin's own answer comes back as it is.
  CHECK(registry.Open("s3://b/p", {}).status().message() == "s3");
  CHECK(registry.Open("/data", {}).status().message() == "file");
  CHECK(registry.Open("file:///data", {}).status().message() == "file");
  REQUIRE(objects.opened.size() == 1);
  CHECK(objects.opened[0].location == "b/p");
  REQUIRE(files.opened.size() == 2);
  CHECK(files.opened[0].location == "/data");
  CHECK(files.opened[1].location == "/data");
}

TEST_CASE("StorageRegistry refuses a second plugin for a scheme and keeps the first", "[unit]") {
  StorageRegistry registry;
  Recorder first, second;
  REQUIRE(registry.Register("file", first.Factory(absl::UnavailableError("first"))).ok());
  absl::Status again = registry.Register("file", second.Factory(absl::UnavailableError("second")));
  CHECK(absl::IsAlreadyExists(again));
  CHECK(again.message().find("\"file\"") != absl::string_view::npos);
  CHECK(registry.Open("/x", {}).status().message() == "first");
  CHECK(second.opened.empty());
  // Not a scheme name, or no factory: refused.
  CHECK(absl::IsInvalidArgument(
      registry.Register("S3", first.Factory(absl::UnavailableError("first")))));
  CHECK(absl::IsInvalidArgument(
      registry.Register("", first.Factory(absl::UnavailableError("first")))));
  CHECK(absl::IsInvalidArgument(registry.Register("gs", nullptr)));
  CHECK(registry.schemes() == std::vector<std::string>{"file"});
}

TEST_CASE("StorageRegistry names an unknown scheme and the known ones", "[unit]") {
  StorageRegistry registry;
  absl::Status none = registry.Open("gs://bucket/x", {}).status();
  CHECK(absl::IsInvalidArgument(none));
  CHECK(none.message().find("unknown scheme \"gs\" (known: none)") != absl::string_view::npos);

  Recorder files, objects;
  REQUIRE(registry.Register("s3", objects.Factory(absl::UnavailableError("s3"))).ok());
  REQUIRE(registry.Register("file", files.Factory(absl::UnavailableError("file"))).ok());
  absl::Status unknown = registry.Open("gs://bucket/x", {}).status();
  CHECK(absl::IsInvalidArgument(unknown));
  CHECK(unknown.message().find("\"gs://bucket/x\"") != absl::string_view::npos);
  CHECK(unknown.message().find("unknown scheme \"gs\" (known: file, s3)") !=
        absl::string_view::npos);
  CHECK(files.opened.empty());
  CHECK(objects.opened.empty());
}

}  // namespace
}  // namespace ckptd
