// Shared by the fuzzers (tests/fuzz/*_fuzz.cc): a CHECK that names the broken property, reference
// versions of the format code's arithmetic computed the slow, obvious way (128-bit, element by
// element), fuzzer-chosen shapes and regions, and a checker for load plans.
// Everything here is single-threaded test code; a failed property aborts, which libFuzzer reports
// as a crash and saves the input.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckptd/v1/common.pb.h"
#include "common/limits.h"
#include "format/load_plan.h"
#include "format/manifest.h"

namespace ckptd::fuzz {

// Aborts, printing the property and a printf-style explanation, unless `cond` holds.
#define FUZZ_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "fuzz property failed: %s at %s:%d: ", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                      \
      std::fputc('\n', stderr);                                                               \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

using u128 = unsigned __int128;

// Shapes up to this many elements are "small": the checks enumerate their elements.
inline constexpr uint64_t kSmallElementsMax = 4096;

// --- reference arithmetic ------------------------------------------------------------------------

// NumElements as its header states it: nullopt for more than kTensorDimsMax dims, a dim above
// kTensorElementsMax or a product (of the non-zero dims) above it; 0 if a dim is 0.
std::optional<uint64_t> RefNumElements(std::span<const uint64_t> shape);

// ValidateRegion as its header states it.
bool RefRegionValid(const v1::Region& region, std::span<const uint64_t> shape);

// Elements of a valid region, in 128 bits.
u128 RefRegionElements(const v1::Region& region, std::span<const uint64_t> shape);

// Row-major index in the global tensor of element `i` of a valid region's buffer
// (i < its elements).
uint64_t GlobalIndex(const v1::Region& region, std::span<const uint64_t> shape, uint64_t i);

// GlobalIndex of every element of the region's buffer, in buffer order.
std::vector<uint64_t> RefElements(const v1::Region& region, std::span<const uint64_t> shape);

// Bytes per element of the known dtypes; 0 for others.
uint32_t RefDTypeSize(int dtype);

// --- fuzzer-chosen values ------------------------------------------------------------------------

// A value near `hint`: at most hint, just below or above it, a power of two nearby, or any uint64
// (so both valid and barely invalid values come up often).
uint64_t ConsumeNear(FuzzedDataProvider& fdp, uint64_t hint);

// A shape: small (at most 4 dims of at most 8, so at most kSmallElementsMax elements) or, when
// `wild`, up to kTensorDimsMax + 1 dims of any size.
std::vector<uint64_t> ConsumeShape(FuzzedDataProvider& fdp, bool wild);

// A region for `shape`: whole, a box or a flat range, usually valid; when `wild`, often not
// (values near the bounds, wrong number of dims).
v1::Region ConsumeRegion(FuzzedDataProvider& fdp, std::span<const uint64_t> shape, bool wild);

// --- load plans ----------------------------------------------------------------------------------

// Whether PlanLoad must accept `options` for checksum blocks of `block_bytes` (load_plan.h).
bool RefPlanOptionsValid(uint64_t block_bytes, const PlanOptions& options);

// Whether every element the tensor request asks for is held by some shard of its item (requests
// of objects are always held).
bool RefRequestCovered(const PlanRequest& request);

// Checks a plan PlanLoad returned for a valid manifest against what load_plan.h promises: runs
// sorted, disjoint, inside their blobs, aligned and at most max_run_bytes; checks inside their
// runs and shards; every copy reads bytes of a shard of the request's item (the request's object
// shard) that a check of the same run verifies, and lands them where the same elements of the
// requested region go; every requested byte is written exactly once; byte counts add up.
// The requests must be small (CheckPlan keeps a counter per requested byte).
void CheckPlan(const Manifest& m, std::span<const PlanRequest> requests, const PlanOptions& options,
               const LoadPlan& plan);

// The manifest `m` encoded, decoded and compared with itself (item by item, serialized). `m` must
// be valid and small.
void CheckRoundTrip(const Manifest& m);

}  // namespace ckptd::fuzz
