// Target layouts of an offline reshard (ckptctl reshard / the Reshard RPC). Pure code.
//
// Grammar (whitespace around tokens is ignored):
//   spec    := rule { ";" rule }
//   rule    := [ pattern "=" ] layout        pattern: a glob over item names (fnmatch(3));
//                                             no pattern means "*"
//   layout  := "consolidated"                 one shard holding the whole tensor
//            | "rows:" N                      N blocks along dim 0
//            | "cols:" N                      N blocks along the last dim
//            | "dim" D ":" N                  N blocks along dim D
//            | "flat:" N                      N flat ranges of the row-major elements
//            | "grid:" N0 "x" N1 { "x" Nk }   N0 blocks along dim 0 times N1 along dim 1 ...
// The first rule whose pattern matches a tensor's name applies; a tensor no rule matches keeps
// consolidated. Blocks are as even as possible: block i of N over a length len is
// [len * i / N, len * (i + 1) / N). "dimD" beyond a tensor's dims means its last dim; grid
// dims a tensor lacks put the whole extent in block 0 of that grid dim; a 0-d tensor is always
// one shard. Block i of a tensor belongs to target rank i (grids
// number blocks row-major), so the target world size is the largest N (product for grids) any
// rule produces, and at least the source's when it has per-rank objects.
// Examples: "consolidated", "rows:4", "*.bias=consolidated; *=grid:2x4".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ckptd/v1/common.pb.h"

namespace ckptd {

struct ReshardRule {
  enum Kind { kConsolidated, kDim, kLastDim, kFlat, kGrid };
  std::string pattern = "*";
  Kind kind = kConsolidated;
  uint32_t dim = 0;             // kDim
  std::vector<uint32_t> parts;  // kDim, kLastDim, kFlat: one count; kGrid: one per leading dim
};

struct ReshardSpec {
  std::vector<ReshardRule> rules;
  std::string text;  // as given, for status and the manifest's record of its origin
};

// INVALID_ARGUMENT naming the offending rule and what was expected, e.g.
//   reshard spec "rows:0": rule 1 "rows:0": block count must be 1..65536
absl::StatusOr<ReshardSpec> ParseReshardSpec(std::string_view text);

// The rule applying to `item` (nullptr: consolidated).
const ReshardRule* MatchRule(const ReshardSpec& spec, std::string_view item);

// The target shards of a tensor: (target rank, region), non-empty regions only, ranks ascending.
std::vector<std::pair<uint32_t, v1::Region>> TargetRegions(const ReshardSpec& spec,
                                                           std::string_view item,
                                                           std::span<const uint64_t> shape);

// Target ranks the rule produces (product of parts; 1 for consolidated).
uint32_t RuleWorldSize(const ReshardRule& rule);

}  // namespace ckptd
