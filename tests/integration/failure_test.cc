// Failure paths: each bad request is a clear gRPC error naming what it concerns, the daemon
// stays up, and a previously committed checkpoint still loads bit-exact afterwards.
// Requests the client library would refuse locally are sent raw over gRPC.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <regex>

#include "ckptd/v1/ckptd.grpc.pb.h"
#include "harness.h"
#include "raw_session.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;
namespace v1 = ::ckptd::v1;

namespace {

constexpr uint64_t kBaseSeed = 5;
const std::string kBaseJob = "base";

bool IsBoundsCode(grpc::StatusCode c) {
  return c == grpc::StatusCode::INVALID_ARGUMENT || c == grpc::StatusCode::OUT_OF_RANGE;
}

std::string Describe(const grpc::Status& s) {
  return std::to_string(static_cast<int>(s.error_code())) + ": " + s.error_message();
}

std::string Describe(const absl::Status& s) { return s.ToString(); }

bool HasNumber(const std::string& text, uint64_t n) {
  return std::regex_search(text, std::regex("(^|[^0-9])" + std::to_string(n) + "([^0-9]|$)"));
}

}  // namespace

TEST_CASE("failure paths answer clear errors and leave committed data intact", "[integration]") {
  Daemon d;
  SaveCommitted(d, kBaseJob, 1, kBaseSeed);
  Raw raw(d);
  auto client = d.Connect();

  SECTION("an unknown session is FAILED_PRECONDITION with reason UNKNOWN_SESSION") {
    // What clients decide on (proto: ErrorReason), never the message text; other errors carry
    // no reason.
    v1::ReserveExtentsRequest req;
    req.set_session_id("no-such-session");
    req.add_sizes_bytes(4096);
    v1::ReserveExtentsResponse resp;
    grpc::Status s =
        raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReserveExtents(c, req, &resp); });
    INFO(Describe(s));
    REQUIRE(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
    v1::ErrorDetail detail;
    REQUIRE(detail.ParseFromString(s.error_details()));
    CHECK(detail.reason() == v1::UNKNOWN_SESSION);
    req.set_session_id(raw.hello.session_id());
    req.clear_sizes_bytes();  // a valid session, no sizes: INVALID_ARGUMENT
    s = raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReserveExtents(c, req, &resp); });
    REQUIRE(!s.ok());
    CHECK(s.error_details().empty());
  }

  SECTION("extent out of bounds") {
    v1::Extent e = raw.Reserve(4096);
    v1::SaveRequest req = raw.SaveOf("bad-extent", 1, 0, 1, "w.past_end", 256);  // 4096 B
    v1::MemRef* m = req.mutable_shards(0)->mutable_data();
    m->set_extent_id(e.id());
    m->set_offset(4096);
    m->set_length(4096);
    grpc::Status s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE(IsBoundsCode(s.error_code()));
    REQUIRE_THAT(s.error_message(), Contains("w.past_end"));

    // Longer than the extent from offset 0 (an 8 KiB tensor in a 4 KiB extent).
    req = raw.SaveOf("bad-extent", 1, 0, 1, "w.too_long", 512);
    m = req.mutable_shards(0)->mutable_data();
    m->set_extent_id(e.id());
    m->set_offset(0);
    m->set_length(8192);
    s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE(IsBoundsCode(s.error_code()));
    REQUIRE_THAT(s.error_message(), Contains("w.too_long"));
  }

  SECTION("registered region out of bounds") {
    TestShm shm(8192);
    v1::RegisterRegionRequest rr;
    rr.set_session_id(raw.hello.session_id());
    rr.set_kind(v1::SHM);
    rr.set_shm_name(shm.name);
    rr.set_size_bytes(8192);
    v1::RegisterRegionResponse rresp;
    grpc::Status s =
        raw.Call([&](grpc::ClientContext* c) { return raw.stub->RegisterRegion(c, rr, &rresp); });
    INFO(Describe(s));
    REQUIRE(s.ok());
    v1::SaveRequest req = raw.SaveOf("bad-region", 1, 0, 1, "w.region_past_end", 512);  // 8 KiB
    v1::MemRef* m = req.mutable_shards(0)->mutable_data();
    m->set_region_id(rresp.region_id());
    m->set_offset(4096);
    m->set_length(8192);
    s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE(IsBoundsCode(s.error_code()));
    REQUIRE_THAT(s.error_message(), Contains("w.region_past_end"));

    // A region larger than the shm object is refused at registration.
    rr.set_size_bytes(1 << 20);
    s = raw.Call([&](grpc::ClientContext* c) { return raw.stub->RegisterRegion(c, rr, &rresp); });
    INFO(Describe(s));
    REQUIRE_FALSE(s.ok());
    REQUIRE_THAT(s.error_message(), Contains(shm.name.substr(1)));
  }

  SECTION("unknown extent or region id") {
    v1::SaveRequest req = raw.SaveOf("bad-id", 1, 0, 1, "w.unknown_extent", 256);
    v1::MemRef* m = req.mutable_shards(0)->mutable_data();
    m->set_extent_id(987654321);
    m->set_length(4096);
    grpc::Status s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE((s.error_code() == grpc::StatusCode::NOT_FOUND ||
             s.error_code() == grpc::StatusCode::INVALID_ARGUMENT));
    REQUIRE_THAT(s.error_message(), Contains("w.unknown_extent"));
    REQUIRE_THAT(s.error_message(), Contains("987654321"));

    req = raw.SaveOf("bad-id", 1, 0, 1, "w.unknown_region", 256);
    m = req.mutable_shards(0)->mutable_data();
    m->set_region_id(123456789);
    m->set_length(4096);
    s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE((s.error_code() == grpc::StatusCode::NOT_FOUND ||
             s.error_code() == grpc::StatusCode::INVALID_ARGUMENT));
    REQUIRE_THAT(s.error_message(), Contains("w.unknown_region"));
    REQUIRE_THAT(s.error_message(), Contains("123456789"));
  }

  SECTION("a shard region outside the tensor's shape") {
    v1::Extent e = raw.Reserve(4096);
    // Rows [6, 10) of an [8, 4] tensor.
    v1::SaveRequest req = raw.SaveOf("bad-shape", 1, 0, 1, "w.outside", 8);
    v1::Box* box = req.mutable_shards(0)->mutable_tensor()->mutable_region()->mutable_box();
    box->add_offsets(6);
    box->add_offsets(0);
    box->add_lengths(4);
    box->add_lengths(4);
    v1::MemRef* m = req.mutable_shards(0)->mutable_data();
    m->set_extent_id(e.id());
    m->set_length(64);
    grpc::Status s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE_THAT(s.error_message(), Contains("w.outside"));

    // A flat range past the end: elements [30, 34) of 32.
    req = raw.SaveOf("bad-shape", 1, 0, 1, "w.flat_outside", 8);
    v1::FlatRange* flat = req.mutable_shards(0)->mutable_tensor()->mutable_region()->mutable_flat();
    flat->set_start(30);
    flat->set_count(4);
    m = req.mutable_shards(0)->mutable_data();
    m->set_extent_id(e.id());
    m->set_length(16);
    s = raw.Save(req);
    INFO(Describe(s));
    REQUIRE(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    REQUIRE_THAT(s.error_message(), Contains("w.flat_outside"));
  }

  SECTION("dtype or shape disagreement between ranks") {
    std::vector<float> rows(4 * 4, 1.5f);
    auto shard = [&](ckptd::DType dt, std::vector<uint64_t> shape, uint64_t row0) {
      ckptd::TensorShard t;
      t.item = "w.disputed";
      t.dtype = dt;
      t.global_shape = shape;
      t.region = ckptd::Region::Box({row0, 0}, {4, shape[1]});
      t.data = rows.data();
      t.bytes = 4 * shape[1] * ckptd::DTypeSize(dt);
      return t;
    };
    std::vector<ckptd::TensorShard> r0 = {shard(ckptd::DType::kFloat32, {8, 4}, 0)};
    REQUIRE(client->Save("disagree", 1, 0, 2, r0).ok());
    std::vector<ckptd::TensorShard> r1 = {shard(ckptd::DType::kInt32, {8, 4}, 4)};
    absl::Status s = client->Save("disagree", 1, 1, 2, r1).status();
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(s.message()), Contains("w.disputed"));
    REQUIRE_THAT(std::string(s.message()), Contains("rank 0"));
    REQUIRE_THAT(std::string(s.message()), Contains("rank 1"));

    r1 = {shard(ckptd::DType::kFloat32, {8, 2}, 4)};
    s = client->Save("disagree", 1, 1, 2, r1).status();
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    REQUIRE_THAT(std::string(s.message()), Contains("w.disputed"));
    REQUIRE_THAT(std::string(s.message()), Contains("rank 0"));
    REQUIRE_THAT(std::string(s.message()), Contains("rank 1"));
  }

  SECTION("waiting on a checkpoint with ranks missing names them") {
    for (uint32_t rank : {0u, 2u}) REQUIRE(SaveRank(*client, "partial", 4, rank, 4, 1).ok());
    absl::Status s = client->WaitCommitted("partial", 4, 500);
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kDeadlineExceeded);
    REQUIRE(HasNumber(std::string(s.message()), 1));
    REQUIRE(HasNumber(std::string(s.message()), 3));
    auto st = client->GetStatus("partial", 4);
    REQUIRE(st.ok());
    REQUIRE(st->missing_ranks == std::vector<uint32_t>{1, 3});
    CommandResult ctl = RunCtl(d, {"status", "partial", "4"});
    INFO(ctl.output);
    REQUIRE_THAT(ctl.output, Contains("ranks missing: 1,3"));
  }

  SECTION("loading a checkpoint or an item that does not exist names it") {
    std::vector<uint8_t> buf(84);  // model.mask: bool [12, 7]
    std::vector<ckptd::LoadTarget> t = {{"model.mask", ckptd::Region::Whole(), buf.data(), 84}};
    absl::Status s = client->Load(kBaseJob, 777, 0, t).status();
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kNotFound);
    REQUIRE(HasNumber(std::string(s.message()), 777));

    s = client->Load("no-such-job", 1, 0, t).status();
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kNotFound);
    REQUIRE_THAT(std::string(s.message()), Contains("no-such-job"));

    s = client->Load("no-such-job", std::nullopt, 0, t).status();
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kNotFound);

    t[0].item = "model.no_such_item";
    s = client->Load(kBaseJob, 1, 0, t).status();
    INFO(Describe(s));
    REQUIRE(s.code() == absl::StatusCode::kNotFound);
    REQUIRE_THAT(std::string(s.message()), Contains("model.no_such_item"));

    auto o = client->LoadObject(kBaseJob, 1, 0, "extra.no_such_object");
    INFO(Describe(o.status()));
    REQUIRE(o.status().code() == absl::StatusCode::kNotFound);
    REQUIRE_THAT(std::string(o.status().message()), Contains("extra.no_such_object"));
  }

  SECTION("a job name with a path separator or '..' is refused") {
    for (const std::string job : {"a/b", "..", "../escape", "x/../y", "/abs"}) {
      INFO("job " << job);
      absl::Status s = SaveRank(*client, job, 1, 0, 4, 1).status();
      INFO(Describe(s));
      REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
      REQUIRE_THAT(std::string(s.message()), Contains(job));
      s = client->GetStatus(job, 1).status();
      REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
    }
    REQUIRE_FALSE(PathExists(d.data_dir() + "/a"));
    REQUIRE_FALSE(PathExists(d.data_dir() + "/../escape"));
    REQUIRE_FALSE(PathExists(d.state_dir() + "/escape"));
  }

  std::string verify = VerifyInProcess(d, kBaseJob, 1, kBaseSeed);
  INFO(d.Log());
  REQUIRE(verify == "");
}

TEST_CASE("a full arena answers RESOURCE_EXHAUSTED stating bytes asked and free", "[integration]") {
  DaemonConfig cfg;
  cfg.staging_bytes_max = 16 << 20;  // the daemon's minimum
  // One uid fills the arena here: its share (uid_arena_share_percent) is off.
  cfg.extra_flags = {"--reserve_timeout_ms=200", "--uid_arena_share_percent=100"};
  Daemon d(cfg);
  SaveCommitted(d, kBaseJob, 1, kBaseSeed);
  auto client = d.Connect();
  auto held = client->Allocate(12 << 20);
  INFO(Describe(held.status()));
  REQUIRE(held.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto more = client->Allocate(8 << 20);
  auto waited = std::chrono::steady_clock::now() - t0;
  INFO(Describe(more.status()));
  REQUIRE(more.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(HasNumber(std::string(more.status().message()), 8 << 20));
  REQUIRE_THAT(std::string(more.status().message()), Contains("free"));
  // It waited (bounded) before failing.
  REQUIRE(waited >= std::chrono::milliseconds(150));
  REQUIRE(waited < std::chrono::seconds(10));

  REQUIRE(client->Release(*held).ok());
  REQUIRE(VerifyInProcess(d, kBaseJob, 1, kBaseSeed) == "");
  auto again = client->Allocate(8 << 20);
  REQUIRE(again.ok());
  REQUIRE(client->Release(*again).ok());
}
