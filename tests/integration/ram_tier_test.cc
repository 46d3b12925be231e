// The RAM tier against the real daemon (tier/ram_tier.h): a restore after the trainer dies is
// served from the arena with no device read; after a daemon restart only once verified; a
// corrupted hot copy falls back to storage with a logged checksum error; prefetch; the tier off.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kSeed = 23;

// Bytes the process `pid` read from storage so far (/proc/PID/io read_bytes: the block layer's
// count, page-cache hits and shared memory excluded).
uint64_t DeviceReadBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/io");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  throw std::runtime_error("no read_bytes in /proc/PID/io");
}

// Loads every tensor and checks it bit-exact; returns the load's counts.
ckptd::LoadResult LoadAndVerify(const Daemon& d, const std::string& job, uint64_t step) {
  auto client = d.Connect();
  ckptd::LoadResult r;
  absl::Status s = VerifyCheckpoint(*client, job, step, kSeed, {}, 4, true, &r);
  INFO(s.ToString() << "\n" << d.Log());
  REQUIRE(s.ok());
  return r;
}

// A flat slice of every tensor (a layout no rank saved), checked against the global bytes.
void LoadSlicesAndVerify(const Daemon& d, const std::string& job, uint64_t step) {
  auto client = d.Connect();
  for (const TensorItem& t : StateDict()) {
    const uint64_t n = ElementCount(t.shape);
    const uint64_t es = ckptd::DTypeSize(t.dtype);
    const uint64_t first = n / 3, count = n / 2;
    std::vector<uint8_t> got(count * es, 0xCD);
    ckptd::LoadTarget target{t.name, ckptd::Region::Flat(first, count), got.data(), got.size()};
    auto r = client->Load(job, step, 0, {&target, 1});
    INFO(t.name);
    REQUIRE(r.ok());
    std::vector<uint8_t> all = GlobalBytes(t, kSeed);
    REQUIRE(std::equal(got.begin(), got.end(), all.begin() + static_cast<long>(first * es)));
  }
}

std::string Status(const Daemon& d, const std::string& job, uint64_t step) {
  CommandResult r = RunCtl(d, {"status", job, std::to_string(step)});
  REQUIRE(r.exit_code == 0);
  return r.output;
}

}  // namespace

TEST_CASE("ram tier: a restore after the trainer's kill -9 copies from RAM, no device read",
          "[integration]") {
  Daemon d;
  const std::string job = "ram-run";
  {
    auto ranks = SaveRanksConcurrently(d, job, 1, kSeed, /*hold=*/true);
    auto client = d.Connect();
    INFO(d.Log());
    REQUIRE(client->WaitCommitted(job, 1, 30000).ok());
    for (auto& r : ranks) r->Kill9();  // the trainer dies right after its checkpoint
  }
  REQUIRE_THAT(Status(d, job, 1), Contains("tiers: ram, local"));
  const uint64_t before = DeviceReadBytes(d.pid());
  ckptd::LoadResult r = LoadAndVerify(d, job, 1);
  LoadSlicesAndVerify(d, job, 1);
  CHECK(r.bytes_read == 0);
  CHECK(r.bytes_from_ram > 0);
  CHECK(DeviceReadBytes(d.pid()) - before == 0);

  SECTION("the next checkpoint of the job takes its place (keep one per job)") {
    SaveCommitted(d, job, 2, kSeed);
    CHECK_THAT(Status(d, job, 2), Contains("tiers: ram, local"));
    CHECK_THAT(Status(d, job, 1), !Contains("tiers: ram"));
    const uint64_t cold_before = DeviceReadBytes(d.pid());
    ckptd::LoadResult cold = LoadAndVerify(d, job, 1);
    CHECK(cold.bytes_from_ram == 0);
    CHECK(cold.bytes_read > 0);
    // The measure sees the device: a cold load (O_DIRECT) counts what it read.
    CHECK(DeviceReadBytes(d.pid()) - cold_before >= cold.bytes_read);
  }
  SECTION("a deleted checkpoint leaves the tier") {
    REQUIRE(RunCtl(d, {"rm", job, "1"}).exit_code == 0);
    SaveCommitted(d, job, 1, kSeed);  // the same key again: its own bytes, hot again
    REQUIRE(LoadAndVerify(d, job, 1).bytes_from_ram > 0);
  }
}

TEST_CASE("ram tier: after a daemon restart the hot copy serves again only once verified",
          "[integration]") {
  Daemon d;
  const std::string job = "ram-restart";
  SaveCommitted(d, job, 1, kSeed);
  SECTION("clean stop") { REQUIRE(d.Stop()); }
  SECTION("kill -9") { d.Kill9(); }
  d.Restart({});
  INFO(d.Log());
  REQUIRE_THAT(d.Log(), Contains("hot in the RAM tier again"));
  REQUIRE_THAT(Status(d, job, 1), Contains("tiers: ram"));
  const uint64_t before = DeviceReadBytes(d.pid());
  ckptd::LoadResult r = LoadAndVerify(d, job, 1);
  CHECK(r.bytes_read == 0);
  // (index pages a restarted RocksDB may read aside: a cold load reads the whole 38 KiB)
  CHECK(DeviceReadBytes(d.pid()) - before < (16u << 10));
}

TEST_CASE("ram tier: corrupted hot bytes are never served: checksum error, read from storage",
          "[integration]") {
  Daemon d;
  const std::string job = "ram-corrupt";
  SaveCommitted(d, job, 1, kSeed);
  REQUIRE_THAT(Status(d, job, 1), Contains("tiers: ram"));
  SECTION("while the daemon runs") {
    CorruptArenaSegment(d);
    ckptd::LoadResult r = LoadAndVerify(d, job, 1);
    CHECK(r.bytes_read > 0);
    CHECK(r.bytes_from_ram == 0);
    CHECK_THAT(d.Log(), Contains("crc32c mismatch") && Contains("reading it from storage"));
    CHECK_THAT(Status(d, job, 1), !Contains("tiers: ram"));  // dropped
  }
  SECTION("before a restart: recovery does not adopt it") {
    d.Kill9();
    CorruptArenaSegment(d);
    d.Restart({});
    CHECK_THAT(d.Log(), Contains("not adopted"));
    CHECK_THAT(Status(d, job, 1), !Contains("tiers: ram"));
    CHECK(LoadAndVerify(d, job, 1).bytes_read > 0);
  }
}

TEST_CASE("ram tier: ckptctl prefetch brings a checkpoint from disk ahead of the restore",
          "[integration]") {
  Daemon d;
  const std::string job = "ram-prefetch";
  SaveCommitted(d, job, 1, kSeed);
  SaveCommitted(d, job, 2, kSeed);  // step 1 leaves the tier (keep one per job)
  REQUIRE_THAT(Status(d, job, 1), !Contains("tiers: ram"));
  CommandResult p = RunCtl(d, {"prefetch", job, "1"});
  INFO(p.output << d.Log());
  REQUIRE(p.exit_code == 0);
  CHECK_THAT(p.output, Contains("is in the RAM tier"));
  CHECK_THAT(Status(d, job, 1), Contains("tiers: ram"));
  ckptd::LoadResult r = LoadAndVerify(d, job, 1);
  CHECK(r.bytes_read == 0);
  LoadSlicesAndVerify(d, job, 1);
  CommandResult again = RunCtl(d, {"prefetch", job, "1"});
  CHECK_THAT(again.output, Contains("0 read from storage now"));
  CommandResult latest = RunCtl(d, {"prefetch", job});
  CHECK(latest.exit_code == 0);
  CHECK_THAT(latest.output, Contains(job + "/2 "));
  CommandResult missing = RunCtl(d, {"prefetch", job, "9"});
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.output, Contains("NOT_FOUND"));
}

TEST_CASE("ram tier: off with --ram_tier_keep_per_job=0", "[integration]") {
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0"}});
  const std::string job = "ram-off";
  SaveCommitted(d, job, 1, kSeed);
  CHECK_THAT(Status(d, job, 1), !Contains("tiers: ram"));
  CHECK(LoadAndVerify(d, job, 1).bytes_read > 0);
  CommandResult p = RunCtl(d, {"prefetch", job, "1"});
  CHECK(p.exit_code == 1);
  CHECK_THAT(p.output, Contains("FAILED_PRECONDITION") && Contains("RAM tier is off"));
}

TEST_CASE("load_io=buffered: four ranks restoring the same checkpoint read it from the device once",
          "[integration]") {
  // The RAM tier off: this is the cold path, with the page cache as the one read.
  const bool buffered = GENERATE(true, false);
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0",
                                        buffered ? "--load_io=buffered" : "--load_io=direct"}});
  const std::string job = "read-once";
  SaveCommitted(d, job, 1, kSeed);  // flushed with O_DIRECT: nothing of it in the page cache
  const uint64_t before = DeviceReadBytes(d.pid());
  std::vector<std::thread> ranks;
  ranks.reserve(4);
  std::vector<ckptd::LoadResult> results(4);
  std::vector<absl::Status> status(4);
  for (int r = 0; r < 4; ++r) {
    ranks.emplace_back([&, r] {
      auto client = d.Connect();
      status[r] = VerifyCheckpoint(*client, job, 1, kSeed, {}, 4, false, &results[r]);
    });
  }
  for (std::thread& t : ranks) t.join();
  uint64_t one = 0;
  for (int r = 0; r < 4; ++r) {
    INFO(status[r].ToString());
    REQUIRE(status[r].ok());
    one = std::max(one, results[r].bytes_read);
  }
  const uint64_t device = DeviceReadBytes(d.pid()) - before;
  INFO("device read " << device << " bytes; one rank's load " << one);
  if (buffered) {
    // Once: readahead reads the small blobs whole (and index pages), never a second rank's copy.
    CHECK(device < one * 3 / 2);
  } else {
    CHECK(device >= 3 * one);  // every rank read it: what buffered loads save
  }
}

// Loads checkpoint `job`/`step` whole from `ranks` concurrent clients with `options`; every load
// checked bit-exact; their results.
std::vector<ckptd::LoadResult> ConcurrentLoads(const Daemon& d, const std::string& job,
                                               uint64_t step, int ranks,
                                               const ckptd::LoadOptions& options) {
  std::vector<std::thread> threads;
  std::vector<ckptd::LoadResult> results(static_cast<size_t>(ranks));
  std::vector<absl::Status> status(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto client = d.Connect();
      status[r] = VerifyCheckpoint(*client, job, step, kSeed, {}, 4, false, &results[r], options);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << status[r].ToString() << "\n" << d.Log());
    REQUIRE(status[r].ok());
  }
  return results;
}

TEST_CASE("load hint: four ranks restoring a checkpoint that is not hot read it once, from RAM",
          "[integration]") {
  Daemon d(DaemonConfig{.extra_flags = {"--load_io=direct"}});
  const std::string job = "hint-once";
  SaveCommitted(d, job, 1, kSeed);
  SaveCommitted(d, job, 2, kSeed);  // step 1 leaves the tier (keep one per job)
  REQUIRE_THAT(Status(d, job, 1), !Contains("tiers: ram"));
  const ckptd::LoadResult cold = LoadAndVerify(d, job, 1);  // from storage
  const uint64_t whole = cold.bytes_read;                   // 4 KiB-rounded runs
  const uint64_t needed = cold.bytes_needed;                // the bytes the load uses
  REQUIRE(whole > 0);
  REQUIRE(needed > 0);
  const uint64_t before = DeviceReadBytes(d.pid());
  std::vector<ckptd::LoadResult> results =
      ConcurrentLoads(d, job, 1, 4, ckptd::LoadOptions{.prefetch = true});
  const uint64_t device = DeviceReadBytes(d.pid()) - before;
  uint64_t prefetched = 0;
  for (const ckptd::LoadResult& r : results) {
    CHECK(r.bytes_read == 0);  // every rank copied from RAM...
    CHECK(r.bytes_from_ram == needed);
    prefetched += r.bytes_prefetched;  // ...and one rank's prefetch read it
  }
  INFO("device read " << device << " bytes; the checkpoint's blobs " << prefetched
                      << "; one load from storage " << whole << " (" << needed << " used)");
  uint64_t blobs = 0;  // the step's blobs on disk
  for (const auto& e : std::filesystem::directory_iterator(d.data_dir() + "/" + job +
                                                           "/step-00000000000000000001")) {
    if (e.path().extension() == ".blob") blobs += e.file_size();
  }
  CHECK(prefetched == blobs);                         // every blob, once
  CHECK(device < prefetched * 21 / 20 + (64 << 10));  // the device read it once too
  CHECK_THAT(Status(d, job, 1), Contains("tiers: ram"));
  // The next restore, hinted or not, finds it hot.
  ckptd::LoadResult again = LoadAndVerify(d, job, 1);
  CHECK(again.bytes_read == 0);
  CHECK(again.bytes_prefetched == 0);
}

TEST_CASE("load hint: never fails a load (the RAM tier off, a checkpoint beyond its budget)",
          "[integration]") {
  const bool off = GENERATE(true, false);
  Daemon d(DaemonConfig{
      .extra_flags = {off ? "--ram_tier_keep_per_job=0" : "--ram_tier_bytes_max=4096"}});
  const std::string job = off ? "hint-off" : "hint-budget";
  SaveCommitted(d, job, 1, kSeed);
  std::vector<ckptd::LoadResult> results =
      ConcurrentLoads(d, job, 1, 2, ckptd::LoadOptions{.prefetch = true});
  for (const ckptd::LoadResult& r : results) {
    CHECK(r.bytes_read > 0);  // from storage, as without the hint
    CHECK(r.bytes_from_ram == 0);
    CHECK(r.bytes_prefetched == 0);
  }
  if (!off) {
    INFO(d.Log());
    CHECK_THAT(d.Log(),
               Contains("prefetch into the RAM tier failed") && Contains("the RAM tier's budget"));
  }
}

TEST_CASE("ram tier: concurrent ckptctl prefetches of one checkpoint read it once",
          "[integration]") {
  Daemon d;
  const std::string job = "prefetch-once";
  SaveCommitted(d, job, 1, kSeed);
  SaveCommitted(d, job, 2, kSeed);
  std::vector<CommandResult> out(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < out.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = RunCtl(d, {"prefetch", job, "1"}); });
  }
  for (std::thread& t : threads) t.join();
  int reads = 0;
  for (const CommandResult& r : out) {
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("is in the RAM tier"));
    if (r.output.find("; 0 read from storage now") == std::string::npos) ++reads;
  }
  CHECK(reads == 1);
  CHECK(LoadAndVerify(d, job, 1).bytes_read == 0);
}

TEST_CASE("load_io=auto: bytes the page cache holds load with no device read", "[integration]") {
  const bool automatic = GENERATE(true, false);
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0",
                                        automatic ? "--load_io=auto" : "--load_io=direct"}});
  const std::string job = "auto-io";
  SaveCommitted(d, job, 1, kSeed);  // flushed with O_DIRECT: nothing of it in the page cache
  uint64_t before = DeviceReadBytes(d.pid());
  const uint64_t whole = LoadAndVerify(d, job, 1).bytes_read;
  const uint64_t cold = DeviceReadBytes(d.pid()) - before;
  INFO("cold load: " << whole << " bytes, device " << cold);
  CHECK(cold >= whole * 9 / 10);  // not cached: read from the device, in either mode
  // Someone reads the blobs through the page cache (a copy tool, a buffered loader).
  for (const auto& e : std::filesystem::recursive_directory_iterator(d.data_dir())) {
    if (!e.is_regular_file() || e.path().extension() != ".blob") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::vector<char> buf(1 << 16);
    while (in.read(buf.data(), static_cast<std::streamsize>(buf.size())) || in.gcount() > 0) {
    }
  }
  before = DeviceReadBytes(d.pid());
  ckptd::LoadResult warm = LoadAndVerify(d, job, 1);
  const uint64_t device = DeviceReadBytes(d.pid()) - before;
  INFO("warm load: " << warm.bytes_read << " bytes, device " << device);
  CHECK(warm.bytes_read == whole);  // read from storage (the page cache), not the RAM tier
  if (automatic) {
    CHECK(device < whole / 10);  // the cache's copy
  } else {
    CHECK(device >= whole * 9 / 10);  // O_DIRECT reads the device whatever the cache holds
  }
}

TEST_CASE("ram tier: segments kept for hot checkpoints are removed once their state dir is gone",
          "[integration]") {
  Daemon a;
  SaveCommitted(a, "kept", 1, kSeed);
  REQUIRE(a.Stop());  // clean stop with a hot checkpoint: the segment stays for the next start
  const std::string segment = "/dev/shm" + a.ArenaName();
  REQUIRE(PathExists(segment));
  std::filesystem::remove_all(a.state_dir());  // the operator throws the state dir away
  // Any daemon's start removes it (no daemon could ever adopt it again): also one a test running
  // beside this one starts, which then logs the removal instead of b.
  const bool removed_beside = !PathExists(segment);
  Daemon b;
  INFO(b.Log());
  CHECK_FALSE(PathExists(segment));
  if (!removed_beside && b.Log().find("is gone") == std::string::npos) {
    WARN("the segment went before b scanned: a daemon of another test removed it");
  } else if (!removed_beside) {
    CHECK_THAT(b.Log(), Contains("its state dir") && Contains("is gone"));
  }
}

TEST_CASE("ckptctl du: checkpoints and bytes per job and tier, the RAM tier included",
          "[integration]") {
  Daemon d;
  SaveCommitted(d, "du-a", 1, kSeed);
  SaveCommitted(d, "du-a", 2, kSeed);
  SaveCommitted(d, "du-b", 1, kSeed);
  // The bytes `ls` reports per checkpoint, summed.
  CommandResult ls = RunCtl(d, {"--json", "ls", "du-a"});
  REQUIRE(ls.exit_code == 0);
  uint64_t bytes = 0;
  const std::regex bytes_re("\"bytes\": (\\d+)");
  for (std::sregex_iterator it(ls.output.begin(), ls.output.end(), bytes_re), end; it != end;
       ++it) {
    bytes += std::stoull((*it)[1]);
  }
  REQUIRE(bytes > 0);
  CommandResult du = RunCtl(d, {"--json", "du", "du-a"});
  INFO(du.output);
  REQUIRE(du.exit_code == 0);
  CHECK_THAT(du.output, Contains("\"job\": \"du-a\", \"checkpoints\": 2, \"local_bytes\": " +
                                 std::to_string(bytes) + ", \"remote_bytes\": 0"));
  const std::string hot = std::to_string(d.Connect()->GetStatus("du-a", 2).value().tiers.ram_bytes);
  CHECK_THAT(du.output, Contains("\"ram_bytes\": " + hot + "}"));  // step 2 only: keep one
  CommandResult all = RunCtl(d, {"du"});
  INFO(all.output);
  CHECK(all.exit_code == 0);
  CHECK_THAT(all.output, Contains("du-a") && Contains("du-b") && Contains("total"));
  CHECK(RunCtl(d, {"du", "a", "b"}).exit_code == 2);
}
