// The plain types of client.h: dtypes, regions, buffer references, and the copy counters.
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/client.h"
#include "client_core.h"
#include "shard_check.h"

namespace ckptd {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kUInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
    case DType::kUInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
    case DType::kUInt16:
      return 2;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat8E4M3FN:
      return "float8_e4m3fn";
    case DType::kFloat8E5M2:
      return "float8_e5m2";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kUInt16:
      return "uint16";
    case DType::kUInt32:
      return "uint32";
    case DType::kUInt64:
      return "uint64";
  }
  return "unknown";
}

const char* CheckpointStateName(CheckpointState state) {
  switch (state) {
    case CheckpointState::kUnspecified:
      return "UNSPECIFIED";
    case CheckpointState::kStaging:
      return "STAGING";
    case CheckpointState::kPersisting:
      return "PERSISTING";
    case CheckpointState::kCommitted:
      return "COMMITTED";
    case CheckpointState::kAborted:
      return "ABORTED";
    case CheckpointState::kDeleting:
      return "DELETING";
    case CheckpointState::kCorrupt:
      return "CORRUPT";
  }
  return "UNKNOWN";
}

Region Region::Whole() { return Region{}; }

Region Region::Box(std::vector<uint64_t> offsets, std::vector<uint64_t> lengths) {
  Region r;
  r.kind = kBox;
  r.offsets = std::move(offsets);
  r.lengths = std::move(lengths);
  return r;
}

Region Region::Flat(uint64_t start, uint64_t count) {
  Region r;
  r.kind = kFlat;
  r.flat_start = start;
  r.flat_count = count;
  return r;
}

namespace {

absl::StatusOr<uint64_t> Product(std::span<const uint64_t> dims, const char* what) {
  uint64_t n = 1;
  for (uint64_t d : dims) {
    if (d != 0 && n > UINT64_MAX / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " [", absl::StrJoin(dims, ","), "] overflows uint64 elements"));
    }
    n *= d;
  }
  return n;
}

}  // namespace

absl::StatusOr<uint64_t> Region::ElementCount(std::span<const uint64_t> global_shape) const {
  absl::StatusOr<uint64_t> total = Product(global_shape, "shape");
  if (!total.ok()) return total.status();
  const std::string shape = absl::StrCat("[", absl::StrJoin(global_shape, ","), "]");
  switch (kind) {
    case kWhole:
      return *total;
    case kFlat:
      if (flat_start > *total || flat_count > *total - flat_start) {
        return absl::InvalidArgumentError(absl::StrCat("flat region [", flat_start, ", +",
                                                       flat_count, ") outside shape ", shape));
      }
      return flat_count;
    case kBox:
      break;
  }
  if (offsets.size() != global_shape.size() || lengths.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("box with ", offsets.size(), " offsets and ",
                                                   lengths.size(),
                                                   " lengths for a tensor of shape ", shape));
  }
  for (size_t i = 0; i < global_shape.size(); ++i) {
    if (offsets[i] > global_shape[i] || lengths[i] > global_shape[i] - offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "box offsets [", absl::StrJoin(offsets, ","), "] lengths [", absl::StrJoin(lengths, ","),
          "] outside shape ", shape, " in dimension ", i));
    }
  }
  return Product(lengths, "box lengths");
}

BufferRef BufferRef::InArena(const ArenaBuffer& buffer, uint64_t offset) {
  BufferRef r;
  r.kind = kArena;
  r.id = buffer.extent_id;
  r.offset = offset;
  r.generation = buffer.generation;
  return r;
}

BufferRef BufferRef::InRegion(RegionRef region) {
  BufferRef r;
  r.kind = kRegion;
  r.id = region.handle;
  r.offset = region.offset;
  return r;
}

namespace {
std::atomic<uint64_t> g_save_bytes{0};
std::atomic<uint64_t> g_save_calls{0};
std::atomic<uint64_t> g_load_bytes{0};
std::atomic<uint64_t> g_load_calls{0};
}  // namespace

CopyStats Client::copy_stats() {
  CopyStats s;
  s.save_bytes = g_save_bytes.load();
  s.save_calls = g_save_calls.load();
  s.load_bytes = g_load_bytes.load();
  s.load_calls = g_load_calls.load();
  return s;
}

void Client::reset_copy_stats() {
  g_save_bytes = 0;
  g_save_calls = 0;
  g_load_bytes = 0;
  g_load_calls = 0;
}

namespace internal {

absl::StatusOr<uint64_t> TensorBytes(const std::string& item, DType dtype,
                                     const std::vector<uint64_t>& shape, const Region& region) {
  absl::StatusOr<uint64_t> n = region.ElementCount(shape);
  if (!n.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("item ", item, ": ", n.status().message()));
  }
  if (*n > UINT64_MAX / DTypeSize(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", item, ": ", *n, " elements overflow uint64 bytes"));
  }
  return *n * DTypeSize(dtype);
}

absl::Status CheckTensorBytes(const std::string& item, DType dtype,
                              const std::vector<uint64_t>& shape, const Region& region,
                              uint64_t bytes) {
  if (item.empty()) return absl::InvalidArgumentError("tensor shard with an empty item name");
  absl::StatusOr<uint64_t> want = TensorBytes(item, dtype, shape, region);
  if (!want.ok()) return want.status();
  if (*want != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "item ", item, ": region holds ", *want, " bytes of ", DTypeName(dtype), ", got ", bytes));
  }
  return absl::OkStatus();
}

void CountedCopy(void* dst, const void* src, uint64_t bytes, bool is_load) {
  if (bytes == 0) return;
  std::memcpy(dst, src, bytes);
  CountCopy(bytes, is_load);
}

void CountCopy(uint64_t bytes, bool is_load) {
  if (bytes == 0) return;
  (is_load ? g_load_bytes : g_save_bytes).fetch_add(bytes, std::memory_order_relaxed);
  (is_load ? g_load_calls : g_save_calls).fetch_add(1, std::memory_order_relaxed);
}

}  // namespace internal
}  // namespace ckptd
