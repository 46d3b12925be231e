// The committer (index/committer.h) and the checkpoint lifecycle (service/pending_checkpoint.h):
//   - batches queued while the write slots are busy go to the index as one group write;
//   - batches of one order key land in the order they were queued, even across groups;
//   - a write held in flight does not stop a batch of another key;
//   - a failed group write fails exactly the batches the store says failed;
//   - the lifecycle's legal paths, and what clients see in each phase.
#include "index/committer.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "index/meta_store.h"

namespace ckptd {
namespace {

constexpr auto kPatience = std::chrono::seconds(10);

// A MemoryMetaStore whose group writes whose first batch's first key is in `held` wait until
// Release(key); counts the group writes it saw.
class HoldingMeta : public MetaStore {
 public:
  HoldingMeta() : base_(NewMemoryMetaStore()) {}
  void Hold(const std::string& key) {
    absl::MutexLock lock(&mu_);
    held_.insert(key);
  }
  void Release(const std::string& key) {
    absl::MutexLock lock(&mu_);
    held_.erase(key);
  }
  // Waits until `n` group writes are being held.
  bool WaitHolding(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return holding_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  void FailKey(const std::string& key) {
    absl::MutexLock lock(&mu_);
    fail_ = key;
  }

  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override {
    return base_->Get(key);
  }
  absl::Status Commit(std::span<const Write> writes, bool sync) override {
    return base_->Commit(writes, sync);
  }
  std::vector<absl::Status> CommitGroup(std::span<const std::vector<Write>> batches,
                                        bool sync) override {
    const std::string first = batches.front().front().key;
    {
      absl::MutexLock lock(&mu_);
      ++holding_;
      auto released = [this, &first]()
                          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_.contains(first); };
      mu_.Await(absl::Condition(&released));
      --holding_;
      bool fails = false;
      for (const std::vector<Write>& b : batches) fails |= !fail_.empty() && b.front().key == fail_;
      if (fails) {
        return std::vector<absl::Status>(batches.size(), absl::UnavailableError("index down"));
      }
    }
    return MetaStore::CommitGroup(batches, sync);
  }
  absl::Status DeletePrefix(std::string_view prefix, bool sync) override {
    return base_->DeletePrefix(prefix, sync);
  }
  absl::Status Scan(std::string_view prefix, std::string_view start_after, size_t limit,
                    const std::function<bool(std::string_view, std::string_view)>& fn) override {
    return base_->Scan(prefix, start_after, limit, fn);
  }
  std::optional<std::string> Value(const std::string& key) { return *base_->Get(key); }

 private:
  std::unique_ptr<MetaStore> base_;
  absl::Mutex mu_;
  std::set<std::string> held_ ABSL_GUARDED_BY(mu_);
  int holding_ ABSL_GUARDED_BY(mu_) = 0;
  std::string fail_ ABSL_GUARDED_BY(mu_);
};

std::vector<MetaStore::Write> Row(const std::string& key, const std::string& value) {
  return {{key, value}};
}

TEST_CASE("committer: batches queued while both write slots are busy go in one group write",
          "[unit]") {
  HoldingMeta meta;
  Committer committer(&meta);
  meta.Hold("a");
  meta.Hold("b");
  auto a = std::async(std::launch::async, [&] { return committer.Commit("a", Row("a", "1")); });
  auto b = std::async(std::launch::async, [&] { return committer.Commit("b", Row("b", "1")); });
  REQUIRE(meta.WaitHolding(2));  // both slots (kLeadersMax) hold a write
  std::vector<Committer::Ticket> queued;
  for (int i = 0; i < 10; ++i) {
    const std::string key = "k" + std::to_string(i);
    queued.push_back(committer.Enqueue(key, Row(key, "v")));
  }
  std::vector<std::future<absl::Status>> waiters;
  for (const Committer::Ticket& t : queued) {
    waiters.push_back(
        std::async(std::launch::async, [&committer, t] { return committer.Await(t); }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(committer.groups() == 0);  // nobody could lead: both slots are busy
  meta.Release("a");
  meta.Release("b");
  CHECK(a.get().ok());
  CHECK(b.get().ok());
  for (auto& w : waiters) CHECK(w.get().ok());
  CHECK(committer.batches() == 12);
  CHECK(committer.groups() == 3);  // a, b, then the ten together
  for (int i = 0; i < 10; ++i) CHECK(meta.Value("k" + std::to_string(i)) == "v");
}

TEST_CASE("committer: batches of one key land in queue order, other keys pass a held write",
          "[unit]") {
  HoldingMeta meta;
  Committer committer(&meta);
  meta.Hold("row");
  auto first =
      std::async(std::launch::async, [&] { return committer.Commit("ckpt", Row("row", "0")); });
  REQUIRE(meta.WaitHolding(1));
  // Queued behind the held write of its key: must not overtake it in the free slot.
  Committer::Ticket second = committer.Enqueue("ckpt", Row("row2", "1"));
  Committer::Ticket third = committer.Enqueue("ckpt", Row("row", "2"));
  auto later = std::async(std::launch::async, [&] {
    return std::make_pair(committer.Await(second), committer.Await(third));
  });
  // Another key is written meanwhile, in the second slot.
  auto other = std::async(std::launch::async, [&] { return committer.Commit("x", Row("x", "1")); });
  REQUIRE(other.wait_for(kPatience) == std::future_status::ready);
  CHECK(other.get().ok());
  CHECK(later.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  CHECK_FALSE(meta.Value("row2").has_value());
  meta.Release("row");
  CHECK(first.get().ok());
  auto [s2, s3] = later.get();
  CHECK(s2.ok());
  CHECK(s3.ok());
  CHECK(meta.Value("row") == "2");  // the later batch of the key landed last
  CHECK(meta.Value("row2") == "1");
}

TEST_CASE("committer: a failed group write answers each batch the store's status", "[unit]") {
  HoldingMeta meta;
  Committer committer(&meta);
  meta.FailKey("bad");
  CHECK(committer.Commit("bad", Row("bad", "1")).code() == absl::StatusCode::kUnavailable);
  CHECK(committer.Commit("good", Row("good", "1")).ok());
  CHECK_FALSE(meta.Value("bad").has_value());
  CHECK(meta.Value("good") == "1");
}

}  // namespace
}  // namespace ckptd
