// The client's save path over the scripted daemon: one reservation for every shard in caller
// memory, one copy of each into its extent (bytes checked on the daemon's side of the arena), the
// daemon's per-reservation limit splitting it, nothing copied for daemon memory, and every
// failure giving the reserved extents back without sending the Save again.
#include "client_rig.h"

using namespace ckptd;
using namespace ckptd::testing;

TEST_CASE("Save reserves once, copies each shard once and sends one Save", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  const std::string a = Pattern(10000, 1), b = Pattern(4096, 2), c = Pattern(1, 3);
  std::vector<TensorShard> tensors = {Tensor("a", a), Tensor("b", b), Tensor("c", c)};
  std::vector<ObjectShard> objects(1);
  objects[0].item = "rng";
  objects[0].bytes = "state";
  Client::reset_copy_stats();

  absl::StatusOr<SaveResult> saved = client->Save("job", 4, 1, 2, tensors, objects);
  REQUIRE(saved.ok());
  CHECK(saved->bytes_staged == a.size() + b.size() + c.size() + 5);
  CHECK(saved->state == CheckpointState::kStaging);
  CHECK(MethodsAmong(*daemon, {"ReserveExtents", "Save", "ReleaseExtents"}) ==
        std::vector<std::string>{"ReserveExtents", "Save"});
  const v1::ReserveExtentsRequest reserve = daemon->reserves()[0];
  CHECK(std::vector<uint64_t>(reserve.sizes_bytes().begin(), reserve.sizes_bytes().end()) ==
        std::vector<uint64_t>{10000, 4096, 1, 5});

  const v1::SaveRequest save = daemon->saves()[0];
  CHECK(save.job() == "job");
  CHECK(save.step() == 4);
  CHECK(save.rank() == 1);
  CHECK(save.world_size() == 2);
  REQUIRE(save.shards_size() == 4);
  CHECK(save.shards(0).item() == "a");
  CHECK(save.shards(0).tensor().dtype() == v1::UINT8);
  CHECK(save.shards(3).item() == "rng");
  CHECK(save.shards(3).object().scope() == v1::REPLICATED);
  // The bytes the daemon finds in the arena are the caller's.
  CHECK(daemon->Stored("job", 4, "a") == a);
  CHECK(daemon->Stored("job", 4, "b") == b);
  CHECK(daemon->Stored("job", 4, "c") == c);
  CHECK(daemon->Stored("job", 4, "rng") == "state");
  const CopyStats stats = Client::copy_stats();
  CHECK(stats.save_bytes == a.size() + b.size() + c.size() + 5);
  CHECK(stats.save_calls == 4);
  CHECK(daemon->extents_held() == 0);  // the daemon took every extent
}

TEST_CASE("Save splits its reservation at the daemon's max_extents_per_reserve", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  v1::Limits limits;
  limits.set_max_extents_per_reserve(2);
  daemon->SetLimits(limits);
  auto client = ConnectTo(daemon);
  std::vector<std::string> bytes;
  for (uint8_t i = 0; i < 5; ++i) bytes.push_back(Pattern(3000 + i, i));
  std::vector<TensorShard> tensors;
  for (size_t i = 0; i < bytes.size(); ++i) tensors.push_back(Tensor(std::to_string(i), bytes[i]));

  REQUIRE(client->Save("job", 1, 0, 1, tensors).ok());
  std::vector<int> per_call;
  for (const v1::ReserveExtentsRequest& r : daemon->reserves())
    per_call.push_back(r.sizes_bytes_size());
  CHECK(per_call == std::vector<int>{2, 2, 1});
  REQUIRE(daemon->saves().size() == 1);
  CHECK(daemon->saves()[0].shards_size() == 5);
  for (size_t i = 0; i < bytes.size(); ++i)
    CHECK(daemon->Stored("job", 1, std::to_string(i)) == bytes[i]);
}

TEST_CASE("a reservation that fails part way gives back what it took, all or none", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>(64 << 10);  // 16 extents of 4 KiB
  v1::Limits limits;
  limits.set_max_extents_per_reserve(2);
  daemon->SetLimits(limits);
  auto client = ConnectTo(daemon);
  const std::string small = Pattern(4096, 1), big = Pattern(60 << 10, 2);
  std::vector<TensorShard> tensors = {Tensor("s0", small), Tensor("s1", small), Tensor("big", big)};

  absl::StatusOr<SaveResult> saved = client->Save("job", 1, 0, 1, tensors);
  CHECK(saved.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(saved.status().message() == "staging arena full: 61440 bytes asked");
  REQUIRE(daemon->reserves().size() == 2);
  REQUIRE(daemon->releases().size() == 1);
  const v1::ReleaseExtentsRequest released = daemon->releases()[0];
  CHECK(std::vector<uint64_t>(released.extent_ids().begin(), released.extent_ids().end()) ==
        std::vector<uint64_t>{1, 2});  // the first call's two extents
  CHECK(daemon->extents_held() == 0);
  CHECK(daemon->count("Save") == 0);
}

TEST_CASE("a Save the daemon refuses is not repeated and its extents are given back", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  const std::string bytes = Pattern(8192, 5);
  std::vector<TensorShard> tensors = {Tensor("w", bytes)};
  daemon->FailNext("Save", grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        "job job step 1 rank 0: item w saved twice"));
  absl::StatusOr<SaveResult> saved = client->Save("job", 1, 0, 1, tensors);
  CHECK(saved.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(saved.status().message() == "job job step 1 rank 0: item w saved twice");
  CHECK(daemon->count("Save") == 1);
  CHECK(MethodsAmong(*daemon, {"ReserveExtents", "Save", "ReleaseExtents"}) ==
        std::vector<std::string>{"ReserveExtents", "Save", "ReleaseExtents"});
  CHECK(daemon->extents_held() == 0);
}

TEST_CASE("bad shards are refused before anything is sent", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  const size_t sent = daemon->calls().size();
  const std::string bytes = Pattern(10, 1);
  TensorShard t = Tensor("w", bytes);
  t.global_shape = {11};  // 11 elements, 10 bytes
  absl::StatusOr<SaveResult> saved = client->Save("job", 1, 0, 1, std::span(&t, 1));
  CHECK(saved.status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<ObjectShard> nameless(1);
  saved = client->Save("job", 1, 0, 1, {}, nameless);
  CHECK(saved.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(saved.status().message() == "object shard with an empty item name");
  CHECK(daemon->calls().size() == sent);
}

TEST_CASE("bytes in an Allocate()d buffer are saved in place, not copied", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  absl::StatusOr<ArenaBuffer> buffer = client->Allocate(8192);
  REQUIRE(buffer.ok());
  const std::string bytes = Pattern(8192, 9);
  std::memcpy(buffer->data, bytes.data(), bytes.size());
  TensorShard t = Tensor("w", bytes);
  t.data = buffer->data;  // the caller's tensor lives in the arena
  Client::reset_copy_stats();

  REQUIRE(client->Save("job", 1, 0, 1, std::span(&t, 1)).ok());
  CHECK(Client::copy_stats().save_bytes == 0);
  CHECK(daemon->reserves().size() == 1);  // Allocate's only
  CHECK(daemon->saves()[0].shards(0).data().extent_id() == buffer->extent_id);
  CHECK(daemon->Stored("job", 1, "w") == bytes);
  // The daemon owns it now: releasing it again is the caller's error, found locally.
  CHECK(client->Release(*buffer).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(daemon->count("ReleaseExtents") == 0);
}
