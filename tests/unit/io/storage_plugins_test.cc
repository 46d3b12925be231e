// The posix and memory plugins as the daemon opens them: registered in a StorageRegistry
// (ckptd/storage_registry.h) by their scheme, opened by URI, their settings checked.
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "ckptd/io.h"
#include "ckptd/storage_registry.h"
#include "storage/memory/memory_storage.h"
#include "storage/posix/posix_storage.h"
#include "test_dir.h"

namespace ckptd {
namespace {

StorageRegistry Plugins() {
  StorageRegistry registry;
  REQUIRE(RegisterPosixStorage(registry).ok());
  REQUIRE(RegisterMemoryStorage(registry).ok());
  return registry;
}

TEST_CASE("storage plugins register once under their schemes", "[unit]") {
  StorageRegistry registry = Plugins();
  CHECK(registry.schemes() == std::vector<std::string>{"file", "memory"});
  CHECK(absl::IsAlreadyExists(RegisterPosixStorage(registry)));
  CHECK(absl::IsAlreadyExists(RegisterMemoryStorage(registry)));
}

TEST_CASE("the file plugin opens a directory by file:// URI or bare path", "[unit]") {
  testing::TestDir dir("storage_plugins");
  auto io = NewPosixIo();
  const StorageRegistry registry = Plugins();
  auto by_uri = registry.Open("file://" + dir.path(), StorageContext{io.get()});
  REQUIRE(by_uri.ok());
  REQUIRE((*by_uri)->PutAtomic("job/x", "bytes").ok());
  auto by_path =
      registry.Open(dir.path(), StorageContext{io.get(), {{"read_cached_through_cache", "true"}}});
  REQUIRE(by_path.ok());
  auto back = (*by_path)->Get("job/x");
  REQUIRE(back.ok());
  CHECK(*back == "bytes");

  CHECK(absl::IsFailedPrecondition(registry.Open(dir.path(), StorageContext{}).status()));
  absl::Status bad =
      registry.Open(dir.path(), StorageContext{io.get(), {{"read_cached_through_cache", "maybe"}}})
          .status();
  CHECK(absl::IsInvalidArgument(bad));
  CHECK(bad.message().find("read_cached_through_cache") != absl::string_view::npos);
  CHECK(absl::IsInvalidArgument(
      registry.Open(dir.path(), StorageContext{io.get(), {{"endpoint", "http://x"}}}).status()));
}

TEST_CASE("the memory plugin opens a new empty store per URI and takes no settings", "[unit]") {
  const StorageRegistry registry = Plugins();
  auto a = registry.Open("memory://a", {});
  REQUIRE(a.ok());
  REQUIRE((*a)->PutAtomic("k", "v").ok());
  auto b = registry.Open("memory://a", {});
  REQUIRE(b.ok());
  CHECK(absl::IsNotFound((*b)->Get("k").status()));
  CHECK(absl::IsInvalidArgument(
      registry.Open("memory://a", StorageContext{nullptr, {{"x", "1"}}}).status()));
  absl::Status unknown = registry.Open("s3://bucket", {}).status();
  CHECK(unknown.message().find("(known: file, memory)") != absl::string_view::npos);
}

}  // namespace
}  // namespace ckptd
