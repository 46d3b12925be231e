#include "format/dtype.h"

#include "absl/strings/str_format.h"
#include "ckptd/v1/dtype_table.h"
#include "format/text.h"

namespace ckptd {
namespace {

struct DTypeInfo {
  v1::DType dtype;
  std::string_view name;
  uint32_t size_bytes;
};

// Expanded from ckptd/v1/dtype_table.h, the one table.
constexpr DTypeInfo kDTypes[] = {
#define CKPTD_DTYPE_INFO(proto, client, name, size, safetensors, numpy_native) \
  {v1::proto, name, size},
    CKPTD_DTYPES(CKPTD_DTYPE_INFO)
#undef CKPTD_DTYPE_INFO
};

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
