// The key schema: round trips, ordering, and rejection of malformed keys.
#include "index/keys.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace ckptd {
namespace {

using std::string_literals::operator""s;

TEST_CASE("keys round trip every kind", "[unit]") {
  for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{255}, uint64_t{1} << 40, ~uint64_t{0}}) {
    INFO("step " << step);
    CHECK(*keys::DecodeJob(keys::Job("llama3-8b-run42")) == "llama3-8b-run42");
    auto c = keys::DecodeCheckpoint(keys::Checkpoint("job", step));
    REQUIRE(c.ok());
    CHECK(c->first == "job");
    CHECK(c->second == step);
    for (uint32_t rank : {0u, 7u, 65535u, ~0u}) {
      auto r = keys::DecodeRank(keys::Rank("job", step, rank));
      REQUIRE(r.ok());
      CHECK(*r == std::make_tuple("job"s, step, rank));
    }
    // Item and blob names may hold any bytes, '\0' included.
    std::string item = "model.layers.3.mlp.fc1.weight\0x\xff"s;
    CHECK(*keys::DecodeItem(keys::Item("job", step, item)) == item);
    CHECK(*keys::DecodeBlob(keys::Blob("job", step, "r00003.blob")) == "r00003.blob");
  }
  CHECK(keys::JobPrefix() == "J");
  CHECK(keys::AllCheckpointsPrefix() == "C");
  CHECK(keys::CheckpointPrefix("j") == "Cj\0"s);
  CHECK(keys::Meta("schema") == "Mschema");
  // Each key starts with its prefix.
  CHECK(keys::Checkpoint("j", 5).rfind(keys::CheckpointPrefix("j"), 0) == 0);
  CHECK(keys::Rank("j", 5, 1).rfind(keys::RankPrefix("j", 5), 0) == 0);
  CHECK(keys::Item("j", 5, "x").rfind(keys::ItemPrefix("j", 5), 0) == 0);
  CHECK(keys::Blob("j", 5, "x").rfind(keys::BlobPrefix("j", 5), 0) == 0);
  CHECK(keys::Job("j").rfind(keys::JobPrefix(), 0) == 0);
}

TEST_CASE("keys sort in natural order", "[unit]") {
  SECTION("steps sort numerically") {
    CHECK(keys::Checkpoint("a", 2) < keys::Checkpoint("a", 10));
    CHECK(keys::Checkpoint("a", 10) < keys::Checkpoint("a", uint64_t{1} << 40));
    CHECK(keys::Rank("a", 2, 9) < keys::Rank("a", 2, 10));
    CHECK(keys::Rank("a", 2, 300) < keys::Rank("a", 3, 0));
    CHECK(keys::Item("a", 2, "zzz") < keys::Item("a", 10, "a"));
  }
  SECTION("one job's keys never interleave with another's") {
    std::vector<std::string> all;
    for (const std::string& job : {"a"s, "a\x01"s, "ab"s, "a-"s, "b"s}) {
      for (uint64_t step : {uint64_t{0}, uint64_t{2}, ~uint64_t{0}}) {
        all.push_back(keys::Checkpoint(job, step));
      }
    }
    std::sort(all.begin(), all.end());
    // Every key of job "a" comes before every key of the others, and contiguously.
    std::string prefix = keys::CheckpointPrefix("a");
    for (size_t i = 0; i < all.size(); ++i) {
      bool is_a = all[i].rfind(prefix, 0) == 0;
      CHECK(is_a == (i < 3));
    }
    CHECK(keys::Checkpoint("a", ~uint64_t{0}) < keys::Checkpoint("a\x01", 0));
    CHECK(keys::Checkpoint("a", ~uint64_t{0}) < keys::Checkpoint("ab", 0));
    CHECK(keys::Item("a", ~uint64_t{0}, "\xff\xff") < keys::Item("a\x01", 0, ""));
  }
  SECTION("jobs list by name") {
    CHECK(keys::Job("a") < keys::Job("ab"));
    CHECK(keys::Job("ab") < keys::Job("b"));
  }
}

TEST_CASE("keys decoders reject malformed keys", "[unit]") {
  CHECK(absl::IsInvalidArgument(keys::DecodeJob("").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeJob("J").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeJob("Xjob").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeJob("Jjo\0b"s).status()));

  std::string c = keys::Checkpoint("job", 5);
  CHECK(absl::IsInvalidArgument(keys::DecodeCheckpoint(c.substr(0, c.size() - 1)).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeCheckpoint(c + "x").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeCheckpoint("Cjob").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeCheckpoint("C\0"s + std::string(8, '\0')).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeCheckpoint(keys::Rank("job", 5, 1)).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeCheckpoint("").status()));

  std::string r = keys::Rank("job", 5, 1);
  CHECK(absl::IsInvalidArgument(keys::DecodeRank(r.substr(0, r.size() - 1)).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeRank(r + "x").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeRank(keys::Checkpoint("job", 5)).status()));

  CHECK(absl::IsInvalidArgument(keys::DecodeItem(keys::ItemPrefix("job", 5)).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeItem(keys::Blob("job", 5, "b")).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeItem("Ijob").status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeBlob(keys::BlobPrefix("job", 5)).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeBlob(keys::Item("job", 5, "i")).status()));
  CHECK(absl::IsInvalidArgument(keys::DecodeBlob("Bjob\0short"s).status()));
}

}  // namespace
}  // namespace ckptd
