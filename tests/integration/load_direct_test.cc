// Cold loads read whole shards straight into their destinations (load_into_destination): the
// bytes are bit-exact whatever the destination (an aligned arena extent, a registered region at an
// aligned or unaligned offset), whatever the shard's length (a short last block goes through the
// read buffer), under both load_io modes, also when one load asks for the same bytes more than
// once (those go through the read buffer), and a flipped byte in the part read in place is caught
// by the checksum there (DATA_LOSS naming the item), never handed out.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"
#include "shards.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

// The largest file under `dir` (a checkpoint's one blob, when one rank saved one shard).
std::string LargestFile(const std::string& dir) {
  std::string best;
  uint64_t size = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.file_size() > size) {
      size = e.file_size();
      best = e.path().string();
    }
  }
  return best;
}

}  // namespace

TEST_CASE("load into destination: whole shards read in place are bit-exact in every mode",
          "[integration]") {
  const bool in_place = GENERATE(true, false);
  const bool buffered = GENERATE(true, false);
  INFO("load_into_destination=" << in_place << " load_io=" << (buffered ? "buffered" : "direct"));
  Daemon d(DaemonConfig{
      .extra_flags = {"--ram_tier_keep_per_job=0",  // the cold path
                      in_place ? "--load_into_destination=true" : "--load_into_destination=false",
                      buffered ? "--load_io=buffered" : "--load_io=direct"}});
  auto client = d.Connect();
  // 1 MiB + 100 bytes (a short last block), 300 KiB (whole blocks), 8 KiB (below the in-place
  // minimum), 3 MiB.
  const std::vector<size_t> floats = {(size_t{1} << 18) + 25, size_t{300} * 256, 2048,
                                      size_t{3} << 18};
  std::vector<std::vector<float>> data;
  std::vector<ckptd::TensorShard> shards;
  for (size_t i = 0; i < floats.size(); ++i) data.push_back(Pattern(floats[i], 1.0f + i));
  for (size_t i = 0; i < data.size(); ++i)
    shards.push_back(Whole("t" + std::to_string(i), data[i]));
  REQUIRE(client->Save("direct", 1, 0, 1, shards).ok());
  REQUIRE(client->WaitCommitted("direct", 1, 60000).ok());

  SECTION("into plain memory (the library's arena scratch: aligned extents)") {
    std::vector<std::vector<float>> out(data.size());
    std::vector<ckptd::LoadTarget> targets;
    for (size_t i = 0; i < data.size(); ++i) {
      out[i].assign(data[i].size(), -1.0f);
      targets.push_back(ckptd::LoadTarget{"t" + std::to_string(i), ckptd::Region::Whole(),
                                          out[i].data(), out[i].size() * sizeof(float)});
    }
    auto r = client->Load("direct", 1, 0, targets);
    REQUIRE(r.ok());
    CHECK(r->bytes_from_ram == 0);
    for (size_t i = 0; i < data.size(); ++i) CHECK(out[i] == data[i]);
  }

  SECTION(
      "the same shard into two destinations in one load (one read in place, the other copied)") {
    // Each whole shard twice, and the 3 MiB one a third time as its second half: every shard's
    // bytes go to more than one copy of its run, so none may be read around the read buffer.
    std::vector<std::vector<float>> out;
    out.reserve(2 * data.size() + 1);  // the targets point into them
    std::vector<ckptd::LoadTarget> targets;
    for (size_t i = 0; i < 2 * data.size() + 1; ++i) {
      const size_t t = i < 2 * data.size() ? i % data.size() : 3;
      const bool half = i == 2 * data.size();
      out.emplace_back(half ? data[t].size() / 2 : data[t].size(), -1.0f);
      const ckptd::Region region =
          half ? ckptd::Region::Box({data[t].size() / 2}, {data[t].size() / 2})
               : ckptd::Region::Whole();
      targets.push_back(ckptd::LoadTarget{"t" + std::to_string(t), region, out.back().data(),
                                          out.back().size() * sizeof(float)});
    }
    auto r = client->Load("direct", 1, 0, targets);
    REQUIRE(r.ok());
    for (size_t i = 0; i < 2 * data.size(); ++i) {
      INFO("target " << i);
      CHECK(std::equal(out[i].begin(), out[i].end(), data[i % data.size()].begin()));
    }
    CHECK(std::equal(out.back().begin(), out.back().end(), data[3].begin() + data[3].size() / 2));
  }

  SECTION("into a registered region, at an aligned and at an unaligned offset") {
    const uint64_t big = data[0].size() * sizeof(float);
    for (const uint64_t offset : {uint64_t{4096}, uint64_t{64}}) {
      INFO("offset " << offset);
      Shm shm(big + 8192);
      auto handle = client->RegisterShm(shm.name(), shm.bytes(), shm.data());
      REQUIRE(handle.ok());
      std::memset(shm.data(), 0xee, shm.bytes());
      ckptd::LoadTarget l{"t0", ckptd::Region::Whole(), shm.data() + offset, big};
      ckptd::Client::reset_copy_stats();
      auto r = client->Load("direct", 1, 0, std::span(&l, 1));
      REQUIRE(r.ok());
      CHECK(ckptd::Client::copy_stats().load_bytes == 0);  // the daemon wrote it where it lives
      CHECK(std::memcmp(shm.data() + offset, data[0].data(), big) == 0);
      CHECK(shm.data()[offset - 1] == 0xee);  // nothing written around it
      CHECK(shm.data()[offset + big] == 0xee);
      REQUIRE(client->Unregister(*handle).ok());
    }
  }
}

TEST_CASE("load into destination: a flipped byte in a part read in place is a checksum error",
          "[integration]") {
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0"}});
  auto client = d.Connect();
  const std::vector<float> values = Pattern((1u << 18) + 25, 5.0f);
  ckptd::TensorShard t = Whole("w", values);
  REQUIRE(client->Save("flip", 1, 0, 1, std::span(&t, 1)).ok());
  REQUIRE(client->WaitCommitted("flip", 1, 60000).ok());
  const std::string blob = LargestFile(d.data_dir());
  REQUIRE_FALSE(blob.empty());
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(512 << 10);  // inside the shard's whole blocks: read straight into the destination
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(512 << 10);
    f.write(&c, 1);
  }
  std::vector<float> out(values.size());
  ckptd::LoadTarget l{"w", ckptd::Region::Whole(), out.data(), out.size() * sizeof(float)};
  auto r = client->Load("flip", 1, 0, std::span(&l, 1));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(r.status().message()),
             Contains("item \"w\"") && Contains("block 128") && Contains("crc32c mismatch"));
}
