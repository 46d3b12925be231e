// Repair (peer/replicator.h "Watched parts", docs/PEERS.md "Repair"): the parts this node keeps
// copied, the repair thread's passes, and how one part is checked and copied again.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/v1/cluster.pb.h"
#include "format/names.h"
#include "peer/placement.h"
#include "peer/replicator.h"
#include "spdlog/spdlog.h"

namespace ckptd::peer {

void Replicator::Watch(Part part) {
  absl::MutexLock lock(&mu_);
  auto it = watched_.find(part.job);
  if (it != watched_.end() && it->second.part.step > part.step) return;
  Watched& w = watched_[part.job];
  w.copies = Copies{part.holders, ""};
  w.record_read = false;
  w.part = std::move(part);
}

std::optional<PeerTier::Copies> Replicator::CopiesOf(const std::string& job, uint64_t step) {
  absl::MutexLock lock(&mu_);
  auto it = watched_.find(job);
  if (it == watched_.end() || it->second.part.step != step) return std::nullopt;
  return it->second.copies;
}

void Replicator::RepairLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_) wake_.WaitWithTimeout(&mu_, options_.repair_interval);
      if (stopping_) return;
    }
    RepairPass();
  }
}

void Replicator::RepairPass() {
  std::vector<Watched> parts;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [job, w] : watched_) parts.push_back(w);
  }
  for (Watched& w : parts) {
    const std::string job = w.part.job;
    const uint64_t step = w.part.step;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      auto it = watched_.find(job);
      if (it == watched_.end() || it->second.part.step != step) continue;  // replaced, dropped
      repairing_.emplace(job, step);
    }
    Copies now = Repair(w);
    absl::MutexLock lock(&mu_);
    repairing_.reset();
    auto it = watched_.find(job);
    if (it == watched_.end() || it->second.part.step != step) continue;  // replaced, or dropped
    it->second.copies = std::move(now);
    it->second.record_read = true;
  }
}

std::vector<std::string> Replicator::LiveHolders(const Part& part,
                                                 const std::vector<std::string>& holders,
                                                 std::vector<std::string>* lost) {
  std::vector<std::string> live;
  for (const std::string& node : holders) {
    absl::StatusOr<std::shared_ptr<Client>> c = ClientFor(node);
    absl::StatusOr<std::map<std::string, uint64_t>> held =
        c.ok() ? (*c)->HeldBlobs(part.job, part.step) : c.status();
    if (!held.ok()) {
      lost->push_back(absl::StrCat(node, " (", held.status().message(), ")"));
      continue;
    }
    size_t missing = 0;
    for (const auto& [blob, size] : part.blobs) {
      auto h = held->find(blob);
      // A blob of 0 bytes was never written (its rank stored only replicas): nothing to hold.
      if (size > 0 && (h == held->end() || h->second != size)) ++missing;
    }
    if (missing == 0) {
      live.push_back(node);
    } else {
      lost->push_back(absl::StrCat(node, " (holds ", part.blobs.size() - missing, " of ",
                                   part.blobs.size(), " blobs)"));
    }
  }
  return live;
}

std::vector<std::string> Replicator::RecordedHolders(const Watched& w) {
  std::vector<std::string> holders = w.copies.holders;
  if (!w.record_read) {  // after a restart: where an earlier repair moved the copies
    absl::StatusOr<std::optional<v1::NodeCopies>> rec =
        ReadNodeCopies(shared_, w.part.job, w.part.step, options_.node_id);
    if (rec.ok() && rec->has_value()) {
      holders.assign((*rec)->replica_nodes().begin(), (*rec)->replica_nodes().end());
    }
  }
  return holders;
}

bool Replicator::CopyToNextNodes(const Part& part, std::vector<std::string>* live,
                                 std::vector<std::string>* failed) {
  absl::StatusOr<std::vector<std::string>> registry = Registry();
  std::vector<std::string> ids;
  if (registry.ok()) {
    ids = *std::move(registry);
  } else {
    failed->push_back(std::string(registry.status().message()));
  }
  bool moved = false;
  for (const std::string& node : Candidates(ids)) {
    if (live->size() >= part.replicas) break;
    if (std::find(live->begin(), live->end(), node) != live->end()) continue;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    bool local_failure = false;
    absl::Status st = CopyPart(node, part.job, part.step, part.dir, part.blobs, &local_failure);
    if (st.ok()) {
      live->push_back(node);
      moved = true;
      continue;
    }
    failed->push_back(absl::StrCat(node, ": ", st.message()));
    if (local_failure) break;  // this node's own copy cannot be read: no other node changes it
  }
  return moved;
}

absl::Status Replicator::RecordHolders(const Part& part, const std::vector<std::string>& live) {
  v1::NodeCopies rec;
  rec.set_format_version(1);
  rec.set_job(part.job);
  rec.set_step(part.step);
  rec.set_node(options_.node_id);
  for (const std::string& n : live) rec.add_replica_nodes(n);
  rec.set_written_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  return shared_->PutAtomic(NodeCopiesPath(part.dir, options_.node_id), rec.SerializeAsString());
}

PeerTier::Copies Replicator::Repair(const Watched& w) {
  const Part& part = w.part;
  const std::string what = absl::StrCat(part.job, "/", part.step);
  std::vector<std::string> holders = RecordedHolders(w);
  std::vector<std::string> lost;
  std::vector<std::string> live = LiveHolders(part, holders, &lost);
  if (live.size() >= part.replicas) return Copies{live, ""};
  // Short of copies: the holders the part had at its commit count again if they hold it (a node
  // back from a partition), and are named as lost otherwise.
  std::vector<std::string> earlier;
  for (const std::string& n : part.holders) {
    if (std::find(holders.begin(), holders.end(), n) == holders.end()) earlier.push_back(n);
  }
  for (std::string& n : LiveHolders(part, earlier, &lost)) live.push_back(std::move(n));
  const bool was_degraded = !w.copies.degraded.empty();
  if (!lost.empty() && !was_degraded) {
    spdlog::warn(
        "peer tier: this node's part of {} lost its copy on {}; copying it to the next "
        "nodes",
        what, absl::StrJoin(lost, ", "));
  }
  std::vector<std::string> failed;
  const bool moved = CopyToNextNodes(part, &live, &failed);
  if (moved || live != holders) {
    absl::Status st = RecordHolders(part, live);
    if (!st.ok()) {
      // Written again at the next pass (its holders then still differ from these).
      const std::string why = absl::StrCat("recording its holders on ", shared_->Describe(),
                                           " failed (retried): ", st.message());
      spdlog::warn("peer tier: this node's part of {}: {}", what, why);
      return Copies{holders, why};
    }
  }
  std::string degraded;
  if (live.size() < part.replicas) {
    degraded = absl::StrCat(
        live.size(), " of ", part.replicas, " peer copies",
        lost.empty() ? "" : absl::StrCat("; lost: ", absl::StrJoin(lost, ", ")),
        failed.empty() ? "" : absl::StrCat("; copying (retried): ", absl::StrJoin(failed, "; ")));
    if (!was_degraded) {
      spdlog::warn("peer tier: this node's part of {} is degraded: {}", what, degraded);
    }
  } else if (moved || was_degraded) {
    spdlog::info("peer tier: this node's part of {} is copied again: on {}", what,
                 absl::StrJoin(live, ", "));
  }
  return Copies{live, degraded};
}

}  // namespace ckptd::peer
