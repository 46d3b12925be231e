// The client's load path over the scripted daemon: the batching policy (a quarter of the arena
// per batch, the daemon's item limit), two batches in flight (the next one sent before the
// previous one's scratch is copied out and given back), targets larger than a batch read in flat
// slices, "latest" resolved once for every batch, and a failing batch stopping the load with all
// scratch given back.
#include "client_rig.h"

using namespace ckptd;
using namespace ckptd::testing;

namespace {

constexpr uint64_t kArena = 1 << 20;    // batches of 256 KiB
constexpr uint64_t kPiece = 100 << 10;  // two per batch

// A float32 tensor item of `bytes` in the daemon's store; returns its bytes.
std::string AddFloats(FakeDaemon& daemon, const std::string& job, uint64_t step,
                      const std::string& item, uint64_t bytes, uint8_t seed) {
  std::string data = Pattern(bytes, seed);
  daemon.AddTensor(job, step, item, DType::kFloat32, {bytes / 4}, data);
  return data;
}

std::vector<std::string> ItemsOf(const v1::LoadRequest& req) {
  std::vector<std::string> out;
  for (const v1::LoadItemRequest& i : req.items()) out.push_back(i.item());
  return out;
}

}  // namespace

TEST_CASE("Load batches its targets and keeps two batches in flight", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  auto client = ConnectTo(daemon);
  REQUIRE(client->load_batch_bytes() == kArena / 4);
  std::vector<std::string> want;
  std::vector<std::string> got(6, std::string(kPiece, '\0'));
  std::vector<LoadTarget> targets;
  for (int i = 0; i < 6; ++i) {
    const std::string name = "t" + std::to_string(i);
    want.push_back(AddFloats(*daemon, "job", 3, name, kPiece, static_cast<uint8_t>(i)));
    targets.push_back(LoadTarget{name, Region::Whole(), got[i].data(), kPiece});
  }
  const size_t before = daemon->calls().size();
  Client::reset_copy_stats();

  absl::StatusOr<LoadResult> loaded = client->Load("job", 3, 0, targets);
  REQUIRE(loaded.ok());
  CHECK(got == want);
  CHECK(loaded->step == 3);
  CHECK(loaded->item_bytes == std::vector<uint64_t>(6, kPiece));
  CHECK(loaded->bytes_read == 6 * kPiece);
  CHECK(Client::copy_stats().load_bytes == 6 * kPiece);

  std::vector<v1::LoadRequest> loads = daemon->loads();
  REQUIRE(loads.size() == 3);
  CHECK(ItemsOf(loads[0]) == std::vector<std::string>{"t0", "t1"});
  CHECK(ItemsOf(loads[1]) == std::vector<std::string>{"t2", "t3"});
  CHECK(ItemsOf(loads[2]) == std::vector<std::string>{"t4", "t5"});
  // Batch i+1 is reserved and sent before batch i's scratch is copied out and given back.
  CHECK(MethodsAmong(*daemon, {"ReserveExtents", "Load", "ReleaseExtents"}, before) ==
        std::vector<std::string>{"ReserveExtents", "Load", "ReserveExtents", "Load",
                                 "ReleaseExtents", "ReserveExtents", "Load", "ReleaseExtents",
                                 "ReleaseExtents"});
  CHECK(daemon->extents_held_max() == 4);  // two batches of two
  CHECK(daemon->extents_held() == 0);
}

TEST_CASE("Load starts a new batch at the daemon's max_load_requests", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  v1::Limits limits;
  limits.set_max_load_requests(3);
  daemon->SetLimits(limits);
  auto client = ConnectTo(daemon);
  std::vector<std::string> got(7, std::string(16, '\0'));
  std::vector<LoadTarget> targets;
  for (int i = 0; i < 7; ++i) {
    daemon->AddObject("job", 1, "o" + std::to_string(i), Pattern(16, static_cast<uint8_t>(i)));
    targets.push_back(LoadTarget{"o" + std::to_string(i), Region::Whole(), got[i].data(), 16});
  }
  REQUIRE(client->Load("job", 1, 0, targets).ok());
  std::vector<int> per_batch;
  for (const v1::LoadRequest& l : daemon->loads()) per_batch.push_back(l.items_size());
  CHECK(per_batch == std::vector<int>{3, 3, 1});
  for (int i = 0; i < 7; ++i) CHECK(got[i] == Pattern(16, static_cast<uint8_t>(i)));
}

TEST_CASE("a target larger than a batch is read in flat slices", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  auto client = ConnectTo(daemon);
  const uint64_t bytes = 600 << 10;  // 153600 floats; a batch holds 65536
  const std::string want = AddFloats(*daemon, "job", 2, "big", bytes, 7);
  std::string got(bytes, '\0');
  LoadTarget target{"big", Region::Whole(), got.data(), bytes};

  absl::StatusOr<LoadResult> loaded = client->Load("job", 2, 0, std::span(&target, 1));
  REQUIRE(loaded.ok());
  CHECK(got == want);
  CHECK(loaded->item_bytes == std::vector<uint64_t>{bytes});
  CHECK(daemon->count("Inspect") == 1);  // the item's dtype, to cut whole elements
  std::vector<v1::LoadRequest> loads = daemon->loads();
  REQUIRE(loads.size() == 3);
  std::vector<std::pair<uint64_t, uint64_t>> slices;
  for (const v1::LoadRequest& l : loads) {
    REQUIRE(l.items_size() == 1);
    slices.emplace_back(l.items(0).region().flat().start(), l.items(0).region().flat().count());
  }
  CHECK(slices ==
        std::vector<std::pair<uint64_t, uint64_t>>{{0, 65536}, {65536, 65536}, {131072, 22528}});
}

TEST_CASE("Load of latest over several batches resolves the step once", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  auto client = ConnectTo(daemon);
  AddFloats(*daemon, "job", 4, "t0", kPiece, 0);
  std::vector<std::string> want;
  std::vector<std::string> got(3, std::string(kPiece, '\0'));
  std::vector<LoadTarget> targets;
  for (int i = 0; i < 3; ++i) {
    want.push_back(AddFloats(*daemon, "job", 9, "t" + std::to_string(i), kPiece,
                             static_cast<uint8_t>(10 + i)));
    targets.push_back(LoadTarget{"t" + std::to_string(i), Region::Whole(), got[i].data(), kPiece});
  }
  absl::StatusOr<LoadResult> loaded = client->Load("job", std::nullopt, 0, targets);
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 9);
  CHECK(got == want);
  CHECK(daemon->count("Latest") == 1);
  for (const v1::LoadRequest& l : daemon->loads()) {
    CHECK_FALSE(l.latest());  // every batch reads the same step, even if a newer one commits
    CHECK(l.step() == 9);
  }

  // One batch: the daemon resolves "latest" within the call, no Latest first.
  LoadTarget one{"t0", Region::Whole(), got[0].data(), kPiece};
  REQUIRE(client->Load("job", std::nullopt, 0, std::span(&one, 1)).ok());
  CHECK(daemon->count("Latest") == 1);
  CHECK(daemon->loads().back().latest());
}

TEST_CASE("a failing batch stops the load after the batch in flight, scratch returned", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  auto client = ConnectTo(daemon);
  std::vector<std::string> got(6, std::string(kPiece, '\0'));
  std::vector<LoadTarget> targets;
  for (int i = 0; i < 6; ++i) {
    AddFloats(*daemon, "job", 3, "t" + std::to_string(i), kPiece, static_cast<uint8_t>(i));
    targets.push_back(LoadTarget{"t" + std::to_string(i), Region::Whole(), got[i].data(), kPiece});
  }
  daemon->FailNext("Load", grpc::Status(grpc::StatusCode::DATA_LOSS,
                                        "checkpoint job/3 item t1: block 0 fails its checksum"));
  absl::StatusOr<LoadResult> loaded = client->Load("job", 3, 0, targets);
  CHECK(loaded.status().code() == absl::StatusCode::kDataLoss);
  CHECK(loaded.status().message() == "checkpoint job/3 item t1: block 0 fails its checksum");
  CHECK(daemon->loads().size() == 2);  // batch 1 was in flight; batch 2 never sent
  CHECK(daemon->extents_held() == 0);
  CHECK(daemon->count("Load") == 2);
}

TEST_CASE("a Load whose daemon went away names the socket and is not repeated", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  ClientOptions options;
  options.rpc_timeout_ms = 4321;
  auto client = ConnectTo(daemon, options);
  AddFloats(*daemon, "job", 1, "w", 4096, 1);
  std::string got(4096, '\0');
  LoadTarget target{"w", Region::Whole(), got.data(), 4096};

  daemon->FailNext("Load", GrpcDeadline());
  absl::StatusOr<LoadResult> loaded = client->Load("job", 1, 0, std::span(&target, 1));
  CHECK(loaded.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(loaded.status().message() ==
        "ckptd at unix:/fake/ckptd.sock did not answer Load within 4321 ms");

  daemon->FailNext("Load", grpc::Status(grpc::StatusCode::UNAVAILABLE, "Connection reset"));
  loaded = client->Load("job", 1, 0, std::span(&target, 1));
  CHECK(loaded.status().code() == absl::StatusCode::kUnavailable);
  CHECK(loaded.status().message() ==
        "ckptd at unix:/fake/ckptd.sock is unavailable: Connection reset");
  CHECK(daemon->count("Load") == 2);
  CHECK(daemon->count("Hello") == 1);

  loaded = client->Load("job", 1, 0, std::span(&target, 1));  // says Hello first
  REQUIRE(loaded.ok());
  CHECK(daemon->count("Hello") == 2);
  CHECK(got == Pattern(4096, 1));
}

TEST_CASE("LoadObject resolves latest, inspects the item, then loads it", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(kArena);
  auto client = ConnectTo(daemon);
  daemon->AddObject("job", 5, "rng", "old");
  daemon->AddObject("job", 8, "rng", "generator state");
  const size_t before = daemon->calls().size();
  absl::StatusOr<std::string> rng = client->LoadObject("job", std::nullopt, 0, "rng");
  REQUIRE(rng.ok());
  CHECK(*rng == "generator state");
  CHECK(MethodsAmong(*daemon, {"Latest", "Inspect", "ReserveExtents", "Load", "ReleaseExtents"},
                     before) ==
        std::vector<std::string>{"Latest", "Inspect", "ReserveExtents", "Load", "ReleaseExtents"});
  CHECK(daemon->loads().back().step() == 8);

  absl::StatusOr<std::string> missing = client->LoadObject("job", 8, 0, "optimizer");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(missing.status().message() == "no item optimizer in checkpoint job/8");
}
