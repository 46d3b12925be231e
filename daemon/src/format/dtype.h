// Element types of tensor items: their sizes and names, from the one table
// (ckptd/v1/dtype_table.h). Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "ckptd/v1/common.pb.h"

namespace ckptd {

// Bytes per element of `dtype`. INVALID_ARGUMENT for DTYPE_UNSPECIFIED or an unknown value (a
// dtype from a newer client).
absl::StatusOr<uint32_t> DTypeSize(v1::DType dtype);

// The dtype's lowercase name as numpy / torch spell it ("float32", "bfloat16", ...);
// "unspecified" for DTYPE_UNSPECIFIED and for unknown values.
std::string_view DTypeName(v1::DType dtype);

// Inverse of DTypeName for the known dtypes. INVALID_ARGUMENT for anything else (including
// "unspecified").
absl::StatusOr<v1::DType> ParseDType(std::string_view name);

}  // namespace ckptd
