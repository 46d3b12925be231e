#include "index/committer.h"

#include <utility>

namespace ckptd {
namespace {

uint64_t BatchBytes(const std::vector<MetaStore::Write>& writes) {
  uint64_t bytes = 0;
  for (const MetaStore::Write& w : writes) bytes += w.key.size() + (w.value ? w.value->size() : 0);
  return bytes;
}

}  // namespace

Committer::Ticket Committer::Enqueue(std::string order_key, std::vector<MetaStore::Write> writes) {
  auto w = std::make_shared<Writer>();
  w->order_key = std::move(order_key);
  w->writes = std::move(writes);
  absl::MutexLock lock(&mu_);
  queue_.push_back(w);
  return w;
}

bool Committer::CanLeadLocked() const {
  if (leaders_ >= kLeadersMax) return false;
  for (const Ticket& t : queue_) {
    // The first batch of a key is the only one of it that may go; it goes unless its key is
    // being written. A later batch of a key seen here waits behind the first.
    if (!writing_keys_.contains(t->order_key)) return true;
  }
  return false;
}

std::vector<Committer::Ticket> Committer::TakeGroupLocked() {
  std::vector<Ticket> group;
  absl::flat_hash_set<std::string> skipped;  // keys with a batch left behind in this pass
  uint64_t bytes = 0;
  for (auto it = queue_.begin();
       it != queue_.end() && group.size() < kGroupBatchesMax && bytes < kGroupBytesMax;) {
    const std::string& key = (*it)->order_key;
    if (writing_keys_.contains(key) || skipped.contains(key)) {
      skipped.insert(key);
      ++it;
      continue;
    }
    bytes += BatchBytes((*it)->writes);
    group.push_back(std::move(*it));
    it = queue_.erase(it);
  }
  for (const Ticket& t : group) writing_keys_.insert(t->order_key);
  return group;
}

void Committer::WriteGroupLocked(std::vector<Ticket> group) {
  ++leaders_;
  std::vector<std::vector<MetaStore::Write>> batches;
  batches.reserve(group.size());
  for (Ticket& t : group) batches.push_back(std::move(t->writes));
  mu_.Unlock();
  std::vector<absl::Status> statuses = meta_->CommitGroup(batches, /*sync=*/true);
  mu_.Lock();
  for (size_t i = 0; i < group.size(); ++i) {
    group[i]->status =
        i < statuses.size() ? statuses[i] : absl::InternalError("the index answered no status");
    group[i]->done = true;
    writing_keys_.erase(group[i]->order_key);
  }
  ++groups_;
  batches_ += group.size();
  --leaders_;
}

absl::Status Committer::Await(const Ticket& ticket) {
  struct Args {
    const Committer* self;
    const Writer* w;
  } args{this, ticket.get()};
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](Args* a)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->w->done || a->self->CanLeadLocked(); },
        &args));
    if (ticket->done) return ticket->status;
    // A slot is free: this waiter leads the group at the front (its own batch among them, unless
    // earlier ones fill the group or its key is being written; then it leads or waits again).
    WriteGroupLocked(TakeGroupLocked());
  }
}

uint64_t Committer::groups() const {
  absl::MutexLock lock(&mu_);
  return groups_;
}

uint64_t Committer::batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

}  // namespace ckptd
