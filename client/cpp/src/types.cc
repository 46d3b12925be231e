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
#define CKPTD_CLIENT_DTYPE_SIZE(proto, client, name, size, safetensors, numpy_native) \
  case DType::client:                                                                 \
    return size;
    CKPTD_DTYPES(CKPTD_CLIENT_DTYPE_SIZE)
#undef CKPTD_CLIENT_DTYPE_SIZE
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
#define CKPTD_CLIENT_DTYPE_NAME(proto, client, name, size, safetensors, numpy_native) \
  case DType::client:                                                                 \
    return name;
    CKPTD_DTYPES(CKPTD_CLIENT_DTYPE_NAME)
#undef CKPTD_CLIENT_DTYPE_NAME
  }
  return "unknown";
}

const char* DTypeSafetensorsName(DType dtype) {
  switch (dtype) {
#define CKPTD_CLIENT_DTYPE_ST(proto, client, name, size, safetensors, numpy_native) \
  case DType::client:                                                               \
    return safetensors;
    CKPTD_DTYPES(CKPTD_CLIENT_DTYPE_ST)
#undef CKPTD_CLIENT_DTYPE_ST
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromName(std::string_view name) {
#define CKPTD_CLIENT_DTYPE_PARSE(proto, client, dtype_name, size, safetensors, numpy_native) \
  if (name == (dtype_name)) return DType::client;
  CKPTD_DTYPES(CKPTD_CLIENT_DTYPE_PARSE)
#undef CKPTD_CLIENT_DTYPE_PARSE
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", absl::string_view(name.data(), name.size()), "\""));
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
    case CheckpointState::kMissing:
      return "MISSING";
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
std::atomic<uint64_t> g_gpu_fallback_bytes{0};
}  // namespace

CopyStats Client::copy_stats() {
  CopyStats s;
  s.save_bytes = g_save_bytes.load();
  s.save_calls = g_save_calls.load();
  s.load_bytes = g_load_bytes.load();
  s.load_calls = g_load_calls.load();
  s.gpu_fallback_bytes = g_gpu_fallback_bytes.load();
  return s;
}

void Client::reset_copy_stats() {
  g_save_bytes = 0;
  g_save_calls = 0;
  g_load_bytes = 0;
  g_load_calls = 0;
  g_gpu_fallback_bytes = 0;
}

namespace internal {

void CountGpuFallback(uint64_t bytes) {
  g_gpu_fallback_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

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

absl::Status CheckCallerMemory(const std::string& what, const void* data,
                               const StridedView* strided, uint64_t bytes) {
  if (strided != nullptr) {
    if (strided->Bytes() < 0 || static_cast<uint64_t>(strided->Bytes()) != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the view has ", strided->Bytes(),
                                                     " bytes, ", bytes, " are needed"));
    }
    data = reinterpret_cast<const void*>(strided->data);
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null memory for ", bytes, " bytes"));
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
