// One copy on restore (issue 37 §1; docs/ARCHITECTURE.md "The load path"): a load from the RAM
// tier into the caller's own memory is answered with where the hot bytes lie in the caller's arena
// segment (LoadResponse.hot_spans) and the client copies them once, verifying as it copies. Against
// the real daemon: exact bytes for whole items and slices; the answer's spans name the right bytes;
// the lease that pins them (released, released twice, another session's, never released, past
// the per-session limit, a delete while it is held); corrupted hot bytes are caught by the client
// and the load still returns correct bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "harness.h"
#include "raw_session.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kSeed = 37;

// The whole of tensor `t` (global bytes) loaded into a caller vector.
std::vector<uint8_t> LoadWhole(ckptd::Client& c, const std::string& job, const TensorItem& t,
                               const ckptd::LoadOptions& o, ckptd::LoadResult* r) {
  std::vector<uint8_t> got(GlobalBytes(t, kSeed).size(), 0xCD);
  ckptd::LoadTarget target{t.name, ckptd::Region::Whole(), got.data(), got.size()};
  absl::StatusOr<ckptd::LoadResult> res = c.Load(job, 1, 0, {&target, 1}, o);
  INFO(t.name << ": " << res.status().ToString());
  REQUIRE(res.ok());
  if (r != nullptr) *r = *res;
  return got;
}

// A Load of every non-empty tensor of (job, 1) asking hot_direct, into extents of `raw`.
v1::LoadRequest DirectLoad(Raw& raw, const std::string& job) {
  v1::LoadRequest req;
  req.set_session_id(raw.hello.session_id());
  req.set_job(job);
  req.set_step(1);
  for (const TensorItem& t : StateDict()) {
    const uint64_t n = GlobalBytes(t, kSeed).size();
    if (n == 0) continue;
    v1::LoadItemRequest* item = req.add_items();
    item->set_item(t.name);
    item->mutable_dest()->set_extent_id(raw.Reserve(n).id());
    item->mutable_dest()->set_length(n);
    item->set_hot_direct(true);
  }
  return req;
}

grpc::Status Load(Raw& raw, const v1::LoadRequest& req, v1::LoadResponse* resp) {
  return raw.Call([&](grpc::ClientContext* c) { return raw.stub->Load(c, req, resp); });
}

grpc::Status ReleaseLease(Raw& raw, uint64_t lease, bool mismatch = false) {
  v1::ReleaseExtentsRequest req;
  req.set_session_id(raw.hello.session_id());
  if (mismatch) {
    req.add_hot_mismatch_lease_ids(lease);
  } else {
    req.add_hot_lease_ids(lease);
  }
  v1::ReleaseExtentsResponse resp;
  return raw.Call([&](grpc::ClientContext* c) { return raw.stub->ReleaseExtents(c, req, &resp); });
}

// The daemon's arena segment of this uid, mapped read-only.
struct Segment {
  explicit Segment(const Daemon& d) {
    const std::string path = "/dev/shm" + d.ArenaName();
    int fd = open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    bytes = static_cast<uint64_t>(st.st_size);
    void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<const uint8_t*>(p);
  }
  ~Segment() { munmap(const_cast<uint8_t*>(data), bytes); }
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// Each item of `req` rebuilt from the answer's spans out of the segment equals its global bytes.
void CheckSpansName(const Daemon& d, const v1::LoadRequest& req, const v1::LoadResponse& resp) {
  Segment seg(d);
  std::vector<std::vector<uint8_t>> items(req.items_size());
  for (int i = 0; i < req.items_size(); ++i) items[i].assign(req.items(i).dest().length(), 0);
  for (const v1::HotSpan& s : resp.hot_spans()) {
    REQUIRE(s.arena_offset() + s.length() <= seg.bytes);
    for (const v1::HotSpanCopy& c : s.copies()) {
      REQUIRE(c.item() < items.size());
      REQUIRE(c.dst_offset() + c.bytes() <= items[c.item()].size());
      std::memcpy(items[c.item()].data() + c.dst_offset(),
                  seg.data + s.arena_offset() + c.span_offset(), c.bytes());
    }
  }
  for (int i = 0; i < req.items_size(); ++i) {
    INFO(req.items(i).item());
    CHECK(resp.items(i).hot_direct());
    for (const TensorItem& t : StateDict()) {
      if (t.name == req.items(i).item()) CHECK(items[i] == GlobalBytes(t, kSeed));
    }
  }
}

}  // namespace

TEST_CASE("hot direct: a RAM-tier restore into ordinary memory is exact, whole items and slices",
          "[integration]") {
  Daemon d;
  const std::string job = "hot-direct";
  SaveCommitted(d, job, 1, kSeed);
  auto client = d.Connect();
  for (bool direct : {true, false}) {
    INFO("hot_direct " << direct);
    ckptd::LoadOptions o;
    o.hot_direct = direct;
    for (const TensorItem& t : StateDict()) {
      ckptd::LoadResult r;
      CHECK(LoadWhole(*client, job, t, o, &r) == GlobalBytes(t, kSeed));
      CHECK(r.bytes_read == 0);
      if (ElementCount(t.shape) > 0) CHECK(r.bytes_from_ram > 0);
      // Flat slices: a region no rank saved, the plan maps hot runs to parts of the destination.
      const uint64_t n = ElementCount(t.shape), es = ckptd::DTypeSize(t.dtype);
      if (n < 3) continue;
      const uint64_t first = n / 3, count = n / 2;
      std::vector<uint8_t> got(count * es, 0xCD);
      ckptd::LoadTarget target{t.name, ckptd::Region::Flat(first, count), got.data(), got.size()};
      absl::StatusOr<ckptd::LoadResult> s = client->Load(job, 1, 0, {&target, 1}, o);
      REQUIRE(s.ok());
      std::vector<uint8_t> all = GlobalBytes(t, kSeed);
      CHECK(std::equal(got.begin(), got.end(), all.begin() + static_cast<long>(first * es)));
      CHECK(s->bytes_read == 0);
    }
  }
  CHECK(VerifyInProcess(d, job, 1, kSeed).empty());
}

TEST_CASE("hot direct: the answer names the hot bytes, pinned by a lease the session releases once",
          "[integration]") {
  Daemon d;
  const std::string job = "hot-lease";
  SaveCommitted(d, job, 1, kSeed);
  Raw raw(d);
  raw.Attach();
  const v1::LoadRequest req = DirectLoad(raw, job);
  v1::LoadResponse resp;
  grpc::Status s = Load(raw, req, &resp);
  INFO(s.error_message() << d.Log());
  REQUIRE(s.ok());
  REQUIRE(resp.hot_lease_id() != 0);
  REQUIRE(resp.hot_spans_size() > 0);
  CHECK(resp.bytes_read() == 0);
  CheckSpansName(d, req, resp);

  SECTION("released twice, or by another session: NOT_FOUND") {
    Raw other(d);
    CHECK(ReleaseLease(other, resp.hot_lease_id()).error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(ReleaseLease(raw, resp.hot_lease_id()).ok());
    grpc::Status again = ReleaseLease(raw, resp.hot_lease_id());
    CHECK(again.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK_THAT(again.error_message(), Contains("hot lease"));
    CHECK(ReleaseLease(raw, 999999).error_code() == grpc::StatusCode::NOT_FOUND);
  }
  SECTION("a delete while the lease is held leaves the bytes where they are until the release") {
    REQUIRE(RunCtl(d, {"rm", job, "1"}).exit_code == 0);
    SaveCommitted(d, "hot-lease-next", 1, kSeed + 1);  // new staging meanwhile
    CheckSpansName(d, req, resp);
    CHECK(ReleaseLease(raw, resp.hot_lease_id()).ok());
  }
  SECTION("a mismatch the client reports drops the hot copy: the next load reads storage") {
    CHECK(ReleaseLease(raw, resp.hot_lease_id(), /*mismatch=*/true).ok());
    CHECK_THAT(d.Log(), Contains("crc32c mismatch"));
    v1::LoadResponse next;
    REQUIRE(Load(raw, DirectLoad(raw, job), &next).ok());
    CHECK(next.hot_spans_size() == 0);
    CHECK(next.hot_lease_id() == 0);
    CHECK(next.bytes_read() > 0);
  }
}

TEST_CASE("hot direct: leases past the per-session limit are refused, unreleased ones expire",
          "[integration]") {
  DaemonConfig config;
  config.extra_flags = {"--hot_lease_ms=1500"};
  Daemon d(config);
  const std::string job = "hot-limit";
  SaveCommitted(d, job, 1, kSeed);
  Raw raw(d);
  raw.Attach();
  const v1::LoadRequest req = DirectLoad(raw, job);
  for (int i = 0; i < 8; ++i) {  // limits::kHotLeasesPerSessionMax, never released
    v1::LoadResponse resp;
    REQUIRE(Load(raw, req, &resp).ok());
    REQUIRE(resp.hot_lease_id() != 0);
  }
  v1::LoadResponse over;
  grpc::Status s = Load(raw, req, &over);
  CHECK(s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(s.error_message(), Contains("kHotLeasesPerSessionMax"));
  v1::LoadRequest plain = req;  // a load not asking for hot bytes is not limited
  for (v1::LoadItemRequest& i : *plain.mutable_items()) i.set_hot_direct(false);
  v1::LoadResponse copied;
  CHECK(Load(raw, plain, &copied).ok());
  CHECK(copied.hot_lease_id() == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1700));  // past hot_lease_ms
  v1::LoadResponse after;
  CHECK(Load(raw, req, &after).ok());
  CHECK(after.hot_lease_id() != 0);
}

TEST_CASE("hot direct: corrupted hot bytes are caught by the client, the load is still exact",
          "[integration]") {
  Daemon d;
  const std::string job = "hot-corrupt";
  SaveCommitted(d, job, 1, kSeed);
  auto client = d.Connect();
  CorruptArenaSegment(d);
  for (const TensorItem& t : StateDict()) {
    ckptd::LoadResult r;
    CHECK(LoadWhole(*client, job, t, {}, &r) == GlobalBytes(t, kSeed));
  }
  INFO(d.Log());
  // Found by the client's copy (it reported the lease), not by the daemon's.
  CHECK_THAT(d.Log(), Contains("copied did not verify (crc32c mismatch)"));
  CHECK(VerifyInProcess(d, job, 1, kSeed).empty());
}
