// Copying a Load answer's hot spans (client/cpp/src/hot_spans.h) out of a mapped arena: whole
// spans straight into the destination, spans copied in parts through a verified private copy,
// a block that does not verify (only its items are refused), and an answer that does not fit the
// mapping or the destinations (INTERNAL, nothing copied).
#include "hot_spans.h"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "format/crc32c.h"

namespace ckptd::internal {
namespace {

constexpr uint64_t kArenaBytes = 4 << 20;
constexpr uint32_t kBlock = 4096;

struct Arena {
  std::shared_ptr<ArenaMapping> map;
  uint8_t* data = nullptr;
  Arena() {
    int fd = memfd_create("hot-spans-test", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, kArenaBytes) == 0);
    auto m = ArenaMapping::MapFd(fd, "hot-spans-test", kArenaBytes, false, false);
    REQUIRE(m.ok());
    map = *m;
    data = *map->At(0, kArenaBytes);
    for (uint64_t i = 0; i < kArenaBytes; ++i) data[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  }
  // A span of `length` bytes at `offset` with the crcs of what the arena holds now.
  v1::HotSpan Span(uint64_t offset, uint64_t length) const {
    v1::HotSpan s;
    s.set_arena_offset(offset);
    s.set_length(length);
    s.set_block_bytes(kBlock);
    for (uint32_t c : BlockCrcs(data + offset, length, kBlock)) s.add_block_crc32c(c);
    return s;
  }
};

void AddCopy(v1::HotSpan* s, uint32_t item, uint64_t span_offset, uint64_t dst_offset,
             uint64_t bytes) {
  v1::HotSpanCopy* c = s->add_copies();
  c->set_item(item);
  c->set_span_offset(span_offset);
  c->set_dst_offset(dst_offset);
  c->set_bytes(bytes);
}

TEST_CASE("hot spans: whole spans and spans in parts land exactly, on several threads", "[unit]") {
  Arena a;
  v1::LoadResponse resp;
  // Item 0: 3 MiB + 100 bytes (a shard's short last block) copied whole, in pieces.
  const uint64_t big = (3 << 20) + 100;
  v1::HotSpan* s0 = resp.add_hot_spans();
  *s0 = a.Span(8192, big);
  AddCopy(s0, 0, 0, 0, big);
  // Item 1: a resharded region: two parts of one span, to two places of its destination.
  v1::HotSpan* s1 = resp.add_hot_spans();
  *s1 = a.Span(big + 16384, 3 * kBlock);
  AddCopy(s1, 1, 10, 500, 1000);
  AddCopy(s1, 1, 2 * kBlock + 5, 0, 300);
  std::vector<uint8_t> d0(big), d1(2000, 0xEE);
  const HotDest dests[] = {{d0.data(), d0.size()}, {d1.data(), d1.size()}};
  for (unsigned threads : {1u, 4u}) {
    std::fill(d0.begin(), d0.end(), 0);
    absl::StatusOr<std::vector<bool>> ok = CopyHotSpans(*a.map, resp, dests, threads);
    REQUIRE(ok.ok());
    CHECK(*ok == std::vector<bool>{true, true});
    CHECK(std::memcmp(d0.data(), a.data + 8192, big) == 0);
    CHECK(std::memcmp(d1.data() + 500, a.data + big + 16384 + 10, 1000) == 0);
    CHECK(std::memcmp(d1.data(), a.data + big + 16384 + 2 * kBlock + 5, 300) == 0);
    CHECK(d1[400] == 0xEE);  // between the parts: untouched
  }
}

TEST_CASE("hot spans: a block that does not verify refuses only the items it feeds", "[unit]") {
  Arena a;
  v1::LoadResponse resp;
  v1::HotSpan* s0 = resp.add_hot_spans();
  *s0 = a.Span(0, 1 << 20);
  AddCopy(s0, 0, 0, 0, 1 << 20);
  v1::HotSpan* s1 = resp.add_hot_spans();
  *s1 = a.Span(2 << 20, 2 * kBlock);
  AddCopy(s1, 1, 0, 0, kBlock);
  v1::HotSpan* s2 = resp.add_hot_spans();
  *s2 = a.Span(3 << 20, kBlock);
  AddCopy(s2, 2, 0, 0, kBlock);
  a.data[(1 << 20) - 1] ^= 1;          // item 0's last block, after its crc was taken
  a.data[(2 << 20) + kBlock] ^= 0x80;  // item 1's span's second block: not copied, still checked
  std::vector<uint8_t> d0(1 << 20), d1(kBlock), d2(kBlock);
  const HotDest dests[] = {{d0.data(), d0.size()}, {d1.data(), d1.size()}, {d2.data(), d2.size()}};
  absl::StatusOr<std::vector<bool>> ok = CopyHotSpans(*a.map, resp, dests, 2);
  REQUIRE(ok.ok());
  CHECK(*ok == std::vector<bool>{false, false, true});
  CHECK(std::memcmp(d2.data(), a.data + (3 << 20), kBlock) == 0);
}

TEST_CASE("hot spans: an answer outside the mapping or a destination is INTERNAL, nothing copied",
          "[unit]") {
  Arena a;
  std::vector<uint8_t> d0(kBlock, 0xEE);
  const HotDest dests[] = {{d0.data(), d0.size()}, {nullptr, 0}};
  auto run = [&](const v1::LoadResponse& resp) {
    absl::StatusOr<std::vector<bool>> ok = CopyHotSpans(*a.map, resp, dests, 2);
    CHECK(absl::IsInternal(ok.status()));
    CHECK(d0[0] == 0xEE);
  };
  v1::LoadResponse past_arena;
  v1::HotSpan* s = past_arena.add_hot_spans();
  *s = a.Span(0, kBlock);
  s->set_arena_offset(kArenaBytes - 10);
  AddCopy(s, 0, 0, 0, kBlock);
  run(past_arena);
  v1::LoadResponse past_dest;
  s = past_dest.add_hot_spans();
  *s = a.Span(0, 2 * kBlock);
  AddCopy(s, 0, 0, 1, kBlock);
  run(past_dest);
  v1::LoadResponse not_direct;  // item 1 was not asked hot_direct: no destination
  s = not_direct.add_hot_spans();
  *s = a.Span(0, kBlock);
  AddCopy(s, 1, 0, 0, 10);
  run(not_direct);
  v1::LoadResponse crcs_short;
  s = crcs_short.add_hot_spans();
  *s = a.Span(0, 2 * kBlock);
  s->mutable_block_crc32c()->RemoveLast();
  AddCopy(s, 0, 0, 0, kBlock);
  run(crcs_short);
}

}  // namespace
}  // namespace ckptd::internal
