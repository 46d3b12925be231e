// Which runs of a load plan the client copies itself (service/hot_direct.h): only runs whose
// every checked block lies in a hot range of the caller's own uid, only requests that asked, a
// request only when all of its runs qualify (and a run only when all of its requests do); the
// answer's spans name the right segment offsets, checksums and destination offsets.
#include "service/hot_direct.h"

#include <unistd.h>

#include <catch2/catch.hpp>

#include "../dataplane/test_arena.h"

namespace ckptd {
namespace {

constexpr uint32_t kBlock = 4096;
constexpr uint32_t kUid = 1000;

struct Fixture {
  std::string prefix =
      "/ckptd-hotdirect-" + std::to_string(getpid()) + "-" + RandomHexId().substr(0, 8) + "-";
  std::unique_ptr<StagingArena> arena = OpenTestArena(prefix, (4 << 20) + 4096);
  v1::ShardEntry a, b;  // blob 0: a = [0, 8192), b = [8192, 12288)
  LoadPlan plan;
  uint64_t arena_offset = 0;
  ~Fixture() { arena->Unlink(); }

  Fixture() {
    a.set_blob_id(0);
    a.set_offset(0);
    a.set_length(2 * kBlock);
    a.add_block_crc32c(0xA0);
    a.add_block_crc32c(0xA1);
    b.set_blob_id(0);
    b.set_offset(2 * kBlock);
    b.set_length(kBlock);
    b.add_block_crc32c(0xB0);
    // Run 0: shard a whole to request 0. Run 1: shard b, its first 100 bytes to request 1 and
    // bytes [1000, 3000) to request 2 at 7.
    plan.runs = {ReadRun{0, 0, 2 * kBlock, 0, 1, 0, 1}, ReadRun{0, 2 * kBlock, kBlock, 1, 1, 1, 2}};
    plan.checks = {BlockCheck{&a, 0, 0, 2}, BlockCheck{&b, 0, 0, 1}};
    plan.copies = {RunCopy{0, 0, 0, 2 * kBlock}, RunCopy{0, 1, 0, 100}, RunCopy{1000, 2, 7, 2000}};
  }
  // A hot copy of blob 0 bytes [0, length) in `uid`'s segment.
  std::shared_ptr<const HotCopy> Hot(uint64_t length, uint32_t uid = kUid) {
    const uint64_t sizes[] = {length};
    auto e = arena->Reserve("s", uid, sizes, absl::ZeroDuration());
    REQUIRE(e.ok());
    const uint64_t id = (*e)[0].id;
    REQUIRE(arena->Take("s", {&id, 1}).ok());
    arena_offset = (*e)[0].offset;
    return std::make_shared<const HotCopy>(
        arena.get(), std::vector<HotRange>{HotRange{0, 0, length, uid, arena_offset}},
        std::vector<HotExtent>{HotExtent{id, uid, arena_offset, (*e)[0].length}});
  }
};

TEST_CASE("hot direct: every run in the caller's hot range goes direct, spans name it exactly",
          "[unit]") {
  Fixture f;
  auto hot = f.Hot(3 * kBlock);
  HotDirectPlan d = PlanHotDirect(*hot, kUid, f.plan, {true, true, true}, kBlock);
  CHECK(d.run == std::vector<bool>{true, true});
  CHECK(d.request == std::vector<bool>{true, true, true});
  CHECK(d.bytes == 2 * kBlock + 100 + 2000);
  v1::LoadResponse resp;
  for (int i = 0; i < 3; ++i) resp.add_items();
  AddHotSpans(*hot, f.plan, d, kBlock, &resp);
  REQUIRE(resp.hot_spans_size() == 2);
  const v1::HotSpan& s0 = resp.hot_spans(0);
  CHECK(s0.arena_offset() == f.arena_offset);
  CHECK(s0.length() == 2 * kBlock);
  CHECK(std::vector<uint32_t>(s0.block_crc32c().begin(), s0.block_crc32c().end()) ==
        std::vector<uint32_t>{0xA0, 0xA1});
  REQUIRE(s0.copies_size() == 1);
  CHECK(s0.copies(0).bytes() == 2 * kBlock);
  const v1::HotSpan& s1 = resp.hot_spans(1);
  CHECK(s1.arena_offset() == f.arena_offset + 2 * kBlock);
  REQUIRE(s1.copies_size() == 2);
  CHECK(s1.copies(1).item() == 2);
  CHECK(s1.copies(1).span_offset() == 1000);
  CHECK(s1.copies(1).dst_offset() == 7);
  CHECK(resp.items(0).hot_direct());
  CHECK(resp.items(2).hot_direct());
}

TEST_CASE(
    "hot direct: a request that did not ask keeps its run, and that run's other requests, "
    "with the daemon",
    "[unit]") {
  Fixture f;
  auto hot = f.Hot(3 * kBlock);
  HotDirectPlan d = PlanHotDirect(*hot, kUid, f.plan, {true, true, false}, kBlock);
  CHECK(d.run == std::vector<bool>{true, false});
  CHECK(d.request == std::vector<bool>{true, false, false});
  CHECK(d.bytes == 2 * kBlock);
}

TEST_CASE("hot direct: another uid's hot bytes, or bytes not all hot, never go direct", "[unit]") {
  Fixture f;
  SECTION("another uid's segment") {
    auto hot = f.Hot(3 * kBlock, kUid + 1);
    HotDirectPlan d = PlanHotDirect(*hot, kUid, f.plan, {true, true, true}, kBlock);
    CHECK(d.run == std::vector<bool>{false, false});
    CHECK(d.request == std::vector<bool>{false, false, false});
    CHECK(d.bytes == 0);
  }
  SECTION("shard b is not hot") {
    auto hot = f.Hot(2 * kBlock);
    HotDirectPlan d = PlanHotDirect(*hot, kUid, f.plan, {true, true, true}, kBlock);
    CHECK(d.run == std::vector<bool>{true, false});
    CHECK(d.request == std::vector<bool>{true, false, false});
  }
}

}  // namespace
}  // namespace ckptd
