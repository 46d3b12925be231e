#include "format/dtype.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckptd/v1/dtype_table.h"

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

struct Row {
  v1::DType proto;
  std::string name;
  uint32_t size;
  std::string safetensors;
};

std::vector<Row> TableRows() {
  return {
#define CKPTD_DTYPE_ROW(proto, client, name, size, safetensors, numpy_native) \
  {v1::proto, name, size, safetensors},
      CKPTD_DTYPES(CKPTD_DTYPE_ROW)
#undef CKPTD_DTYPE_ROW
  };
}

TEST_CASE("the dtype table has one row per wire value, in value order", "[unit]") {
  std::vector<Row> rows = TableRows();
  // Every value of the proto enum except DTYPE_UNSPECIFIED, and nothing else.
  std::vector<int> wire;
  for (int d = v1::DType_MIN; d <= v1::DType_MAX; ++d) {
    if (v1::DType_IsValid(d) && d != v1::DTYPE_UNSPECIFIED) wire.push_back(d);
  }
  REQUIRE(rows.size() == wire.size());
  std::set<std::string> names, safetensors;
  for (size_t i = 0; i < rows.size(); ++i) {
    INFO("row " << i << ": " << rows[i].name);
    CHECK(static_cast<int>(rows[i].proto) == wire[i]);
    CHECK(static_cast<int>(rows[i].proto) == static_cast<int>(i) + 1);
    CHECK(names.insert(rows[i].name).second);
    CHECK(safetensors.insert(rows[i].safetensors).second);
    // The daemon's functions are the table's round trips: enum -> name -> enum, enum -> size.
    CHECK(DTypeName(rows[i].proto) == rows[i].name);
    auto parsed = ParseDType(rows[i].name);
    REQUIRE(parsed.ok());
    CHECK(*parsed == rows[i].proto);
    auto size = DTypeSize(rows[i].proto);
    REQUIRE(size.ok());
    CHECK(*size == rows[i].size);
  }
  CHECK(names.count("unspecified") == 0);
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
