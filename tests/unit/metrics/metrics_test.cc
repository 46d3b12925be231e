// Metrics (metrics/metrics.h) in process: what a scrape serializes after events, the job label
// bound, and the levels read at scrape time.
#include "metrics/metrics.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace ckptd {
namespace {

std::string Scrape(const Metrics& m) {
  std::vector<prometheus::MetricFamily> families;
  for (const std::weak_ptr<prometheus::Collectable>& c : m.Collectables()) {
    if (auto live = c.lock()) {
      for (prometheus::MetricFamily& f : live->Collect()) families.push_back(std::move(f));
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

bool Has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST_CASE("Metrics: events become samples with bounded labels", "[unit]") {
  Metrics m;
  m.Save("a", absl::StatusCode::kOk, 100, 0.01);
  m.Save("a", absl::StatusCode::kResourceExhausted, 0, 0.5);
  m.Load("a", absl::StatusCode::kOk, Metrics::LoadBytes{.local = 10, .ram = 30}, 0.2);
  m.CheckpointEnded("a", "committed", 1.5);
  m.CheckpointEnded("a", "corrupt", -1);
  m.Flushed("local", 4096, 0.25);
  m.ChecksumFailure("ram");
  m.Rpc("Save", absl::StatusCode::kOk, 0.001);
  const std::string text = Scrape(m);
  INFO(text);
  CHECK(Has(text, "ckptd_saves_total{ckpt_job=\"a\",code=\"OK\"} 1"));
  CHECK(Has(text, "ckptd_saves_total{ckpt_job=\"a\",code=\"RESOURCE_EXHAUSTED\"} 1"));
  CHECK(Has(text, "ckptd_staged_bytes_total{ckpt_job=\"a\"} 100"));
  CHECK(Has(text, "ckptd_load_bytes_total{ckpt_job=\"a\",tier=\"local\"} 10"));
  CHECK(Has(text, "ckptd_load_bytes_total{ckpt_job=\"a\",tier=\"ram\"} 30"));
  CHECK(text.find("tier=\"remote\"") == std::string::npos);  // nothing from it: no series
  CHECK(Has(text, "ckptd_checkpoints_total{ckpt_job=\"a\",outcome=\"corrupt\"} 1"));
  CHECK(Has(text, "ckptd_checkpoint_seconds_count{outcome=\"committed\"} 1"));
  CHECK(text.find("ckptd_checkpoint_seconds_count{outcome=\"corrupt\"}") == std::string::npos);
  CHECK(Has(text, "ckptd_flush_bytes_total{tier=\"local\"} 4096"));
  CHECK(Has(text, "ckptd_checksum_failures_total{where=\"ram\"} 1"));
  CHECK(Has(text, "ckptd_rpc_duration_seconds_count{code=\"OK\",method=\"Save\"} 1"));
  // No levels until the daemon sets where they come from.
  CHECK(text.find("ckptd_sessions") == std::string::npos);
}

TEST_CASE("Metrics: jobs past kJobLabelsMax share the label _other", "[unit]") {
  Metrics m;
  for (size_t i = 0; i < Metrics::kJobLabelsMax + 10; ++i) {
    m.Save(absl::StrCat("job", i), absl::StatusCode::kOk, 1, 0);
  }
  m.Save("job0", absl::StatusCode::kOk, 1, 0);  // labelled before the bound: keeps its label
  const std::string text = Scrape(m);
  CHECK(Has(text, "ckptd_staged_bytes_total{ckpt_job=\"job0\"} 2"));
  CHECK(Has(text, absl::StrCat("ckptd_staged_bytes_total{ckpt_job=\"job",
                               Metrics::kJobLabelsMax - 1, "\"} 1")));
  CHECK(Has(text, "ckptd_staged_bytes_total{ckpt_job=\"_other\"} 10"));
  CHECK(text.find(absl::StrCat("ckpt_job=\"job", Metrics::kJobLabelsMax, "\"")) ==
        std::string::npos);
}

TEST_CASE("Metrics: levels are read at each scrape", "[unit]") {
  Metrics m;
  uint64_t sessions = 3;
  m.SetLevels([&] {
    Metrics::Levels l;
    l.arena_capacity_bytes = 1000;
    l.arena_free_bytes = 400;
    l.sessions = sessions;
    l.reserve_waits = 2;
    l.reserve_wait_seconds = 0.5;
    l.queued = {{"rpc", 7}};
    return l;
  });
  std::string text = Scrape(m);
  INFO(text);
  CHECK(Has(text, "ckptd_sessions 3"));
  CHECK(Has(text, "ckptd_arena_bytes{state=\"used\"} 600"));
  CHECK(Has(text, "ckptd_arena_bytes{state=\"free\"} 400"));
  CHECK(Has(text, "ckptd_reserve_waits_total 2"));
  CHECK(Has(text, "ckptd_reserve_wait_seconds_total 0.5"));
  CHECK(Has(text, "ckptd_queued_calls{pool=\"rpc\"} 7"));
  sessions = 5;
  CHECK(Has(Scrape(m), "ckptd_sessions 5"));
}

}  // namespace
}  // namespace ckptd
