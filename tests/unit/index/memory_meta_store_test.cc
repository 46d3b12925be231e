// MemoryMetaStore's power-loss model (memory_meta_store.h): a synced write makes every write
// before it durable; DropUnsynced() forgets the rest; Crash() refuses writes.
#include "index/memory_meta_store.h"

#include <catch2/catch.hpp>

namespace ckptd {
namespace {

std::optional<std::string> Get(MemoryMetaStore& s, const std::string& key) {
  auto v = s.Get(key);
  REQUIRE(v.ok());
  return *v;
}

TEST_CASE("MemoryMetaStore: a power loss keeps what the last synced write covered", "[unit]") {
  MemoryMetaStore store;
  std::vector<MetaStore::Write> a = {{"a", "1"}};
  std::vector<MetaStore::Write> b = {{"b", "2"}};
  std::vector<MetaStore::Write> c = {{"c", "3"}, {"a", std::nullopt}};
  REQUIRE(store.Commit(a, /*sync=*/false).ok());
  REQUIRE(store.Commit(b, /*sync=*/true).ok());  // makes "a" durable too
  REQUIRE(store.Commit(c, /*sync=*/false).ok());
  REQUIRE(store.DeletePrefix("b", /*sync=*/false).ok());
  CHECK(Get(store, "c") == "3");
  store.Crash();
  CHECK(absl::IsUnavailable(store.Commit(a, true)));
  CHECK(absl::IsUnavailable(store.DeletePrefix("a", true)));
  CHECK(Get(store, "c") == "3");  // reads still work
  store.DropUnsynced();
  CHECK(Get(store, "a") == "1");
  CHECK(Get(store, "b") == "2");
  CHECK(Get(store, "c") == std::nullopt);
  REQUIRE(store.DeletePrefix("", /*sync=*/true).ok());
  store.DropUnsynced();
  CHECK(Get(store, "a") == std::nullopt);
}

}  // namespace
}  // namespace ckptd
