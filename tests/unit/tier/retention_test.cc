// tier/retention.h: the retention plan per tier, and the two rules no plan breaks (a local copy
// whose upload is under way stays; the newest checkpoint keeps a durable copy).
#include "tier/retention.h"

#include <catch2/catch.hpp>
#include <random>

namespace ckptd {
namespace {

std::string Render(const std::vector<RetentionStep>& plan) {
  std::string out;
  for (const RetentionStep& s : plan) {
    out += std::to_string(s.step) + ":" + RetentionActionName(s.action) + " ";
  }
  return out;
}

TEST_CASE("retention: keep_local and keep_remote per tier", "[unit]") {
  // Newest first: 5..1, every one local and durable remotely.
  std::vector<RetainedCheckpoint> all;
  for (uint64_t s = 5; s >= 1; --s) all.push_back({.step = s, .local = true, .remote = true});
  CHECK(Render(PlanRetention(all, 0, 0)).empty());
  CHECK(Render(PlanRetention(all, 2, 0)) == "3:drop local 2:drop local 1:drop local ");
  CHECK(Render(PlanRetention(all, 0, 3)) == "2:drop remote 1:drop remote ");
  // Past both: deleted.
  CHECK(Render(PlanRetention(all, 1, 3)) == "4:drop local 3:drop local 2:delete 1:delete ");
  auto plan = PlanRetention(all, 1, 3);
  CHECK(plan[0].why == "local copy 2 of keep_local 1");
  CHECK(plan[2].why == "local copy 4 of keep_local 1; remote copy 4 of keep_remote 3");
}

TEST_CASE("retention: keep_every milestones keep every copy and count among the newest", "[unit]") {
  std::vector<RetainedCheckpoint> all;
  for (uint64_t s = 9; s >= 1; --s) all.push_back({.step = s, .local = true, .remote = true});
  // keep_local 2: 9 and 8 (a milestone of 4); 4 is a milestone too; the rest drop their local copy.
  CHECK(Render(PlanRetention(all, 2, 0, 4)) ==
        "7:drop local 6:drop local 5:drop local 3:drop local 2:drop local 1:drop local ");
  // Past both counts: deleted, but never a milestone.
  CHECK(Render(PlanRetention(all, 1, 1, 3)) ==
        "8:delete 7:delete 5:delete 4:delete 2:delete 1:delete ");
  // keep_every 0: none.
  CHECK(Render(PlanRetention(all, 8, 0, 0)) == "1:drop local ");
}

TEST_CASE("retention: a copy that is the only durable one goes only with its checkpoint",
          "[unit]") {
  std::vector<RetainedCheckpoint> c = {
      {.step = 9, .local = true},                          // newest, local only
      {.step = 8, .local = true, .upload_pending = true},  // upload under way: stays
      {.step = 7, .local = true},                          // local only: deleted
      {.step = 6, .local = false, .remote = true},         // remote only, within keep_remote
      {.step = 5, .local = false, .remote = true},         // remote only, past it: deleted
  };
  CHECK(Render(PlanRetention(c, 1, 1)) == "7:delete 5:delete ");
  // Ranks count per tier: 6 is the newest remote copy, so keep_remote 1 keeps it.
}

TEST_CASE("retention: random histories never leave the newest without a copy", "[unit]") {
  std::mt19937_64 rng(1234);
  for (int round = 0; round < 2000; ++round) {
    std::vector<RetainedCheckpoint> c;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      RetainedCheckpoint r{.step = static_cast<uint64_t>(100 - i)};
      r.local = rng() % 3 != 0;
      r.remote = rng() % 2 == 0;
      if (!r.local && !r.remote) r.local = true;  // COMMITTED: durable somewhere
      r.upload_pending = r.local && !r.remote && rng() % 2 == 0;
      c.push_back(r);
    }
    const uint32_t keep_local = static_cast<uint32_t>(rng() % 4);
    const uint32_t keep_remote = static_cast<uint32_t>(rng() % 4);
    INFO("round " << round);
    for (const RetentionStep& s : PlanRetention(c, keep_local, keep_remote)) {
      const RetainedCheckpoint& r =
          *std::find_if(c.begin(), c.end(), [&](const auto& x) { return x.step == s.step; });
      if (s.step == c.front().step) CHECK(s.action != RetentionAction::kDelete);
      if (r.upload_pending) CHECK(s.action != RetentionAction::kDropLocal);
      if (r.upload_pending) CHECK(s.action != RetentionAction::kDelete);
      if (s.action == RetentionAction::kDropLocal) CHECK(r.remote);
      if (s.action == RetentionAction::kDropRemote) CHECK(r.local);
    }
  }
}

}  // namespace
}  // namespace ckptd
