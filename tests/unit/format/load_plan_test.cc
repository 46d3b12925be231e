// The load planner against a reference that materializes every global tensor: random shapes,
// dtypes and source partitions (boxes, flat ranges, mixtures) laid out in blobs, random
// destination regions loaded by executing the plan in memory, compared bit-exact. Seeded: the
// seed is printed on failure; CKPTD_TEST_SEED=<seed> replays it.
#include "format/load_plan.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "format/crc32c.h"
#include "format/region.h"
#include "region_test_util.h"

namespace ckptd {
namespace {

using testing::Box;
using testing::Flat;
using testing::RefElements;

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A checkpoint in memory: the manifest, the blobs' bytes and each tensor's global bytes.
struct Fixture {
  Manifest m;
  std::map<uint32_t, std::string> blobs;
  std::map<std::string, std::string> global;  // item → row-major bytes of the whole tensor
};

v1::DType DTypeOfSize(uint32_t size) {
  switch (size) {
    case 1:
      return v1::UINT8;
    case 2:
      return v1::BFLOAT16;
    case 4:
      return v1::FLOAT32;
    default:
      return v1::INT64;
  }
}

// The bytes of `region` of a tensor whose global bytes are `global`, gathered element by element.
std::string Gather(const std::vector<uint64_t>& shape, uint32_t elem, const std::string& global,
                   const v1::Region& region) {
  std::string out;
  for (uint64_t g : RefElements(shape, region)) out.append(global, g * elem, elem);
  return out;
}

// Appends `bytes` to a blob at the next aligned offset and returns the shard entry.
v1::ShardEntry Store(Fixture* f, uint32_t blob, const std::string& bytes, uint64_t align,
                     uint32_t block) {
  std::string& b = f->blobs[blob];
  v1::ShardEntry s;
  s.set_blob_id(blob);
  s.set_offset(RoundUp(b.size(), align));
  s.set_length(bytes.size());
  b.resize(s.offset());
  b += bytes;
  for (uint32_t c : BlockCrcs(bytes.data(), bytes.size(), block)) s.add_block_crc32c(c);
  return s;
}

void AddTensor(std::mt19937_64& rng, Fixture* f, const std::string& name,
               const std::vector<uint64_t>& shape, uint32_t elem,
               const std::vector<v1::Region>& partition, uint64_t align, uint32_t blobs) {
  v1::ItemEntry item;
  item.set_name(name);
  item.set_kind(v1::TENSOR);
  item.set_dtype(DTypeOfSize(elem));
  for (uint64_t d : shape) item.add_shape(d);
  std::string& global = f->global[name];
  global.resize(testing::RefNumel(shape) * elem);
  for (char& c : global) c = static_cast<char>(rng());
  for (const v1::Region& r : partition) {
    v1::ShardEntry s =
        Store(f, static_cast<uint32_t>(rng() % blobs), Gather(shape, elem, global, r), align,
              f->m.header.checksum_block_bytes());
    *s.mutable_region() = r;
    *item.add_shards() = s;
  }
  f->m.items.push_back(item);
}

void FinishBlobs(Fixture* f) {
  std::sort(f->m.items.begin(), f->m.items.end(),
            [](const v1::ItemEntry& a, const v1::ItemEntry& b) { return a.name() < b.name(); });
  for (const auto& [id, bytes] : f->blobs) {
    v1::BlobInfo* b = f->m.header.add_blobs();
    b->set_id(id);
    b->set_size_bytes(bytes.size());
  }
}

struct Executed {
  std::vector<std::string> dst;
  absl::Status status;
};

// Runs the plan over the in-memory blobs, checking its structural promises on the way.
Executed Execute(const Fixture& f, const LoadPlan& plan, const PlanOptions& o) {
  Executed ex;
  ex.dst.resize(plan.request_bytes.size());
  for (size_t i = 0; i < ex.dst.size(); ++i) ex.dst[i].assign(plan.request_bytes[i], '\0');
  const uint32_t block = f.m.header.checksum_block_bytes();
  uint64_t read = 0;
  for (size_t r = 0; r < plan.runs.size(); ++r) {
    const ReadRun& run = plan.runs[r];
    const std::string& blob = f.blobs.at(run.blob_id);
    INFO("run " << r << " blob " << run.blob_id << " [" << run.offset << ", +" << run.length
                << ") of " << blob.size());
    REQUIRE(run.length > 0);
    REQUIRE(run.length <= o.max_run_bytes);
    REQUIRE(run.offset % o.alignment_bytes == 0);
    REQUIRE(run.offset + run.length <= blob.size());
    REQUIRE((run.length % o.alignment_bytes == 0 || run.offset + run.length == blob.size()));
    if (r > 0 && plan.runs[r - 1].blob_id == run.blob_id) {
      const ReadRun& prev = plan.runs[r - 1];
      REQUIRE(prev.offset + prev.length <= run.offset);
      uint64_t gap = run.offset - (prev.offset + prev.length);
      uint64_t merged = run.offset + run.length - prev.offset;
      // Adjacent runs come from a split; others were too far apart to merge.
      if (gap > 0) {
        CHECK(gap > std::max<uint64_t>(o.alignment_bytes,
                                       static_cast<uint64_t>(o.merge_gap_fraction * merged)));
      }
    }
    read += run.length;
    std::string buf = blob.substr(run.offset, run.length);
    std::vector<std::pair<uint64_t, uint64_t>> verified;
    for (uint32_t c = run.first_check; c < run.first_check + run.check_count; ++c) {
      const BlockCheck& k = plan.checks[c];
      uint64_t n =
          std::min<uint64_t>(k.end_block * block, k.shard->length()) - k.first_block * block;
      REQUIRE(k.run_offset + n <= run.length);
      REQUIRE(run.offset + k.run_offset == k.shard->offset() + k.first_block * block);
      absl::Status st = VerifyBlocks(
          buf.data() + k.run_offset, k.first_block, n, k.shard->length(),
          std::span<const uint32_t>(k.shard->block_crc32c().data(), k.shard->block_crc32c().size()),
          block, "test");
      if (!st.ok() && ex.status.ok()) ex.status = st;
      verified.emplace_back(k.run_offset, k.run_offset + n);
    }
    for (uint64_t c = run.first_copy; c < run.first_copy + run.copy_count; ++c) {
      const RunCopy& cp = plan.copies[c];
      REQUIRE(cp.run_offset + cp.bytes <= run.length);
      REQUIRE(cp.dst_offset + cp.bytes <= ex.dst[cp.request].size());
      bool covered = false;  // every byte used was verified in this run
      for (auto [b, e] : verified) covered |= b <= cp.run_offset && cp.run_offset + cp.bytes <= e;
      REQUIRE(covered);
      std::memcpy(ex.dst[cp.request].data() + cp.dst_offset, buf.data() + cp.run_offset, cp.bytes);
    }
  }
  CHECK(read == plan.read_bytes);
  CHECK(plan.needed_bytes <= plan.needed_aligned_bytes);
  CHECK(plan.needed_aligned_bytes <= plan.read_bytes);
  return ex;
}

struct Case {
  Fixture f;
  std::vector<PlanRequest> requests;
  std::vector<std::string> expected;
};

Case RandomCase(std::mt19937_64& rng, uint64_t align, uint32_t block) {
  Case c;
  c.f.m.header.set_checksum_block_bytes(block);
  const uint32_t blobs = 1 + static_cast<uint32_t>(rng() % 4);
  const int items = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < items; ++i) {
    std::vector<uint64_t> shape = testing::RandomShape(rng, 3, 14);
    uint32_t elem = 1u << (rng() % 4);
    AddTensor(rng, &c.f, "t" + std::to_string(i), shape, elem, testing::RandomPartition(rng, shape),
              align, blobs);
  }
  if (rng() % 3 == 0) {  // an object item with two per-rank copies
    v1::ItemEntry obj;
    obj.set_name("obj");
    obj.set_kind(v1::OBJECT);
    obj.set_scope(v1::PER_RANK);
    for (uint32_t rank = 0; rank < 2; ++rank) {
      std::string bytes(rng() % 300, static_cast<char>('a' + rank));
      v1::ShardEntry s = Store(&c.f, rank % blobs, bytes, align, block);
      s.set_saved_by_rank(rank);
      *obj.add_shards() = s;
    }
    c.f.m.items.push_back(obj);
  }
  FinishBlobs(&c.f);
  for (const v1::ItemEntry& item : c.f.m.items) {
    if (item.kind() == v1::OBJECT) {
      const v1::ShardEntry& s = item.shards(static_cast<int>(rng() % 2));
      c.requests.push_back(PlanRequest{&item, {}, &s});
      std::string blob = c.f.blobs[s.blob_id()];
      c.expected.push_back(blob.substr(s.offset(), s.length()));
      continue;
    }
    std::vector<uint64_t> shape(item.shape().begin(), item.shape().end());
    std::vector<v1::Region> dst;
    if (rng() % 2) {
      dst = testing::RandomPartition(rng, shape);
    } else {
      for (int k = static_cast<int>(rng() % 4); k >= 0; --k) {
        dst.push_back(testing::RandomRegion(rng, shape));
      }
    }
    uint32_t elem = static_cast<uint32_t>(c.f.global[item.name()].size() /
                                          std::max<uint64_t>(testing::RefNumel(shape), 1));
    if (testing::RefNumel(shape) == 0) elem = 1;
    for (const v1::Region& r : dst) {
      c.requests.push_back(PlanRequest{&item, r, nullptr});
      c.expected.push_back(Gather(shape, elem, c.f.global[item.name()], r));
    }
  }
  return c;
}

TEST_CASE("PlanLoad loads random layouts bit-exactly (property)", "[unit]") {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 seeds(seed);
  const int kCases = 5000;
  for (int i = 0; i < kCases; ++i) {
    const uint64_t case_seed = seeds();
    INFO("base seed " << seed << " (replay: CKPTD_TEST_SEED=" << seed << "), case " << i);
    std::mt19937_64 rng(case_seed);
    // Small alignment and blocks so that small tensors still span blocks, runs and splits;
    // every 10th case uses the daemon's real 4 KiB.
    const bool real = i % 10 == 0;
    const uint64_t align = real ? 4096 : 64;
    const uint32_t block = real ? 4096 : static_cast<uint32_t>(64 << (rng() % 3));
    PlanOptions o;
    o.alignment_bytes = align;
    o.max_run_bytes = RoundUp(2 * block + rng() % (8 * block), align);
    o.merge_gap_fraction = (rng() % 3) * 0.05;
    o.linear_shards_max = rng() % 2 ? 0 : 16;  // the interval index on half of the cases
    Case c = RandomCase(rng, align, block);
    absl::StatusOr<LoadPlan> plan = PlanLoad(c.f.m, c.requests, o);
    REQUIRE(plan.ok());
    Executed ex = Execute(c.f, *plan, o);
    REQUIRE(ex.status.ok());
    for (size_t r = 0; r < c.requests.size(); ++r) {
      INFO("request " << r << " item " << c.requests[r].item->name() << " region "
                      << DescribeRegion(c.requests[r].region));
      REQUIRE(plan->request_bytes[r] == c.expected[r].size());
      REQUIRE(ex.dst[r] == c.expected[r]);
    }
    // A flipped byte that the load uses is always caught by a checksum of the same run.
    if (!plan->copies.empty() && rng() % 4 == 0) {
      const ReadRun* run = nullptr;
      const RunCopy* cp = nullptr;
      for (const ReadRun& r : plan->runs) {
        if (r.copy_count > 0) run = &r, cp = &plan->copies[r.first_copy];
      }
      Fixture bad = c.f;
      bad.blobs[run->blob_id][run->offset + cp->run_offset + rng() % cp->bytes] ^= 0x20;
      Executed corrupted = Execute(bad, *plan, o);
      CHECK(corrupted.status.code() == absl::StatusCode::kDataLoss);
    }
  }
}

TEST_CASE("PlanLoad reads only the runs needed and merges by the gap rule", "[unit]") {
  // 64 rows of 64 KiB (float32 [64, 16384]) saved as one row-major shard; loading column block
  // [0, 1024) of every row needs 4 KiB of each 64 KiB row: 60 KiB gaps are never merged.
  Fixture f;
  f.m.header.set_checksum_block_bytes(4096);
  std::mt19937_64 rng(7);
  const std::vector<uint64_t> shape = {64, 16384};
  AddTensor(rng, &f, "w", shape, 4, {v1::Region()}, 4096, 1);
  FinishBlobs(&f);
  std::vector<PlanRequest> req = {{&f.m.items[0], Box({0, 0}, {64, 1024}), nullptr}};
  LoadPlan plan = *PlanLoad(f.m, req);
  CHECK(plan.runs.size() == 64);
  CHECK(plan.needed_bytes == 64 * 4096);
  CHECK(plan.read_bytes == plan.needed_aligned_bytes);
  CHECK(Execute(f, plan, {}).dst[0] == Gather(shape, 4, f.global["w"], req[0].region));

  // Row blocks of 16 rows each in their own blob load as one run per blob, merged across the
  // 4 KiB-rounded tail of each shard.
  SECTION("columns [0, 15360) of each row: gaps of 4 KiB merge, the whole blob is one run") {
    req[0].region = Box({0, 0}, {64, 15360});
    plan = *PlanLoad(f.m, req);
    CHECK(plan.runs.size() == (64 * 65536 + 16 * 1024 * 1024 - 1) / (16 * 1024 * 1024));
    CHECK(plan.read_bytes == 64 * 65536 - 4096);  // all but the last row's unneeded tail
  }
  SECTION("two requests for the same bytes read them once") {
    req.push_back(req[0]);
    LoadPlan twice = *PlanLoad(f.m, req);
    CHECK(twice.read_bytes == plan.read_bytes);
    Executed ex = Execute(f, twice, {});
    CHECK(ex.dst[0] == ex.dst[1]);
  }
}

TEST_CASE("PlanLoad rejects bad regions and uncovered data", "[unit]") {
  Fixture f;
  f.m.header.set_checksum_block_bytes(4096);
  f.m.header.set_partial(true);
  std::mt19937_64 rng(1);
  AddTensor(rng, &f, "w", {8, 8}, 4, {Box({0, 0}, {4, 8})}, 4096, 1);
  FinishBlobs(&f);
  std::vector<PlanRequest> req = {{&f.m.items[0], Box({0, 0}, {9, 8}), nullptr}};
  absl::StatusOr<LoadPlan> plan = PlanLoad(f.m, req);
  CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(plan.status().message()),
             Catch::Contains("item \"w\"") && Catch::Contains("box[0:9, 0:8]"));
  req[0].region = Box({2, 0}, {4, 8});
  plan = PlanLoad(f.m, req);
  CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(plan.status().message()), Catch::Contains("16 of 32 elements"));
  req[0].region = Box({0, 0}, {4, 8});
  CHECK(PlanLoad(f.m, req).ok());
  PlanOptions o;
  o.max_run_bytes = 4096;  // below two checksum blocks
  CHECK(PlanLoad(f.m, req, o).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("PlanLoad is exact at 10k shards", "[unit]") {
  // float32 [1000, 1000] saved as a 100 x 100 grid of 10x10 boxes (10,000 shards in 8 blobs),
  // loaded as 3 uneven flat ranges and as 7 column blocks.
  Fixture f;
  f.m.header.set_checksum_block_bytes(4096);
  std::mt19937_64 rng(11);
  const std::vector<uint64_t> shape = {1000, 1000};
  std::vector<v1::Region> grid;
  for (uint64_t r = 0; r < 100; ++r) {
    for (uint64_t c = 0; c < 100; ++c) grid.push_back(Box({r * 10, c * 10}, {10, 10}));
  }
  std::shuffle(grid.begin(), grid.end(), rng);
  // Reference gathers are element-wise; build the global tensor and shards directly instead.
  v1::ItemEntry item;
  item.set_name("big");
  item.set_kind(v1::TENSOR);
  item.set_dtype(v1::FLOAT32);
  item.add_shape(1000);
  item.add_shape(1000);
  std::string global(4'000'000, '\0');
  for (size_t i = 0; i < global.size(); ++i) global[i] = static_cast<char>(rng());
  for (const v1::Region& r : grid) {
    std::string bytes(400, '\0');
    CopyRegion(shape, 4, v1::Region(), reinterpret_cast<const uint8_t*>(global.data()), r,
               reinterpret_cast<uint8_t*>(bytes.data()));
    v1::ShardEntry s = Store(&f, static_cast<uint32_t>(rng() % 8), bytes, 4096, 4096);
    *s.mutable_region() = r;
    *item.add_shards() = s;
  }
  f.m.items.push_back(item);
  FinishBlobs(&f);
  auto check = [&](const std::vector<v1::Region>& dst) {
    std::vector<PlanRequest> req;
    for (const v1::Region& r : dst) req.push_back(PlanRequest{&f.m.items[0], r, nullptr});
    LoadPlan plan = *PlanLoad(f.m, req);
    Executed ex = Execute(f, plan, {});
    REQUIRE(ex.status.ok());
    for (size_t i = 0; i < dst.size(); ++i) {
      std::string want(plan.request_bytes[i], '\0');
      CopyRegion(shape, 4, v1::Region(), reinterpret_cast<const uint8_t*>(global.data()), dst[i],
                 reinterpret_cast<uint8_t*>(want.data()));
      REQUIRE(ex.dst[i] == want);
    }
  };
  check({Flat(0, 333'333), Flat(333'333, 333'334), Flat(666'667, 333'333)});
  std::vector<v1::Region> cols;
  for (uint64_t c = 0; c < 1000; c += 143)
    cols.push_back(Box({0, c}, {1000, std::min<uint64_t>(143, 1000 - c)}));
  check(cols);
}

}  // namespace
}  // namespace ckptd
