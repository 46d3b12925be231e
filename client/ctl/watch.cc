#include "watch.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_escape.h"
#include "table.h"

namespace ckptctl {

namespace v1 = ckptd::v1;

namespace {

using Key = std::tuple<std::string, uint64_t, std::string>;
using ckptd::JsonString;

// Weight of the newest poll's rate in the smoothed rate.
constexpr double kRateWeight = 0.5;

}  // namespace

std::string WatchModel::Bar(uint64_t done, uint64_t total, int width) {
  const int filled = total == 0 ? 0
                                : static_cast<int>(std::min<uint64_t>(done, total) *
                                                   static_cast<uint64_t>(width) / total);
  return absl::StrCat("[", std::string(filled, '#'), std::string(width - filled, '-'), "]");
}

std::string WatchModel::Duration(double seconds) {
  const auto s = static_cast<uint64_t>(std::max(0.0, std::round(seconds)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

std::string WatchModel::Render(const Progress& p, double rate, std::optional<double> eta_s) {
  const uint64_t pct = p.total == 0 ? 0 : std::min<uint64_t>(p.done, p.total) * 100 / p.total;
  std::string line =
      absl::StrFormat("%s/%d  %-10s %-6s %s %s / %s %3d%%", p.job, p.step, p.phase, p.tier,
                      Bar(p.done, p.total, 24), HumanBytes(p.done), HumanBytes(p.total), pct);
  absl::StrAppend(&line, "  ", rate > 0 ? HumanBytes(static_cast<uint64_t>(rate)) + "/s" : "-/s");
  absl::StrAppend(&line, "  ETA ", eta_s.has_value() ? Duration(*eta_s) : "-");
  if (p.tier == "local") {
    absl::StrAppend(&line, "  ranks ", p.ranks_staged, "/", p.world_size);
    if (!p.missing_ranks.empty()) {
      std::vector<uint32_t> shown(
          p.missing_ranks.begin(),
          p.missing_ranks.begin() + static_cast<long>(std::min<size_t>(p.missing_ranks.size(), 8)));
      absl::StrAppend(&line, " (missing ", absl::StrJoin(shown, ","),
                      p.missing_ranks.size() > shown.size() ? ",..." : "", ")");
    }
  }
  if (!p.note.empty()) absl::StrAppend(&line, "  ", p.note);
  return line;
}

std::vector<WatchLine> WatchModel::Update(double now_s, const std::vector<Progress>& in_flight,
                                          const std::map<Key, std::string>& ended) {
  std::vector<WatchLine> lines;
  std::map<Key, Seen> next;
  for (const Progress& p : in_flight) {
    const Key key{p.job, p.step, p.tier};
    Seen s;
    if (auto it = seen_.find(key); it != seen_.end()) {
      s = it->second;
      const double dt = now_s - s.last_s;
      if (dt > 0 && p.done >= s.last_done) {
        const double r = static_cast<double>(p.done - s.last_done) / dt;
        s.rate = s.has_rate ? kRateWeight * r + (1 - kRateWeight) * s.rate : r;
        s.has_rate = true;
      }
    } else {
      s.first_s = now_s;
    }
    s.last_s = now_s;
    s.last_done = p.done;
    WatchLine line;
    line.p = p;
    line.rate = s.has_rate ? s.rate : 0;
    if (line.rate > 0 && p.total >= p.done) {
      line.eta_s = static_cast<double>(p.total - p.done) / line.rate;
    }
    line.elapsed_s = now_s - s.first_s;
    line.text = Render(p, line.rate, line.eta_s);
    lines.push_back(std::move(line));
    next[key] = s;
  }
  for (const auto& [key, state] : ended) {
    auto it = seen_.find(key);
    if (it == seen_.end() || next.contains(key)) continue;
    WatchLine line;
    line.p.job = std::get<0>(key);
    line.p.step = std::get<1>(key);
    line.p.tier = std::get<2>(key);
    line.final_state = state;
    line.elapsed_s = now_s - it->second.first_s;
    line.text = absl::StrFormat("%s/%d  %s (%s; watched for %s)", line.p.job, line.p.step, state,
                                line.p.tier, Duration(line.elapsed_s));
    lines.push_back(std::move(line));
  }
  seen_ = std::move(next);
  return lines;
}

std::vector<Key> WatchModel::Keys() const {
  std::vector<Key> keys;
  keys.reserve(seen_.size());
  for (const auto& [k, s] : seen_) keys.push_back(k);
  return keys;
}

namespace {

// The checkpoints of `jobs` in flight, each with its status (local) or its upload (remote).
absl::Status Poll(Context& ctx, const std::vector<std::string>& jobs, std::vector<Progress>* out) {
  for (const std::string& job : jobs) {
    absl::StatusOr<v1::ListCheckpointsResponse> listed = AllCheckpoints(ctx, job);
    if (absl::IsNotFound(listed.status())) continue;  // deleted meanwhile
    if (!listed.ok()) return listed.status();
    for (const v1::CheckpointSummary& c : listed->checkpoints()) {
      if (c.state() == v1::STAGING || c.state() == v1::PERSISTING) {
        v1::GetStatusRequest sr;
        sr.set_job(job);
        sr.set_step(c.step());
        v1::CheckpointStatus st;
        absl::Status got = Call(ctx, ctx.rpc_timeout_ms, [&](grpc::ClientContext* cc) {
          return ctx.stub->GetStatus(cc, sr, &st);
        });
        if (absl::IsNotFound(got)) continue;  // ended meanwhile
        if (!got.ok()) return got;
        Progress p{.job = job,
                   .step = c.step(),
                   .phase = st.summary().state() == v1::STAGING ? "staging" : "persisting",
                   .tier = "local",
                   .done = st.bytes_persisted(),
                   .total = std::max(st.bytes_staged(), st.summary().bytes())};
        p.ranks_staged = static_cast<uint32_t>(st.ranks_size());
        p.world_size = st.summary().world_size();
        p.missing_ranks.assign(st.missing_ranks().begin(), st.missing_ranks().end());
        if (!st.summary().origin().empty()) p.note = st.summary().origin();
        out->push_back(std::move(p));
      }
      const v1::Upload& u = c.tiers().upload();
      if (c.state() == v1::COMMITTED && c.tiers().has_upload() && u.state() != v1::UPLOAD_DURABLE) {
        Progress p{.job = job,
                   .step = c.step(),
                   .phase = u.state() == v1::UPLOAD_RUNNING    ? "uploading"
                            : u.state() == v1::UPLOAD_RETRYING ? "retrying"
                            : u.state() == v1::UPLOAD_REFUSED  ? "refused"
                                                               : "pending",
                   .tier = "remote",
                   .done = u.bytes_done(),
                   .total = u.bytes_total()};
        if (u.state() == v1::UPLOAD_RETRYING || u.state() == v1::UPLOAD_REFUSED) {
          p.note = absl::StrCat(u.attempts(), " failed: ", u.error());
        }
        out->push_back(std::move(p));
      }
    }
  }
  return absl::OkStatus();
}

// How a checkpoint that left the set in flight ended, in words.
std::string EndedAs(Context& ctx, const Key& key) {
  v1::GetStatusRequest req;
  req.set_job(std::get<0>(key));
  req.set_step(std::get<1>(key));
  v1::CheckpointStatus st;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->GetStatus(c, req, &st); });
  if (absl::IsNotFound(s)) return "deleted";
  if (!s.ok()) return absl::StrCat("unknown (", s.message(), ")");
  if (std::get<2>(key) == "remote") {
    return st.summary().tiers().remote() ? "durable on the remote tier"
                                         : "upload no longer tracked";
  }
  std::string state = v1::CheckpointState_Name(st.summary().state());
  if (!st.summary().error().empty()) absl::StrAppend(&state, ": ", st.summary().error());
  return state;
}

std::string LineJson(const WatchLine& l) {
  std::string out = absl::StrCat("{\"job\": ", JsonString(l.p.job), ", \"step\": ", l.p.step,
                                 ", \"tier\": ", JsonString(l.p.tier));
  if (!l.final_state.empty()) {
    absl::StrAppend(&out, ", \"ended\": ", JsonString(l.final_state),
                    absl::StrFormat(", \"elapsed_s\": %.3f}", l.elapsed_s));
    return out;
  }
  absl::StrAppend(&out, ", \"phase\": ", JsonString(l.p.phase), ", \"bytes_done\": ", l.p.done,
                  ", \"bytes_total\": ", l.p.total,
                  absl::StrFormat(", \"rate_bytes_per_s\": %.0f", l.rate));
  if (l.eta_s.has_value()) absl::StrAppend(&out, absl::StrFormat(", \"eta_s\": %.1f", *l.eta_s));
  if (l.p.tier == "local") {
    absl::StrAppend(&out, ", \"ranks_staged\": ", l.p.ranks_staged,
                    ", \"world_size\": ", l.p.world_size, ", \"missing_ranks\": [",
                    absl::StrJoin(l.p.missing_ranks, ", "), "]");
  }
  if (!l.p.note.empty()) absl::StrAppend(&out, ", \"note\": ", JsonString(l.p.note));
  absl::StrAppend(&out, absl::StrFormat(", \"elapsed_s\": %.3f}", l.elapsed_s));
  return out;
}

}  // namespace

absl::Status Watch(Context& ctx, const WatchOptions& o, std::ostream& out) {
  WatchModel model;
  const auto start = std::chrono::steady_clock::now();
  size_t drawn = 0;                      // tty: lines drawn by the last poll, redrawn in place
  std::map<Key, std::string> last_text;  // plain: what each key printed last
  bool first = true;
  while (true) {
    std::vector<std::string> jobs;
    if (!o.job.empty()) {
      jobs.push_back(o.job);
    } else {
      absl::StatusOr<v1::ListJobsResponse> all = AllJobs(ctx);
      if (!all.ok()) return all.status();
      for (const v1::JobSummary& j : all->jobs()) jobs.push_back(j.job());
    }
    std::vector<Progress> in_flight;
    absl::Status polled = Poll(ctx, jobs, &in_flight);
    if (!polled.ok()) return polled;
    std::set<Key> now_keys;
    for (const Progress& p : in_flight) now_keys.insert({p.job, p.step, p.tier});
    std::map<Key, std::string> ended;
    for (const Key& k : model.Keys()) {
      if (!now_keys.contains(k)) ended[k] = EndedAs(ctx, k);
    }
    const double now_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<WatchLine> lines = model.Update(now_s, in_flight, ended);
    if (ctx.json) {
      for (const WatchLine& l : lines) out << LineJson(l) << "\n";
    } else if (o.tty) {
      // Back to the first live line drawn last time; the ended lines first (they stay: the next
      // redraw starts below them), then the live ones, each cleared to its end.
      if (drawn > 0) out << "\x1b[" << drawn << "F";
      drawn = 0;
      for (const WatchLine& l : lines) {
        if (!l.final_state.empty()) out << l.text << "\x1b[K\n";
      }
      if (lines.empty() && first) out << "nothing in flight\x1b[K\n";
      for (const WatchLine& l : lines) {
        if (l.final_state.empty()) {
          out << l.text << "\x1b[K\n";
          ++drawn;
        }
      }
      out << "\x1b[J";
    } else {
      for (const WatchLine& l : lines) {
        const Key key{l.p.job, l.p.step, l.p.tier};
        // A line whose text did not change since it was last printed is not repeated.
        if (l.final_state.empty() && last_text[key] == l.text) continue;
        out << l.text << "\n";
        if (l.final_state.empty()) {
          last_text[key] = l.text;
        } else {
          last_text.erase(key);
        }
      }
      if (lines.empty() && first) out << "nothing in flight\n";
    }
    out.flush();
    first = false;
    if (o.until_idle && in_flight.empty()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  }
}

}  // namespace ckptctl
