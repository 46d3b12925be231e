// libckptd-client's one data path against the real daemon: loads larger than one batch (several
// Load RPCs, two in flight, oversized targets sliced), strided sources and destinations (one
// gather, one scatter), memory already in daemon-visible buffers (no copy at all, found by the
// library itself), and giving buffers back by address.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "harness.h"
#include "shards.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

TEST_CASE("data path: a load larger than one batch is batched, sliced and bit-exact",
          "[integration]") {
  Daemon d;  // a 64 MiB arena: batches of 16 MiB
  auto client = d.Connect();
  const uint64_t batch = client->load_batch_bytes();
  REQUIRE(batch == 16ull << 20);

  // One 40 MiB tensor (sliced into flat pieces), 150 of 64 KiB (several per batch), one object.
  std::vector<std::vector<float>> data;
  data.push_back(Pattern((40ull << 20) / sizeof(float), 1.0f));
  for (int i = 0; i < 150; ++i) data.push_back(Pattern((64 << 10) / sizeof(float), 2.0f + i));
  std::vector<ckptd::TensorShard> shards;
  for (size_t i = 0; i < data.size(); ++i)
    shards.push_back(Whole("t" + std::to_string(i), data[i]));
  std::vector<ckptd::ObjectShard> objects = {{"meta", false, std::string(1000, 'm'), {}}};
  REQUIRE(client->Save("batched", 1, 0, 1, shards, objects).ok());
  REQUIRE(client->WaitCommitted("batched", 1, 60000).ok());

  std::vector<std::vector<float>> out(data.size());
  std::string meta(4096, '\0');
  std::vector<ckptd::LoadTarget> targets;
  uint64_t total = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    out[i].assign(data[i].size(), -1.0f);
    targets.push_back(ckptd::LoadTarget{"t" + std::to_string(i), ckptd::Region::Whole(),
                                        out[i].data(), out[i].size() * sizeof(float)});
    total += targets.back().bytes;
  }
  targets.push_back(ckptd::LoadTarget{"meta", ckptd::Region::Whole(), meta.data(), meta.size()});
  ckptd::Client::reset_copy_stats();
  absl::StatusOr<ckptd::LoadResult> r = client->Load("batched", std::nullopt, 0, targets);
  REQUIRE(r.ok());
  CHECK(r->step == 1);  // "latest", resolved once for every batch
  REQUIRE(r->item_bytes.size() == targets.size());
  for (size_t i = 0; i < data.size(); ++i) {
    CHECK(r->item_bytes[i] == targets[i].bytes);
    CHECK(out[i] == data[i]);
  }
  CHECK(r->item_bytes.back() == 1000);
  CHECK(meta.substr(0, 1000) == std::string(1000, 'm'));
  ckptd::CopyStats s = ckptd::Client::copy_stats();
  CHECK(s.load_bytes == total + 1000);  // one copy per byte, whatever the batching
  CHECK(s.load_calls > data.size());    // the large tensor came in several slices
  CHECK(r->bytes_read >= total);

  SECTION("a flat region larger than a batch is sliced too") {
    std::vector<float> part(data[0].size() / 2);
    const uint64_t start = data[0].size() / 4;
    ckptd::LoadTarget t{"t0", ckptd::Region::Flat(start, part.size()), part.data(),
                        part.size() * sizeof(float)};
    auto flat = client->Load("batched", 1, 0, std::span(&t, 1));
    REQUIRE(flat.ok());
    CHECK(flat->item_bytes[0] == t.bytes);
    CHECK(std::equal(part.begin(), part.end(), data[0].begin() + static_cast<int64_t>(start)));
  }
  SECTION("a box larger than a batch is one batch of its own") {
    // t0 seen as a 2-D tensor is not possible (it was saved 1-D): use a 1-D box instead.
    std::vector<float> part((20ull << 20) / sizeof(float));
    ckptd::LoadTarget t{"t0", ckptd::Region::Box({8}, {part.size()}), part.data(),
                        part.size() * sizeof(float)};
    auto box = client->Load("batched", 1, 0, std::span(&t, 1));
    REQUIRE(box.ok());
    CHECK(std::equal(part.begin(), part.end(), data[0].begin() + 8));
  }
}

TEST_CASE("data path: strided sources and destinations are gathered and scattered once",
          "[integration]") {
  Daemon d;
  auto client = d.Connect();
  // A 64 x 48 float32 matrix stored column-major: its row-major view is strided.
  const int64_t rows = 64, cols = 48;
  std::vector<float> colmajor(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) colmajor[c * rows + r] = static_cast<float>(r * 1000 + c);
  }
  ckptd::StridedView src{reinterpret_cast<uintptr_t>(colmajor.data()),
                         {rows, cols},
                         {static_cast<int64_t>(sizeof(float)), rows * 4},
                         4};
  REQUIRE_FALSE(src.Contiguous());
  ckptd::TensorShard t;
  t.item = "m";
  t.global_shape = {static_cast<uint64_t>(rows), static_cast<uint64_t>(cols)};
  t.bytes = rows * cols * 4;
  t.strided = src;
  ckptd::Client::reset_copy_stats();
  REQUIRE(client->Save("strided", 1, 0, 1, std::span(&t, 1)).ok());
  CHECK(ckptd::Client::copy_stats().save_bytes == t.bytes);
  CHECK(ckptd::Client::copy_stats().save_calls == 1);
  REQUIRE(client->WaitCommitted("strided", 1, 30000).ok());

  // Row-major on disk: load the whole thing contiguously and check it.
  std::vector<float> rowmajor(rows * cols);
  ckptd::LoadTarget plain{"m", ckptd::Region::Whole(), rowmajor.data(), t.bytes};
  REQUIRE(client->Load("strided", 1, 0, std::span(&plain, 1)).ok());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) REQUIRE(rowmajor[r * cols + c] == r * 1000.0f + c);
  }
  // And back into a column-major destination: one scatter.
  std::vector<float> back(rows * cols, -1.0f);
  ckptd::LoadTarget strided{"m", ckptd::Region::Whole(), nullptr, t.bytes};
  strided.strided = src;
  strided.strided->data = reinterpret_cast<uintptr_t>(back.data());
  ckptd::Client::reset_copy_stats();
  auto r = client->Load("strided", 1, 0, std::span(&strided, 1));
  REQUIRE(r.ok());
  CHECK(back == colmajor);
  CHECK(ckptd::Client::copy_stats().load_bytes == t.bytes);

  SECTION("a view whose size differs from the region is refused before any copy") {
    ckptd::TensorShard bad = t;
    bad.strided->shape = {rows, cols - 1};
    ckptd::Client::reset_copy_stats();
    auto s = client->Save("strided", 2, 0, 1, std::span(&bad, 1));
    REQUIRE(s.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(s.status().message()), Contains("item m"));
    CHECK(ckptd::Client::copy_stats().save_bytes == 0);
    ckptd::LoadTarget bad_load = strided;
    bad_load.strided->shape = {rows - 1, cols};
    auto l = client->Load("strided", 1, 0, std::span(&bad_load, 1));
    REQUIRE(l.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(l.status().message()), Contains("load target m"));
  }
}

TEST_CASE("data path: bytes already in daemon-visible memory are never copied", "[integration]") {
  Daemon d;
  auto client = d.Connect();
  const std::vector<float> values = Pattern(1 << 16, 3.0f);
  const uint64_t bytes = values.size() * sizeof(float);

  SECTION("an Allocate()d buffer: Save finds it, the daemon takes it") {
    auto buf = client->Allocate(bytes);
    REQUIRE(buf.ok());
    std::memcpy(buf->data, values.data(), bytes);
    std::optional<ckptd::BufferRef> where = client->Locate(buf->data, bytes);
    REQUIRE(where.has_value());
    CHECK(where->kind == ckptd::BufferRef::kArena);
    CHECK(where->id == buf->extent_id);
    CHECK_FALSE(client->Locate(static_cast<uint8_t*>(buf->data) + 8, buf->size).has_value());
    ckptd::Client::reset_copy_stats();
    ckptd::TensorShard t = Whole("v", values);
    t.data = buf->data;
    REQUIRE(client->Save("inplace", 1, 0, 1, std::span(&t, 1)).ok());
    CHECK(ckptd::Client::copy_stats().save_bytes == 0);
    // The daemon owns it now: the client no longer lists it, and cannot give it back.
    CHECK_FALSE(client->Locate(buf->data, bytes).has_value());
    CHECK(client->Release(*buf).code() == absl::StatusCode::kFailedPrecondition);
    REQUIRE(client->WaitCommitted("inplace", 1, 30000).ok());
    std::vector<float> got(values.size());
    ckptd::LoadTarget l{"v", ckptd::Region::Whole(), got.data(), bytes};
    REQUIRE(client->Load("inplace", 1, 0, std::span(&l, 1)).ok());
    CHECK(got == values);
  }

  SECTION("a region registered with its mapping: saved from and loaded into in place") {
    Shm shm(2 * bytes);
    auto handle = client->RegisterShm(shm.name(), shm.bytes(), shm.data());
    REQUIRE(handle.ok());
    std::memcpy(shm.data() + 4096, values.data(), bytes);
    std::optional<ckptd::BufferRef> where = client->Locate(shm.data() + 4096, bytes);
    REQUIRE(where.has_value());
    CHECK(where->kind == ckptd::BufferRef::kRegion);
    CHECK(where->id == *handle);
    CHECK(where->offset == 4096);
    ckptd::Client::reset_copy_stats();
    ckptd::TensorShard t = Whole("v", values);
    t.data = shm.data() + 4096;
    REQUIRE(client->Save("region", 1, 0, 1, std::span(&t, 1)).ok());
    REQUIRE(client->WaitCommitted("region", 1, 30000).ok());
    std::memset(shm.data(), 0, shm.bytes());
    ckptd::LoadTarget l{"v", ckptd::Region::Whole(), shm.data() + bytes, bytes};
    auto r = client->Load("region", 1, 0, std::span(&l, 1));
    REQUIRE(r.ok());
    ckptd::CopyStats s = ckptd::Client::copy_stats();
    CHECK(s.save_bytes == 0);
    CHECK(s.load_bytes == 0);
    CHECK(std::memcmp(shm.data() + bytes, values.data(), bytes) == 0);
    REQUIRE(client->Unregister(*handle).ok());
    CHECK_FALSE(client->Locate(shm.data(), 8).has_value());
  }

  SECTION("ReleaseAt gives back the buffers holding the addresses, and only those") {
    auto bufs = client->AllocateMany(std::vector<uint64_t>{8192, 8192});
    REQUIRE(bufs.ok());
    const void* inside = static_cast<uint8_t*>((*bufs)[0].data) + 100;
    const void* elsewhere = values.data();
    client->ReleaseAt(std::vector<const void*>{inside, inside, elsewhere});
    CHECK(client->Release((*bufs)[0]).code() == absl::StatusCode::kFailedPrecondition);
    CHECK(client->Release((*bufs)[1]).ok());
  }
}
