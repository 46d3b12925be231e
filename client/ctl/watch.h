// ckptctl watch: live progress of the checkpoints a daemon is saving and uploading.
//
// Every interval it lists the jobs (or the one named), finds their checkpoints in flight — being
// staged or persisted to the local tier (STAGING, PERSISTING), or COMMITTED with an upload to the
// remote tier not durable yet — and asks each one's status. WatchModel (pure, unit-tested) turns
// those samples into one line per checkpoint and tier: bytes done of the total, a bar, the rate
// (smoothed over polls), the ETA and the ranks staged or missing; and, once a checkpoint leaves
// the set in flight, one line with how it ended. On a terminal the lines are redrawn in place
// (ANSI cursor movement); otherwise (a pipe, a log) each changed line is printed once per poll.
// --json prints one JSON object per line and poll instead.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "commands.h"

namespace ckptctl {

// One checkpoint's progress on one tier, as a poll saw it.
struct Progress {
  std::string job;
  uint64_t step = 0;
  std::string phase;  // "staging", "persisting", "uploading", "retrying", "pending"
  std::string tier;   // "local" or "remote"
  uint64_t done = 0;  // bytes persisted (local) or uploaded (remote)
  uint64_t total = 0;
  uint32_t ranks_staged = 0;  // local: ranks staged so far
  uint32_t world_size = 0;
  std::vector<uint32_t> missing_ranks;  // local: ranks not staged yet
  std::string note;                     // e.g. the upload's last error
};

// One rendered line of a poll: what it shows, and the numbers behind it (--json).
struct WatchLine {
  Progress p;
  double rate = 0;              // bytes per second, smoothed; 0 before two samples
  std::optional<double> eta_s;  // seconds left at that rate; none without a rate
  std::string final_state;      // set once: the checkpoint left the set in flight
  double elapsed_s = 0;         // since the watch first saw it
  std::string text;             // the line as printed
};

class WatchModel {
 public:
  // A poll at `now_s` (seconds, monotonic) that saw `in_flight`; `ended` names the final state
  // (COMMITTED, ABORTED, "durable on the remote tier", "gone") of each key seen at the previous
  // poll and not now, as the caller found out. Returns the lines: one per item of `in_flight`,
  // in order, then one per ended key.
  std::vector<WatchLine> Update(
      double now_s, const std::vector<Progress>& in_flight,
      const std::map<std::tuple<std::string, uint64_t, std::string>, std::string>& ended);
  // The keys (job, step, tier) the last poll saw in flight.
  std::vector<std::tuple<std::string, uint64_t, std::string>> Keys() const;

  // The line of one checkpoint's progress (no trailing newline).
  static std::string Render(const Progress& p, double rate, std::optional<double> eta_s);
  // "[#########---------------]": `width` cells, done/total of them filled.
  static std::string Bar(uint64_t done, uint64_t total, int width);
  // "2s", "1m05s", "2h03m".
  static std::string Duration(double seconds);

 private:
  struct Seen {
    double first_s = 0;
    double last_s = 0;
    uint64_t last_done = 0;
    double rate = 0;
    bool has_rate = false;
  };
  std::map<std::tuple<std::string, uint64_t, std::string>, Seen> seen_;
};

struct WatchOptions {
  std::string job;  // empty: every job
  uint32_t interval_ms = 500;
  bool until_idle = false;  // return once a poll finds nothing in flight (the first included)
  bool tty = false;         // redraw in place
};

// Polls until interrupted (or, with until_idle, idle). Errors: the daemon's.
absl::Status Watch(Context& ctx, const WatchOptions& options, std::ostream& out);

}  // namespace ckptctl
