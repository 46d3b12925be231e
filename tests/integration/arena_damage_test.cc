// Damage to a uid's staging arena segment (issue 33 §3), against the real daemon: a process of
// the uid holds the segment's descriptor (the arena socket hands it over) and can truncate it.
// That used to break the uid's staging for every later client until the daemon restarted (each
// reservation failed faulting pages past the end). Now the daemon notices the segment's size at the
// next reservation or mapping, retires it and creates a new one: new sessions save and load
// bit-exact, a checkpoint committed before still loads bit-exact (its hot copy was in the damaged
// segment: the load reads storage), a session that mapped the damaged segment gets a clear
// FAILED_PRECONDITION, and a checkpoint staged in it aborts with the reason when flushed.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {

constexpr char kJob[] = "damage";

void Truncate(const std::string& segment) {
  const int fd = shm_open(segment.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 0) == 0);
  close(fd);
}

}  // namespace

TEST_CASE("arena damage: a truncated segment is retired, new sessions get a new one",
          "[integration][trust]") {
  Daemon d;
  auto old = d.Connect();
  for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(*old, kJob, 1, r, 4, 61).ok());
  REQUIRE(old->WaitCommitted(kJob, 1, 30000).ok());
  const std::string damaged = d.ArenaName();
  REQUIRE_FALSE(damaged.empty());
  Truncate(damaged);

  // New processes of the uid stage and commit (each rank its own process: a client that mapped
  // the damaged segment would die of SIGBUS copying into it, not this test).
  auto ranks = SaveRanksConcurrently(d, kJob, 2, 62, /*hold=*/false);
  for (auto& r : ranks) {
    INFO(r->output() << "\nlog:\n" << d.Log());
    REQUIRE(r->Wait() == 0);
  }
  REQUIRE(d.Connect()->WaitCommitted(kJob, 2, 30000).ok());
  CHECK(VerifyInProcess(d, kJob, 2, 62) == "");
  CHECK(VerifyInProcess(d, kJob, 1, 61) == "");  // its hot copy went with the damaged segment
  CHECK(d.ArenaName() != damaged);
  CHECK_FALSE(PathExists("/dev/shm" + damaged));  // retired: unlinked
  CHECK_THAT(d.Log(), Contains("segment retired"));

  // The session that mapped the damaged segment: a clear error, never a crash.
  auto refused = SaveRank(*old, kJob, 3, 0, 4, 63);
  INFO(refused.status().ToString());
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(refused.status().message()), Contains("truncated"));
  // A new client in this process maps the new segment and saves.
  auto fresh = d.Connect();
  for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(*fresh, kJob, 3, r, 4, 63).ok());
  REQUIRE(fresh->WaitCommitted(kJob, 3, 30000).ok());
  CHECK(VerifyInProcess(d, kJob, 3, 63) == "");
}

TEST_CASE("arena damage: a checkpoint staged in a segment truncated before its flush aborts",
          "[integration][trust]") {
  Daemon d(DaemonConfig{.extra_flags = {"--debug_flush_delay_ms=1500"}});
  auto client = d.Connect();
  for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(*client, kJob, 1, r, 4, 71).ok());
  Truncate(d.ArenaName());
  absl::Status st = client->WaitCommitted(kJob, 1, 30000);
  INFO(st.ToString() << "\nlog:\n" << d.Log());
  CHECK(st.code() == absl::StatusCode::kAborted);
  // The flush read the damaged segment under the memory guard (or the kernel refused the write
  // from it): the reason names the flush.
  CHECK_THAT(std::string(st.message()), Contains("flushing rank"));
  // The daemon serves on: a new client stages into a new segment.
  auto fresh = d.Connect();
  for (uint32_t r = 0; r < 4; ++r) REQUIRE(SaveRank(*fresh, kJob, 2, r, 4, 72).ok());
  REQUIRE(fresh->WaitCommitted(kJob, 2, 30000).ok());
  CHECK(VerifyInProcess(d, kJob, 2, 72) == "");
}
