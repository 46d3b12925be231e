// MemoryStorage: the crash model (durable vs unsynced state) other modules' fault tests rely on.
#include "storage/memory/memory_storage.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace ckptd {
namespace {

absl::Status WriteString(BlobWriter& w, const std::string& data, uint64_t offset) {
  IoSlice s{const_cast<char*>(data.data()), data.size(), offset};
  return w.Write({&s, 1});
}

std::string ReadBlob(MemoryStorage& storage, const std::string& path) {
  auto r = storage.OpenBlob(path);
  REQUIRE(r.ok());
  std::string back((*r)->size_bytes(), '\0');
  IoSlice s{back.data(), back.size(), 0};
  REQUIRE((*r)->Read({&s, 1}).ok());
  return back;
}

TEST_CASE("MemoryStorage blobs, objects, listing", "[unit]") {
  auto storage = NewMemoryStorage();
  auto w = storage->CreateBlob("job/1/r0.blob");
  REQUIRE(w.ok());
  REQUIRE(WriteString(**w, "world", 6).ok());
  REQUIRE(WriteString(**w, "hello ", 0).ok());
  REQUIRE((*w)->Sync().ok());
  CHECK(absl::IsFailedPrecondition((*w)->Sync()));
  CHECK(ReadBlob(*storage, "job/1/r0.blob") == "hello world");
  CHECK(*storage->Get("job/1/r0.blob") == "hello world");

  auto r = storage->OpenBlob("job/1/r0.blob");
  REQUIRE(r.ok());
  std::string past(10, '\0');
  IoSlice s{past.data(), past.size(), 5};
  CHECK(absl::IsDataLoss((*r)->Read({&s, 1})));
  CHECK(absl::IsNotFound(storage->OpenBlob("job/1/none").status()));
  CHECK(absl::IsNotFound(storage->Get("job/1/none").status()));

  REQUIRE(storage->PutAtomic("job/1/MANIFEST", "m").ok());
  REQUIRE(storage->PutAtomic("job/10/MANIFEST", "m").ok());
  REQUIRE(storage->PutAtomic("job.x", "m").ok());
  CHECK(*storage->List("") == std::vector<std::string>{"job", "job.x"});
  CHECK(*storage->List("job") == std::vector<std::string>{"1", "10"});
  CHECK(*storage->List("job/1") == std::vector<std::string>{"MANIFEST", "r0.blob"});
  CHECK(storage->List("nothing")->empty());
  CHECK(*storage->Exists("job/1"));
  CHECK(*storage->Exists("job/1/MANIFEST"));
  CHECK_FALSE(*storage->Exists("job/2"));
  REQUIRE(storage->RemoveAll("job/1").ok());
  CHECK_FALSE(*storage->Exists("job/1"));
  CHECK(*storage->Exists("job/10/MANIFEST"));
  CHECK(storage->RemoveAll("job/1").ok());

  CHECK(absl::IsInvalidArgument(storage->CreateBlob("/abs").status()));
  CHECK(absl::IsInvalidArgument(storage->PutAtomic("a/../b", "x")));
  CHECK(absl::IsInvalidArgument(storage->List("..").status()));
}

TEST_CASE("MemoryStorage DropUnsynced reverts to the durable state", "[unit][fault]") {
  auto storage = NewMemoryStorage();

  // Synced blob survives; written after sync is lost.
  auto synced = storage->CreateBlob("j/synced");
  REQUIRE(synced.ok());
  REQUIRE(WriteString(**synced, "durable", 0).ok());
  REQUIRE((*synced)->Sync().ok());
  CHECK(storage->IsDurable("j/synced"));

  // Created, written, never synced: vanishes.
  auto lost = storage->CreateBlob("j/lost");
  REQUIRE(lost.ok());
  REQUIRE(WriteString(**lost, "gone", 0).ok());
  CHECK_FALSE(storage->IsDurable("j/lost"));

  // A durable blob rewritten but not synced goes back to its old content.
  auto again = storage->CreateBlob("j/synced");
  REQUIRE(again.ok());
  REQUIRE(WriteString(**again, "rewritten-not-synced", 0).ok());
  CHECK(*storage->Get("j/synced") == "rewritten-not-synced");

  // PutAtomic is durable at once.
  REQUIRE(storage->PutAtomic("j/MANIFEST", "v1").ok());
  CHECK(storage->IsDurable("j/MANIFEST"));

  storage->DropUnsynced();
  CHECK(*storage->Get("j/synced") == "durable");
  CHECK(absl::IsNotFound(storage->Get("j/lost").status()));
  CHECK(*storage->Get("j/MANIFEST") == "v1");
  CHECK(*storage->List("j") == std::vector<std::string>{"MANIFEST", "synced"});
  // The writer of a vanished blob now fails cleanly.
  CHECK(absl::IsNotFound(WriteString(**lost, "x", 0)));
  CHECK(absl::IsNotFound((*lost)->Sync()));
}

TEST_CASE("MemoryStorage is safe from several threads", "[unit]") {
  auto storage = NewMemoryStorage();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        std::string path = "t" + std::to_string(t) + "/" + std::to_string(i);
        auto w = storage->CreateBlob(path);
        if (!w.ok()) continue;
        (void)WriteString(**w, path, 0);
        if (i % 2 == 0) (void)(*w)->Sync();
        (void)storage->List("t" + std::to_string(t));
      }
    });
  }
  for (auto& th : threads) th.join();
  storage->DropUnsynced();
  for (int t = 0; t < 4; ++t) CHECK(storage->List("t" + std::to_string(t))->size() == 50);
}

}  // namespace
}  // namespace ckptd
