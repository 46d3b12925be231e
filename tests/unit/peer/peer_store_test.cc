// The peer store (daemon/src/peer/peer_store.h): copies checked block by block as they arrive,
// kept whole or not at all, within the budget and the per-node limits, evicted never from a
// job's newest steps, and the races of two puts and of a drop during a put.
#include "peer/peer_store.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

#include "format/crc32c.h"

namespace ckptd::peer {
namespace {

constexpr uint32_t kBlock = 4096;

std::vector<char> Bytes(uint64_t n, uint8_t seed) {
  std::vector<char> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return v;
}

BlobHeader Header(const std::vector<char>& data, std::string node = "node-a",
                  std::string job = "job", uint64_t step = 1, std::string blob = "b0") {
  BlobHeader h;
  h.key = BlobKey{std::move(node), std::move(job), step, std::move(blob)};
  h.total_bytes = data.size();
  h.block_bytes = kBlock;
  h.spans.push_back(Span{0, data.size(), BlockCrcs(data.data(), data.size(), kBlock)});
  return h;
}

Store::Limits Lim(uint64_t bytes_max) {
  return Store::Limits{.bytes_max = bytes_max,
                       .streams_per_node_max = 4,
                       .inflight_bytes_per_node_max = 1 << 30,
                       .connections_per_node_max = 2};
}

// Sends `data` in chunks of `chunk` bytes and finishes.
absl::Status PutAll(Store& store, const BlobHeader& h, const std::vector<char>& data,
                    size_t chunk = 1000) {
  auto stream = store.OpenStream(h.key.origin_node, "conn-1");
  if (!stream.ok()) return stream.status();
  auto put = store.BeginPut(**stream, h);
  if (!put.ok()) return put.status();
  if (*put == nullptr) return absl::OkStatus();  // deduplicated
  for (size_t at = 0; at < data.size(); at += chunk) {
    const size_t n = std::min(chunk, data.size() - at);
    if (absl::Status st = (*put)->Append({data.data() + at, n}); !st.ok()) return st;
  }
  return (*put)->Finish();
}

TEST_CASE("peer store: a copy round-trips bit-exact in any chunking", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  const std::vector<char> data = Bytes(3 * kBlock + 123, 1);
  for (size_t chunk : {size_t{1}, size_t{4095}, size_t{4096}, size_t{100000}}) {
    BlobHeader h = Header(data, "node-a", "job", chunk, "b0");
    REQUIRE(PutAll(store, h, data, chunk).ok());
    auto got = store.Find(h.key);
    REQUIRE(got.ok());
    REQUIRE(std::memcmp((*got)->data.get(), data.data(), data.size()) == 0);
  }
  REQUIRE(store.usage().blobs == 4);
  REQUIRE(store.usage().bytes_reserved == 0);
}

TEST_CASE("peer store: a bad block is DATA_LOSS naming it, and nothing is kept", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  std::vector<char> data = Bytes(4 * kBlock, 2);
  const BlobHeader h = Header(data);
  data[2 * kBlock + 7] ^= 1;  // block 2
  const absl::Status st = PutAll(store, h, data);
  REQUIRE(st.code() == absl::StatusCode::kDataLoss);
  REQUIRE_THAT(std::string(st.message()),
               Catch::Contains("job job step 1 blob b0 from node node-a") &&
                   Catch::Contains("block 2") && Catch::Contains("[8192, 12288)"));
  REQUIRE(store.Find(h.key).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(store.usage().bytes_used == 0);
  REQUIRE(store.usage().bytes_reserved == 0);
}

TEST_CASE("peer store: several spans with padding between them are checked", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  std::vector<char> data = Bytes(3 * kBlock, 3);
  BlobHeader h = Header(data);
  h.spans.clear();
  h.spans.push_back(Span{0, 1000, BlockCrcs(data.data(), 1000, kBlock)});
  h.spans.push_back(Span{kBlock, 2 * kBlock, BlockCrcs(data.data() + kBlock, 2 * kBlock, kBlock)});
  data[2000] ^= 1;  // padding: not checked
  REQUIRE(PutAll(store, h, data).ok());
  data[kBlock + 1] ^= 1;
  h.key.blob = "b1";
  REQUIRE(PutAll(store, h, data).code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("peer store: a sender lying about sizes is refused", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  const std::vector<char> data = Bytes(2 * kBlock, 4);
  BlobHeader h = Header(data);
  SECTION("more bytes than total_bytes") {
    std::vector<char> more = data;
    more.push_back('x');
    REQUIRE(PutAll(store, h, more).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("fewer bytes than total_bytes") {
    std::vector<char> fewer(data.begin(), data.end() - 10);
    h.spans[0] = Span{0, kBlock, BlockCrcs(data.data(), kBlock, kBlock)};
    REQUIRE(PutAll(store, h, fewer).code() == absl::StatusCode::kInvalidArgument);
  }
  SECTION("a span past the end or crcs short") {
    h.spans[0].length += 1;
    REQUIRE(ValidateHeader(h).code() == absl::StatusCode::kInvalidArgument);
    h.spans[0].length -= 1;
    h.spans[0].crcs.pop_back();
    REQUIRE(ValidateHeader(h).code() == absl::StatusCode::kInvalidArgument);
  }
  REQUIRE(store.Find(h.key).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(store.usage().bytes_used + store.usage().bytes_reserved == 0);
}

TEST_CASE("peer store: a put abandoned mid-stream leaves nothing", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  const std::vector<char> data = Bytes(4 * kBlock, 5);
  const BlobHeader h = Header(data);
  {
    auto stream = store.OpenStream("node-a", "conn-1");
    REQUIRE(stream.ok());
    auto put = store.BeginPut(**stream, h);
    REQUIRE(put.ok());
    REQUIRE((*put)->Append({data.data(), 2 * kBlock}).ok());
    REQUIRE(store.usage().bytes_reserved == data.size());
  }  // the sender died: the handler returns, the Put and Stream go
  REQUIRE(store.usage().bytes_reserved == 0);
  REQUIRE(store.Find(h.key).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(PutAll(store, h, data).ok());  // the retry is not refused
}

TEST_CASE("peer store: two puts of the same blob", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  const std::vector<char> data = Bytes(2 * kBlock, 6);
  const BlobHeader h = Header(data);
  auto s1 = store.OpenStream("node-a", "conn-1");
  auto s2 = store.OpenStream("node-a", "conn-1");
  REQUIRE((s1.ok() && s2.ok()));
  auto p1 = store.BeginPut(**s1, h);
  REQUIRE(p1.ok());
  // While the first arrives: the second is ABORTED.
  REQUIRE(store.BeginPut(**s2, h).status().code() == absl::StatusCode::kAborted);
  REQUIRE((*p1)->Append(data).ok());
  REQUIRE((*p1)->Finish().ok());
  // Once stored: the same header is deduplicated, another is ALREADY_EXISTS.
  auto dup = store.BeginPut(**s2, h);
  REQUIRE(dup.ok());
  REQUIRE(*dup == nullptr);
  BlobHeader other = h;
  other.spans[0].crcs[0] ^= 1;
  REQUIRE(store.BeginPut(**s2, other).status().code() == absl::StatusCode::kAlreadyExists);
}

TEST_CASE("peer store: a drop during a put stores nothing of the step", "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  const std::vector<char> data = Bytes(2 * kBlock, 7);
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 1, "b0"), data).ok());
  auto stream = store.OpenStream("node-a", "conn-1");
  REQUIRE(stream.ok());
  auto put = store.BeginPut(**stream, Header(data, "node-a", "job", 1, "b1"));
  REQUIRE(put.ok());
  REQUIRE((*put)->Append(data).ok());
  const Store::DropResult r = store.Drop("node-a", "job", 1);
  REQUIRE(r.blobs == 1);
  REQUIRE(r.bytes == data.size());
  REQUIRE((*put)->Finish().code() == absl::StatusCode::kAborted);
  REQUIRE(store.usage().blobs == 0);
  // Another node's copies of the same step are not the sender's to drop.
  REQUIRE(PutAll(store, Header(data, "node-b", "job", 1, "b0"), data).ok());
  REQUIRE(store.Drop("node-a", "job", 1).blobs == 0);
  REQUIRE(store.usage().blobs == 1);
}

TEST_CASE("peer store: Held lists a node's whole copies of a step, not one still arriving",
          "[unit][peer]") {
  Store store(Lim(1 << 20), nullptr);
  const std::vector<char> data = Bytes(2 * kBlock, 9);
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 1, "b1"), data).ok());
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 1, "b0"), data).ok());
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 2, "b0"), data).ok());
  REQUIRE(PutAll(store, Header(data, "node-b", "job", 1, "b0"), data).ok());
  auto stream = store.OpenStream("node-a", "conn-1");
  REQUIRE(stream.ok());
  auto put = store.BeginPut(**stream, Header(data, "node-a", "job", 1, "b2"));
  REQUIRE(put.ok());
  REQUIRE((*put)->Append({data.data(), kBlock}).ok());  // half of it: not held yet
  using Held = std::vector<std::pair<std::string, uint64_t>>;
  CHECK(store.Held("node-a", "job", 1) == Held{{"b0", data.size()}, {"b1", data.size()}});
  CHECK(store.Held("node-b", "job", 1) == Held{{"b0", data.size()}});
  CHECK(store.Held("node-c", "job", 1).empty());
  store.Drop("node-a", "job", 1);
  CHECK(store.Held("node-a", "job", 1).empty());
  CHECK(store.Held("node-a", "job", 2).size() == 1);
}

TEST_CASE("peer store: the budget evicts old steps, never a job's two newest", "[unit][peer]") {
  const std::vector<char> data = Bytes(kBlock, 8);  // each copy: one block
  Store store(Lim(3 * kBlock), nullptr);
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 1), data).ok());
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 2), data).ok());
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 3), data).ok());
  // Step 4 evicts step 1 (the oldest; 3 and 4 are protected).
  REQUIRE(PutAll(store, Header(data, "node-a", "job", 4), data).ok());
  REQUIRE(store.Find(BlobKey{"node-a", "job", 1, "b0"}).status().code() ==
          absl::StatusCode::kNotFound);
  REQUIRE(store.usage().evictions == 1);
  // A put that does not fit without evicting a protected step: RESOURCE_EXHAUSTED, nothing
  // evicted.
  const std::vector<char> big = Bytes(2 * kBlock, 9);
  const absl::Status st = PutAll(store, Header(big, "node-a", "job", 5), big);
  // Steps 4 and 5 are protected; 2 and 3 are 2 blocks: evicting them fits 2 blocks.
  REQUIRE(st.ok());
  REQUIRE(store.usage().blobs == 2);
  const std::vector<char> huge = Bytes(3 * kBlock, 10);
  const absl::Status refused = PutAll(store, Header(huge, "node-a", "job", 6), huge);
  REQUIRE(refused.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(refused.message()), Catch::Contains("peer_bytes_max"));
  REQUIRE(store.usage().blobs == 2);  // steps 4 and 5 kept
}

TEST_CASE("peer store: the tier off refuses puts", "[unit][peer]") {
  Store store(Lim(0), nullptr);
  const std::vector<char> data = Bytes(kBlock, 11);
  REQUIRE(PutAll(store, Header(data), data).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("peer store: per-node limits name the limit and the node", "[unit][peer]") {
  Store::Limits l = Lim(1 << 20);
  l.streams_per_node_max = 2;
  l.inflight_bytes_per_node_max = 2 * kBlock;
  l.connections_per_node_max = 1;
  Store store(l, nullptr);
  auto s1 = store.OpenStream("node-a", "conn-1");
  auto s2 = store.OpenStream("node-a", "conn-1");
  REQUIRE((s1.ok() && s2.ok()));
  auto s3 = store.OpenStream("node-a", "conn-1");
  REQUIRE(s3.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(s3.status().message()),
               Catch::Contains("peer_streams_per_node_max") && Catch::Contains("node-a"));
  // Another node has its own.
  auto other = store.OpenStream("node-b", "conn-2");
  REQUIRE(other.ok());
  auto c2 = store.OpenStream("node-b", "conn-3");
  REQUIRE(c2.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(c2.status().message()), Catch::Contains("connections"));
  // Bytes in flight.
  const std::vector<char> data = Bytes(2 * kBlock, 12);
  auto p1 = store.BeginPut(**s1, Header(data, "node-a", "job", 1, "b0"));
  REQUIRE(p1.ok());
  auto p2 = store.BeginPut(**s2, Header(data, "node-a", "job", 1, "b1"));
  REQUIRE(p2.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE_THAT(std::string(p2.status().message()),
               Catch::Contains("peer_inflight_bytes_per_node_max") && Catch::Contains("node-a"));
  p1->reset();
  REQUIRE(store.BeginPut(**s2, Header(data, "node-a", "job", 1, "b1")).ok());
}

}  // namespace
}  // namespace ckptd::peer
