// The store's catalog: checkpoints that other daemons committed to the shared store (the remote
// tier), adopted into this node's index so that they list, inspect and load here like its own.
//
// When: at start, recovery scans every job on the store (recovery.h step 3); while the daemon
// runs, a client's question about a job scans that job's directory first — a Load of "latest",
// Latest, the first page of ListCheckpoints (ListJobs: every job), and GetStatus, Inspect or a
// Load of a step this node has no row of. The scan runs on StoreDiscovery's thread and the caller
// waits at most store_discovery_wait_ms for it, then answers from the index either way: a store
// that is slow or down delays an answer by that bound, and never fails it.
//
// Adopting (job, step) (AdoptFromStore): the key is claimed in rewriting_ ("being adopted from
// the store") only while this node has no row of it and no save, reshard or rewrite holds it, so
// neither a Save nor a Delete of the key races the adoption; the manifest is read from the store
// and verified (framing, checksums, and that it names the checkpoint); it is indexed COMMITTED on
// the remote tier alone (IndexCommitted: synced, with its item rows and a DURABLE upload row) —
// or, committed at the peer tier (the manifest's blobs_on_nodes), on its nodes and peers, the
// store holding its manifest and no blob (StoreTiersOf);
// the claim is released. The job's owner is the one the manifest records (mapped to a uid here,
// common/owner_map.h), claimed if the job has none here; a manifest whose owner maps to no uid
// here, or to another than the job's here, is not adopted (PERMISSION_DENIED, a problem naming
// both). A checkpoint this node has a row of is never adopted: its row is this
// node's own word (a node that took part in a checkpoint spanning nodes learns its commit from
// the cluster protocol, service/cluster.cc). A manifest that does not verify is not adopted (a
// problem naming it; the scan goes on).
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/names.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<bool> CheckpointService::AdoptFromStore(const std::string& job, uint64_t step) {
  CKPTD_CHECK(remote_.enabled());
  const Key key{job, step};
  {
    absl::MutexLock lock(&mu_);
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> row,
                           ReadRowLocked(key, /*corrupt_is_error=*/false));
    if (row || pending_.contains(key) || reshards_.contains(key) || rewriting_.contains(key)) {
      return false;
    }
    rewriting_.emplace(key, "being adopted from the store");
    KeyChangedLocked(key);
  }
  absl::StatusOr<Manifest> m = ReadManifest(*remote_.remote(), job, step);
  absl::StatusOr<bool> adopted = false;
  if (m.ok()) {
    // Its owner first (owners.cc): the one its manifest records, mapped to a uid here; refused
    // when the job here belongs to another uid.
    absl::Status indexed = AdoptOwner(*m);
    if (indexed.ok()) {
      indexed = IndexCommitted(*m, CheckpointDir(job, step), StoreTiersOf(*m));
    }
    if (indexed.ok()) {
      adopted = true;
    } else {
      adopted = indexed;
    }
  } else if (!absl::IsNotFound(m.status())) {  // no manifest: not committed (yet), not adopted
    adopted = Annotate(m.status(), absl::StrCat(CkptName(job, step), " on ",
                                                remote_.remote()->Describe(), " not adopted"));
  }
  {
    absl::MutexLock lock(&mu_);
    rewriting_.erase(key);
    KeyChangedLocked(key);
    changed_.SignalAll();
  }
  if (adopted.ok() && *adopted) {
    spdlog::info("adopted {} from its manifest on {}", CkptName(job, step),
                 remote_.remote()->Describe());
  }
  return adopted;
}

absl::Status CheckpointService::ScanStore(const std::string& scope,
                                          const std::function<void(std::string)>& problem) {
  Storage& store = *remote_.remote();
  const std::function<void(std::string)> report =
      problem ? problem : [](std::string what) { spdlog::warn("store catalog: {}", what); };
  return ForEachCheckpointDir(store, scope, report,
                              [&](const std::string& job, uint64_t step) -> absl::Status {
                                // One checkpoint that cannot be adopted is its own problem; the
                                // scan goes on.
                                absl::StatusOr<bool> adopted = AdoptFromStore(job, step);
                                if (!adopted.ok()) report(std::string(adopted.status().message()));
                                return absl::OkStatus();
                              });
}

absl::StatusOr<std::optional<v1::CheckpointRecord>> CheckpointService::ReadRecordOrAdopt(
    const std::string& job, uint64_t step, bool corrupt_is_error) {
  auto read = [&] { return corrupt_is_error ? GetRecord(job, step) : ReadRecord(job, step); };
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, read());
  if (rec || !remote_.enabled()) return rec;
  RefreshFromStore(job, /*force=*/true);
  return read();
}

void CheckpointService::RefreshFromStore(const std::string& scope, bool force) {
  if (!remote_.enabled() || deps_.options->store_discovery_wait_ms == 0) return;
  absl::Status st =
      discovery_.Refresh(scope, absl::Milliseconds(deps_.options->store_discovery_wait_ms), force);
  if (st.ok()) return;
  // A store that stays down answers every question this way: one warning per
  // kDiscoveryWarnIntervalMs, the rest at debug level.
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  int64_t last = last_discovery_warn_ms_.load(std::memory_order_relaxed);
  const bool warn = now_ms - last >= static_cast<int64_t>(limits::kDiscoveryWarnIntervalMs) &&
                    last_discovery_warn_ms_.compare_exchange_strong(last, now_ms);
  spdlog::log(
      warn ? spdlog::level::warn : spdlog::level::debug,
      "checkpoints on {} {}: answering from this node's index: {}", remote_.remote()->Describe(),
      scope.empty() ? std::string("of every job") : absl::StrCat("of job ", scope), st.ToString());
}

}  // namespace ckptd
