// The checkpoint lifecycle (service/pending_checkpoint.h): its legal paths, what clients see in
// each phase, and replicated items stored once.
#include "service/pending_checkpoint.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <utility>

namespace ckptd {
namespace {

TEST_CASE("lifecycle: the legal paths of a checkpoint and what clients see", "[unit]") {
  PendingCheckpoint p("job", 1);
  p.world_size = 2;
  CHECK(p.api_state() == v1::STAGING);
  PendingRank r0;
  p.AddRank(0, std::move(r0));
  CHECK(p.staging());
  CHECK_FALSE(p.ready_to_commit());
  p.AddRank(1, PendingRank{});
  CHECK(p.phase() == CheckpointPhase::kPersisting);  // every rank staged
  CHECK(p.api_state() == v1::PERSISTING);
  for (auto& [r, pr] : p.ranks) {
    CHECK_FALSE(pr.journaled());
    pr.Transition(RankPhase::kJournaling, RankPhase::kJournaled);
    pr.Transition(RankPhase::kJournaled, RankPhase::kFlushing);
    CHECK(pr.flushing());
    pr.Transition(RankPhase::kFlushing, RankPhase::kPersisted);
  }
  CHECK(p.ready_to_commit());
  p.Transition(CheckpointPhase::kPersisting, CheckpointPhase::kCommitting);
  CHECK_FALSE(p.idle());  // a commit in flight pins it
  CHECK(p.api_state() == v1::PERSISTING);
  p.Transition(CheckpointPhase::kCommitting, CheckpointPhase::kCommitted);
  CHECK(p.api_state() == v1::COMMITTED);

  PendingCheckpoint q("job", 2);
  q.world_size = 4;
  q.AddRank(3, PendingRank{});
  q.Transition(CheckpointPhase::kStaging, CheckpointPhase::kAborting);
  CHECK(q.api_state() == v1::ABORTED);
  ++q.flushes_in_flight;
  CHECK_FALSE(q.idle());  // the abort waits for the flush
  --q.flushes_in_flight;
  CHECK(q.idle());
  q.Transition(CheckpointPhase::kAborting, CheckpointPhase::kAborted);
}

TEST_CASE("lifecycle: replicas are stored once, by the first rank staging the region", "[unit]") {
  PendingCheckpoint p("job", 1);
  p.world_size = 2;
  for (uint32_t r = 0; r < 2; ++r) {
    PendingRank pr;
    v1::StagedShard* sh = pr.rec.add_shards();
    sh->mutable_spec()->set_item("obj");
    sh->mutable_spec()->mutable_object()->set_scope(v1::REPLICATED);
    sh->mutable_spec()->mutable_data()->set_length(8);
    CHECK(p.AddRank(r, std::move(pr)) == 8);
  }
  CHECK_FALSE(p.ranks.at(0).rec.shards(0).replica());
  CHECK(p.ranks.at(1).rec.shards(0).replica());
  CHECK(p.items.at("obj").first_rank == 0);
  CHECK(p.stored_copy.size() == 1);
}

}  // namespace
}  // namespace ckptd
