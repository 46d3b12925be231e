// Metrics: the daemon's Prometheus metrics, kept in one prometheus-cpp registry that the metrics
// endpoint (rpc/metrics_server.h, option metrics_address) serves. Events are recorded where they
// happen (the RPC layer, the service's save, load and commit paths, the flush); levels (arena and
// RAM-tier bytes, sessions, checkpoints in flight, queue depths) are read at scrape time through
// a LevelsFn, so nothing polls.
//
// Names and labels are the contract with deploy/grafana-dashboard.json (tests/deploy checks that
// every query names a metric exported here). Label sets are bounded: `method` and `code` by the
// API, `pool`, `tier`, `outcome` and `where` by this file, `ckpt_job` (the checkpoint's job; not
// `job`, which Prometheus gives every scraped series) by kJobLabelsMax (jobs beyond it share the
// label "_other"); steps are never labels.
//
// Thread safety: every method may be called from any thread at once (prometheus-cpp's counters,
// gauges and histograms are atomic; the family maps and the job labels have their own locks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ckptd {

class Metrics {
 public:
  // Jobs that get a label of their own; later ones are counted under "_other".
  static constexpr size_t kJobLabelsMax = 256;

  // What the daemon holds right now, read at each scrape.
  struct Levels {
    uint64_t arena_capacity_bytes = 0;
    uint64_t arena_free_bytes = 0;
    uint64_t ram_tier_hot_bytes = 0;
    uint64_t ram_tier_provisional_bytes = 0;
    uint64_t ram_tier_budget_bytes = 0;
    uint64_t ram_tier_hot_checkpoints = 0;
    uint64_t ram_tier_evictions = 0;
    uint64_t sessions = 0;
    uint64_t checkpoints_in_flight = 0;
    uint64_t reserve_waits = 0;  // reservations that waited for arena space, since start
    double reserve_wait_seconds = 0;
    // Reservations waiting now, by the budget that holds them back, and the bytes they ask.
    uint64_t reserve_waiting_arena_bytes = 0;  // the arena's bytes
    uint64_t reserve_waiting_uid_share = 0;    // their uid's share (uid_arena_share_percent)
    uint64_t reserve_waiting_bytes = 0;
    uint64_t arena_prefault_left_bytes = 0;  // the arena's background faulting, still to do
    std::vector<std::pair<std::string, uint64_t>> queued;  // (pool, calls waiting)
  };
  using LevelsFn = std::function<Levels()>;

  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // What the endpoint serves: the registry of the events and the levels' collectable.
  std::vector<std::weak_ptr<prometheus::Collectable>> Collectables() const;
  // Where levels come from (main sets it once the service exists; until then none are exported).
  void SetLevels(LevelsFn fn);

  // --- events ---------------------------------------------------------------------------------
  // One RPC answered: its latency by method and status code.
  void Rpc(std::string_view method, absl::StatusCode code, double seconds);
  // A rank's Save answered (staged or refused): by job and code; `bytes` staged when OK; the
  // call's latency is the daemon's share of the save stall.
  void Save(std::string_view job, absl::StatusCode code, uint64_t bytes, double seconds);
  // A checkpoint ended: outcome "committed", "aborted" or "corrupt" (a committed one whose
  // manifest no longer verifies); `seconds` from its first rank's Save to the end (for
  // committed: the time to durable), or < 0 when that does not apply (corrupt).
  void CheckpointEnded(std::string_view job, std::string_view outcome, double seconds);
  // A Load answered, by job and code, with the bytes it took from each tier.
  struct LoadBytes {
    uint64_t local = 0;   // read from local storage
    uint64_t remote = 0;  // read from the remote tier
    uint64_t peer = 0;    // read from other nodes' peer stores
    uint64_t ram = 0;     // copied from the RAM tier
    uint64_t prefetched = 0;
  };
  void Load(std::string_view job, absl::StatusCode code, const LoadBytes& bytes, double seconds);
  // A reshard target ended: "committed" or "aborted".
  void Reshard(std::string_view job, std::string_view outcome);
  // A rank's blob written and synced to `tier` ("local" or "remote"): bytes and seconds.
  void Flushed(std::string_view tier, uint64_t bytes, double seconds);
  // A load whose bytes did not verify, by where they were: "ram" (a hot copy's checksum failed;
  // the load fell back to storage) or "storage" (the load failed DATA_LOSS).
  void ChecksumFailure(std::string_view where);
  // The peer channel (peer/; docs/PEERS.md): bytes by the other node's id and what happened to
  // them: "received" (PutBlob chunks read), "stored" (copies verified and kept), "served"
  // (GetBlob bytes sent). Nodes beyond kJobLabelsMax share the label "_other".
  void PeerBytes(std::string_view node, std::string_view what, uint64_t bytes);

 private:
  class LevelsCollectable;
  std::string JobLabel(std::string_view job) ABSL_LOCKS_EXCLUDED(jobs_mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<LevelsCollectable> levels_;

  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& saves_;
  prometheus::Family<prometheus::Histogram>& save_seconds_;
  prometheus::Family<prometheus::Counter>& staged_bytes_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Family<prometheus::Histogram>& commit_seconds_;
  prometheus::Family<prometheus::Counter>& loads_;
  prometheus::Family<prometheus::Counter>& load_bytes_;
  prometheus::Family<prometheus::Histogram>& load_seconds_;
  prometheus::Family<prometheus::Counter>& reshards_;
  prometheus::Family<prometheus::Counter>& flush_bytes_;
  prometheus::Family<prometheus::Counter>& flush_seconds_;
  prometheus::Family<prometheus::Counter>& checksum_failures_;
  prometheus::Family<prometheus::Counter>& peer_bytes_;

  absl::Mutex jobs_mu_;
  absl::flat_hash_set<std::string> job_labels_ ABSL_GUARDED_BY(jobs_mu_);   // labelled jobs
  absl::flat_hash_set<std::string> node_labels_ ABSL_GUARDED_BY(jobs_mu_);  // labelled peers
};

}  // namespace ckptd
