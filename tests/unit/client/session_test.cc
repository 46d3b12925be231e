// The client's session with the daemon, over the scripted daemon: Connect (Hello, Attach, the
// arena mapped), a daemon that is down, a dropped connection, a daemon restart (new instance: the
// arena mapped again, regions registered again, old buffers refused), a restart nobody noticed
// (UNKNOWN_SESSION), a call that fails UNAVAILABLE (not repeated; the next call says Hello), Close.
#include <set>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "client_rig.h"

using namespace ckptd;
using namespace ckptd::testing;

namespace {

bool HelloAgain(FakeDaemon& daemon, Client& client, int hellos) {
  return Eventually([&] { return daemon.count("Hello") >= hellos; },
                    [&] { (void)client.arena_bytes(); });
}

}  // namespace

TEST_CASE("Connect says Hello, attaches and maps the arena, in that order", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(1 << 20);
  ClientOptions options;
  options.connect_timeout_ms = 750;
  auto client = ConnectTo(daemon, options);
  CHECK(daemon->methods() == std::vector<std::string>{"Hello", "Attach", "MapArena"});
  const Received hello = daemon->calls()[0];
  CHECK(hello.timeout_ms == 750);  // Hello's deadline is connect_timeout_ms...
  CHECK(hello.wait_for_ready);     // ...within which it rides out a daemon restart
  CHECK(daemon->calls()[1].session_id == daemon->session_id());
  CHECK(client->arena_bytes() == (1u << 20));
  CHECK(client->extent_alignment_bytes() == 4096);
  CHECK(client->load_batch_bytes() == (1u << 20) / 4);  // a quarter of the arena
  CHECK(client->target() == FakeDaemon::kTarget);
  CHECK(client->reconnect_count() == 0);
  CHECK(daemon->open_streams() == 1);
}

TEST_CASE("Connect to a daemon that is down is UNAVAILABLE after one Hello", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  daemon->SetDown(true);
  ClientOptions options;
  options.connect_timeout_ms = 250;
  absl::StatusOr<std::unique_ptr<Client>> client =
      internal::ClientFactory::Create(options, daemon->Connect());
  REQUIRE(client.status().code() == absl::StatusCode::kUnavailable);
  CHECK(client.status().message() ==
        "ckptd at unix:/fake/ckptd.sock is unavailable: no answer to Hello within 250 ms");
  CHECK(daemon->count("Hello") == 1);
  CHECK(daemon->calls()[0].timeout_ms == 250);
}

TEST_CASE("options are checked before anything is sent", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  ClientOptions options;
  options.rpc_timeout_ms = 0;
  absl::StatusOr<std::unique_ptr<Client>> client =
      internal::ClientFactory::Create(options, daemon->Connect());
  CHECK(client.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(client.status().message(), "rpc_timeout_ms (0)"));
  CHECK(daemon->calls().empty());
}

TEST_CASE("an arena the daemon refuses fails Connect and ends the session", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  daemon->FailNext("MapArena",
                   grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                "the daemon refused the arena: uid 1000 over its share"));
  absl::StatusOr<std::unique_ptr<Client>> client =
      internal::ClientFactory::Create({}, daemon->Connect());
  REQUIRE(client.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(client.status().message() ==
        "mapping the staging arena of ckptd at unix:/fake/ckptd.sock: the daemon refused the "
        "arena: uid 1000 over its share");
  // The session it opened is given back and its stream closed: nothing of it is left.
  CHECK(daemon->methods() == std::vector<std::string>{"Hello", "Attach", "MapArena", "Goodbye"});
  CHECK(daemon->open_streams() == 0);
}

TEST_CASE("a dropped connection opens a new session and registers regions again", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  absl::StatusOr<uint64_t> handle = client->RegisterShm("/trainer-shm", 8192);
  REQUIRE(handle.ok());
  const std::string first = daemon->session_id();

  daemon->DropSessions();  // the Attach stream ends: the client notices on its reader thread
  REQUIRE(HelloAgain(*daemon, *client, 2));
  CHECK(daemon->session_id() != first);
  CHECK(client->reconnect_count() == 1);
  CHECK(daemon->arena_maps() == 1);  // the same instance: its arena mapping is kept
  std::vector<v1::RegisterRegionRequest> regs = daemon->registrations();
  REQUIRE(regs.size() == 2);
  CHECK(regs[1].session_id() == daemon->session_id());
  CHECK(regs[1].shm_name() == "/trainer-shm");
  CHECK(regs[1].size_bytes() == 8192);
  CHECK(daemon->open_streams() == 1);
}

TEST_CASE("after a daemon restart the arena is mapped again and old buffers are refused",
          "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  absl::StatusOr<ArenaBuffer> old = client->Allocate(4096);
  REQUIRE(old.ok());
  absl::StatusOr<uint64_t> handle = client->RegisterShm("/trainer-shm", 8192);
  REQUIRE(handle.ok());

  daemon->Restart();
  REQUIRE(HelloAgain(*daemon, *client, 2));
  CHECK(client->reconnect_count() == 1);
  CHECK(daemon->arena_maps() == 2);  // a new instance: a new segment
  REQUIRE(daemon->registrations().size() == 2);
  CHECK(daemon->registrations()[1].session_id() == daemon->session_id());

  // The old instance's buffer: refused here, never sent.
  InPlaceTensorShard from_old{"w", DType::kUInt8, {4096}, Region::Whole(), BufferRef::InArena(*old),
                              4096};
  absl::StatusOr<SaveResult> saved =
      client->SaveInPlace("job", 1, 0, 1, std::span<const InPlaceTensorShard>(&from_old, 1));
  CHECK(saved.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(saved.status().message(),
                          "arena buffer 1 belongs to a previous daemon instance"));
  CHECK(daemon->count("Save") == 0);

  // The region handle stays valid: it names the region as registered with the new instance (id 2).
  InPlaceTensorShard from_region{
      "w", DType::kUInt8, {4096}, Region::Whole(), BufferRef::InRegion({*handle, 4096}), 4096};
  saved = client->SaveInPlace("job", 1, 0, 1, std::span<const InPlaceTensorShard>(&from_region, 1));
  REQUIRE(saved.ok());
  const v1::SaveRequest save = daemon->saves().back();
  CHECK(save.session_id() == daemon->session_id());
  CHECK(save.shards(0).data().region_id() == 2);
  CHECK(save.shards(0).data().offset() == 4096);
}

TEST_CASE("UNKNOWN_SESSION fails that call once, the next call says Hello", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  const std::string bytes = Pattern(5000, 1);
  std::vector<TensorShard> shards = {Tensor("w", bytes)};
  const std::string old_session = daemon->session_id();

  daemon->ForgetSessions();  // restarted between two calls; the stream drop not seen yet
  absl::StatusOr<SaveResult> saved = client->Save("job", 1, 0, 1, shards);
  CHECK(saved.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(saved.status().message() == "unknown session " + old_session);
  CHECK(daemon->count("ReserveExtents") == 1);  // not repeated
  CHECK(daemon->count("Save") == 0);
  CHECK(daemon->count("Hello") == 1);

  saved = client->Save("job", 1, 0, 1, shards);
  REQUIRE(saved.ok());
  CHECK(daemon->count("Hello") == 2);
  CHECK(daemon->saves().back().session_id() == daemon->session_id());
  CHECK(daemon->session_id() != old_session);
  CHECK(daemon->Stored("job", 1, "w") == bytes);
}

TEST_CASE("a call that fails UNAVAILABLE is not repeated, the next one says Hello first",
          "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  const std::string bytes = Pattern(10000, 2);
  std::vector<TensorShard> shards = {Tensor("w", bytes)};

  daemon->FailNext("Save", grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
  absl::StatusOr<SaveResult> saved = client->Save("job", 7, 0, 1, shards);
  REQUIRE(saved.status().code() == absl::StatusCode::kUnavailable);
  CHECK(saved.status().message() == "ckptd at unix:/fake/ckptd.sock is unavailable: Socket closed");
  CHECK(daemon->count("Save") == 1);
  CHECK(daemon->extents_held() == 0);  // the extent reserved for it was given back
  const size_t before = daemon->calls().size();

  saved = client->Save("job", 7, 0, 1, shards);
  REQUIRE(saved.ok());
  CHECK(MethodsAmong(*daemon, {"Hello", "Attach", "MapArena", "ReserveExtents", "Save"}, before) ==
        std::vector<std::string>{"Hello", "Attach", "ReserveExtents", "Save"});
  CHECK(client->reconnect_count() == 1);
  CHECK(daemon->Stored("job", 7, "w") == bytes);
}

TEST_CASE("a daemon down at the next call is UNAVAILABLE, and back up it is found again",
          "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  ClientOptions options;
  options.connect_timeout_ms = 300;
  auto client = ConnectTo(daemon, options);
  daemon->Restart();
  daemon->SetDown(true);
  REQUIRE(HelloAgain(*daemon, *client, 2));  // tried, and failed
  absl::StatusOr<CheckpointInfo> status = client->GetStatus("job", 1);
  CHECK(status.status().code() == absl::StatusCode::kUnavailable);
  CHECK(status.status().message() ==
        "ckptd at unix:/fake/ckptd.sock is unavailable: no answer to Hello within 300 ms");
  CHECK(daemon->count("GetStatus") == 0);  // no session: the call itself was never sent

  daemon->SetDown(false);
  v1::CheckpointStatus committed;
  committed.mutable_summary()->set_job("job");
  committed.mutable_summary()->set_step(1);
  committed.mutable_summary()->set_state(v1::COMMITTED);
  daemon->SetStatus("job", 1, committed);
  status = client->GetStatus("job", 1);
  REQUIRE(status.ok());
  CHECK(status->state == CheckpointState::kCommitted);
  CHECK(client->reconnect_count() == 1);
  CHECK(daemon->arena_maps() == 2);
}

TEST_CASE("Close says Goodbye, ends the stream and refuses later calls locally", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  const std::string session = daemon->session_id();
  client->Close();
  std::vector<Received> calls = daemon->calls();
  REQUIRE(calls.back().method == "Goodbye");
  CHECK(calls.back().session_id == session);
  CHECK(calls.back().timeout_ms == 1000);  // best effort, short deadline
  CHECK(daemon->open_streams() == 0);

  const size_t sent = calls.size();
  absl::StatusOr<uint64_t> latest = client->Latest("job");
  CHECK(latest.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(latest.status().message() == "this client of ckptd at unix:/fake/ckptd.sock is closed");
  client->Close();  // again: nothing
  CHECK(daemon->calls().size() == sent);
}

TEST_CASE("an Attach the daemon refuses fails Connect with its code, naming the socket", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  daemon->FailNext("Attach", grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                          "uid 1000 holds 64 of its 64 sessions"));
  absl::StatusOr<std::unique_ptr<Client>> client =
      internal::ClientFactory::Create({}, daemon->Connect());
  CHECK(client.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(client.status().message() == "uid 1000 holds 64 of its 64 sessions");
  CHECK(daemon->methods() == std::vector<std::string>{"Hello", "Attach"});  // no arena mapped

  daemon->FailNext("Attach", grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
  client = internal::ClientFactory::Create({}, daemon->Connect());
  CHECK(client.status().code() == absl::StatusCode::kUnavailable);
  CHECK(client.status().message() ==
        "ckptd at unix:/fake/ckptd.sock is unavailable: Socket closed");
}

TEST_CASE("saves racing a daemon restart each succeed or fail cleanly, and the client recovers",
          "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(4 << 20);
  auto client = ConnectTo(daemon);
  constexpr int kThreads = 4;
  constexpr int kSaves = 20;
  // Save calls kHeldFrom .. kHeldFrom + kThreads - 1 are held in the daemon until it restarted:
  // a thread whose save is held sends no other, and each has more than kHeldFrom saves, so the
  // held calls are one of each thread and the restart lands with all of them in flight.
  constexpr int kHeldFrom = 8;
  absl::Mutex mu;
  int held = 0;
  bool restarted = false;
  std::set<std::pair<std::string, uint64_t>> held_saves;  // job, step
  daemon->OnSave([&](int call, const v1::SaveRequest& req) {
    if (call < kHeldFrom || call >= kHeldFrom + kThreads) return;
    absl::MutexLock l(&mu);
    ++held;
    held_saves.insert({req.job(), req.step()});
    mu.Await(absl::Condition(&restarted));
  });
  // Different bytes for every save, so a save that stored another's bytes is seen.
  auto seed = [](int t, int i) { return static_cast<uint8_t>(t * kSaves + i); };
  std::vector<std::vector<std::string>> bytes(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kSaves; ++i) bytes[t].push_back(Pattern(20000, seed(t, i)));
  }
  std::vector<std::vector<absl::StatusCode>> codes(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kSaves; ++i) {
        std::vector<TensorShard> shards = {Tensor("w", bytes[t][i])};
        absl::StatusOr<SaveResult> saved =
            client->Save("job" + std::to_string(t), static_cast<uint64_t>(i), 0, 1, shards);
        codes[t].push_back(saved.status().code());
      }
    });
  }
  {
    absl::MutexLock l(&mu);
    auto all_held = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return held == kThreads; };
    mu.Await(absl::Condition(&all_held));
  }
  daemon->Restart();  // with kThreads saves in flight
  {
    absl::MutexLock l(&mu);
    restarted = true;
  }
  for (std::thread& th : threads) th.join();  // none hangs
  daemon->OnSave(nullptr);

  int ok = 0;
  for (int t = 0; t < kThreads; ++t) {
    const std::string job = "job" + std::to_string(t);
    REQUIRE(codes[t].size() == kSaves);
    for (int i = 0; i < kSaves; ++i) {
      const absl::StatusCode code = codes[t][i];
      INFO(job << "/" << i << ": " << absl::StatusCodeToString(code));
      // OK, or the session's end as the client sees it: UNKNOWN_SESSION (FAILED_PRECONDITION),
      // UNAVAILABLE ("restarted during the call"); never INTERNAL or a wrong answer.
      CHECK((code == absl::StatusCode::kOk || code == absl::StatusCode::kFailedPrecondition ||
             code == absl::StatusCode::kUnavailable));
      // A save held across the restart named a session the new daemon does not know.
      if (held_saves.count({job, static_cast<uint64_t>(i)}) > 0) {
        CHECK(code != absl::StatusCode::kOk);
      }
      if (code != absl::StatusCode::kOk) continue;
      ++ok;
      // Every save that said OK stored exactly its bytes (compared whole, not printed).
      const std::string stored = daemon->Stored(job, static_cast<uint64_t>(i), "w");
      INFO("stored " << stored.size() << " bytes of " << bytes[t][i].size());
      CHECK((stored == bytes[t][i]));
    }
  }
  CHECK(held_saves.size() == kThreads);
  CHECK(ok >= kHeldFrom);  // those before the hold, at least
  std::vector<TensorShard> shards = {Tensor("w", bytes[0][0])};
  REQUIRE(Eventually([&] { return client->Save("after", 1, 0, 1, shards).ok(); }, [] {}));
  CHECK(daemon->Stored("after", 1, "w") == bytes[0][0]);
  CHECK(client->reconnect_count() >= 1);
  CHECK(daemon->arena_maps() == 2);
}
