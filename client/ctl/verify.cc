#include "verify.h"

#include <chrono>
#include <iostream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "json.h"

namespace ckptctl {

namespace v1 = ::ckptd::v1;

namespace {

absl::StatusOr<v1::VerifyTier> ParseTier(const std::string& tier) {
  if (tier.empty()) return v1::VERIFY_TIER_ALL;
  if (tier == "local") return v1::VERIFY_TIER_LOCAL;
  if (tier == "remote") return v1::VERIFY_TIER_REMOTE;
  if (tier == "ram") return v1::VERIFY_TIER_RAM;
  if (tier == "peer") return v1::VERIFY_TIER_PEER;
  return absl::InvalidArgumentError(
      absl::StrCat("--tier needs local, remote, ram or peer, got \"", tier, "\""));
}

// "BAD tier=local item=w rank=1 blob=r00001.blob block=3 offset=12288: crc32c expected 0x..
// actual 0x..".
std::string FailureLine(const v1::VerifyFailure& f) {
  std::string line = absl::StrCat("BAD tier=", f.tier());
  if (!f.item().empty()) absl::StrAppend(&line, " item=", f.item(), " rank=", f.rank());
  absl::StrAppend(&line, " blob=", f.blob());
  if (!f.item().empty()) absl::StrAppend(&line, " block=", f.block(), " offset=", f.offset());
  absl::StrAppend(&line, ": ", f.detail());
  return line;
}

std::string TierLine(const v1::VerifyTierResult& t, uint64_t seed) {
  const std::string sampled = seed == 0
                                  ? ""
                                  : absl::StrCat(" (a sample: ", t.blocks_checked(), " of ",
                                                 t.blocks_total(), " blocks, seed ", seed, ")");
  if (t.blocks_bad() == 0 && t.manifest_ok()) {
    return absl::StrCat(t.tier(), ": ok: ", t.blocks_checked(), " blocks, ", t.bytes_read(),
                        " bytes verified", sampled);
  }
  return absl::StrCat(t.tier(), ": DAMAGED: ", t.blocks_bad(), " of ", t.blocks_checked(),
                      " blocks checked are bad", t.manifest_ok() ? "" : ", its manifest is bad",
                      sampled);
}

}  // namespace

absl::Status Verify(Context& ctx, const VerifyOptions& options, bool* damaged) {
  *damaged = false;
  v1::VerifyRequest req;
  req.set_job(options.job);
  if (options.step) {
    req.set_step(*options.step);
  } else {
    req.set_latest(true);
  }
  req.set_sample(options.sample);
  req.set_seed(options.seed);
  absl::StatusOr<v1::VerifyTier> tier = ParseTier(options.tier);
  if (!tier.ok()) return tier.status();
  req.set_tier(*tier);
  v1::VerifyResponse resp;
  absl::Status s = Call(ctx, options.timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->Verify(c, req, &resp); });
  if (!s.ok()) return s;
  *damaged = resp.failures_total() > 0;
  if (ctx.json) {
    std::cout << MessageJson(resp) << "\n";
    return absl::OkStatus();
  }
  for (const v1::VerifyFailure& f : resp.failures()) std::cout << FailureLine(f) << "\n";
  if (resp.failures_total() > static_cast<uint64_t>(resp.failures_size())) {
    std::cout << "(" << resp.failures_total() - static_cast<uint64_t>(resp.failures_size())
              << " more failures not listed)\n";
  }
  for (const v1::VerifyTierResult& t : resp.tiers()) std::cout << TierLine(t, resp.seed()) << "\n";
  std::cout << options.job << "/" << resp.step() << ": "
            << (*damaged ? absl::StrCat("DAMAGED (", resp.failures_total(), " failures)")
                         : std::string("verified"))
            << "\n";
  return absl::OkStatus();
}

}  // namespace ckptctl
