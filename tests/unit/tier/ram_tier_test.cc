// The RAM tier (tier/ram_tier.h): which copies are hot, eviction (budget, keep-per-job, the
// arena's reclaim, Drop), pins outliving eviction, and its index rows.
#include "tier/ram_tier.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "../dataplane/test_arena.h"
#include "index/keys.h"

namespace ckptd {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kUid = 1000;

struct Fixture {
  std::string prefix =
      "/ckptd-ramtier-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 8) + "-";
  std::unique_ptr<StagingArena> arena = OpenTestArena(prefix, 16 * kMiB + 4096);
  std::unique_ptr<MetaStore> meta = NewMemoryMetaStore();
  ~Fixture() { arena->Unlink(); }

  // A daemon-owned extent of `bytes` filled with `fill`, as one rank's blob 0..bytes.
  HotParts Rank(uint32_t blob, uint64_t bytes, uint8_t fill) {
    const uint64_t sizes[] = {bytes};
    auto e = arena->Reserve("s", kUid, sizes, absl::ZeroDuration());
    REQUIRE(e.ok());
    const uint64_t id = (*e)[0].id;
    REQUIRE(arena->Take("s", {&id, 1}).ok());
    std::memset(arena->Data((*e)[0]), fill, bytes);
    HotParts p;
    p.ranges.push_back(HotRange{blob, 0, bytes, kUid, (*e)[0].offset});
    p.extents.push_back(HotExtent{id, kUid, (*e)[0].offset, (*e)[0].length});
    return p;
  }
  bool HasRow(const std::string& job, uint64_t step) {
    auto v = meta->Get(keys::Hot(job, step));
    REQUIRE(v.ok());
    return v->has_value();
  }
};

RamTier::Options Keep(uint32_t n, uint64_t bytes_max = 0) { return {bytes_max, n}; }

TEST_CASE("RAM tier: a committed copy serves its ranges and has a row, provisional ones do not",
          "[unit]") {
  Fixture f;
  RamTier tier(Keep(1), f.arena.get(), f.meta.get());
  const RamTier::Key k{"j", 1};
  REQUIRE(tier.AddRank(k, f.Rank(0, kMiB, 0xA0)));
  REQUIRE(tier.AddRank(k, f.Rank(1, kMiB, 0xA1)));
  CHECK(tier.Pin(k) == nullptr);  // provisional: not hot until committed
  CHECK_FALSE(tier.HotBytes(k).has_value());
  CHECK_FALSE(f.HasRow("j", 1));
  tier.Commit(k);
  CHECK(f.HasRow("j", 1));
  CHECK(tier.HotBytes(k) == 2 * kMiB);
  std::shared_ptr<const HotCopy> c = tier.Pin(k);
  REQUIRE(c != nullptr);
  const uint8_t* p = c->Find(1, 4096, 100);
  REQUIRE(p != nullptr);
  CHECK(p[0] == 0xA1);
  CHECK(c->Find(0, kMiB - 10, 10)[9] == 0xA0);
  CHECK(c->Find(0, kMiB - 10, 11) == nullptr);  // past the range
  CHECK(c->Find(2, 0, 1) == nullptr);           // a blob it does not hold
  v1::HotRecord rec = c->Record();
  CHECK(rec.ranges_size() == 2);
  CHECK(rec.extents_size() == 2);
  CHECK(rec.generations().at(kUid) == f.arena->Generation(kUid));
}

TEST_CASE("RAM tier: keep_per_job keeps the newest steps and frees the others' extents", "[unit]") {
  Fixture f;
  const uint64_t free0 = f.arena->free_bytes();
  RamTier tier(Keep(1), f.arena.get(), f.meta.get());
  REQUIRE(tier.AddRank({"j", 1}, f.Rank(0, kMiB, 1)));
  tier.Commit({"j", 1});
  REQUIRE(tier.AddRank({"k", 1}, f.Rank(0, kMiB, 1)));  // another job is not trimmed
  tier.Commit({"k", 1});
  REQUIRE(tier.AddRank({"j", 2}, f.Rank(0, kMiB, 2)));
  CHECK(tier.HotBytes({"j", 1}).has_value());  // step 2 is not committed yet
  tier.Commit({"j", 2});
  CHECK_FALSE(tier.HotBytes({"j", 1}).has_value());
  CHECK_FALSE(f.HasRow("j", 1));
  CHECK(tier.HotBytes({"j", 2}).has_value());
  CHECK(tier.HotBytes({"k", 1}).has_value());
  CHECK(f.arena->free_bytes() == free0 - 2 * kMiB);
  // An older step committed after a newer one is not kept.
  REQUIRE(tier.AddRank({"j", 0}, f.Rank(0, kMiB, 0)));
  tier.Commit({"j", 0});
  CHECK_FALSE(tier.HotBytes({"j", 0}).has_value());
  CHECK(tier.stats().hot_checkpoints == 2);
  tier.Drop({"j", 2});
  tier.Drop({"k", 1});
  CHECK(f.arena->free_bytes() == free0);
  CHECK(tier.stats().hot_bytes == 0);
}

TEST_CASE("RAM tier: the budget evicts the least recently used, a copy larger than it is refused",
          "[unit]") {
  Fixture f;
  RamTier tier(Keep(8, 3 * kMiB), f.arena.get(), f.meta.get());
  for (uint64_t s = 1; s <= 3; ++s) {
    REQUIRE(tier.AddRank({"j", s}, f.Rank(0, kMiB, 1)));
    tier.Commit({"j", s});
  }
  CHECK(tier.Pin({"j", 1}) != nullptr);  // used: step 2 is now the least recently used
  REQUIRE(tier.AddRank({"j", 4}, f.Rank(0, kMiB, 1)));
  CHECK_FALSE(tier.HotBytes({"j", 2}).has_value());
  CHECK(tier.HotBytes({"j", 1}).has_value());
  const uint64_t free_before = f.arena->free_bytes();
  HotParts big = f.Rank(0, 4 * kMiB, 1);
  const uint64_t id = big.extents[0].id;
  const bool taken = tier.AddRank({"j", 5}, std::move(big));
  CHECK_FALSE(taken);  // it took nothing: the caller frees
  f.arena->Free({&id, 1});
  CHECK(f.arena->free_bytes() == free_before);
  CHECK(tier.stats().evictions == 1);
}

TEST_CASE("RAM tier: a reservation that needs the space evicts hot copies, never staging",
          "[unit]") {
  Fixture f;
  RamTier tier(Keep(8), f.arena.get(), f.meta.get());
  f.arena->SetReclaimer([&](uint64_t bytes) { return tier.Reclaim(bytes); });
  // 16 MiB: 6 hot, 6 provisional (a save in flight), 4 free.
  REQUIRE(tier.AddRank({"a", 1}, f.Rank(0, 6 * kMiB, 1)));
  tier.Commit({"a", 1});
  REQUIRE(tier.AddRank({"b", 1}, f.Rank(0, 6 * kMiB, 2)));
  const uint64_t sizes[] = {6 * kMiB};
  auto e = f.arena->Reserve("client", kUid, sizes, absl::ZeroDuration());
  REQUIRE(e.ok());
  CHECK_FALSE(tier.HotBytes({"a", 1}).has_value());  // the committed copy went first
  CHECK(tier.stats().provisional_bytes == 6 * kMiB);
  CHECK_FALSE(f.HasRow("a", 1));
  // Then the provisional one: the save keeps its blob on storage, only its hot copy is lost.
  const uint64_t more[] = {8 * kMiB};
  auto e2 = f.arena->Reserve("client", kUid, more, absl::ZeroDuration());
  REQUIRE(e2.ok());
  CHECK(tier.stats().provisional_bytes == 0);
  tier.Commit({"b", 1});  // nothing left to make hot
  CHECK_FALSE(tier.HotBytes({"b", 1}).has_value());
  // Nothing left to evict: a full arena answers RESOURCE_EXHAUSTED as before.
  const uint64_t one[] = {3 * kMiB};
  auto e3 = f.arena->Reserve("client", kUid, one, absl::ZeroDuration());
  CHECK(absl::IsResourceExhausted(e3.status()));
  f.arena->SetReclaimer(nullptr);
}

TEST_CASE("RAM tier: an evicted copy a load still pins keeps its bytes until the pin goes",
          "[unit]") {
  Fixture f;
  const uint64_t free0 = f.arena->free_bytes();
  RamTier tier(Keep(1), f.arena.get(), f.meta.get());
  REQUIRE(tier.AddRank({"j", 1}, f.Rank(0, kMiB, 7)));
  tier.Commit({"j", 1});
  std::shared_ptr<const HotCopy> pin = tier.Pin({"j", 1});
  tier.Drop({"j", 1});
  CHECK_FALSE(f.HasRow("j", 1));
  CHECK(tier.Pin({"j", 1}) == nullptr);
  CHECK(f.arena->free_bytes() == free0 - kMiB);  // still held by the load
  CHECK(pin->Find(0, 0, kMiB)[kMiB - 1] == 7);
  pin.reset();
  CHECK(f.arena->free_bytes() == free0);
}

TEST_CASE("RAM tier: off (keep_per_job 0) takes nothing", "[unit]") {
  Fixture f;
  RamTier tier(Keep(0), f.arena.get(), f.meta.get());
  CHECK_FALSE(tier.enabled());
  HotParts p = f.Rank(0, kMiB, 1);
  const uint64_t id = p.extents[0].id;
  CHECK_FALSE(tier.AddRank({"j", 1}, p));
  CHECK_FALSE(tier.Insert({"j", 1}, p, true));
  f.arena->Free({&id, 1});
  CHECK_FALSE(tier.Reclaim(kMiB));
}

}  // namespace
}  // namespace ckptd
