// Helpers of the tests of checkpoints spanning nodes (multi_node_test.cc, remote_s3_test.cc).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "harness.h"
#include "testclient/rank_io.h"

namespace ckptd_it {

// A client of `d` whose saves span nodes: `local_world_size` of their ranks save through `d`.
inline std::unique_ptr<ckptd::Client> ConnectNode(
    const Daemon& d, uint32_t local_world_size,
    ckptd::TierPolicy policy = ckptd::TierPolicy::kLocalAndRemote) {
  ckptd::ClientOptions o;
  o.socket_path = d.socket();
  o.tier_policy = policy;
  o.local_world_size = local_world_size;
  auto c = ckptd::Client::Connect(o);
  if (!c.ok()) return nullptr;
  return *std::move(c);
}

// Polls the status of (job, step) until what it waits for mentions `what` (the status then), or
// `timeout_ms` (DEADLINE_EXCEEDED with the last status).
inline absl::StatusOr<ckptd::CheckpointInfo> WaitForWaiting(ckptd::Client& c,
                                                            const std::string& job, uint64_t step,
                                                            const std::string& what,
                                                            int timeout_ms) {
  std::string last;
  for (int waited = 0; waited < timeout_ms; waited += 50) {
    auto st = c.GetStatus(job, step);
    if (st.ok() && st->waiting_for.find(what) != std::string::npos) return st;
    last = st.ok() ? st->waiting_for : st.status().ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("not waiting for \"", what, "\" after ", timeout_ms, " ms; last: ", last));
}

// Loads the last third of the rows of the first tensor of (job, step) from `d` (a daemon that has
// no local copy): "" when it is bit-exact, read from the store alone and within 1.05x the
// needed bytes (4 KiB-rounded); else what was wrong.
inline std::string CheckPartialLoadFromStore(const Daemon& d, const std::string& job, uint64_t step,
                                             uint64_t seed) {
  const TensorItem& t = StateDict().front();
  std::vector<uint64_t> offsets(t.shape.size(), 0), lengths = t.shape;
  lengths[0] = std::max<uint64_t>(1, t.shape[0] / 3);
  offsets[0] = t.shape[0] - lengths[0];
  std::vector<uint8_t> got(ElementCount(lengths) * ckptd::DTypeSize(t.dtype));
  std::vector<ckptd::LoadTarget> targets = {
      {t.name, ckptd::Region::Box(offsets, lengths), got.data(), got.size()}};
  auto r = d.Connect()->Load(job, step, 0, targets);
  if (!r.ok()) return r.status().ToString();
  if (r->bytes_read_remote != r->bytes_read || r->bytes_read == 0) {
    return absl::StrCat("read ", r->bytes_read, " bytes, ", r->bytes_read_remote,
                        " from the store");
  }
  if (static_cast<double>(r->bytes_read) > 1.05 * static_cast<double>(r->bytes_needed_aligned)) {
    return absl::StrCat("read ", r->bytes_read, " bytes for ", r->bytes_needed_aligned, " needed");
  }
  std::vector<uint8_t> whole = GlobalBytes(t, seed);
  const uint64_t row_bytes = whole.size() / t.shape[0];
  if (!std::equal(got.begin(), got.end(), whole.begin() + offsets[0] * row_bytes)) {
    return "the loaded rows differ from the saved ones";
  }
  return "";
}

}  // namespace ckptd_it
