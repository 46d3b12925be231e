#include "format/reshard_spec.h"

#include <fnmatch.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"

namespace ckptd {
namespace {

constexpr uint64_t kPartsMax = limits::kWorldSizeMax;

std::string Trim(std::string_view s) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size())));
}

bool ParseCount(std::string_view s, uint32_t* out) {
  uint64_t v = 0;
  if (!absl::SimpleAtoi(Trim(s), &v) || v < 1 || v > kPartsMax) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

// Parses `layout` into *rule; an empty string when fine, else what was expected.
std::string ParseLayout(const std::string& layout, ReshardRule* rule) {
  if (layout == "consolidated") {
    rule->kind = ReshardRule::kConsolidated;
    return "";
  }
  size_t colon = layout.find(':');
  if (colon == std::string::npos) {
    return "expected consolidated, rows:N, cols:N, dimD:N, flat:N or grid:AxB";
  }
  const std::string head = Trim(std::string_view(layout).substr(0, colon));
  const std::string tail = Trim(std::string_view(layout).substr(colon + 1));
  const std::string count_error = absl::StrFormat("block count must be 1..%d", kPartsMax);
  uint32_t n = 0;
  if (head == "grid") {
    rule->kind = ReshardRule::kGrid;
    uint64_t total = 1;
    for (absl::string_view part : absl::StrSplit(tail, 'x')) {
      if (!ParseCount(std::string(part), &n)) return count_error + " in each grid dimension";
      total *= n;
      if (total > kPartsMax) return absl::StrFormat("a grid has at most %d blocks", kPartsMax);
      rule->parts.push_back(n);
    }
    if (rule->parts.size() > limits::kTensorDimsMax) return "a grid has at most 16 dimensions";
    return "";
  }
  if (!ParseCount(tail, &n)) return count_error;
  rule->parts = {n};
  if (head == "rows") {
    rule->kind = ReshardRule::kDim;
    rule->dim = 0;
  } else if (head == "cols") {
    rule->kind = ReshardRule::kLastDim;
  } else if (head == "flat") {
    rule->kind = ReshardRule::kFlat;
  } else if (head.size() > 3 && head.rfind("dim", 0) == 0 &&
             absl::SimpleAtoi(head.substr(3), &rule->dim) && rule->dim < limits::kTensorDimsMax) {
    rule->kind = ReshardRule::kDim;
  } else {
    return absl::StrFormat(
        "unknown layout \"%s\"; expected rows, cols, dimD (D < 16), flat or "
        "grid",
        head);
  }
  return "";
}

// Block i of n over [0, len).
std::pair<uint64_t, uint64_t> Block(uint64_t len, uint32_t n, uint32_t i) {
  // len * i fits: len <= kTensorElementsMax (2^56) and i < 2^16 would overflow, so divide first.
  auto at = [&](uint32_t k) { return len / n * k + len % n * k / n; };
  return {at(i), at(i + 1) - at(i)};
}

constexpr size_t kNoDim = SIZE_MAX;

v1::Region BoxRegion(std::span<const uint64_t> shape, const std::vector<uint32_t>& parts,
                     const std::vector<size_t>& dims, uint32_t index) {
  v1::Region r;
  v1::Box* box = r.mutable_box();
  std::vector<uint64_t> off(shape.size(), 0), len(shape.begin(), shape.end());
  bool empty = false;
  for (size_t k = parts.size(); k-- > 0;) {  // row-major numbering of the grid's blocks
    uint32_t i = index % parts[k];
    index /= parts[k];
    if (dims[k] == kNoDim) {  // a grid dim the tensor lacks: block 0 holds everything
      empty = empty || i != 0;
      continue;
    }
    std::tie(off[dims[k]], len[dims[k]]) = Block(shape[dims[k]], parts[k], i);
  }
  if (empty && !shape.empty()) len[0] = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    box->add_offsets(off[d]);
    box->add_lengths(len[d]);
  }
  return r;
}

}  // namespace

absl::StatusOr<ReshardSpec> ParseReshardSpec(std::string_view text) {
  ReshardSpec spec;
  spec.text = Trim(text);
  if (spec.text.empty()) {
    return absl::InvalidArgumentError("reshard spec is empty; e.g. \"consolidated\" or \"rows:4\"");
  }
  if (spec.text.size() > 4096) {
    return absl::InvalidArgumentError("reshard spec is longer than 4096 bytes");
  }
  int index = 0;
  for (absl::string_view raw : absl::StrSplit(spec.text, ';')) {
    ++index;
    std::string rule_text = Trim(std::string_view(raw.data(), raw.size()));
    if (rule_text.empty()) continue;  // a trailing ';'
    ReshardRule rule;
    std::string layout = rule_text;
    size_t eq = rule_text.find('=');
    if (eq != std::string::npos) {
      rule.pattern = Trim(std::string_view(rule_text).substr(0, eq));
      layout = Trim(std::string_view(rule_text).substr(eq + 1));
    }
    std::string problem =
        rule.pattern.empty() ? "empty item pattern before '='" : ParseLayout(layout, &rule);
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("reshard spec \"%s\": rule %d \"%s\": %s",
                                                        spec.text, index, rule_text, problem));
    }
    spec.rules.push_back(std::move(rule));
  }
  if (spec.rules.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("reshard spec \"%s\" has no rules", spec.text));
  }
  return spec;
}

const ReshardRule* MatchRule(const ReshardSpec& spec, std::string_view item) {
  std::string name(item);
  for (const ReshardRule& r : spec.rules) {
    if (fnmatch(r.pattern.c_str(), name.c_str(), 0) == 0) return &r;
  }
  return nullptr;
}

uint32_t RuleWorldSize(const ReshardRule& rule) {
  uint32_t n = 1;
  for (uint32_t p : rule.parts) n *= p;
  return rule.kind == ReshardRule::kConsolidated ? 1 : n;
}

std::vector<std::pair<uint32_t, v1::Region>> TargetRegions(const ReshardSpec& spec,
                                                           std::string_view item,
                                                           std::span<const uint64_t> shape) {
  const ReshardRule* rule = MatchRule(spec, item);
  std::vector<std::pair<uint32_t, v1::Region>> out;
  uint64_t numel = 1;
  for (uint64_t d : shape) numel *= d;
  if (rule == nullptr || rule->kind == ReshardRule::kConsolidated || shape.empty()) {
    if (numel > 0) out.emplace_back(0, v1::Region());
    return out;
  }
  const uint32_t n = RuleWorldSize(*rule);
  std::vector<size_t> dims;
  if (rule->kind == ReshardRule::kDim) dims = {std::min<size_t>(rule->dim, shape.size() - 1)};
  if (rule->kind == ReshardRule::kLastDim) dims = {shape.size() - 1};
  if (rule->kind == ReshardRule::kGrid) {
    for (size_t k = 0; k < rule->parts.size(); ++k) dims.push_back(k < shape.size() ? k : kNoDim);
  }
  for (uint32_t i = 0; i < n; ++i) {
    v1::Region r;
    uint64_t elems = 0;
    if (rule->kind == ReshardRule::kFlat) {
      auto [start, count] = Block(numel, n, i);
      r.mutable_flat()->set_start(start);
      r.mutable_flat()->set_count(count);
      elems = count;
    } else {
      r = BoxRegion(shape, rule->parts, dims, i);
      elems = 1;
      for (uint64_t l : r.box().lengths()) elems *= l;
    }
    if (elems > 0) out.emplace_back(i, std::move(r));
  }
  return out;
}

}  // namespace ckptd
