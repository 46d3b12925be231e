#include "service/pending_checkpoint.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "format/region.h"

namespace ckptd {
namespace {

bool LegalStep(CheckpointPhase from, CheckpointPhase to) {
  using P = CheckpointPhase;
  switch (from) {
    case P::kStaging:
      return to == P::kPersisting || to == P::kAborting;
    case P::kPersisting:
      return to == P::kCommitting || to == P::kAwaitingCluster || to == P::kAborting;
    case P::kAwaitingCluster:
      return to == P::kCommitting || to == P::kAborting;
    case P::kCommitting:
      return to == P::kCommitted || to == P::kAborting || to == P::kPersisting ||
             to == P::kAwaitingCluster;
    case P::kAborting:
      return to == P::kAborted;
    case P::kCommitted:
    case P::kAborted:
      return false;
  }
  return false;
}

bool LegalStep(RankPhase from, RankPhase to) {
  using R = RankPhase;
  switch (from) {
    case R::kJournaling:
      return to == R::kJournaled;
    case R::kJournaled:
      return to == R::kFlushing;
    case R::kFlushing:
      return to == R::kPersisted || to == R::kJournaled;
    case R::kPersisted:
      return false;
  }
  return false;
}

[[noreturn]] void IllegalStep(const char* what, const char* actual, const char* from,
                              const char* to) {
  std::fprintf(stderr, "CHECK failed: illegal %s transition %s -> %s (the phase is %s)\n", what,
               from, to, actual);
  std::abort();
}

}  // namespace

std::string StoredCopyKey(const v1::ShardSpec& spec, uint32_t rank) {
  std::string key = spec.item();
  key.push_back('\0');
  if (spec.has_tensor()) {
    std::vector<uint64_t> shape(spec.tensor().global_shape().begin(),
                                spec.tensor().global_shape().end());
    key += RegionKey(spec.tensor().region(), shape);
  } else if (spec.object().scope() == v1::PER_RANK) {
    key += absl::StrCat("rank", rank);
  }
  return key;
}

uint64_t PendingCheckpoint::AddRank(uint32_t r, PendingRank rank) {
  uint64_t bytes = 0;
  for (int i = 0; i < rank.rec.shards_size(); ++i) {
    v1::StagedShard* sh = rank.rec.mutable_shards(i);
    const v1::ShardSpec& s = sh->spec();
    auto inserted = stored_copy.emplace(StoredCopyKey(s, r), std::make_pair(r, size_t(i))).second;
    sh->set_replica(!inserted);
    bytes += s.data().length();
  }
  NoteItems(r, rank.rec);
  rank.rec.set_bytes(bytes);
  ranks.emplace(r, std::move(rank));
  if (ranks.size() == expected_ranks())
    Transition(CheckpointPhase::kStaging, CheckpointPhase::kPersisting);
  return bytes;
}

void PendingCheckpoint::NoteItems(uint32_t r, const v1::RankRecord& rec) {
  for (const v1::StagedShard& sh : rec.shards()) {
    const v1::ShardSpec& s = sh.spec();
    if (items.contains(s.item())) continue;
    ItemMeta m;
    m.kind = s.has_tensor() ? v1::TENSOR : v1::OBJECT;
    if (s.has_tensor()) {
      m.dtype = s.tensor().dtype();
      m.shape.assign(s.tensor().global_shape().begin(), s.tensor().global_shape().end());
    } else {
      m.scope = s.object().scope();
    }
    m.first_rank = r;
    items.emplace(s.item(), std::move(m));
  }
}

const char* CheckpointPhaseName(CheckpointPhase phase) {
  switch (phase) {
    case CheckpointPhase::kStaging:
      return "staging";
    case CheckpointPhase::kPersisting:
      return "persisting";
    case CheckpointPhase::kAwaitingCluster:
      return "awaiting the cluster";
    case CheckpointPhase::kCommitting:
      return "committing";
    case CheckpointPhase::kAborting:
      return "aborting";
    case CheckpointPhase::kCommitted:
      return "committed";
    case CheckpointPhase::kAborted:
      return "aborted";
  }
  return "?";
}

const char* RankPhaseName(RankPhase phase) {
  switch (phase) {
    case RankPhase::kJournaling:
      return "journaling";
    case RankPhase::kJournaled:
      return "journaled";
    case RankPhase::kFlushing:
      return "flushing";
    case RankPhase::kPersisted:
      return "persisted";
  }
  return "?";
}

void PendingRank::Transition(RankPhase from, RankPhase to) {
  if (phase_ != from || !LegalStep(from, to)) {
    IllegalStep("rank", RankPhaseName(phase_), RankPhaseName(from), RankPhaseName(to));
  }
  phase_ = to;
}

void PendingCheckpoint::Transition(CheckpointPhase from, CheckpointPhase to) {
  if (phase_ != from || !LegalStep(from, to)) {
    IllegalStep("checkpoint", CheckpointPhaseName(phase_), CheckpointPhaseName(from),
                CheckpointPhaseName(to));
  }
  phase_ = to;
}

v1::CheckpointState PendingCheckpoint::api_state() const {
  switch (phase_) {
    case CheckpointPhase::kStaging:
      return v1::STAGING;
    case CheckpointPhase::kPersisting:
    case CheckpointPhase::kAwaitingCluster:
    case CheckpointPhase::kCommitting:
      return v1::PERSISTING;
    case CheckpointPhase::kCommitted:
      return v1::COMMITTED;
    case CheckpointPhase::kAborting:
    case CheckpointPhase::kAborted:
      return v1::ABORTED;
  }
  return v1::STAGING;
}

bool PendingCheckpoint::ready_to_commit() const {
  if (ranks.empty() || journals_in_flight > 0) return false;
  if (!partial && ranks.size() < expected_ranks()) return false;
  for (const auto& [r, pr] : ranks) {
    if (!pr.persisted()) return false;
  }
  return true;
}

}  // namespace ckptd
