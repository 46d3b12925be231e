#include "metrics/metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace ckptd {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Seconds: 100 µs to 10 min, roughly ×2.5 apart.
const Histogram::BucketBoundaries& SecondsBuckets() {
  static const Histogram::BucketBoundaries* const kBuckets = new Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
      0.25,   0.5,     1,      2.5,   5,      10,    25,   60,    150,  600};
  return *kBuckets;
}

std::string CodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

prometheus::ClientMetric Level(double value, std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help,
                                     std::vector<prometheus::ClientMetric> metrics) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = prometheus::MetricType::Gauge;
  f.metric = std::move(metrics);
  return f;
}

// A counter kept elsewhere (the arena, the RAM tier), read at the scrape.
prometheus::MetricFamily Total(std::string name, std::string help, double value) {
  prometheus::MetricFamily f = GaugeFamily(std::move(name), std::move(help), {Level(0, {})});
  f.type = prometheus::MetricType::Counter;
  f.metric[0].counter.value = value;
  return f;
}

}  // namespace

// The levels, read from the daemon at each scrape.
class Metrics::LevelsCollectable : public prometheus::Collectable {
 public:
  void Set(LevelsFn fn) {
    absl::MutexLock lock(&mu_);
    fn_ = std::move(fn);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    LevelsFn fn;
    {
      absl::MutexLock lock(&mu_);
      fn = fn_;
    }
    if (!fn) return {};
    const Levels l = fn();
    const double used = static_cast<double>(l.arena_capacity_bytes - l.arena_free_bytes);
    std::vector<prometheus::MetricFamily> out;
    out.push_back(
        GaugeFamily("ckptd_arena_bytes",
                    "Staging arena bytes, used (extents held, hot copies included) and free",
                    {Level(used, {{"state", "used"}}),
                     Level(static_cast<double>(l.arena_free_bytes), {{"state", "free"}})}));
    out.push_back(GaugeFamily("ckptd_arena_capacity_bytes",
                              "Bytes the staging arena's extents can use",
                              {Level(static_cast<double>(l.arena_capacity_bytes), {})}));
    out.push_back(GaugeFamily(
        "ckptd_ram_tier_bytes",
        "RAM tier bytes: hot (committed checkpoints kept for restores) and provisional (saves in "
        "flight that become hot at commit)",
        {Level(static_cast<double>(l.ram_tier_hot_bytes), {{"state", "hot"}}),
         Level(static_cast<double>(l.ram_tier_provisional_bytes), {{"state", "provisional"}})}));
    out.push_back(GaugeFamily("ckptd_ram_tier_budget_bytes", "The RAM tier's budget",
                              {Level(static_cast<double>(l.ram_tier_budget_bytes), {})}));
    out.push_back(GaugeFamily("ckptd_ram_tier_checkpoints", "Checkpoints hot in the RAM tier",
                              {Level(static_cast<double>(l.ram_tier_hot_checkpoints), {})}));
    out.push_back(Total("ckptd_ram_tier_evictions_total",
                        "Checkpoints evicted from the RAM tier since start",
                        static_cast<double>(l.ram_tier_evictions)));
    out.push_back(Total("ckptd_reserve_waits_total",
                        "Reservations that waited for staging arena space (done or timed out)",
                        static_cast<double>(l.reserve_waits)));
    out.push_back(Total("ckptd_reserve_wait_seconds_total",
                        "Seconds reservations spent waiting for staging arena space",
                        l.reserve_wait_seconds));
    out.push_back(GaugeFamily(
        "ckptd_reserve_waiting",
        "Reservations waiting for staging arena space now, by the budget that holds them back: "
        "arena_bytes (every range reserved, staged and not yet persisted, or hot and pinned) or "
        "uid_share (uid_arena_share_percent)",
        {Level(static_cast<double>(l.reserve_waiting_arena_bytes), {{"budget", "arena_bytes"}}),
         Level(static_cast<double>(l.reserve_waiting_uid_share), {{"budget", "uid_share"}})}));
    out.push_back(GaugeFamily(
        "ckptd_arena_prefault_left_bytes",
        "Arena bytes the background faulting has still to fault in (0: done; a save before then "
        "faults what it reserves itself, a slower first save)",
        {Level(static_cast<double>(l.arena_prefault_left_bytes), {})}));
    out.push_back(GaugeFamily("ckptd_reserve_waiting_bytes",
                              "Bytes the reservations waiting now ask for, together",
                              {Level(static_cast<double>(l.reserve_waiting_bytes), {})}));
    out.push_back(GaugeFamily("ckptd_sessions", "Client sessions open",
                              {Level(static_cast<double>(l.sessions), {})}));
    out.push_back(GaugeFamily("ckptd_checkpoints_in_flight",
                              "Checkpoints being saved (staging, flushing or committing)",
                              {Level(static_cast<double>(l.checkpoints_in_flight), {})}));
    std::vector<prometheus::ClientMetric> queued;
    queued.reserve(l.queued.size());
    for (const auto& [pool, n] : l.queued) {
      queued.push_back(Level(static_cast<double>(n), {{"pool", pool}}));
    }
    out.push_back(GaugeFamily("ckptd_queued_calls",
                              "Work waiting for a thread, by pool (RPC pools, flush, load)",
                              std::move(queued)));
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  LevelsFn fn_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      levels_(std::make_shared<LevelsCollectable>()),
      rpc_seconds_(BuildHistogram()
                       .Name("ckptd_rpc_duration_seconds")
                       .Help("RPC latency in the daemon (queueing included), by method and code")
                       .Register(*registry_)),
      saves_(BuildCounter()
                 .Name("ckptd_saves_total")
                 .Help("Rank saves answered, by job and code (OK: staged)")
                 .Register(*registry_)),
      save_seconds_(BuildHistogram()
                        .Name("ckptd_save_stage_seconds")
                        .Help("The daemon's share of a rank's save stall: Save received to staged")
                        .Register(*registry_)),
      staged_bytes_(BuildCounter()
                        .Name("ckptd_staged_bytes_total")
                        .Help("Bytes staged by rank saves, by job")
                        .Register(*registry_)),
      checkpoints_(BuildCounter()
                       .Name("ckptd_checkpoints_total")
                       .Help("Checkpoints ended, by job and outcome (committed, aborted, corrupt)")
                       .Register(*registry_)),
      commit_seconds_(BuildHistogram()
                          .Name("ckptd_checkpoint_seconds")
                          .Help("First rank's Save to the checkpoint's end (committed: the time "
                                "to durable), by outcome")
                          .Register(*registry_)),
      loads_(BuildCounter()
                 .Name("ckptd_loads_total")
                 .Help("Load calls answered, by job and code")
                 .Register(*registry_)),
      load_bytes_(BuildCounter()
                      .Name("ckptd_load_bytes_total")
                      .Help("Bytes loads took, by job and tier (local, remote: read from storage; "
                            "ram: copied from the RAM tier; prefetched: read into it by a hint)")
                      .Register(*registry_)),
      load_seconds_(BuildHistogram()
                        .Name("ckptd_load_seconds")
                        .Help("Load call latency in the daemon")
                        .Register(*registry_)),
      reshards_(BuildCounter()
                    .Name("ckptd_reshards_total")
                    .Help("Offline reshards ended, by job and outcome")
                    .Register(*registry_)),
      flush_bytes_(BuildCounter()
                       .Name("ckptd_flush_bytes_total")
                       .Help("Bytes of rank blobs written and synced, by tier (local, remote); "
                             "referenced: bytes of unchanged shards that deltas referenced in an "
                             "earlier checkpoint's blob instead of writing them")
                       .Register(*registry_)),
      flush_seconds_(BuildCounter()
                         .Name("ckptd_flush_seconds_total")
                         .Help("Seconds spent writing and syncing rank blobs, by tier (bytes / "
                               "seconds: the flush rate)")
                         .Register(*registry_)),
      checksum_failures_(BuildCounter()
                             .Name("ckptd_checksum_failures_total")
                             .Help("Loads whose bytes did not verify, by where they were (ram: a "
                                   "hot copy, the load fell back to storage; storage: DATA_LOSS)")
                             .Register(*registry_)),
      peer_bytes_(BuildCounter()
                      .Name("ckptd_peer_bytes_total")
                      .Help("Bytes of the peer channel by the other node (peer) and what "
                            "happened to them (received, stored, served)")
                      .Register(*registry_)) {
  // Series an operator alerts on exist from the start (at 0), so rate() and increase() see the
  // first event.
  for (const char* where : {"ram", "storage"}) checksum_failures_.Add({{"where", where}});
  flush_bytes_.Add({{"tier", "local"}});
  flush_seconds_.Add({{"tier", "local"}});
}

Metrics::~Metrics() = default;

std::vector<std::weak_ptr<prometheus::Collectable>> Metrics::Collectables() const {
  return {registry_, levels_};
}

void Metrics::SetLevels(LevelsFn fn) { levels_->Set(std::move(fn)); }

std::string Metrics::JobLabel(std::string_view job) {
  std::string name(job);
  absl::MutexLock lock(&jobs_mu_);
  if (job_labels_.contains(name)) return name;
  if (job_labels_.size() >= kJobLabelsMax) return "_other";
  job_labels_.insert(name);
  return name;
}

void Metrics::Rpc(std::string_view method, absl::StatusCode code, double seconds) {
  rpc_seconds_.Add({{"method", std::string(method)}, {"code", CodeName(code)}}, SecondsBuckets())
      .Observe(seconds);
}

void Metrics::Save(std::string_view job, absl::StatusCode code, uint64_t bytes, double seconds) {
  const std::string label = JobLabel(job);
  saves_.Add({{"ckpt_job", label}, {"code", CodeName(code)}}).Increment();
  if (code != absl::StatusCode::kOk) return;
  staged_bytes_.Add({{"ckpt_job", label}}).Increment(static_cast<double>(bytes));
  save_seconds_.Add({}, SecondsBuckets()).Observe(seconds);
}

void Metrics::CheckpointEnded(std::string_view job, std::string_view outcome, double seconds) {
  checkpoints_.Add({{"ckpt_job", JobLabel(job)}, {"outcome", std::string(outcome)}}).Increment();
  if (seconds < 0) return;
  commit_seconds_.Add({{"outcome", std::string(outcome)}}, SecondsBuckets()).Observe(seconds);
}

void Metrics::Load(std::string_view job, absl::StatusCode code, const LoadBytes& bytes,
                   double seconds) {
  const std::string label = JobLabel(job);
  loads_.Add({{"ckpt_job", label}, {"code", CodeName(code)}}).Increment();
  load_seconds_.Add({}, SecondsBuckets()).Observe(seconds);
  const std::pair<const char*, uint64_t> tiers[] = {{"local", bytes.local},
                                                    {"remote", bytes.remote},
                                                    {"peer", bytes.peer},
                                                    {"ram", bytes.ram},
                                                    {"prefetched", bytes.prefetched}};
  for (const auto& [tier, n] : tiers) {
    if (n > 0)
      load_bytes_.Add({{"ckpt_job", label}, {"tier", tier}}).Increment(static_cast<double>(n));
  }
}

void Metrics::Reshard(std::string_view job, std::string_view outcome) {
  reshards_.Add({{"ckpt_job", JobLabel(job)}, {"outcome", std::string(outcome)}}).Increment();
}

void Metrics::Flushed(std::string_view tier, uint64_t bytes, double seconds) {
  flush_bytes_.Add({{"tier", std::string(tier)}}).Increment(static_cast<double>(bytes));
  flush_seconds_.Add({{"tier", std::string(tier)}}).Increment(seconds);
}

void Metrics::ChecksumFailure(std::string_view where) {
  checksum_failures_.Add({{"where", std::string(where)}}).Increment();
}

void Metrics::PeerBytes(std::string_view node, std::string_view what, uint64_t bytes) {
  std::string label(node);
  {
    absl::MutexLock lock(&jobs_mu_);
    if (!node_labels_.contains(label)) {
      if (node_labels_.size() >= kJobLabelsMax) {
        label = "_other";
      } else {
        node_labels_.insert(label);
      }
    }
  }
  peer_bytes_.Add({{"peer", label}, {"what", std::string(what)}})
      .Increment(static_cast<double>(bytes));
}

}  // namespace ckptd
