#include "format/dtype.h"

#include <catch2/catch.hpp>

namespace ckptd {
namespace {

TEST_CASE("DTypeSize, DTypeName and ParseDType agree for every dtype", "[unit]") {
  for (int d = v1::DType_MIN + 1; d <= v1::DType_MAX; ++d) {
    auto dtype = static_cast<v1::DType>(d);
    auto size = DTypeSize(dtype);
    REQUIRE(size.ok());
    CHECK((*size == 1 || *size == 2 || *size == 4 || *size == 8));
    auto parsed = ParseDType(DTypeName(dtype));
    REQUIRE(parsed.ok());
    CHECK(*parsed == dtype);
  }
  CHECK(*DTypeSize(v1::BFLOAT16) == 2);
  CHECK(*DTypeSize(v1::UINT64) == 8);
  CHECK(*DTypeSize(v1::BOOL) == 1);
  CHECK(DTypeName(v1::FLOAT8_E4M3FN) == "float8_e4m3fn");
}

TEST_CASE("DType errors", "[unit]") {
  CHECK(DTypeSize(v1::DTYPE_UNSPECIFIED).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(DTypeSize(static_cast<v1::DType>(99)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(DTypeName(v1::DTYPE_UNSPECIFIED) == "unspecified");
  CHECK(DTypeName(static_cast<v1::DType>(99)) == "unspecified");
  CHECK(ParseDType("unspecified").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseDType("float128").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseDType("").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckptd
