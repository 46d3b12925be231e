// One contract, three storages: posix, memory and S3 answer List, Exists, Get, RemoveAll,
// PutAtomic and PutIfAbsent the same way (storage.h). The S3 leg needs weed (else it is skipped
// with a warning, and fails in CI).
#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckptd/io.h"
#include "s3_env.h"
#include "storage/memory/memory_storage.h"
#include "storage/posix/posix_storage.h"

namespace ckptd {
namespace {

using Names = std::vector<std::string>;

void CheckContract(Storage& s) {
  // An empty store.
  CHECK(*s.List("") == Names{});
  CHECK(*s.List("absent") == Names{});
  CHECK(*s.Exists("") == true);
  CHECK_FALSE(*s.Exists("a"));
  CHECK(absl::IsNotFound(s.Get("a/x").status()));
  CHECK(absl::IsNotFound(s.OpenBlob("a/x").status()));
  CHECK(absl::IsInvalidArgument(s.PutAtomic("../x", "no")));
  CHECK(absl::IsInvalidArgument(s.PutAtomic("/x", "no")));
  CHECK(absl::IsInvalidArgument(s.RemoveAll("")));

  REQUIRE(s.PutAtomic("a/x", "one").ok());
  REQUIRE(s.PutAtomic("a/y/z", "two").ok());
  REQUIRE(s.PutAtomic("a/y/w", "").ok());
  REQUIRE(s.PutAtomic("a.b", "three").ok());
  REQUIRE(s.PutAtomic("a2/q", "four").ok());
  CHECK(*s.Get("a/x") == "one");
  CHECK(*s.Get("a/y/w") == "");
  REQUIRE(s.PutAtomic("a/x", "one again").ok());  // replaces
  CHECK(*s.Get("a/x") == "one again");

  CHECK(*s.List("") == Names{"a", "a.b", "a2"});
  CHECK(*s.List("a") == Names{"x", "y"});
  CHECK(*s.List("a/y") == Names{"w", "z"});
  CHECK(*s.List("a/nothing") == Names{});
  CHECK(*s.Exists("a"));  // a directory
  CHECK(*s.Exists("a/y"));
  CHECK(*s.Exists("a/y/z"));
  CHECK_FALSE(*s.Exists("a/y/q"));
  CHECK_FALSE(
      *s.Exists("a/"
                "yy"));

  // PutIfAbsent: only the first one, content unchanged.
  REQUIRE(s.PutIfAbsent("a/commit", "first").ok());
  CHECK(absl::IsAlreadyExists(s.PutIfAbsent("a/commit", "second")));
  CHECK(*s.Get("a/commit") == "first");
  CHECK(absl::IsAlreadyExists(s.PutIfAbsent("a/x", "no")));
  CHECK(absl::IsInvalidArgument(s.PutIfAbsent("", "no")));

  // RemoveAll: the tree, not its siblings sharing a name prefix; absent is fine.
  REQUIRE(s.RemoveAll("a").ok());
  CHECK(*s.List("") == Names{"a.b", "a2"});
  CHECK_FALSE(*s.Exists("a"));
  CHECK(absl::IsNotFound(s.Get("a/y/z").status()));
  REQUIRE(s.RemoveAll("a").ok());
  REQUIRE(s.RemoveAll("a.b").ok());  // a single object
  CHECK(*s.List("") == Names{"a2"});

  // Racing PutIfAbsent: exactly one of four wins, every round.
  for (int round = 0; round < 4; ++round) {
    std::atomic<int> wins{0};
    std::atomic<int> lost{0};
    std::vector<std::thread> threads;
    const std::string path = absl::StrCat("race/", round);
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        absl::Status st = s.PutIfAbsent(path, absl::StrCat("w", t));
        if (st.ok()) ++wins;
        if (absl::IsAlreadyExists(st)) ++lost;
      });
    }
    for (std::thread& th : threads) th.join();
    CHECK(wins == 1);
    CHECK(lost == 3);
  }
  CHECK(s.List("race")->size() == 4);
}

TEST_CASE("storage contract: posix", "[s3][contract]") {
  std::string root =
      absl::StrCat(std::filesystem::temp_directory_path().string(), "/ckptd-contract-", getpid());
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  auto io = NewPosixIo();
  auto storage = NewPosixStorage(root, io.get());
  CheckContract(*storage);
  // Nothing but the objects is left (no temporary of a losing PutIfAbsent).
  CHECK(*storage->List("race") == Names{"0", "1", "2", "3"});
  std::filesystem::remove_all(root);
}

TEST_CASE("storage contract: memory", "[s3][contract]") {
  auto storage = NewMemoryStorage();
  CheckContract(*storage);
}

TEST_CASE("storage contract: s3", "[s3][contract]") {
  CKPTD_REQUIRE_WEED(weed);
  auto storage = NewS3Storage(testing::TestOptions(""));
  REQUIRE(storage.ok());
  CheckContract(**storage);
}

}  // namespace
}  // namespace ckptd
