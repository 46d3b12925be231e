// Hot leases (service/hot_leases.h): a client copying a hot copy itself keeps its bytes pinned
// until it releases the lease, its session ends or the lease time passes; ids it does not hold
// and leases past the per-session limit are refused.
#include "service/hot_leases.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "../dataplane/test_arena.h"
#include "common/limits.h"
#include "index/meta_store.h"

namespace ckptd {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kUid = 1000;

struct Fixture {
  std::string prefix =
      "/ckptd-hotlease-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 8) + "-";
  std::unique_ptr<StagingArena> arena = OpenTestArena(prefix, 8 * kMiB + 4096);
  std::unique_ptr<MetaStore> meta = NewMemoryMetaStore();
  RamTier tier{RamTier::Options{0, 1}, arena.get(), meta.get()};
  FakeClock clock{absl::FromUnixSeconds(1000)};
  HotLeases leases{&clock, absl::Seconds(60)};
  ~Fixture() { arena->Unlink(); }

  // A committed hot copy of (j, step): one MiB of `fill` as blob 0.
  std::shared_ptr<const HotCopy> Hot(uint64_t step, uint8_t fill) {
    const uint64_t sizes[] = {kMiB};
    auto e = arena->Reserve("s", kUid, sizes, absl::ZeroDuration());
    REQUIRE(e.ok());
    const uint64_t id = (*e)[0].id;
    REQUIRE(arena->Take("s", {&id, 1}).ok());
    std::memset(arena->Data((*e)[0]), fill, kMiB);
    HotParts p;
    p.ranges.push_back(HotRange{0, 0, kMiB, kUid, (*e)[0].offset});
    p.extents.push_back(HotExtent{id, kUid, (*e)[0].offset, (*e)[0].length});
    REQUIRE(tier.Insert({"j", step}, std::move(p), /*write_row=*/true));
    return tier.Pin({"j", step});
  }
};

TEST_CASE("hot leases: a lease pins its copy past eviction until released", "[unit]") {
  Fixture f;
  const uint64_t free0 = f.arena->free_bytes();
  std::shared_ptr<const HotCopy> hot = f.Hot(1, 0x5A);
  const uint8_t* bytes = hot->Find(0, 0, kMiB);
  absl::StatusOr<uint64_t> id = f.leases.Grant("s1", {"j", 1}, std::move(hot));
  REQUIRE(id.ok());
  CHECK(*id != 0);
  f.tier.Drop({"j", 1});  // eviction, delete or a mismatch: only the tier's reference goes
  CHECK(f.tier.Pin({"j", 1}) == nullptr);
  CHECK(f.arena->free_bytes() == free0 - kMiB);  // still pinned by the lease
  CHECK(bytes[kMiB - 1] == 0x5A);
  absl::StatusOr<RamTier::Key> key = f.leases.Release("s1", *id);
  REQUIRE(key.ok());
  CHECK(*key == RamTier::Key{"j", 1});
  CHECK(f.arena->free_bytes() == free0);  // the last pin went: freed
  CHECK(f.leases.held() == 0);
}

TEST_CASE("hot leases: releasing twice, another session's id or one never granted is NOT_FOUND",
          "[unit]") {
  Fixture f;
  absl::StatusOr<uint64_t> id = f.leases.Grant("s1", {"j", 1}, f.Hot(1, 1));
  REQUIRE(id.ok());
  absl::StatusOr<RamTier::Key> other = f.leases.Release("s2", *id);
  CHECK(absl::IsNotFound(other.status()));
  CHECK(f.leases.held() == 1);  // untouched by the other session's try
  CHECK(absl::IsNotFound(f.leases.Release("s1", *id + 100).status()));
  CHECK(f.leases.Release("s1", *id).ok());
  absl::StatusOr<RamTier::Key> twice = f.leases.Release("s1", *id);
  CHECK(absl::IsNotFound(twice.status()));
  CHECK(std::string(twice.status().message()).find("hot lease") != std::string::npos);
}

TEST_CASE("hot leases: a session past the limit is refused, naming it, others are not", "[unit]") {
  Fixture f;
  std::shared_ptr<const HotCopy> hot = f.Hot(1, 1);
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < limits::kHotLeasesPerSessionMax; ++i) {
    absl::StatusOr<uint64_t> id = f.leases.Grant("s1", {"j", 1}, hot);
    REQUIRE(id.ok());
    ids.push_back(*id);
  }
  absl::StatusOr<uint64_t> over = f.leases.Grant("s1", {"j", 1}, hot);
  CHECK(absl::IsResourceExhausted(over.status()));
  CHECK(std::string(over.status().message()).find("kHotLeasesPerSessionMax") != std::string::npos);
  CHECK(f.leases.Grant("s2", {"j", 1}, hot).ok());
  REQUIRE(f.leases.Release("s1", ids[0]).ok());
  CHECK(f.leases.Grant("s1", {"j", 1}, hot).ok());
}

TEST_CASE(
    "hot leases: a lease never released ends after the lease time, a session's end ends "
    "all of its own",
    "[unit]") {
  Fixture f;
  const uint64_t free0 = f.arena->free_bytes();
  {
    std::shared_ptr<const HotCopy> hot = f.Hot(1, 1);
    REQUIRE(f.leases.Grant("s1", {"j", 1}, hot).ok());
    REQUIRE(f.leases.Grant("s2", {"j", 1}, hot).ok());
    REQUIRE(f.leases.Grant("s2", {"j", 1}, hot).ok());
  }
  f.tier.Drop({"j", 1});
  f.clock.Advance(absl::Seconds(59));
  CHECK(f.leases.Expire() == 0);
  f.leases.DropSession("s2");
  CHECK(f.leases.held() == 1);
  CHECK(f.arena->free_bytes() == free0 - kMiB);  // s1's lease still pins it
  f.clock.Advance(absl::Seconds(2));
  CHECK(f.leases.Expire() == 1);
  CHECK(f.leases.held() == 0);
  CHECK(f.arena->free_bytes() == free0);
}

}  // namespace
}  // namespace ckptd
