#include "format/dtype.h"

#include <array>

#include "absl/strings/str_format.h"
#include "format/text.h"

namespace ckptd {
namespace {

struct DTypeInfo {
  v1::DType dtype;
  std::string_view name;
  uint32_t size_bytes;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {v1::FLOAT32, "float32", 4},
    {v1::FLOAT64, "float64", 8},
    {v1::FLOAT16, "float16", 2},
    {v1::BFLOAT16, "bfloat16", 2},
    {v1::FLOAT8_E4M3FN, "float8_e4m3fn", 1},
    {v1::FLOAT8_E5M2, "float8_e5m2", 1},
    {v1::INT8, "int8", 1},
    {v1::UINT8, "uint8", 1},
    {v1::INT16, "int16", 2},
    {v1::INT32, "int32", 4},
    {v1::INT64, "int64", 8},
    {v1::BOOL, "bool", 1},
    {v1::UINT16, "uint16", 2},
    {v1::UINT32, "uint32", 4},
    {v1::UINT64, "uint64", 8},
}};

const DTypeInfo* Find(v1::DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<uint32_t> DTypeSize(v1::DType dtype) {
  const DTypeInfo* info = Find(dtype);
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("dtype %d is unspecified or unknown", static_cast<int>(dtype)));
  }
  return info->size_bytes;
}

std::string_view DTypeName(v1::DType dtype) {
  const DTypeInfo* info = Find(dtype);
  return info == nullptr ? std::string_view("unspecified") : info->name;
}

absl::StatusOr<v1::DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(absl::StrFormat("unknown dtype \"%s\"", EscapeName(name)));
}

}  // namespace ckptd
