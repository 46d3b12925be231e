// The remote tier (issue 11 part 2) against real daemons: the posix plugin on a directory standing
// for a shared file system (each test's own temp dir). A checkpoint saved with local+remote
// commits locally, then uploads in the background (blobs, then the manifest, then the index row);
// Wait(kRemote) waits for that; status and ckptctl show the tier; a daemon with an empty state dir
// adopts what the store holds and loads it in another layout; a local blob missing or corrupt is
// read from the remote tier instead; a failed upload is retried until it succeeds; a restart
// resumes an interrupted upload; SIGTERM mid-upload drains it (answering status meanwhile);
// delete removes both copies.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ckptd/sync_point.h"
#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

namespace {

constexpr char kJob[] = "remote-job";

std::vector<std::string> RemoteFlags(const std::string& remote, const std::string& policy) {
  return {"--remote_dir=" + remote, "--tier_policy=" + policy, "--upload_retry_max_ms=1000"};
}

// Saves the 4 ranks of (kJob, step) with `policy` and waits until COMMITTED.
void SaveWith(const Daemon& d, uint64_t step, uint64_t seed, ckptd::TierPolicy policy) {
  ckptd::ClientOptions o;
  o.socket_path = d.socket();
  o.tier_policy = policy;
  auto client = ckptd::Client::Connect(o);
  REQUIRE(client.ok());
  for (uint32_t r = 0; r < 4; ++r) {
    auto saved = SaveRank(**client, kJob, step, r, 4, seed);
    REQUIRE(saved.ok());
  }
  REQUIRE((*client)->WaitCommitted(kJob, step, 30000).ok());
}

std::string StepPath(const std::string& root, uint64_t step) {
  return root + "/" + kJob + "/" + StepDir(step);
}

// Loads one item whole from `d`; the result (bytes read, of them from the remote tier).
ckptd::LoadResult LoadItem(const Daemon& d, uint64_t step, const std::string& item,
                           std::vector<uint8_t>* out) {
  const TensorItem* t = nullptr;
  for (const TensorItem& x : StateDict()) {
    if (x.name == item) t = &x;
  }
  REQUIRE(t != nullptr);
  out->assign(ElementCount(t->shape) * ckptd::DTypeSize(t->dtype), 0);
  auto client = d.Connect();
  std::vector<ckptd::LoadTarget> targets = {
      {item, ckptd::Region::Whole(), out->data(), out->size()}};
  auto r = client->Load(kJob, step, 0, targets);
  INFO(r.status().ToString() << "\nlog:\n" << d.Log());
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("remote tier: local+remote uploads after commit, a fresh node loads from the store",
          "[integration][remote]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  Daemon a(DaemonConfig{.extra_flags = RemoteFlags(remote, "local")});
  SaveWith(a, 1, 11, ckptd::TierPolicy::kLocalAndRemote);
  SaveWith(a, 2, 12, ckptd::TierPolicy::kLocal);

  auto client = a.Connect();
  auto durable = client->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000);
  INFO(durable.status().ToString() << "\nlog:\n" << a.Log());
  REQUIRE(durable.ok());
  CHECK(durable->tiers.local);
  CHECK(durable->tiers.remote);
  CHECK(durable->tiers.upload.state == ckptd::UploadProgress::kDurable);
  CHECK(durable->tiers.upload.store == "posix:" + remote);
  CHECK(PathExists(StepPath(remote, 1) + "/manifest.ckm"));
  // A checkpoint saved local only has no upload: Wait(kRemote) says so.
  auto local_only = client->Wait(kJob, 2, ckptd::WaitFor::kRemote, 1000);
  CHECK(local_only.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(!PathExists(StepPath(remote, 2)));
  CommandResult ls = RunCtl(a, {"ls", kJob});
  INFO(ls.output);
  CHECK(ls.output.find("local, remote") != std::string::npos);
  CommandResult wait = RunCtl(a, {"wait", kJob, "1", "--until", "remote"});
  CHECK(wait.exit_code == 0);

  // A fresh daemon (empty state dir: a new node) configured with the store adopts step 1 from it
  // and loads it whole (another layout than the 4 row shards it was saved as), bit-exact, every
  // byte read from the remote tier.
  Daemon b(DaemonConfig{.extra_flags = RemoteFlags(remote, "local")});
  auto bc = b.Connect();
  auto latest = bc->Latest(kJob);
  INFO(b.Log());
  REQUIRE(latest.ok());
  CHECK(*latest == 1);
  auto st = bc->GetStatus(kJob, 1);
  REQUIRE(st.ok());
  CHECK(!st->tiers.local);
  CHECK(st->tiers.remote);
  CHECK(VerifyInProcess(b, kJob, 1, 11) == "");
  std::vector<uint8_t> got;
  ckptd::LoadResult r = LoadItem(b, 1, StateDict().front().name, &got);
  CHECK(r.bytes_read > 0);
  CHECK(r.bytes_read_remote == r.bytes_read);
  CHECK(got == GlobalBytes(StateDict().front(), 11));

  // Deleting on the node that uploaded it removes both copies; the fresh node's index still
  // lists it until it is deleted there too (no daemon talks to another), but its load then
  // finds no manifest on any tier.
  CHECK(RunCtl(a, {"rm", kJob, "1"}).exit_code == 0);
  CHECK(!PathExists(StepPath(remote, 1)));
  CHECK(!PathExists(StepPath(a.data_dir(), 1)));
  CHECK(VerifyInProcess(b, kJob, 1, 11) != "");
}

TEST_CASE("remote tier: a missing or corrupt local blob is read from the remote tier",
          "[integration][remote]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  // The RAM tier off: loads read the local blobs this test breaks.
  std::vector<std::string> flags = RemoteFlags(remote, "local+remote");
  flags.push_back("--ram_tier_keep_per_job=0");
  Daemon d(DaemonConfig{.extra_flags = flags});
  SaveWith(d, 1, 21, ckptd::TierPolicy::kDefault);
  auto client = d.Connect();
  REQUIRE(client->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000).ok());
  std::vector<uint8_t> got;
  CHECK(LoadItem(d, 1, StateDict().front().name, &got).bytes_read_remote == 0);

  auto flip_first_byte = [](const std::filesystem::path& blob) {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    char c = 0;
    f.seekg(0);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5A);
    f.seekp(0);
    f.write(&c, 1);
  };
  std::vector<std::filesystem::path> blobs;
  for (const auto& e : std::filesystem::directory_iterator(StepPath(d.data_dir(), 1))) {
    if (e.path().extension() == ".blob") blobs.push_back(e.path());
  }
  std::sort(blobs.begin(), blobs.end());
  REQUIRE(blobs.size() == 4);  // the first tensor is row-sharded over all 4

  // One local blob corrupt: that blob alone is read from the remote tier.
  flip_first_byte(blobs[0]);
  ckptd::LoadResult one = LoadItem(d, 1, StateDict().front().name, &got);
  CHECK(got == GlobalBytes(StateDict().front(), 21));
  CHECK(one.bytes_read_remote > 0);
  CHECK(one.bytes_read_remote < got.size());  // one rank's rows of it (4 KiB-rounded), not all
  CHECK(d.Log().find("reading it from posix:" + remote) != std::string::npos);
  flip_first_byte(blobs[0]);  // good again

  // Flip bytes of every local blob: the checksums fail locally, the remote copy verifies.
  for (const auto& b : blobs) flip_first_byte(b);
  ckptd::LoadResult r = LoadItem(d, 1, StateDict().front().name, &got);
  CHECK(r.bytes_read_remote > 0);
  CHECK(got == GlobalBytes(StateDict().front(), 21));
  CHECK(r.bytes_read_remote >= got.size());
  CHECK(d.Log().find("each blob is read from the first tier that has it") != std::string::npos);

  // A local blob gone altogether: the same.
  for (const auto& e : std::filesystem::directory_iterator(StepPath(d.data_dir(), 1))) {
    if (e.path().extension() == ".blob") std::filesystem::remove(e.path());
  }
  CHECK(VerifyInProcess(d, kJob, 1, 21) == "");
}

TEST_CASE("remote tier: a failing store is retried, the error shown, until the upload succeeds",
          "[integration][remote][fault]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  // A file where the job's directory must go: every upload attempt fails (ENOTDIR / EEXIST).
  { std::ofstream(remote + "/" + kJob) << "in the way"; }
  Daemon d(DaemonConfig{.extra_flags = RemoteFlags(remote, "local+remote")});
  SaveWith(d, 1, 31, ckptd::TierPolicy::kDefault);
  auto client = d.Connect();
  // COMMITTED locally all along; the remote side retries and says why.
  auto first = client->Wait(kJob, 1, ckptd::WaitFor::kRemote, 2500);
  CHECK(first.status().code() == absl::StatusCode::kDeadlineExceeded);
  INFO(first.status().ToString());
  CHECK(first.status().message().find("last attempt failed") != std::string::npos);
  auto st = client->GetStatus(kJob, 1);
  REQUIRE(st.ok());
  CHECK(st->state == ckptd::CheckpointState::kCommitted);
  CHECK(st->tiers.local);
  CHECK(!st->tiers.remote);
  CHECK(st->tiers.upload.state == ckptd::UploadProgress::kRetrying);
  CHECK(st->tiers.upload.attempts >= 1);
  CHECK(!st->tiers.upload.error.empty());
  CommandResult ls = RunCtl(d, {"ls", kJob});
  INFO(ls.output);
  CHECK(ls.output.find("remote (retrying") != std::string::npos);
  CHECK(VerifyInProcess(d, kJob, 1, 31) == "");  // loads meanwhile, from local

  std::filesystem::remove(remote + "/" + kJob);  // the store is back
  auto durable = client->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000);
  INFO(durable.status().ToString() << "\nlog:\n" << d.Log());
  REQUIRE(durable.ok());
  CHECK(durable->tiers.remote);
  CHECK(PathExists(StepPath(remote, 1) + "/manifest.ckm"));
}

#if CKPTD_TEST_HOOKS
TEST_CASE("remote tier: a daemon killed mid-upload resumes it at restart",
          "[integration][remote][crash]") {
  for (const char* point : {"upload.blobs_copied", "upload.manifest_put", "upload.durable"}) {
    DYNAMIC_SECTION(point) {
      TempDir shared;
      const std::string remote = shared.path() + "/store";
      std::filesystem::create_directories(remote);
      std::vector<std::string> flags = RemoteFlags(remote, "local+remote");
      flags.push_back(std::string("--debug_crash_at=") + point);
      Daemon d(DaemonConfig{.extra_flags = flags});
      {
        auto client = d.Connect();
        for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(*client, kJob, 1, r, 4, 41).ok());
      }
      REQUIRE(d.WaitExit(30000) >= 0);
      CHECK(d.Log().find(std::string("crash point ") + point) != std::string::npos);
      // Before the row is DURABLE the store may hold blobs (and, past manifest_put, a manifest
      // that verifies: the copy is complete); a restart finishes the upload either way.
      d.Restart(RemoteFlags(remote, "local+remote"));
      auto client = d.Connect();
      auto durable = client->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000);
      INFO(durable.status().ToString() << "\nlog:\n" << d.Log());
      REQUIRE(durable.ok());
      CHECK(VerifyInProcess(d, kJob, 1, 41) == "");
      Daemon fresh(DaemonConfig{.extra_flags = RemoteFlags(remote, "local")});
      CHECK(VerifyInProcess(fresh, kJob, 1, 41) == "");
    }
  }
}

// Issue 33 §3: a committed checkpoint whose local manifest is gone is restored from the remote
// tier when the store holds a complete copy, even one its upload row does not record as durable
// (the daemon died between the manifest's put and the row): COMMITTED there, loads bit-exact —
// never MISSING, never ABORTED.
TEST_CASE("remote tier: a vanished local manifest is restored from the store's copy",
          "[integration][remote][crash]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  std::vector<std::string> flags = RemoteFlags(remote, "local+remote");
  flags.push_back("--debug_crash_at=upload.manifest_put");
  Daemon d(DaemonConfig{.extra_flags = flags});
  {
    auto client = d.Connect();
    for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(*client, kJob, 1, r, 4, 44).ok());
  }
  REQUIRE(d.WaitExit(30000) >= 0);
  REQUIRE(PathExists(StepPath(remote, 1) + "/manifest.ckm"));
  std::filesystem::remove(StepPath(d.data_dir(), 1) + "/manifest.ckm");
  d.Restart(RemoteFlags(remote, "local+remote"));
  auto st = d.Connect()->GetStatus(kJob, 1);
  INFO(st.status().ToString() << "\nlog:\n" << d.Log());
  REQUIRE(st.ok());
  CHECK(st->state == ckptd::CheckpointState::kCommitted);
  CHECK(st->tiers.remote);
  CHECK_FALSE(st->tiers.local);
  CHECK(VerifyInProcess(d, kJob, 1, 44) == "");
}
#endif

// Issue 33 §3: SIGTERM abandoned the upload in flight and stopped the RPC server before the
// drain. Now, with the store slowed down (--debug_upload_delay_ms on every 4 KiB chunk), SIGTERM
// arrives mid-upload: the daemon keeps answering status (on a connection it had, and on a new
// one: ckptctl), finishes the upload within shutdown_grace_s, logs the tiers the checkpoint
// reached, and exits 0; the store then holds a complete copy a fresh node loads.
TEST_CASE("remote tier: SIGTERM mid-upload drains it within the grace, answering status",
          "[integration][remote]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  std::vector<std::string> flags = RemoteFlags(remote, "local+remote");
  flags.insert(flags.end(), {"--debug_upload_delay_ms=150", "--upload_chunk_bytes=4096",
                             "--shutdown_grace_s=60"});
  Daemon d(DaemonConfig{.extra_flags = flags});
  SaveWith(d, 1, 51, ckptd::TierPolicy::kLocalAndRemote);
  auto client = d.Connect();
  bool running = false;
  for (int i = 0; i < 200 && !running; ++i) {
    auto st = client->GetStatus(kJob, 1);
    REQUIRE(st.ok());
    running = st->tiers.upload.state == ckptd::UploadProgress::kRunning &&
              st->tiers.upload.bytes_done < st->tiers.upload.bytes_total;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO(d.Log());
  REQUIRE(running);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(kill(d.pid(), SIGTERM) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Still draining: status answers, on the old connection and on a new one.
  auto during = client->GetStatus(kJob, 1);
  INFO(during.status().ToString());
  REQUIRE(during.ok());
  CHECK(during->state == ckptd::CheckpointState::kCommitted);
  CHECK_FALSE(during->tiers.remote);  // the upload is still under way
  CommandResult ctl = RunCtl(d, {"status", kJob, "1"});
  INFO(ctl.output);
  CHECK(ctl.exit_code == 0);
  // A new checkpoint is refused while stopping.
  auto refused = SaveRank(*client, kJob, 2, 0, 4, 52);
  CHECK(refused.status().code() == absl::StatusCode::kUnavailable);
  const int rc = d.WaitExit(60000);
  const auto took = std::chrono::steady_clock::now() - t0;
  INFO(d.Log());
  CHECK(rc == 0);
  CHECK(took < std::chrono::seconds(60));
  CHECK(PathExists(StepPath(remote, 1) + "/manifest.ckm"));
  CHECK(d.Log().find("remote-job/1 reached: COMMITTED, durable on local and remote") !=
        std::string::npos);
  Daemon fresh(DaemonConfig{.extra_flags = RemoteFlags(remote, "local")});
  CHECK(VerifyInProcess(fresh, kJob, 1, 51) == "");
}

TEST_CASE("remote tier: the remote policy flushes straight to the store, with no local copy",
          "[integration][remote]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  Daemon a(DaemonConfig{.extra_flags = RemoteFlags(remote, "remote")});
  SaveWith(a, 1, 13, ckptd::TierPolicy::kDefault);  // the daemon's default: remote
  auto client = a.Connect();
  auto st = client->Wait(kJob, 1, ckptd::WaitFor::kRemote, 30000);
  INFO(st.status().ToString() << "\nlog:\n" << a.Log());
  REQUIRE(st.ok());
  CHECK_FALSE(st->tiers.local);
  CHECK(st->tiers.remote);
  CHECK(st->tiers.upload.state == ckptd::UploadProgress::kDurable);
  // The blobs and the manifest are on the store only.
  CHECK(PathExists(StepPath(remote, 1) + "/manifest.ckm"));
  CHECK_FALSE(PathExists(StepPath(a.data_dir(), 1)));
  std::vector<uint8_t> got;
  ckptd::LoadResult r = LoadItem(a, 1, StateDict().front().name, &got);
  CHECK(r.bytes_read_remote == r.bytes_read);
  CHECK(got == GlobalBytes(StateDict().front(), 13));
  CHECK(VerifyInProcess(a, kJob, 1, 13) == "");
  CommandResult ls = RunCtl(a, {"ls", kJob});
  INFO(ls.output);
  CHECK(ls.output.find("remote") != std::string::npos);

  // An aborted checkpoint's blobs, flushed to the store, go with it.
  {
    auto c = a.Connect();
    REQUIRE(SaveRank(*c, kJob, 2, 0, 4, 14).ok());
    for (int i = 0; i < 200 && !PathExists(StepPath(remote, 2)); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the flush gate
    }
    REQUIRE(PathExists(StepPath(remote, 2)));
    REQUIRE(c->Abort(kJob, 2, "test").ok());
    CHECK_FALSE(PathExists(StepPath(remote, 2)));
  }

  // A daemon killed with ranks staged resumes them to the store after its restart.
  Daemon b(DaemonConfig{.extra_flags = RemoteFlags(remote, "remote")});
  {
    auto c = b.Connect();
    for (uint32_t rk = 0; rk < 4; ++rk) REQUIRE(SaveRank(*c, kJob, 3, rk, 4, 15).ok());
  }
  b.Kill9();
  b.Restart(RemoteFlags(remote, "remote"));
  REQUIRE(b.Connect()->WaitCommitted(kJob, 3, 30000).ok());
  CHECK(VerifyInProcess(b, kJob, 3, 15) == "");
  CHECK_FALSE(PathExists(StepPath(b.data_dir(), 3)));

  // Delete removes it from the store.
  CHECK(RunCtl(a, {"rm", kJob, "1"}).exit_code == 0);
  CHECK_FALSE(PathExists(StepPath(remote, 1)));
}

TEST_CASE("remote tier: bad configuration and policies are refused with the cause",
          "[integration][remote]") {
  TempDir dir;
  CommandResult no_remote =
      RunCommand({CKPTD_BIN, "--state_dir=" + dir.path() + "/s1", "--tier_policy=local+remote"});
  CHECK(no_remote.exit_code == 2);
  CHECK(no_remote.output.find("needs a remote tier (remote_dir or") != std::string::npos);
  CommandResult remote_only =
      RunCommand({CKPTD_BIN, "--state_dir=" + dir.path() + "/s2", "--tier_policy=remote"});
  CHECK(remote_only.exit_code == 2);
  CHECK(remote_only.output.find("option tier_policy = \"remote\" needs a remote tier") !=
        std::string::npos);
  CommandResult missing = RunCommand(
      {CKPTD_BIN, "--state_dir=" + dir.path() + "/s3", "--remote_dir=" + dir.path() + "/nowhere"});
  CHECK(missing.exit_code != 0);
  CHECK(missing.output.find("is not a directory") != std::string::npos);

  // A Save asking for a remote tier the daemon does not have.
  Daemon d;
  ckptd::ClientOptions o;
  o.socket_path = d.socket();
  o.tier_policy = ckptd::TierPolicy::kLocalAndRemote;
  auto client = ckptd::Client::Connect(o);
  REQUIRE(client.ok());
  auto saved = SaveRank(**client, kJob, 1, 0, 1, 51);
  CHECK(saved.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(saved.status().message().find("no remote tier") != std::string::npos);
}

TEST_CASE("remote tier: retention keeps the newest copies per tier, gc and housekeeping apply it",
          "[integration][remote][retention]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  std::vector<std::string> flags = RemoteFlags(remote, "local+remote");
  flags.push_back("--keep_local=1");
  flags.push_back("--keep_remote=2");
  flags.push_back("--gc_interval_ms=3600000");  // only ckptctl gc during the test
  Daemon d(DaemonConfig{.extra_flags = flags});
  auto client = d.Connect();
  for (uint64_t step = 1; step <= 4; ++step) {
    SaveWith(d, step, 80 + step, ckptd::TierPolicy::kDefault);
    REQUIRE(client->Wait(kJob, step, ckptd::WaitFor::kRemote, 30000).ok());
  }
  CommandResult dry = RunCtl(d, {"gc", kJob, "--dry_run"});
  INFO(dry.output);
  CHECK(dry.exit_code == 0);
  CHECK(dry.output.find("drop local") != std::string::npos);
  CHECK(dry.output.find("(dry run)") != std::string::npos);
  CHECK(PathExists(StepPath(d.data_dir(), 1)));  // nothing done

  CommandResult gc = RunCtl(d, {"gc", kJob});
  INFO(gc.output << "\nlog:\n" << d.Log());
  CHECK(gc.exit_code == 0);
  // 4: both copies; 3: remote only; 2, 1: past both limits, deleted.
  auto s4 = client->GetStatus(kJob, 4);
  auto s3 = client->GetStatus(kJob, 3);
  REQUIRE(s4.ok());
  REQUIRE(s3.ok());
  CHECK((s4->tiers.local && s4->tiers.remote));
  CHECK((!s3->tiers.local && s3->tiers.remote));
  CHECK(client->GetStatus(kJob, 2).status().code() == absl::StatusCode::kNotFound);
  CHECK(client->GetStatus(kJob, 1).status().code() == absl::StatusCode::kNotFound);
  CHECK(!PathExists(StepPath(d.data_dir(), 3)));
  CHECK(!PathExists(StepPath(remote, 2)));
  CHECK(!PathExists(StepPath(remote, 1)));
  CHECK(VerifyInProcess(d, kJob, 3, 83) == "");  // from the remote copy
  CHECK(VerifyInProcess(d, kJob, 4, 84) == "");
  CHECK(RunCtl(d, {"gc", kJob}).output.find("nothing to collect") != std::string::npos);
  // A restart keeps the tiers as retention left them.
  d.Restart(flags);
  auto again = d.Connect()->GetStatus(kJob, 3);
  REQUIRE(again.ok());
  CHECK((!again->tiers.local && again->tiers.remote));
}

TEST_CASE("remote tier: retention never drops a local copy whose upload is still under way",
          "[integration][remote][retention]") {
  TempDir shared;
  const std::string remote = shared.path() + "/store";
  std::filesystem::create_directories(remote);
  { std::ofstream(remote + "/" + kJob) << "in the way"; }  // every upload fails
  std::vector<std::string> flags = RemoteFlags(remote, "local+remote");
  flags.push_back("--keep_local=1");
  flags.push_back("--gc_interval_ms=1000");  // housekeeping applies it
  Daemon d(DaemonConfig{.extra_flags = flags});
  for (uint64_t step = 1; step <= 3; ++step)
    SaveWith(d, step, 90 + step, ckptd::TierPolicy::kDefault);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two housekeeping rounds
  for (uint64_t step = 1; step <= 3; ++step) {
    INFO("step " << step << "\nlog:\n" << d.Log());
    CHECK(VerifyInProcess(d, kJob, step, 90 + step) == "");
  }
  // Once uploads succeed, the next round drops the old local copies.
  std::filesystem::remove(remote + "/" + kJob);
  auto client = d.Connect();
  for (uint64_t step = 1; step <= 3; ++step) {
    REQUIRE(client->Wait(kJob, step, ckptd::WaitFor::kRemote, 30000).ok());
  }
  bool trimmed = false;
  for (int i = 0; i < 100 && !trimmed; ++i) {
    trimmed = !PathExists(StepPath(d.data_dir(), 1)) && !PathExists(StepPath(d.data_dir(), 2));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(trimmed);
  CHECK(PathExists(StepPath(d.data_dir(), 3)));
  CHECK(VerifyInProcess(d, kJob, 1, 91) == "");  // from the store
}
