// `ckptctl verify` against the real daemon (the Verify RPC, daemon/src/service/verify.cc): a
// clean checkpoint verifies on every tier; a flipped byte, a truncated blob, a missing blob and a
// damaged manifest on disk are each reported with their item, saving rank, blob and block, and
// exit 3; a sample checks fewer blocks but always a shard's ends; the RAM tier's hot copy and the
// remote tier are verified too; a delete waits for a verify; a verify whose caller went away
// stops; errors exit 1 and usage errors 2.
//
// The checkpoint: tensor "w", float32 [2, 65536], rank r saving row r (256 KiB: 64 checksum
// blocks of the default 4 KiB), so rank r's blob r0000r.blob holds that one shard at offset 0.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/str_join.h"
#include "as_uid.h"
#include "harness.h"
#include "raw_session.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr uint32_t kWorld = 2;
constexpr uint64_t kCols = 65536;
constexpr uint64_t kRowBytes = kCols * 4;
constexpr uint64_t kBlock = 4096;
constexpr uint64_t kBlocksPerShard = kRowBytes / kBlock;  // 64
constexpr uint64_t kBlocks = kBlocksPerShard * kWorld;    // 128

// Saves both ranks of (job, step) through `client` and waits until COMMITTED.
void SaveRows(ckptd::Client& client, const std::string& job, uint64_t step) {
  std::mt19937_64 rng(step);
  for (uint32_t r = 0; r < kWorld; ++r) {
    std::vector<uint8_t> row(kRowBytes);
    for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
    ckptd::TensorShard s;
    s.item = "w";
    s.dtype = ckptd::DType::kFloat32;
    s.global_shape = {kWorld, kCols};
    s.region = ckptd::Region::Box({r, 0}, {1, kCols});
    s.data = row.data();
    s.bytes = row.size();
    auto saved = client.Save(job, step, r, kWorld, {&s, 1});
    INFO(saved.status().ToString());
    REQUIRE(saved.ok());
  }
  absl::Status committed = client.WaitCommitted(job, step, 30000);
  INFO(committed.ToString());
  REQUIRE(committed.ok());
}

void SaveRows(const Daemon& d, const std::string& job, uint64_t step) {
  auto client = d.Connect();
  SaveRows(*client, job, step);
}

std::string Blob(const std::string& root, const std::string& job, uint64_t step, uint32_t rank) {
  char name[32];
  std::snprintf(name, sizeof name, "r%05u.blob", rank);
  return root + "/" + job + "/" + StepDir(step) + "/" + name;
}

// Flips every bit of the byte at `offset` of the file (what a bad sector or a stray write does).
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

CommandResult Verify(const Daemon& d, std::vector<std::string> args) {
  args.insert(args.begin(), "verify");
  CommandResult r = RunCtl(d, args);
  UNSCOPED_INFO("ckptctl " << absl::StrJoin(args, " ") << " -> " << r.exit_code << "\n"
                           << r.output);
  return r;
}

// The number after `"key": ` in a --json answer (the first one), or -1.
int64_t JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\": (\\d+)"))) return -1;
  return std::stoll(m[1]);
}

// Whether a thread of `pid` is blocked opening a FIFO (waiting for its writer).
bool BlockedOnFifo(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(tasks, ec)) {
    if (ReadFile(t.path().string() + "/wchan").find("wait_for_partner") == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("verify: a clean checkpoint verifies every block on every tier it is on",
          "[integration][verify]") {
  Daemon d;
  SaveRows(d, "clean", 1);
  SaveRows(d, "clean", 2);
  // Step 1 is on local storage; step 2 also in the RAM tier (keep one per job).
  CommandResult one = Verify(d, {"clean", "1"});
  CHECK(one.exit_code == 0);
  CHECK_THAT(one.output, Contains("local: ok: 128 blocks, 524288 bytes verified"));
  CHECK_THAT(one.output, !Contains("ram:"));
  CHECK_THAT(one.output, Contains("clean/1: verified"));
  CommandResult latest = Verify(d, {"clean", "latest"});
  CHECK(latest.exit_code == 0);
  CHECK_THAT(latest.output, Contains("local: ok: 128 blocks, 524288 bytes verified"));
  CHECK_THAT(latest.output, Contains("ram: ok: 128 blocks, 524288 bytes verified"));
  CHECK_THAT(latest.output, Contains("clean/2: verified"));
  CommandResult ram = Verify(d, {"clean", "2", "--tier", "ram"});
  CHECK(ram.exit_code == 0);
  CHECK_THAT(ram.output, !Contains("local:"));

  // --json: numbers as numbers.
  CommandResult json = RunCtl(d, {"--json", "verify", "clean", "1", "--tier", "local"});
  INFO(json.output);
  CHECK(json.exit_code == 0);
  CHECK(JsonNumber(json.output, "step") == 1);
  CHECK(JsonNumber(json.output, "blocks_total") == static_cast<int64_t>(kBlocks));
  CHECK(JsonNumber(json.output, "blocks_checked") == static_cast<int64_t>(kBlocks));
  CHECK(JsonNumber(json.output, "blocks_bad") == 0);
  CHECK(JsonNumber(json.output, "bytes_read") == static_cast<int64_t>(kBlocks * kBlock));
  CHECK(JsonNumber(json.output, "failures_total") == 0);
  CHECK(JsonNumber(json.output, "checksum_block_bytes") == static_cast<int64_t>(kBlock));
  CHECK_THAT(json.output, Contains("\"manifest_ok\": true"));
}

TEST_CASE("verify: a flipped byte is reported by tier, item, rank, blob and block, exit 3",
          "[integration][verify]") {
  Daemon d;
  SaveRows(d, "flip", 1);
  FlipByte(Blob(d.data_dir(), "flip", 1, 1), 5 * kBlock + 17);
  CommandResult r = Verify(d, {"flip", "1"});
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Contains("BAD tier=local item=w rank=1 blob=r00001.blob block=5 "
                                "offset=20480: crc32c expected 0x"));
  CHECK_THAT(r.output, Contains(" actual 0x"));
  CHECK_THAT(r.output, Contains("local: DAMAGED: 1 of 128 blocks checked are bad"));
  // The hot copy in RAM was never touched: it verifies.
  CHECK_THAT(r.output, Contains("ram: ok: 128 blocks"));
  CHECK_THAT(r.output, Contains("flip/1: DAMAGED (1 failures)"));
  // Verify marks nothing: the checkpoint stays COMMITTED (a load of row 0 still works).
  CHECK_THAT(RunCtl(d, {"ls", "flip"}).output, Contains("COMMITTED"));

  CommandResult json = RunCtl(d, {"--json", "verify", "flip", "1", "--tier", "local"});
  INFO(json.output);
  CHECK(json.exit_code == 3);
  CHECK_THAT(json.output, Contains("\"problem\": \"CHECKSUM_MISMATCH\""));
  CHECK_THAT(json.output, Contains("\"item\": \"w\""));
  CHECK(JsonNumber(json.output, "rank") == 1);
  CHECK(JsonNumber(json.output, "block") == 5);
  CHECK(JsonNumber(json.output, "offset") == static_cast<int64_t>(5 * kBlock));
  CHECK(JsonNumber(json.output, "blocks_bad") == 1);
  CHECK(JsonNumber(json.output, "failures_total") == 1);
}

TEST_CASE("verify: a truncated blob and a missing blob are reported, exit 3",
          "[integration][verify]") {
  Daemon d;
  SaveRows(d, "cut", 1);
  SECTION("truncated") {
    REQUIRE(truncate(Blob(d.data_dir(), "cut", 1, 0).c_str(), 10 * kBlock + 100) == 0);
    CommandResult r = Verify(d, {"cut", "1", "--tier", "local"});
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output, Contains("BAD tier=local item=w rank=0 blob=r00000.blob block=10 "
                                  "offset=40960: blob truncated: 41060 bytes, manifest says "
                                  "262144"));
    // The 10 blocks before the cut verify; the 54 from it on are bad.
    CHECK_THAT(r.output, Contains("local: DAMAGED: 54 of 128 blocks checked are bad"));
  }
  SECTION("missing") {
    REQUIRE(unlink(Blob(d.data_dir(), "cut", 1, 1).c_str()) == 0);
    CommandResult r = Verify(d, {"cut", "1", "--tier", "local"});
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output,
               Contains("BAD tier=local item=w rank=1 blob=r00001.blob block=0 offset=0: blob "
                        "missing"));
    CHECK_THAT(r.output, Contains("local: DAMAGED: 64 of 128 blocks checked are bad"));
  }
}

TEST_CASE("verify: a manifest that verifies on no tier is reported and marks it CORRUPT",
          "[integration][verify]") {
  Daemon d;
  SaveRows(d, "man", 1);
  SaveRows(d, "man", 2);
  FlipByte(d.data_dir() + "/man/" + StepDir(1) + "/manifest.ckm", 20);
  CommandResult r = Verify(d, {"man", "1"});
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Contains("BAD tier=local blob=manifest.ckm: "));
  CHECK_THAT(r.output, Contains("its manifest is bad"));
  // As a load would have recorded it: CORRUPT, never latest.
  CHECK_THAT(RunCtl(d, {"ls", "man"}).output, Contains("CORRUPT"));
  // A CORRUPT checkpoint can still be verified (after an operator restored its files).
  CHECK(Verify(d, {"man", "1"}).exit_code == 3);
  CHECK(Verify(d, {"man", "2"}).exit_code == 0);
}

TEST_CASE("verify: --sample checks fewer blocks, always each shard's first and last",
          "[integration][verify]") {
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0"}});
  SaveRows(d, "sample", 1);
  CommandResult a =
      RunCtl(d, {"--json", "verify", "sample", "1", "--sample", "0.1", "--seed", "7"});
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  const int64_t checked = JsonNumber(a.output, "blocks_checked");
  CHECK(checked >= 4);  // both ends of both shards
  CHECK(checked < static_cast<int64_t>(kBlocks) / 2);
  CHECK(JsonNumber(a.output, "blocks_total") == static_cast<int64_t>(kBlocks));
  CHECK(JsonNumber(a.output, "seed") == 7);
  // The same seed: the same blocks.
  CommandResult again =
      RunCtl(d, {"--json", "verify", "sample", "1", "--sample", "0.1", "--seed", "7"});
  CHECK(JsonNumber(again.output, "blocks_checked") == checked);
  // No seed: the daemon picks one and says which.
  CommandResult text = Verify(d, {"sample", "1", "--sample", "0.1"});
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.output, Contains("(a sample: "));
  CHECK_THAT(text.output, Contains(" blocks, seed "));

  SECTION("damage in a shard's last block") {
    FlipByte(Blob(d.data_dir(), "sample", 1, 0), kRowBytes - 1);
    CommandResult r = Verify(d, {"sample", "1", "--sample", "0.01"});
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output, Contains("BAD tier=local item=w rank=0 blob=r00000.blob block=63 "
                                  "offset=258048: crc32c"));
  }
  SECTION("damage in a shard's first block") {
    FlipByte(Blob(d.data_dir(), "sample", 1, 1), 0);
    CommandResult r = Verify(d, {"sample", "1", "--sample", "0.01"});
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.output,
               Contains("BAD tier=local item=w rank=1 blob=r00001.blob block=0 offset=0: crc32c"));
  }
}

TEST_CASE("verify: the RAM tier's hot copy is checked in place", "[integration][verify]") {
  Daemon d;
  SaveRows(d, "hot", 1);
  CorruptArenaSegment(d);  // the hot copy's bytes; the blobs on disk are intact
  CommandResult ram = Verify(d, {"hot", "1", "--tier", "ram"});
  CHECK(ram.exit_code == 3);
  CHECK_THAT(ram.output, Contains("BAD tier=ram item=w rank=0 blob=r00000.blob block=0 offset=0: "
                                  "crc32c expected"));
  CHECK_THAT(ram.output, Contains("ram: DAMAGED: 128 of 128 blocks checked are bad"));
  CHECK(Verify(d, {"hot", "1", "--tier", "local"}).exit_code == 0);
  // Not hot: the RAM tier cannot be verified.
  SaveRows(d, "hot", 2);  // takes the job's one hot place
  CommandResult cold = Verify(d, {"hot", "1", "--tier", "ram"});
  CHECK(cold.exit_code == 1);
  CHECK_THAT(cold.output, Contains("FAILED_PRECONDITION"));
  CHECK_THAT(cold.output, Contains("not in the RAM tier"));
}

TEST_CASE("verify: the remote tier's copy is checked through its storage",
          "[integration][verify][remote]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  Daemon d(DaemonConfig{.extra_flags = {"--remote_dir=" + remote, "--tier_policy=local+remote",
                                        "--ram_tier_keep_per_job=0"}});
  SaveRows(d, "far", 1);
  auto client = d.Connect();
  REQUIRE(client->Wait("far", 1, ckptd::WaitFor::kRemote, 30000).ok());
  CommandResult clean = Verify(d, {"far", "1"});
  CHECK(clean.exit_code == 0);
  CHECK_THAT(clean.output, Contains("local: ok: 128 blocks"));
  CHECK_THAT(clean.output, Contains("remote: ok: 128 blocks"));

  FlipByte(Blob(remote, "far", 1, 0), 7 * kBlock);
  CommandResult r = Verify(d, {"far", "1"});
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Contains("BAD tier=remote item=w rank=0 blob=r00000.blob block=7 "
                                "offset=28672: crc32c"));
  CHECK_THAT(r.output, Contains("local: ok: 128 blocks"));
  CHECK(Verify(d, {"far", "1", "--tier", "local"}).exit_code == 0);
  CHECK(Verify(d, {"far", "1", "--tier", "remote"}).exit_code == 3);
}

TEST_CASE("verify: a delete waits for the verify reading the checkpoint", "[integration][verify]") {
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0"}});
  SaveRows(d, "busy", 1);
  // Rank 0's blob, the first one verify opens, becomes a FIFO: the verify's open waits for a
  // writer there, with the checkpoint claimed.
  const std::string blob = Blob(d.data_dir(), "busy", 1, 0);
  REQUIRE(unlink(blob.c_str()) == 0);
  REQUIRE(mkfifo(blob.c_str(), 0600) == 0);
  Child verify({CKPTCTL_BIN, "--socket", d.socket(), "verify", "busy", "1"});
  bool blocked = false;
  for (int i = 0; i < 200 && !(blocked = BlockedOnFifo(d.pid())); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(blocked);
  CommandResult rm = RunCtl(d, {"rm", "busy", "1"});
  INFO(rm.output);
  CHECK(rm.exit_code == 1);
  CHECK_THAT(rm.output, Contains("ABORTED"));
  CHECK_THAT(rm.output, Contains("being verified"));
  // The writer lets the verify go on: the FIFO reads as an empty blob (kept open until the
  // verify ends, so every open of it finds a writer).
  int writer = open(blob.c_str(), O_WRONLY);
  REQUIRE(writer >= 0);
  const int status = verify.Wait();
  close(writer);
  INFO(verify.output());
  CHECK(status == 3);
  CHECK_THAT(verify.output(), Contains("BAD tier=local item=w rank=0 blob=r00000.blob block=0 "
                                       "offset=0: blob truncated: 0 bytes, manifest says 262144"));
  CHECK(RunCtl(d, {"rm", "busy", "1"}).exit_code == 0);
}

TEST_CASE("verify: a caller that goes away stops the verify and releases the checkpoint",
          "[integration][verify]") {
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0", "--log_level=debug"}});
  SaveRows(d, "gone", 1);
  // As above: the verify's first open waits on a FIFO, the checkpoint claimed, while its caller
  // gives up (the deadline of --timeout_ms passes).
  const std::string blob = Blob(d.data_dir(), "gone", 1, 0);
  REQUIRE(unlink(blob.c_str()) == 0);
  REQUIRE(mkfifo(blob.c_str(), 0600) == 0);
  CommandResult v = Verify(d, {"gone", "1", "--timeout_ms", "1500"});
  CHECK(v.exit_code == 1);
  CHECK_THAT(v.output, Contains("DEADLINE_EXCEEDED"));
  REQUIRE(BlockedOnFifo(d.pid()));  // the daemon is still in the open
  // Released, the verify reaches its next batch, finds its caller gone and ends there: the
  // claim goes with it, so a delete succeeds without any writer closing the FIFO.
  int writer = open(blob.c_str(), O_WRONLY);
  REQUIRE(writer >= 0);
  CommandResult rm;
  for (int i = 0; i < 100; ++i) {
    rm = RunCtl(d, {"rm", "gone", "1"});
    if (rm.exit_code == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  close(writer);
  INFO(rm.output);
  CHECK(rm.exit_code == 0);
  CHECK_THAT(d.Log(), Contains("the caller went away"));
}

TEST_CASE("verify: errors exit 1, usage errors 2", "[integration][verify]") {
  Daemon d;
  SaveRows(d, "err", 1);
  CommandResult missing = Verify(d, {"err", "9"});
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.output, Contains("NOT_FOUND"));
  CHECK_THAT(missing.output, Contains("err/9 does not exist"));
  CommandResult no_job = Verify(d, {"nojob", "latest"});
  CHECK(no_job.exit_code == 1);
  CHECK_THAT(no_job.output, Contains("NOT_FOUND"));
  CHECK(Verify(d, {"err"}).exit_code == 2);
  CHECK(Verify(d, {"err", "1", "--sample", "0"}).exit_code == 2);
  CHECK(Verify(d, {"err", "1", "--sample", "1.5"}).exit_code == 2);
  CHECK(Verify(d, {"err", "1", "--tier", "tape"}).exit_code == 2);
  CHECK(Verify(d, {"err", "x"}).exit_code == 2);
  CHECK(RunCtl(d, {"ls", "--sample", "0.5"}).exit_code == 2);
  CommandResult no_remote = Verify(d, {"err", "1", "--tier", "remote"});
  CHECK(no_remote.exit_code == 1);
  CHECK_THAT(no_remote.output, Contains("FAILED_PRECONDITION"));
}

namespace {
// As another uid (as_uid.h; args: SOCKET): verify root's job "mine" step 1 and report the answer's
// code and message.
std::string VerifyAsOtherUid(const std::vector<std::string>& args, int /*gate_fd*/) {
  Raw other(args.at(0));
  v1::VerifyRequest req;
  req.set_job("mine");
  req.set_step(1);
  v1::VerifyResponse resp;
  grpc::Status s =
      other.Call([&](grpc::ClientContext* c) { return other.stub->Verify(c, req, &resp); });
  return std::to_string(s.error_code()) + " " + s.error_message();
}
CKPTD_AS_UID_CHILD("verify-other-uid", VerifyAsOtherUid);
}  // namespace

TEST_CASE("verify: another uid may not verify a job it does not own", "[integration][verify]") {
  if (geteuid() != 0) {
    WARN("not run: needs root to act as a second uid");
    return;
  }
  // The socket open to group 65534 (nogroup), the temp dir above the state dir traversable.
  Daemon d(DaemonConfig{.extra_flags = {"--socket_mode=0660", "--socket_group=65534"}});
  const std::string parent = d.state_dir().substr(0, d.state_dir().rfind('/'));
  REQUIRE(chmod(parent.c_str(), 0711) == 0);
  SaveRows(d, "mine", 1);
  const std::string sock = d.socket();
  const std::string answer = ExecAsUid(65534, 65534, "verify-other-uid", {sock}).Finish();
  INFO(answer);
  CHECK(answer.rfind(std::to_string(grpc::StatusCode::PERMISSION_DENIED) + " ", 0) == 0);
  // Root is an admin: it may verify the job.
  CHECK(Verify(d, {"mine", "1"}).exit_code == 0);
}
