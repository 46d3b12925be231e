// Deltas against a real daemon (docs/USER_GUIDE.md "Deltas"): a LoRA-style job — a large frozen
// tensor and a small one that changes every step — writes the frozen bytes once; later
// checkpoints share that blob file by a hard link and load bit-exact from disk and from the RAM
// tier, also after the checkpoint that wrote the file is deleted and after a restart. The bytes
// are compared before they are referenced (a damaged earlier blob is never referenced), the
// per-job rule turns deltas on for some jobs only, and a kill -9 after a delta's blob synced
// leaves a checkpoint that commits (or aborts) whole.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"

using namespace ckptd_it;  // NOLINT(google-build-using-namespace): the harness
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kFrozen = 1 << 20;  // floats: 4 MiB
constexpr uint64_t kLora = 4096;       // floats: 16 KiB

std::vector<float> Filled(uint64_t n, float seed) {
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = seed + static_cast<float>(i % 9973) * 0.5f;
  return v;
}

ckptd::TensorShard Shard(const std::string& item, const std::vector<float>& data) {
  ckptd::TensorShard t;
  t.item = item;
  t.global_shape = {data.size()};
  t.region = ckptd::Region::Box({0}, {data.size()});
  t.data = data.data();
  t.bytes = data.size() * sizeof(float);
  return t;
}

// Saves (job, step) of one rank: "frozen" (first, so it leads the blob) and "lora".
void Save(const Daemon& d, const std::string& job, uint64_t step, const std::vector<float>& frozen,
          const std::vector<float>& lora) {
  auto client = d.Connect();
  std::vector<ckptd::TensorShard> t = {Shard("frozen", frozen), Shard("lora", lora)};
  absl::StatusOr<ckptd::SaveResult> r = client->Save(job, step, 0, 1, t, {});
  INFO(r.status().ToString() << "\n" << d.Log());
  REQUIRE(r.ok());
  absl::Status committed = client->WaitCommitted(job, step, 30000);
  INFO(committed.ToString());
  REQUIRE(committed.ok());
}

// Loads (job, step) and checks both tensors bit-exact.
void CheckLoads(const Daemon& d, const std::string& job, uint64_t step,
                const std::vector<float>& frozen, const std::vector<float>& lora) {
  auto client = d.Connect();
  std::vector<float> f(frozen.size()), l(lora.size());
  std::vector<ckptd::LoadTarget> targets = {{.item = "frozen",
                                             .region = ckptd::Region::Box({0}, {f.size()}),
                                             .dest = f.data(),
                                             .bytes = f.size() * sizeof(float)},
                                            {.item = "lora",
                                             .region = ckptd::Region::Box({0}, {l.size()}),
                                             .dest = l.data(),
                                             .bytes = l.size() * sizeof(float)}};
  absl::Status st = client->Load(job, step, 0, targets).status();
  INFO(job << "/" << step << ": " << st.ToString() << "\n" << d.Log());
  REQUIRE(st.ok());
  CHECK(std::memcmp(f.data(), frozen.data(), f.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(l.data(), lora.data(), l.size() * sizeof(float)) == 0);
}

std::string StepPath(const Daemon& d, const std::string& job, uint64_t step) {
  return d.data_dir() + "/" + job + "/" + StepDir(step);
}

std::string Linked(uint64_t written_at) {
  char name[64];
  std::snprintf(name, sizeof(name), "r00000-s%020llu.blob",
                static_cast<unsigned long long>(written_at));
  return name;
}

ino_t Inode(const std::string& path) {
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  return st.st_ino;
}

uint64_t FileBytes(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace

TEST_CASE("deltas: unchanged shards are written once and shared, and every checkpoint loads",
          "[integration][deltas]") {
  Daemon d(DaemonConfig{.extra_flags = {"--deltas=true"}});
  const std::vector<float> frozen = Filled(kFrozen, 1.0f);
  std::vector<std::vector<float>> lora;
  for (uint64_t step = 1; step <= 3; ++step) {
    lora.push_back(Filled(kLora, 100.0f * static_cast<float>(step)));
    Save(d, "ft", step, frozen, lora.back());
  }
  const std::string s1 = StepPath(d, "ft", 1);
  // Steps 2 and 3 share step 1's blob (one inode, three names) and write only the changed tensor.
  for (uint64_t step : {2, 3}) {
    const std::string dir = StepPath(d, "ft", step);
    INFO("step " << step);
    REQUIRE(PathExists(dir + "/" + Linked(1)));
    CHECK(Inode(dir + "/" + Linked(1)) == Inode(s1 + "/r00000.blob"));
    CHECK(FileBytes(dir + "/r00000.blob") <= kLora * sizeof(float) + 4096);
  }
  CHECK(FileBytes(s1 + "/r00000.blob") >= kFrozen * sizeof(float));
  for (uint64_t step = 1; step <= 3; ++step) CheckLoads(d, "ft", step, frozen, lora[step - 1]);

  // The checkpoint that wrote the shared file goes: the later ones keep its bytes.
  REQUIRE(d.Connect()->Delete("ft", 1).ok());
  CHECK(!PathExists(s1));
  CheckLoads(d, "ft", 2, frozen, lora[1]);
  CheckLoads(d, "ft", 3, frozen, lora[2]);
  CommandResult verify = RunCtl(d, {"verify", "ft", "3"});
  INFO(verify.output);
  CHECK(verify.exit_code == 0);

  // A later step still links the file (by the name of the step that wrote it), now through
  // step 3's name for it; after a restart without the RAM tier every load reads the disk.
  lora.push_back(Filled(kLora, 400.0f));
  Save(d, "ft", 4, frozen, lora.back());
  CHECK(Inode(StepPath(d, "ft", 4) + "/" + Linked(1)) ==
        Inode(StepPath(d, "ft", 2) + "/" + Linked(1)));
  d.Restart({"--deltas=true", "--ram_tier_keep_per_job=0"});
  for (uint64_t step = 2; step <= 4; ++step) CheckLoads(d, "ft", step, frozen, lora[step - 1]);
}

TEST_CASE("deltas: a damaged earlier blob is never referenced (the bytes are compared first)",
          "[integration][deltas]") {
  Daemon d(DaemonConfig{.extra_flags = {"--deltas=true", "--ram_tier_keep_per_job=0"}});
  const std::vector<float> frozen = Filled(kFrozen, 2.0f);
  const std::vector<float> l1 = Filled(kLora, 7.0f), l2 = Filled(kLora, 8.0f);
  Save(d, "dmg", 1, frozen, l1);
  {
    // One byte of the frozen tensor on disk flips (its checksum in the manifest stays).
    std::fstream f(StepPath(d, "dmg", 1) + "/r00000.blob",
                   std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekp(100);
    const char flipped = static_cast<char>(0x5a);
    f.write(&flipped, 1);
  }
  Save(d, "dmg", 2, frozen, l2);
  CHECK(!PathExists(StepPath(d, "dmg", 2) + "/" + Linked(1)));
  CHECK(FileBytes(StepPath(d, "dmg", 2) + "/r00000.blob") >= kFrozen * sizeof(float));
  CHECK_THAT(d.Log(), Contains("does not match"));
  CheckLoads(d, "dmg", 2, frozen, l2);
}

TEST_CASE("deltas: on for the jobs a retention rule names only", "[integration][deltas]") {
  Daemon d(DaemonConfig{.extra_flags = {"--retention_rules=lora-*: deltas=1"}});
  const std::vector<float> frozen = Filled(kFrozen / 4, 3.0f);
  for (const std::string job : {"lora-a", "full"}) {
    Save(d, job, 1, frozen, Filled(kLora, 1.0f));
    Save(d, job, 2, frozen, Filled(kLora, 2.0f));
  }
  CHECK(PathExists(StepPath(d, "lora-a", 2) + "/" + Linked(1)));
  CHECK(!PathExists(StepPath(d, "full", 2) + "/" + Linked(1)));
  CheckLoads(d, "lora-a", 2, frozen, Filled(kLora, 2.0f));

  // A bad value stops the start, naming the rule.
  CommandResult bad = RunCommand(
      {CKPTD_BIN, "--state_dir=" + d.state_dir() + "/x", "--retention_rules=lora-*: deltas=2"});
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Contains("deltas = 2 is not 0 or 1"));
}

TEST_CASE("deltas: a kill -9 after a delta's links and blob are synced loses nothing",
          "[integration][deltas]") {
  Daemon d(DaemonConfig{.extra_flags = {"--deltas=true", "--ram_tier_keep_per_job=0"}});
  const std::vector<float> frozen = Filled(kFrozen, 5.0f);
  const std::vector<float> l1 = Filled(kLora, 1.5f), l2 = Filled(kLora, 2.5f);
  Save(d, "crash", 1, frozen, l1);
  // The second flush crashes the daemon once its links are made and its blob synced, before
  // "persisted" is journaled; the restart resumes the staged rank from shared memory.
  d.Restart({"--deltas=true", "--ram_tier_keep_per_job=0", "--debug_crash_at=flush.blob_synced:1"});
  {
    auto client = d.Connect();
    std::vector<ckptd::TensorShard> t = {Shard("frozen", frozen), Shard("lora", l2)};
    REQUIRE(client->Save("crash", 2, 0, 1, t, {}).ok());
  }
  CHECK(d.WaitExit(30000) != 0);
  d.Restart({"--deltas=true", "--ram_tier_keep_per_job=0"});
  absl::Status committed = d.Connect()->WaitCommitted("crash", 2, 30000);
  INFO(committed.ToString() << "\n" << d.Log());
  REQUIRE(committed.ok());
  CheckLoads(d, "crash", 1, frozen, l1);
  CheckLoads(d, "crash", 2, frozen, l2);
  CHECK(PathExists(StepPath(d, "crash", 2) + "/" + Linked(1)));
}

TEST_CASE("deltas: the remote tier gets whole checkpoints, and a fresh node loads them from it",
          "[integration][deltas]") {
  TempDir store;
  const std::vector<std::string> flags = {"--deltas=true", "--remote_dir=" + store.path(),
                                          "--tier_policy=local+remote",
                                          "--upload_retry_max_ms=1000"};
  const std::vector<float> frozen = Filled(kFrozen / 4, 6.0f);
  const std::vector<float> l1 = Filled(kLora, 6.5f), l2 = Filled(kLora, 7.5f);
  {
    Daemon a(DaemonConfig{.extra_flags = flags});
    Save(a, "up", 1, frozen, l1);
    Save(a, "up", 2, frozen, l2);
    REQUIRE(PathExists(StepPath(a, "up", 2) + "/" + Linked(1)));
    for (uint64_t step : {1, 2}) {
      absl::Status up = a.Connect()->Wait("up", step, ckptd::WaitFor::kRemote, 30000).status();
      INFO(up.ToString() << "\n" << a.Log());
      REQUIRE(up.ok());
    }
    // On the store every checkpoint directory holds its own copy of every blob it lists.
    CHECK(FileBytes(store.path() + "/up/" + StepDir(2) + "/" + Linked(1)) >=
          frozen.size() * sizeof(float));
    REQUIRE(a.Connect()->Delete("up", 1).ok());
  }
  // A fresh node (empty state dir) loads step 2 from the store alone.
  Daemon b(DaemonConfig{.extra_flags = flags});
  CheckLoads(b, "up", 2, frozen, l2);
}
