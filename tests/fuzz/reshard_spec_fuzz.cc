// The reshard spec parser (format/reshard_spec.h). Input: the spec text up to the first NUL byte;
// the bytes after it choose item names and shapes. Properties:
//  - ParseReshardSpec never crashes; an accepted spec has 1+ rules, each with block counts in
//    1..65536 (a grid's product too, at most 16 grid dims), and parsing its text again gives the
//    same rules;
//  - TargetRegions of any valid shape: ranks ascending, distinct and below the rule's world size;
//    regions valid and non-empty, covering the tensor exactly once (CheckCoverage).
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "format/region.h"
#include "format/reshard_spec.h"
#include "fuzz_util.h"

namespace ckptd::fuzz {
namespace {

bool SameRules(const ReshardSpec& a, const ReshardSpec& b) {
  if (a.rules.size() != b.rules.size()) return false;
  for (size_t i = 0; i < a.rules.size(); ++i) {
    const ReshardRule& x = a.rules[i];
    const ReshardRule& y = b.rules[i];
    if (x.pattern != y.pattern || x.kind != y.kind || x.dim != y.dim || x.parts != y.parts) {
      return false;
    }
  }
  return true;
}

void CheckRules(const ReshardSpec& spec) {
  FUZZ_CHECK(!spec.rules.empty(), "spec \"%s\" has no rules", spec.text.c_str());
  for (const ReshardRule& rule : spec.rules) {
    FUZZ_CHECK(!rule.pattern.empty(), "spec \"%s\": empty pattern", spec.text.c_str());
    u128 product = 1;
    for (uint32_t p : rule.parts) {
      FUZZ_CHECK(p >= 1 && p <= limits::kWorldSizeMax, "spec \"%s\": block count %u",
                 spec.text.c_str(), p);
      product *= p;
    }
    FUZZ_CHECK(product <= limits::kWorldSizeMax && rule.parts.size() <= limits::kTensorDimsMax,
               "spec \"%s\": %zu grid dims", spec.text.c_str(), rule.parts.size());
    FUZZ_CHECK(rule.kind == ReshardRule::kConsolidated ? rule.parts.empty() : !rule.parts.empty(),
               "spec \"%s\": kind %d with %zu counts", spec.text.c_str(), rule.kind,
               rule.parts.size());
    FUZZ_CHECK(rule.kind == ReshardRule::kGrid || rule.parts.size() <= 1, "spec \"%s\": %zu counts",
               spec.text.c_str(), rule.parts.size());
    FUZZ_CHECK(rule.kind != ReshardRule::kDim || rule.dim < limits::kTensorDimsMax,
               "spec \"%s\": dim %u", spec.text.c_str(), rule.dim);
    const uint32_t ws = RuleWorldSize(rule);
    FUZZ_CHECK(ws >= 1 && ws <= limits::kWorldSizeMax, "spec \"%s\": world size %u",
               spec.text.c_str(), ws);
  }
}

void CheckTargets(const ReshardSpec& spec, const std::string& item,
                  const std::vector<uint64_t>& shape, bool big_ok) {
  const std::optional<uint64_t> numel = RefNumElements(shape);
  if (!numel) return;  // TargetRegions takes shapes of valid manifests only
  const ReshardRule* rule = MatchRule(spec, item);
  const uint32_t ws = rule == nullptr ? 1 : RuleWorldSize(*rule);
  // Up to 65536 target regions: fine now and then, too slow for every input.
  if (ws > 4096 && !big_ok) return;
  const auto targets = TargetRegions(spec, item, shape);
  std::vector<v1::Region> regions;
  for (size_t i = 0; i < targets.size(); ++i) {
    const auto& [rank, region] = targets[i];
    FUZZ_CHECK(rank < ws && (i == 0 || targets[i - 1].first < rank),
               "spec \"%s\", item \"%s\" %s: target %zu has rank %u (world size %u)",
               spec.text.c_str(), item.c_str(), DescribeShape(shape).c_str(), i, rank, ws);
    absl::Status valid = ValidateRegion(region, shape);
    FUZZ_CHECK(valid.ok() && RegionElements(region, shape) > 0,
               "spec \"%s\" %s: rank %u gets %s (%s)", spec.text.c_str(),
               DescribeShape(shape).c_str(), rank, DescribeRegion(region).c_str(),
               valid.ToString().c_str());
    regions.push_back(region);
  }
  if (regions.size() > 4096) return;  // the sweep of CheckCoverage is not the subject here
  absl::Status covered = CheckCoverage(shape, regions, item);
  FUZZ_CHECK(covered.ok(), "spec \"%s\", item \"%s\" %s: %s", spec.text.c_str(), item.c_str(),
             DescribeShape(shape).c_str(), covered.ToString().c_str());
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptd;
  using namespace ckptd::fuzz;
  const auto* text_end = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t text_size = text_end == nullptr ? size : static_cast<size_t>(text_end - data);
  const std::string_view text(reinterpret_cast<const char*>(data), text_size);
  absl::StatusOr<ReshardSpec> spec = ParseReshardSpec(text);
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument, "%s",
               spec.status().ToString().c_str());
    return 0;
  }
  CheckRules(*spec);
  absl::StatusOr<ReshardSpec> again = ParseReshardSpec(spec->text);
  FUZZ_CHECK(again.ok() && again->text == spec->text && SameRules(*spec, *again),
             "spec \"%s\" parses differently the second time", spec->text.c_str());

  const size_t rest = text_end == nullptr ? 0 : size - text_size - 1;
  FuzzedDataProvider fdp(data + size - rest, rest);
  const int n = fdp.ConsumeIntegralInRange<int>(1, 4);
  for (int i = 0; i < n; ++i) {
    const std::string item = fdp.ConsumeRandomLengthString(64);
    const std::vector<uint64_t> shape = ConsumeShape(fdp, fdp.ConsumeBool());
    CheckTargets(*spec, item, shape, fdp.ConsumeIntegralInRange<int>(0, 15) == 0);
  }
  return 0;
}
