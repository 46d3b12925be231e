// MetaStore contract, run against both implementations, plus RocksDB persistence and locking.
#include "index/meta_store.h"

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../io/test_dir.h"
#include "index/keys.h"

namespace ckptd {
namespace {

using std::string_literals::operator""s;
using testing::TestDir;

std::vector<std::pair<std::string, std::string>> ScanAll(MetaStore& store, std::string_view prefix,
                                                         std::string_view start_after = "",
                                                         size_t limit = 0) {
  std::vector<std::pair<std::string, std::string>> out;
  auto collect = [&](std::string_view k, std::string_view v) {
    out.emplace_back(k, v);
    return true;
  };
  absl::Status s = store.Scan(prefix, start_after, limit, collect);
  REQUIRE(s.ok());
  return out;
}

std::vector<std::string> Keys(const std::vector<std::pair<std::string, std::string>>& kvs) {
  std::vector<std::string> keys;
  for (const auto& kv : kvs) keys.push_back(kv.first);
  return keys;
}

void RunContract(MetaStore& store) {
  SECTION("Get of an absent key is nullopt, not an error") {
    auto v = store.Get("nope");
    REQUIRE(v.ok());
    CHECK_FALSE(v->has_value());
  }
  SECTION("Commit puts and deletes atomically") {
    std::vector<MetaStore::Write> w = {{"a", "1"}, {"b", "2"}, {"c", "3"}};
    REQUIRE(store.Commit(w, true).ok());
    CHECK(**store.Get("b") == "2");
    std::vector<MetaStore::Write> w2 = {{"b", std::nullopt}, {"a", "10"}, {"d", ""}};
    REQUIRE(store.Commit(w2, false).ok());
    CHECK_FALSE(store.Get("b")->has_value());
    CHECK(**store.Get("a") == "10");
    CHECK(store.Get("d")->has_value());
    CHECK(**store.Get("d") == "");
    REQUIRE(store.Commit({}, true).ok());
    // Binary keys and values.
    std::vector<MetaStore::Write> w3 = {{"k\0\xff"s, "v\0v"s}};
    REQUIRE(store.Commit(w3, true).ok());
    CHECK(**store.Get("k\0\xff"s) == "v\0v"s);
  }
  SECTION("Scan honours prefix, start_after, limit and early stop") {
    std::vector<MetaStore::Write> w;
    for (uint64_t step : std::vector<uint64_t>{1, 2, 10, 100, uint64_t{1} << 40}) {
      w.push_back({keys::Checkpoint("a", step), std::to_string(step)});
      w.push_back({keys::Checkpoint("ab", step), "ab"});
      w.push_back({keys::Checkpoint("a\x01", step), "a1"});
    }
    w.push_back({keys::Job("a"), "job"});
    REQUIRE(store.Commit(w, true).ok());

    auto all = ScanAll(store, keys::CheckpointPrefix("a"));
    REQUIRE(all.size() == 5);
    CHECK(all[0].second == "1");
    CHECK(all[2].second == "10");
    CHECK(all[4].second == std::to_string(uint64_t{1} << 40));

    auto page1 = ScanAll(store, keys::CheckpointPrefix("a"), "", 2);
    CHECK(Keys(page1) ==
          std::vector<std::string>{keys::Checkpoint("a", 1), keys::Checkpoint("a", 2)});
    auto page2 = ScanAll(store, keys::CheckpointPrefix("a"), page1.back().first, 2);
    CHECK(Keys(page2) ==
          std::vector<std::string>{keys::Checkpoint("a", 10), keys::Checkpoint("a", 100)});
    auto page3 = ScanAll(store, keys::CheckpointPrefix("a"), page2.back().first, 2);
    CHECK(Keys(page3) == std::vector<std::string>{keys::Checkpoint("a", uint64_t{1} << 40)});
    CHECK(ScanAll(store, keys::CheckpointPrefix("a"), page3.back().first, 2).empty());
    // start_after between keys, before the prefix, after the prefix.
    CHECK(ScanAll(store, keys::CheckpointPrefix("a"), keys::Checkpoint("a", 5)).size() == 3);
    CHECK(ScanAll(store, keys::CheckpointPrefix("a"), "A").size() == 5);
    CHECK(ScanAll(store, keys::CheckpointPrefix("a"), "D").empty());
    CHECK(ScanAll(store, keys::AllCheckpointsPrefix()).size() == 15);
    CHECK(ScanAll(store, "").size() == 16);
    CHECK(ScanAll(store, "Z").empty());

    int calls = 0;
    auto stop_at_3 = [&](std::string_view, std::string_view) { return ++calls < 3; };
    REQUIRE(store.Scan(keys::AllCheckpointsPrefix(), "", 0, stop_at_3).ok());
    CHECK(calls == 3);
  }
  SECTION("DeletePrefix removes exactly the prefix") {
    std::vector<MetaStore::Write> w;
    for (uint32_t rank = 0; rank < 100; ++rank) {
      w.push_back({keys::Rank("a", 7, rank), "r"});
      w.push_back({keys::Rank("a", 8, rank), "r"});
      w.push_back({keys::Rank("ab", 7, rank), "r"});
    }
    w.push_back({"\xff\xff"s, "x"});
    w.push_back({"\xff\xff\x01"s, "y"});
    w.push_back({"\xfe"s, "z"});
    REQUIRE(store.Commit(w, true).ok());
    REQUIRE(store.DeletePrefix(keys::RankPrefix("a", 7), true).ok());
    CHECK(ScanAll(store, keys::RankPrefix("a", 7)).empty());
    CHECK(ScanAll(store, keys::RankPrefix("a", 8)).size() == 100);
    CHECK(ScanAll(store, keys::RankPrefix("ab", 7)).size() == 100);
    // A prefix with no successor (all 0xff bytes).
    REQUIRE(store.DeletePrefix("\xff\xff"s, false).ok());
    CHECK(ScanAll(store, "\xff"s).empty());
    CHECK(store.Get("\xfe"s)->has_value());
    REQUIRE(store.DeletePrefix("nothing-here", false).ok());
  }
  SECTION("concurrent commits and scans") {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint32_t i = 0; i < 200; ++i) {
          std::vector<MetaStore::Write> w = {{keys::Rank("job" + std::to_string(t), 1, i), "v"}};
          (void)store.Commit(w, false);
          (void)store.Scan(keys::AllCheckpointsPrefix(), "", 10,
                           [](std::string_view, std::string_view) { return true; });
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 4; ++t) {
      CHECK(ScanAll(store, keys::RankPrefix("job" + std::to_string(t), 1)).size() == 200);
    }
  }
}

TEST_CASE("MemoryMetaStore honours the MetaStore contract", "[unit]") {
  auto store = NewMemoryMetaStore();
  RunContract(*store);
}

TEST_CASE("RocksDbMetaStore honours the MetaStore contract", "[unit]") {
  TestDir dir("metastore");
  auto store = OpenRocksDbMetaStore(dir.path() + "/index");
  REQUIRE(store.ok());
  RunContract(**store);
}

TEST_CASE("RocksDbMetaStore keeps synced data across reopen", "[unit]") {
  TestDir dir("metastore_reopen");
  std::string path = dir.path() + "/index";
  {
    auto store = OpenRocksDbMetaStore(path);
    REQUIRE(store.ok());
    std::vector<MetaStore::Write> w = {{keys::Job("j"), "owner"},
                                       {keys::Checkpoint("j", 42), "committed"}};
    REQUIRE((*store)->Commit(w, true).ok());
    std::vector<MetaStore::Write> del = {{keys::Job("j"), std::nullopt}};
    REQUIRE((*store)->Commit(del, true).ok());
    REQUIRE((*store)->DeletePrefix(keys::RankPrefix("j", 42), true).ok());
  }
  auto store = OpenRocksDbMetaStore(path);
  REQUIRE(store.ok());
  CHECK_FALSE((*store)->Get(keys::Job("j"))->has_value());
  CHECK(**(*store)->Get(keys::Checkpoint("j", 42)) == "committed");
}

TEST_CASE("RocksDbMetaStore refuses a second open of the same directory", "[unit]") {
  TestDir dir("metastore_lock");
  std::string path = dir.path() + "/index";
  auto first = OpenRocksDbMetaStore(path);
  REQUIRE(first.ok());
  auto second = OpenRocksDbMetaStore(path);
  REQUIRE_FALSE(second.ok());
  CHECK(absl::IsFailedPrecondition(second.status()));
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains("another ckptd holds the index at " + path));
  first->reset();
  CHECK(OpenRocksDbMetaStore(path).ok());
}

TEST_CASE("RocksDbMetaStore open errors name the directory", "[unit]") {
  TestDir dir("metastore_err");
  std::string file = dir.path() + "/not-a-dir";
  FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fclose(f);
  auto store = OpenRocksDbMetaStore(file + "/index");
  REQUIRE_FALSE(store.ok());
  CHECK_THAT(std::string(store.status().message()), Catch::Contains(file));
}

}  // namespace
}  // namespace ckptd
