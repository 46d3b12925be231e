// `ckptctl verify`: asks the daemon to re-read a committed checkpoint on its tiers and check
// every checksum (the Verify RPC; service/verify.cc in the daemon does the reading), and prints
// what it found: one "BAD ..." line per damaged block (or missing or truncated blob, or damaged
// manifest), naming the tier, item, saving rank, blob, block and byte offset, then one line per
// tier ("local: ok: 120 blocks, 491520 bytes verified"); or, with ctx.json, the answer as one JSON
// document. Scripts read the exit code: ckptctl exits 3 when anything did not verify.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "commands.h"

namespace ckptctl {

struct VerifyOptions {
  std::string job;
  // nullopt: the latest COMMITTED step.
  std::optional<uint64_t> step;
  // The share of checksum blocks to check, in (0, 1] (each shard's first and last always); 0:
  // every block. Default: 0
  double sample = 0;
  // The sample's seed (0: the daemon picks one and it is printed, to repeat the run). Default: 0
  uint64_t seed = 0;
  // "local", "remote" or "ram"; empty: every tier the checkpoint is on. Default: ""
  std::string tier;
  // How long to wait for the daemon's answer (it reads the whole checkpoint). Default: 1 hour
  int64_t timeout_ms = 3600000;
};

// Runs the verify and prints the result. *damaged: something did not verify (the call itself is
// OK then). Errors are the daemon's: NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION (not
// COMMITTED, not on the tier asked for), UNAVAILABLE, INVALID_ARGUMENT (a bad --sample or --tier).
absl::Status Verify(Context& ctx, const VerifyOptions& options, bool* damaged);

}  // namespace ckptctl
