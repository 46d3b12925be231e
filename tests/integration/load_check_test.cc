// Load-side checks through the real daemon (issue 33 §5), where only unit tests or an error
// message's text looked before:
//   - a byte flipped in a blob, then parts of the damaged shard loaded — a resharded sub-box
//     inside one block, a box spanning both ranks' shards, and the same shard asked for twice in
//     one load — is DATA_LOSS naming the item and the block, every time (three tries each: no
//     cache or hot copy turns a failed check into a success), while a box that does not touch the
//     damaged block still loads bit-exact;
//   - an item of more than 16 shards (the planner's interval index, PlanOptions::
//     linear_shards_max) with uneven boundaries in both dimensions loads bit-exact: whole, in
//     uneven row bands, and in seeded random boxes.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <random>

#include "harness.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

// Flips every bit of the byte at `offset` of the file.
void FlipByte(const std::string& path, uint64_t offset) {
  int fd = open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  uint8_t b = 0;
  REQUIRE(pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  b = static_cast<uint8_t>(~b);
  REQUIRE(pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
  REQUIRE(fsync(fd) == 0);
  close(fd);
}

std::string BlobOf(const Daemon& d, const std::string& job, uint64_t step, uint32_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "r%05u.blob", rank);
  return d.data_dir() + "/" + job + "/" + StepDir(step) + "/" + name;
}

// The value of element (row, col) of the test tensors: distinct for every element.
uint32_t Value(uint64_t row, uint64_t col, uint64_t seed) {
  return static_cast<uint32_t>((row * 1000003u + col * 7919u + seed * 31u) ^ 0x5bd1e995u);
}

// The box [r0, r0+rows) x [c0, c0+cols) of the tensor, row-major.
std::vector<uint32_t> Box(uint64_t r0, uint64_t rows, uint64_t c0, uint64_t cols, uint64_t seed) {
  std::vector<uint32_t> out(rows * cols);
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) out[r * cols + c] = Value(r0 + r, c0 + c, seed);
  }
  return out;
}

// Loads box [r0, r0+rows) x [c0, c0+cols) of "w" (one target, or `copies` targets of it in one
// load); checks every copy against the saved values when the load succeeds.
absl::Status LoadBox(ckptd::Client& client, const std::string& job, uint64_t r0, uint64_t rows,
                     uint64_t c0, uint64_t cols, uint64_t seed, int copies = 1) {
  std::vector<std::vector<uint32_t>> out(copies, std::vector<uint32_t>(rows * cols, 0xdeadbeef));
  std::vector<ckptd::LoadTarget> targets;
  for (auto& o : out) {
    targets.push_back(
        {"w", ckptd::Region::Box({r0, c0}, {rows, cols}), o.data(), o.size() * sizeof(uint32_t)});
  }
  auto r = client.Load(job, 1, 0, targets);
  if (!r.ok()) return r.status();
  const std::vector<uint32_t> want = Box(r0, rows, c0, cols, seed);
  for (const auto& o : out) {
    if (o != want) {
      return absl::InternalError(
          absl::StrCat("box [", r0, "+", rows, ", ", c0, "+", cols, "] loaded different bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

TEST_CASE("load check: a flipped byte fails every partial load of its block, naming the block",
          "[integration][verify]") {
  // From storage every time: no hot copy (it would be checked and dropped, then storage read).
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0"}});
  auto client = d.Connect();
  // float32-sized [2, 65536]: rank r saves row r (256 KiB, 64 checksum blocks of 4 KiB).
  constexpr uint64_t kCols = 65536;
  constexpr uint64_t kSeed = 5;
  for (uint32_t r = 0; r < 2; ++r) {
    std::vector<uint32_t> row = Box(r, 1, 0, kCols, kSeed);
    ckptd::TensorShard s;
    s.item = "w";
    s.dtype = ckptd::DType::kFloat32;
    s.global_shape = {2, kCols};
    s.region = ckptd::Region::Box({r, 0}, {1, kCols});
    s.data = row.data();
    s.bytes = row.size() * sizeof(uint32_t);
    REQUIRE(client->Save("flip", 1, r, 2, {&s, 1}).ok());
  }
  REQUIRE(client->WaitCommitted("flip", 1, 30000).ok());
  // Block 5 of rank 1's shard: elements [5120, 6144) of row 1.
  FlipByte(BlobOf(d, "flip", 1, 1), 5 * 4096 + 17);

  struct Part {
    const char* what;
    uint64_t r0, rows, c0, cols;
    int copies;
  };
  const Part damaged[] = {
      {"a sub-box inside the block", 1, 1, 5120 + 3, 100, 1},
      {"a resharded box over both ranks' shards", 0, 2, 5000, 1500, 1},
      {"the same shard twice in one load", 1, 1, 0, kCols, 2},
      {"the same sub-box twice in one load", 1, 1, 5200, 64, 2},
  };
  for (const Part& p : damaged) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      INFO(p.what << ", attempt " << attempt);
      absl::Status st = LoadBox(*client, "flip", p.r0, p.rows, p.c0, p.cols, kSeed, p.copies);
      INFO(st.ToString());
      CHECK(st.code() == absl::StatusCode::kDataLoss);
      CHECK_THAT(std::string(st.message()),
                 Contains("item \"w\"") && Contains("block 5") && Contains("crc32c mismatch"));
    }
  }
  // Parts that do not touch the damaged block still load, bit-exact.
  CHECK(LoadBox(*client, "flip", 1, 1, 0, 5120, kSeed).ok());
  CHECK(LoadBox(*client, "flip", 1, 1, 6144, kCols - 6144, kSeed).ok());
  CHECK(LoadBox(*client, "flip", 0, 1, 0, kCols, kSeed, 2).ok());
}

TEST_CASE("load check: an item of more than 16 uneven shards loads bit-exact in any layout",
          "[integration][reshard]") {
  Daemon d;
  auto client = d.Connect();
  // [101, 67] cut at uneven row and column boundaries: 6 x 4 = 24 shards, over 4 ranks.
  const std::vector<uint64_t> row_cuts = {0, 3, 20, 21, 50, 77, 101};
  const std::vector<uint64_t> col_cuts = {0, 1, 30, 31, 67};
  constexpr uint64_t kRows = 101, kCols = 67, kSeed = 9;
  constexpr uint32_t kWorld = 4;
  std::vector<std::vector<ckptd::TensorShard>> by_rank(kWorld);
  std::vector<std::vector<uint32_t>> data;
  data.reserve(24);
  uint32_t cell = 0;
  for (size_t i = 0; i + 1 < row_cuts.size(); ++i) {
    for (size_t j = 0; j + 1 < col_cuts.size(); ++j, ++cell) {
      const uint64_t r0 = row_cuts[i], rows = row_cuts[i + 1] - r0;
      const uint64_t c0 = col_cuts[j], cols = col_cuts[j + 1] - c0;
      data.push_back(Box(r0, rows, c0, cols, kSeed));
      ckptd::TensorShard s;
      s.item = "w";
      s.dtype = ckptd::DType::kFloat32;
      s.global_shape = {kRows, kCols};
      s.region = ckptd::Region::Box({r0, c0}, {rows, cols});
      s.data = data.back().data();
      s.bytes = data.back().size() * sizeof(uint32_t);
      by_rank[cell % kWorld].push_back(s);
    }
  }
  REQUIRE(cell > 16);
  for (uint32_t r = 0; r < kWorld; ++r) {
    auto saved = client->Save("many", 1, r, kWorld, by_rank[r]);
    INFO(saved.status().ToString());
    REQUIRE(saved.ok());
  }
  REQUIRE(client->WaitCommitted("many", 1, 30000).ok());

  CHECK(LoadBox(*client, "many", 0, kRows, 0, kCols, kSeed).ok());
  // Three ranks loading uneven row bands, every band crossing row cuts.
  for (auto [r0, rows] : {std::pair<uint64_t, uint64_t>{0, 34}, {34, 33}, {67, 34}}) {
    CHECK(LoadBox(*client, "many", r0, rows, 0, kCols, kSeed).ok());
  }
  std::mt19937_64 rng(33);
  for (int i = 0; i < 40; ++i) {
    const uint64_t r0 = rng() % kRows, c0 = rng() % kCols;
    const uint64_t rows = 1 + rng() % (kRows - r0), cols = 1 + rng() % (kCols - c0);
    INFO("box [" << r0 << "+" << rows << ", " << c0 << "+" << cols << "]");
    absl::Status st = LoadBox(*client, "many", r0, rows, c0, cols, kSeed);
    INFO(st.ToString());
    CHECK(st.ok());
  }
}
