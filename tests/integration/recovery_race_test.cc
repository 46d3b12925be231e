// Delete and recovery against the real daemon:
//   - `ckptctl rm` racing a re-save (and, every other round, a second rm racing the re-save's
//     commit) of the same step, 20 rounds: afterwards the step is either absent or COMMITTED and
//     loads bit-exact, and Delete never answers INTERNAL;
//   - stray files and directories in the data dir: the daemon starts and names them in its log;
//   - a corrupted newest manifest: CORRUPT in `ckptctl ls`, latest is the previous step (a restore
//     of "latest" falls back), loading it by number is DATA_LOSS;
//   - a vanished manifest: MISSING in `ckptctl ls`, its blobs kept, COMMITTED again once the
//     manifest is put back;
//   - index rows that do not parse (written into the stopped daemon's RocksDB): repaired from the
//     manifest or aborted, and the daemon starts.
#include <dlfcn.h>
#include <rocksdb/c.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr uint32_t kWorld = 2;

std::string ManifestPath(const Daemon& d, const std::string& job, uint64_t step) {
  return d.data_dir() + "/" + job + "/" + StepDir(step) + "/manifest.ckm";
}

// Saves every rank of (job, step) from this process, retrying rank 0 while an older checkpoint
// of that step is still there or being deleted; then waits for COMMITTED. `after_rank0` runs
// once rank 0 is staged.
absl::Status ReSave(ckptd::Client& client, const std::string& job, uint64_t step, uint64_t seed,
                    const std::function<void()>& after_rank0) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (true) {
    auto r0 = SaveRank(client, job, step, 0, kWorld, seed);
    if (r0.ok()) break;
    const absl::StatusCode code = r0.status().code();
    if (code != absl::StatusCode::kAlreadyExists && code != absl::StatusCode::kAborted) {
      return r0.status();
    }
    if (std::chrono::steady_clock::now() > deadline) return r0.status();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  after_rank0();
  for (uint32_t r = 1; r < kWorld; ++r) {
    auto res = SaveRank(client, job, step, r, kWorld, seed);
    if (!res.ok()) return res.status();
  }
  return client.WaitCommitted(job, step, 30000);
}

bool AnsweredInternal(const CommandResult& r) {
  return r.output.find("INTERNAL") != std::string::npos;
}

void FlipByte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

// The key of a checkpoint's index row (daemon/src/index/keys.h): 'C' job '\0' be64(step).
std::string CheckpointKey(const std::string& job, uint64_t step) {
  std::string key = "C" + job;
  key.push_back('\0');
  for (int i = 7; i >= 0; --i) key.push_back(static_cast<char>((step >> (8 * i)) & 0xff));
  return key;
}

// Writes raw rows into the RocksDB index of a stopped daemon through RocksDB's C API, loaded at
// run time (the test binary does not link RocksDB). Returns "" or the error.
std::string PutIndexRows(const std::string& index_dir,
                         const std::vector<std::pair<std::string, std::string>>& rows) {
  void* lib = dlopen("librocksdb.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("librocksdb.so.7.8", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::string("dlopen librocksdb: ") + dlerror();
#define CKPTD_IT_SYM(name) auto name##_fn = reinterpret_cast<decltype(&name)>(dlsym(lib, #name))
  CKPTD_IT_SYM(rocksdb_options_create);
  CKPTD_IT_SYM(rocksdb_options_destroy);
  CKPTD_IT_SYM(rocksdb_writeoptions_create);
  CKPTD_IT_SYM(rocksdb_writeoptions_destroy);
  CKPTD_IT_SYM(rocksdb_writeoptions_set_sync);
  CKPTD_IT_SYM(rocksdb_open);
  CKPTD_IT_SYM(rocksdb_put);
  CKPTD_IT_SYM(rocksdb_close);
  CKPTD_IT_SYM(rocksdb_free);
#undef CKPTD_IT_SYM
  if (!rocksdb_options_create_fn || !rocksdb_options_destroy_fn ||
      !rocksdb_writeoptions_create_fn || !rocksdb_writeoptions_destroy_fn ||
      !rocksdb_writeoptions_set_sync_fn || !rocksdb_open_fn || !rocksdb_put_fn ||
      !rocksdb_close_fn || !rocksdb_free_fn) {
    dlclose(lib);
    return "librocksdb lacks a C API function";
  }
  std::string result;
  rocksdb_options_t* options = rocksdb_options_create_fn();
  char* err = nullptr;
  rocksdb_t* db = rocksdb_open_fn(options, index_dir.c_str(), &err);
  if (err != nullptr) {
    result = std::string("open ") + index_dir + ": " + err;
    rocksdb_free_fn(err);
  } else {
    rocksdb_writeoptions_t* wo = rocksdb_writeoptions_create_fn();
    rocksdb_writeoptions_set_sync_fn(wo, 1);
    for (const auto& [key, value] : rows) {
      rocksdb_put_fn(db, wo, key.data(), key.size(), value.data(), value.size(), &err);
      if (err != nullptr) {
        result = std::string("put: ") + err;
        rocksdb_free_fn(err);
        break;
      }
    }
    rocksdb_writeoptions_destroy_fn(wo);
    rocksdb_close_fn(db);
  }
  rocksdb_options_destroy_fn(options);
  dlclose(lib);
  return result;
}

}  // namespace

TEST_CASE("delete racing a re-save of the same step: absent or complete, never INTERNAL",
          "[integration]") {
  Daemon d;
  const std::string job = "race";
  const uint64_t step = 5;
  auto client = d.Connect();
  {
    auto ranks = SaveRanksConcurrently(d, job, step, /*seed=*/100, /*hold=*/false, kWorld);
    for (auto& r : ranks) {
      INFO(r->output());
      REQUIRE(r->Wait() == 0);
    }
  }
  REQUIRE(client->WaitCommitted(job, step, 30000).ok());
  const std::string dir = d.data_dir() + "/" + job + "/" + StepDir(step);
  int resaved = 0, second_rm_won = 0;
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    const uint64_t seed = 200 + round;
    CommandResult rm, rm2;
    std::thread first([&] { rm = RunCtl(d, {"rm", job, std::to_string(step)}); });
    std::thread second;
    absl::Status resave = ReSave(*client, job, step, seed, [&] {
      // Every other round, delete again while the re-save's ranks stage and it commits.
      if (round % 2 == 1) {
        second = std::thread([&] { rm2 = RunCtl(d, {"rm", job, std::to_string(step)}); });
      }
    });
    first.join();
    if (second.joinable()) second.join();
    INFO("rm: " << rm.output << "\nsecond rm: " << rm2.output
                << "\nre-save: " << resave.ToString());
    CHECK(rm.exit_code == 0);
    CHECK_FALSE(AnsweredInternal(rm));
    CHECK_FALSE(AnsweredInternal(rm2));
    if (round % 2 == 1 && rm2.exit_code != 0) {
      // Refused only because the re-save was still being written.
      CHECK_THAT(rm2.output, Contains("FAILED_PRECONDITION"));
    }
    auto st = client->GetStatus(job, step);
    if (st.ok()) {
      INFO(ckptd::CheckpointStateName(st->state));
      REQUIRE(st->state == ckptd::CheckpointState::kCommitted);
      absl::Status verified = VerifyCheckpoint(*client, job, step, seed, {}, kWorld, true);
      INFO(verified.ToString() << "\n" << d.Log());
      REQUIRE(verified.ok());
      ++resaved;
    } else {
      INFO(st.status().ToString());
      REQUIRE(st.status().code() == absl::StatusCode::kNotFound);
      REQUIRE(rm2.exit_code == 0);  // only the second rm may leave the step absent
      REQUIRE_FALSE(PathExists(dir));
      ++second_rm_won;
      // The next round starts from a committed step again.
      for (uint32_t r = 0; r < kWorld; ++r) {
        REQUIRE(SaveRank(*client, job, step, r, kWorld, seed).ok());
      }
      REQUIRE(client->WaitCommitted(job, step, 30000).ok());
    }
  }
  INFO("re-saved " << resaved << ", deleted by the second rm " << second_rm_won);
  CHECK(resaved + second_rm_won == 20);
}

TEST_CASE("recovery: stray files and directories in the data dir - the daemon starts",
          "[integration][crash]") {
  Daemon d;
  const std::string job = "strays";
  SaveCommitted(d, job, 1, 31);
  REQUIRE(d.Stop());
  const std::string data = d.data_dir();
  std::ofstream(data + "/notes.txt") << "an operator's notes\n";
  std::ofstream(data + "/" + job + "/notes") << "more notes\n";
  std::filesystem::create_directories(data + "/" + job + "/step-latest-copy");
  std::filesystem::create_directories(data + "/.trash");
  d.Restart({});
  REQUIRE(VerifyInProcess(d, job, 1, 31) == "");
  const std::string log = d.Log();
  CHECK_THAT(log, Contains(data + "/notes.txt"));
  CHECK_THAT(log, Contains(data + "/" + job + "/notes"));
  CHECK_THAT(log, Contains("step-latest-copy"));
  CommandResult ls = RunCtl(d, {"ls", job});
  INFO(ls.output);
  CHECK(ls.exit_code == 0);
  SaveCommitted(d, job, 2, 32);
  REQUIRE(VerifyInProcess(d, job, 2, 32) == "");
}

TEST_CASE(
    "recovery: a corrupted newest manifest is CORRUPT and latest falls back to the one "
    "before",
    "[integration][crash]") {
  Daemon d;
  const std::string job = "corrupt";
  SaveCommitted(d, job, 1, 41);
  SaveCommitted(d, job, 2, 42);
  REQUIRE(d.Stop());
  const std::string manifest = ManifestPath(d, job, 2);
  const size_t size = std::filesystem::file_size(manifest);
  for (size_t at : {size / 3, size / 2}) FlipByte(manifest, at);
  d.Restart({});
  auto client = d.Connect();

  auto latest = client->Latest(job);
  INFO(latest.status().ToString() << "\n" << d.Log());
  REQUIRE(latest.ok());
  CHECK(*latest == 1);
  CommandResult ls = RunCtl(d, {"ls", job});
  INFO(ls.output);
  CHECK(ls.exit_code == 0);
  CHECK_THAT(ls.output, Contains("CORRUPT"));
  CHECK_THAT(ls.output, Contains("COMMITTED"));
  CommandResult st = RunCtl(d, {"--json", "status", job, "2"});
  INFO(st.output);
  CHECK_THAT(st.output, Contains("\"state\": \"CORRUPT\""));
  CHECK_THAT(d.Log(), Contains(manifest));

  auto by_number = client->LoadObject(job, 2, 0, kRankObject);
  INFO(by_number.status().ToString());
  CHECK(by_number.status().code() == absl::StatusCode::kDataLoss);
  // Restoring "latest" falls back to step 1 instead of failing.
  CommandResult restore =
      RunTestClient(d, "load", {"--job", job, "--step", "latest", "--seed", "41"});
  INFO(restore.output);
  CHECK(restore.exit_code == 0);
  REQUIRE(VerifyInProcess(d, job, 1, 41) == "");

  // The corrupt one is deleted like any other, and the step saves again.
  CommandResult rm = RunCtl(d, {"rm", job, "2"});
  INFO(rm.output);
  CHECK(rm.exit_code == 0);
  SaveCommitted(d, job, 2, 43);
  REQUIRE(VerifyInProcess(d, job, 2, 43) == "");
}

// Issue 33 §3: a committed checkpoint whose manifest vanished (no other tier holding it) was
// ABORTED at the next start and its blobs removed. Now it is MISSING in `ckptctl ls`, its blobs
// stay, latest is the step before, a load of it by number is DATA_LOSS; the manifest put back,
// the next start makes it COMMITTED and it loads bit-exact.
TEST_CASE("recovery: a vanished manifest makes its checkpoint MISSING, its files kept",
          "[integration][crash]") {
  Daemon d;
  const std::string job = "vanished";
  SaveCommitted(d, job, 1, 51);
  SaveCommitted(d, job, 2, 52);
  REQUIRE(d.Stop());
  const std::string manifest = ManifestPath(d, job, 2);
  const std::string kept = d.state_dir() + "/manifest-2.kept";
  std::filesystem::rename(manifest, kept);
  d.Restart({});
  auto client = d.Connect();
  auto latest = client->Latest(job);
  INFO(latest.status().ToString() << "\n" << d.Log());
  REQUIRE(latest.ok());
  CHECK(*latest == 1);
  CommandResult ls = RunCtl(d, {"ls", job});
  INFO(ls.output);
  CHECK(ls.exit_code == 0);
  CHECK_THAT(ls.output, Contains("MISSING"));
  CommandResult st = RunCtl(d, {"--json", "status", job, "2"});
  INFO(st.output);
  CHECK_THAT(st.output, Contains("\"state\": \"MISSING\"") && Contains("manifest.ckm"));
  CHECK(PathExists(d.data_dir() + "/" + job + "/" + StepDir(2) + "/r00000.blob"));
  auto by_number = client->LoadObject(job, 2, 0, kRankObject);
  INFO(by_number.status().ToString());
  CHECK(by_number.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(by_number.status().message()), Contains("MISSING"));

  REQUIRE(d.Stop());
  std::filesystem::rename(kept, manifest);
  d.Restart({});
  auto again = d.Connect()->GetStatus(job, 2);
  REQUIRE(again.ok());
  CHECK(again->state == ckptd::CheckpointState::kCommitted);
  CHECK(VerifyInProcess(d, job, 2, 52) == "");
}

TEST_CASE("recovery: index rows that do not parse are repaired or aborted - the daemon starts",
          "[integration][crash]") {
  Daemon d;
  const std::string job = "badrows";
  SaveCommitted(d, job, 1, 51);
  SaveCommitted(d, job, 2, 52);
  REQUIRE(d.Stop());
  // 'n' starts a protobuf field of wire type 6, which does not exist: no record parses from it.
  const std::string garbage = "not a protobuf";
  const std::string put =
      PutIndexRows(d.state_dir() + "/index",
                   {{CheckpointKey(job, 1), garbage}, {CheckpointKey(job, 7), garbage}});
  REQUIRE(put == "");
  d.Restart({});
  auto client = d.Connect();
  INFO(d.Log());
  CHECK_THAT(d.Log(), Contains("does not parse"));
  auto s1 = client->GetStatus(job, 1);
  REQUIRE(s1.ok());
  CHECK(s1->state == ckptd::CheckpointState::kCommitted);  // rebuilt from its manifest
  REQUIRE(VerifyInProcess(d, job, 1, 51) == "");
  REQUIRE(VerifyInProcess(d, job, 2, 52) == "");
  auto s7 = client->GetStatus(job, 7);
  REQUIRE(s7.ok());
  CHECK(s7->state == ckptd::CheckpointState::kAborted);
  auto latest = client->Latest(job);
  REQUIRE(latest.ok());
  CHECK(*latest == 2);
}
