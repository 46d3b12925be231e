// RunPieces (service/run_copy.h): every piece runs exactly once, on the caller and the pool; the
// first error is returned and later pieces are skipped; it returns only once no piece still runs;
// a refusing (shut-down) pool leaves the work to the caller. AddRunPieces: a strided load (a
// column slice, one checksum block per row) is copied bit-exact in a few batched pieces, and a
// flipped byte fails it naming the block.
#include "service/run_copy.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/worker_pool.h"
#include "format/load_plan.h"

namespace ckptd {
namespace {

TEST_CASE("run pieces: each piece runs once, on the calling thread and the pool", "[run_copy]") {
  WorkerPool pool("copy-test", 3, 16);
  const bool with_pool = GENERATE(true, false);
  std::vector<std::atomic<int>> ran(200);
  std::atomic<int> off_caller{0};
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<CopyPiece> pieces;
  pieces.reserve(ran.size());
  for (size_t i = 0; i < ran.size(); ++i) {
    pieces.push_back([&, i] {
      ran[i].fetch_add(1);
      if (std::this_thread::get_id() != caller) off_caller.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return absl::OkStatus();
    });
  }
  REQUIRE(RunPieces(with_pool ? &pool : nullptr, pieces).ok());
  for (size_t i = 0; i < ran.size(); ++i) CHECK(ran[i].load() == 1);
  if (with_pool) {
    CHECK(off_caller.load() > 0);  // the pool took some
  } else {
    CHECK(off_caller.load() == 0);
  }
}

TEST_CASE("run pieces: the first error wins and nothing runs after the call returns",
          "[run_copy]") {
  WorkerPool pool("copy-test", 3, 16);
  std::atomic<int> running{0};
  std::atomic<int> started{0};
  std::vector<CopyPiece> pieces;
  pieces.reserve(64);
  for (int i = 0; i < 64; ++i) {
    pieces.push_back([&, i] {
      running.fetch_add(1);
      started.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      running.fetch_sub(1);
      if (i == 5) return absl::DataLossError("piece 5");
      return absl::OkStatus();
    });
  }
  absl::Status st = RunPieces(&pool, pieces);
  CHECK(running.load() == 0);  // every piece that started has ended
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(st.message() == "piece 5");
  CHECK(started.load() < 64);  // pieces taken after the failure were skipped
  const int after = started.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(started.load() == after);  // helpers that start late find nothing to do
}

TEST_CASE("run pieces: a pool that refuses leaves the work to the caller", "[run_copy]") {
  WorkerPool pool("copy-test", 2, 4);
  pool.Shutdown(WorkerPool::ShutdownMode::kDrain);
  std::atomic<int> ran{0};
  std::vector<CopyPiece> pieces(10, [&] {
    ran.fetch_add(1);
    return absl::OkStatus();
  });
  REQUIRE(RunPieces(&pool, pieces).ok());
  CHECK(ran.load() == 10);
}

// A float32 [rows, 4096] tensor saved whole (rows of 16 KiB, checksum blocks of 4 KiB) in blob 0,
// loaded by its column quarter `q`: 64 runs (the gaps are too wide to merge), each one block
// going whole to one 4 KiB copy.
struct StridedLoad {
  static constexpr uint64_t kRows = 64, kCols = 4096, kRowBytes = kCols * 4;
  static constexpr uint32_t kBlock = 4096;
  Manifest m;
  std::string blob;
  LoadPlan plan;
  std::string dst;
  uint8_t* dst_ptr = nullptr;  // LoadDests' span points here

  explicit StridedLoad(uint64_t q) {
    blob.resize(kRows * kRowBytes);
    for (size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<char>(i * 7 + i / 4096);
    m.header.set_checksum_block_bytes(kBlock);
    v1::ItemEntry item;
    item.set_name("t");
    item.set_kind(v1::TENSOR);
    item.set_dtype(v1::FLOAT32);
    item.add_shape(kRows);
    item.add_shape(kCols);
    v1::ShardEntry* s = item.add_shards();
    s->set_blob_id(0);
    s->set_offset(0);
    s->set_length(blob.size());
    for (uint32_t c : BlockCrcs(blob.data(), blob.size(), kBlock)) s->add_block_crc32c(c);
    m.items.push_back(item);
    v1::BlobInfo* b = m.header.add_blobs();
    b->set_id(0);
    b->set_size_bytes(blob.size());
    PlanRequest req;
    req.item = &m.items[0];
    v1::Box* box = req.region.mutable_box();
    for (uint64_t v : {uint64_t{0}, q * kCols / 4}) box->add_offsets(v);
    for (uint64_t v : {kRows, kCols / 4}) box->add_lengths(v);
    plan = *PlanLoad(m, std::span(&req, 1), PlanOptions{});
    dst.assign(plan.request_bytes[0], '\0');
  }

  // The pieces of every run, reading the blob in place.
  std::vector<CopyPiece> Pieces(const std::string* where) {
    dst_ptr = reinterpret_cast<uint8_t*>(dst.data());
    const LoadDests dests{std::span<uint8_t* const>(&dst_ptr, 1), {}, nullptr};
    std::vector<CopyPiece> pieces;
    std::vector<DeviceCopy> to_device;
    FusedBatcher batch(&pieces);  // across the runs, as the loader does
    for (size_t k = 0; k < plan.runs.size(); ++k) {
      const ReadRun& run = plan.runs[k];
      auto at = [&](uint64_t off, uint64_t) {
        return reinterpret_cast<const uint8_t*>(blob.data()) + run.offset + off;
      };
      AddRunPieces(m, plan, k, at, dests, where, &pieces, &to_device, {}, &batch);
    }
    batch.Flush();
    CHECK(to_device.empty());
    return pieces;
  }

  std::string Expected(uint64_t q) const {
    std::string out;
    for (uint64_t r = 0; r < kRows; ++r)
      out += blob.substr(r * kRowBytes + q * kRowBytes / 4, kRowBytes / 4);
    return out;
  }
};

TEST_CASE("run pieces: a column slice's one-block runs are copied bit-exact in batched pieces",
          "[run_copy]") {
  const uint64_t q = GENERATE(0, 1, 3);
  StridedLoad load(q);
  REQUIRE(load.plan.runs.size() == StridedLoad::kRows);  // one run, of one block, per row
  REQUIRE(load.plan.checks.size() == StridedLoad::kRows);
  const std::string where = "memory";
  std::vector<CopyPiece> pieces = load.Pieces(&where);
  // 64 blocks of 4 KiB: far fewer pieces than blocks (each piece one guard, not one per block).
  CHECK(pieces.size() < StridedLoad::kRows);
  WorkerPool pool("copy-test", 2, 16);
  REQUIRE(RunPieces(&pool, pieces).ok());
  CHECK(load.dst == load.Expected(q));
}

TEST_CASE("run pieces: a flipped byte in a batched one-block run fails naming its block",
          "[run_copy]") {
  StridedLoad load(2);
  // Row 10's third quarter is block 10 * 4 + 2 of the shard.
  load.blob[10 * StridedLoad::kRowBytes + 2 * 4096 + 123] ^= 0x40;
  const std::string where = "the RAM tier";
  std::vector<CopyPiece> pieces = load.Pieces(&where);
  absl::Status st = RunPieces(nullptr, pieces);
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(st.message()), Catch::Contains("block 42 crc32c mismatch"));
  CHECK_THAT(std::string(st.message()), Catch::Contains("item \"t\""));
  CHECK_THAT(std::string(st.message()), Catch::Contains("the RAM tier"));
}

// One run of `n` one-block checks, its copies in reverse order; copy i of every 5th check is cut
// short (not a whole check: no pair) and request 1 is a GPU destination (never paired).
struct PairedRun {
  static constexpr uint32_t kBlock = 4096;
  v1::ShardEntry shard;
  LoadPlan plan;
  std::vector<uint8_t*> ptr{nullptr, nullptr};
  std::vector<int> device{-1, 0};

  explicit PairedRun(uint32_t n) {
    shard.set_length(uint64_t{n} * kBlock);
    ReadRun run;
    run.length = shard.length();
    run.check_count = n;
    for (uint32_t i = 0; i < n; ++i) {
      plan.checks.push_back(BlockCheck{&shard, uint64_t{i} * kBlock, i, i + 1});
    }
    for (uint32_t i = n; i-- > 0;) {
      const uint64_t bytes = i % 5 == 0 ? kBlock / 2 : kBlock;
      plan.copies.push_back(RunCopy{uint64_t{i} * kBlock, 0, uint64_t{i} * kBlock, bytes});
      // The same bytes to the GPU too, listed first for odd checks: skipped for the host one.
      if (i % 2 == 1) {
        plan.copies.insert(plan.copies.end() - 1, RunCopy{uint64_t{i} * kBlock, 1, 0, kBlock});
      }
    }
    run.copy_count = plan.copies.size();
    plan.runs.push_back(run);
  }
};

TEST_CASE(
    "fused pairs: each whole check pairs with the host copy of exactly its bytes, in check "
    "order, with few copies (the scan) and many (the index)",
    "[run_copy]") {
  const uint32_t n = GENERATE(1u, 6u, 10u, 100u);  // 6 and 10: the scan; 100: the index
  PairedRun r(n);
  const LoadDests dests{r.ptr, r.device, nullptr};
  const FusedPairList pairs = FusedPairs(r.plan, 0, dests, PairedRun::kBlock);
  std::vector<uint32_t> want;
  for (uint32_t i = 0; i < n; ++i) {
    if (i % 5 != 0) want.push_back(i);
  }
  REQUIRE(pairs.size() == want.size());
  for (size_t j = 0; j < pairs.size(); ++j) {
    CHECK(pairs[j].check == want[j]);  // in check order
    const RunCopy& cp = r.plan.copies[pairs[j].copy];
    CHECK(cp.request == 0);  // the host copy, never the GPU one at the same offset
    CHECK(cp.run_offset == r.plan.checks[pairs[j].check].run_offset);
    CHECK(cp.bytes == PairedRun::kBlock);
  }
}

TEST_CASE("direct prefixes: a whole shard is read in place only when no other copy takes its bytes",
          "[run_copy]") {
  constexpr uint64_t kBlock = 4096;
  constexpr uint64_t kShard = 64 * kBlock;  // 256 KiB: the least read in place
  v1::ShardEntry shard;
  shard.set_length(kShard);
  alignas(4096) static uint8_t dst[4][kShard];
  std::vector<uint8_t*> ptr{dst[0], dst[1], dst[2], dst[3]};
  std::vector<int> device{-1, -1, -1, 0};  // request 3: a GPU destination
  auto plan_with = [&](std::vector<RunCopy> others) {
    LoadPlan plan;
    plan.checks.push_back(BlockCheck{&shard, 0, 0, kShard / kBlock});
    plan.copies.push_back(RunCopy{0, 0, 0, kShard});  // the whole shard to request 0
    for (const RunCopy& c : others) plan.copies.push_back(c);
    ReadRun run;
    run.length = kShard;
    run.check_count = 1;
    run.copy_count = plan.copies.size();
    plan.runs.push_back(run);
    return plan;
  };
  const LoadDests dests{ptr, device, nullptr};
  SECTION("alone: in place") { CHECK(DirectPrefixes(plan_with({}), dests, kBlock)[0] == kShard); }
  SECTION("the same bytes twice, a part of them, or the same bytes to a GPU: through the buffer") {
    const RunCopy other = GENERATE(RunCopy{0, 1, 0, kShard}, RunCopy{kShard / 2, 2, 0, kBlock},
                                   RunCopy{0, 3, 0, kShard});
    const std::vector<uint64_t> in_place = DirectPrefixes(plan_with({other}), dests, kBlock);
    CHECK(in_place[0] == 0);
    CHECK(in_place[1] == 0);
  }
}

}  // namespace
}  // namespace ckptd
