// Internal to libckptd-client: local checks of shard sizes, so a mistake is reported before any
// byte is copied or any extent reserved (the daemon checks again).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/client.h"

namespace ckptd::internal {

// Bytes of `region` of a tensor of `shape`; INVALID_ARGUMENT naming `item` when it does not fit.
absl::StatusOr<uint64_t> TensorBytes(const std::string& item, DType dtype,
                                     const std::vector<uint64_t>& shape, const Region& region);

// INVALID_ARGUMENT unless `bytes` equals TensorBytes(...) and the item is named.
absl::Status CheckTensorBytes(const std::string& item, DType dtype,
                              const std::vector<uint64_t>& shape, const Region& region,
                              uint64_t bytes);

// INVALID_ARGUMENT naming `what` unless caller memory of `bytes` bytes is usable: a strided view
// of exactly `bytes` bytes at a non-null address, or else a non-null `data` (when bytes > 0).
absl::Status CheckCallerMemory(const std::string& what, const void* data,
                               const StridedView* strided, uint64_t bytes);

// The address of the bytes when they are contiguous (`data`, or a contiguous view's), else null:
// what Locate() can look up.
inline void* ContiguousAddress(const void* data, const StridedView* strided) {
  if (strided == nullptr) return const_cast<void*>(data);
  return strided->Contiguous() ? reinterpret_cast<void*>(strided->data) : nullptr;
}

}  // namespace ckptd::internal
