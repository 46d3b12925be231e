// ckptctl watch's model (client/ctl/watch.h): lines with bars, smoothed rates and ETAs from
// successive polls; one line when a checkpoint leaves the set in flight; durations; and the
// phase timings' human form (table.h HumanMicros).
#include "watch.h"

#include <catch2/catch.hpp>

#include "table.h"

namespace ckptctl {
namespace {

Progress Local(uint64_t done, uint64_t total) {
  return Progress{.job = "run42",
                  .step = 1000,
                  .phase = "persisting",
                  .tier = "local",
                  .done = done,
                  .total = total,
                  .ranks_staged = 3,
                  .world_size = 4,
                  .missing_ranks = {2}};
}

TEST_CASE("watch: bars, durations and phase times", "[unit]") {
  CHECK(WatchModel::Bar(0, 100, 4) == "[----]");
  CHECK(WatchModel::Bar(50, 100, 4) == "[##--]");
  CHECK(WatchModel::Bar(100, 100, 4) == "[####]");
  CHECK(WatchModel::Bar(150, 100, 4) == "[####]");  // never past full
  CHECK(WatchModel::Bar(5, 0, 4) == "[----]");      // total unknown yet
  CHECK(WatchModel::Duration(0.4) == "0s");
  CHECK(WatchModel::Duration(65) == "1m05s");
  CHECK(WatchModel::Duration(7380) == "2h03m");
  CHECK(HumanMicros(0) == "-");
  CHECK(HumanMicros(850) == "850 us");
  CHECK(HumanMicros(12'345) == "12.3 ms");
  CHECK(HumanMicros(2'450'000) == "2.45 s");
  CHECK(HumanMicros(185'000'000) == "3m05s");
}

TEST_CASE("watch: the rate comes from successive polls, smoothed, and gives the ETA", "[unit]") {
  WatchModel m;
  const uint64_t mib = 1 << 20;
  auto first = m.Update(0.0, {Local(0, 100 * mib)}, {});
  REQUIRE(first.size() == 1);
  CHECK(first[0].rate == 0);  // one sample: no rate yet
  CHECK(!first[0].eta_s.has_value());
  CHECK(first[0].text ==
        "run42/1000  persisting local  [------------------------] 0 B / 100.0 MiB   0%  -/s  "
        "ETA -  ranks 3/4 (missing 2)");
  auto second = m.Update(1.0, {Local(20 * mib, 100 * mib)}, {});
  CHECK(second[0].rate == Approx(20.0 * mib));
  REQUIRE(second[0].eta_s.has_value());
  CHECK(*second[0].eta_s == Approx(4.0));
  CHECK(second[0].text.find(" 20% ") != std::string::npos);
  CHECK(second[0].text.find("20.0 MiB/s  ETA 4s") != std::string::npos);
  // 60 MiB in the next second: smoothed half and half (40 MiB/s).
  auto third = m.Update(2.0, {Local(80 * mib, 100 * mib)}, {});
  CHECK(third[0].rate == Approx(40.0 * mib));
  CHECK(*third[0].eta_s == Approx(0.5));
}

TEST_CASE("watch: an ended checkpoint gets one line, and only if it was seen", "[unit]") {
  WatchModel m;
  Progress up{
      .job = "j", .step = 7, .phase = "uploading", .tier = "remote", .done = 5, .total = 10};
  m.Update(0.0, {Local(1, 2), up}, {});
  CHECK(m.Keys().size() == 2);
  // The local part ended (COMMITTED); the upload goes on; an unknown key is ignored.
  std::map<std::tuple<std::string, uint64_t, std::string>, std::string> ended = {
      {{"run42", 1000, "local"}, "COMMITTED"}, {{"other", 1, "local"}, "ABORTED"}};
  auto lines = m.Update(3.0, {up}, ended);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].p.tier == "remote");
  CHECK(lines[0].text.find("ranks") == std::string::npos);  // ranks are the local tier's
  CHECK(lines[1].final_state == "COMMITTED");
  CHECK(lines[1].text == "run42/1000  COMMITTED (local; watched for 3s)");
  CHECK(m.Keys().size() == 1);
  // Seen ended once: not again.
  CHECK(m.Update(4.0, {up}, ended).size() == 1);
}

}  // namespace
}  // namespace ckptctl
