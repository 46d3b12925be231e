// Every consumer of the one dtype table (ckptd/v1/dtype_table.h) agrees with it: the daemon's
// format/dtype.h, the C++ client's DType (sizes, names, wire conversions) and ckptctl's
// safetensors names. The Python view (_ckptd.DTYPES) is checked by tests/python/test_dtypes.py.
#include "ckptd/v1/dtype_table.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckptd/client.h"
#include "ckptd/v1/common.pb.h"
#include "convert.h"
#include "format/dtype.h"
#include "safetensors.h"

namespace {

using ckptctl::safetensors::SafetensorsDType;

struct Row {
  ckptd::v1::DType proto;
  ckptd::DType client;
  std::string name;
  size_t size;
  std::string safetensors;
};

std::vector<Row> TableRows() {
  return {
#define CKPTD_DTYPE_ROW(proto, client, name, size, safetensors, numpy_native) \
  {ckptd::v1::proto, ckptd::DType::client, name, size, safetensors},
      CKPTD_DTYPES(CKPTD_DTYPE_ROW)
#undef CKPTD_DTYPE_ROW
  };
}

TEST_CASE("the daemon, the C++ client and ckptctl agree with the dtype table", "[unit]") {
  const std::vector<Row> rows = TableRows();
  REQUIRE(rows.size() == ckptd::kDTypeCount);
  // Every wire value but DTYPE_UNSPECIFIED has a row (the table is complete for this build).
  int wire_values = 0;
  for (int d = ckptd::v1::DType_MIN; d <= ckptd::v1::DType_MAX; ++d) {
    if (ckptd::v1::DType_IsValid(d) && d != ckptd::v1::DTYPE_UNSPECIFIED) ++wire_values;
  }
  CHECK(rows.size() == static_cast<size_t>(wire_values));
  std::set<ckptd::v1::DType> protos;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    INFO("row " << i << ": " << r.name);
    CHECK(protos.insert(r.proto).second);
    // Client enum values are the row index; the wire value is one more.
    CHECK(static_cast<size_t>(r.client) == i);
    CHECK(ckptd::kDTypes[i] == r.client);
    CHECK(static_cast<int>(r.proto) == static_cast<int>(r.client) + 1);
    // C++ client: size, name, name -> enum, enum <-> wire.
    CHECK(ckptd::DTypeSize(r.client) == r.size);
    CHECK(std::string(ckptd::DTypeName(r.client)) == r.name);
    CHECK(std::string(ckptd::DTypeSafetensorsName(r.client)) == r.safetensors);
    auto from_name = ckptd::DTypeFromName(r.name);
    REQUIRE(from_name.ok());
    CHECK(*from_name == r.client);
    CHECK(ckptd::internal::ToProto(r.client) == r.proto);
    auto from_proto = ckptd::internal::FromProto(r.proto);
    REQUIRE(from_proto.ok());
    CHECK(*from_proto == r.client);
    // The daemon: the same name and size for the wire value.
    CHECK(ckptd::DTypeName(r.proto) == r.name);
    auto daemon_size = ckptd::DTypeSize(r.proto);
    REQUIRE(daemon_size.ok());
    CHECK(*daemon_size == r.size);
    // ckptctl export.
    auto st = SafetensorsDType(r.client);
    REQUIRE(st.ok());
    CHECK(*st == r.safetensors);
  }
}

TEST_CASE("values outside the dtype table are refused by every consumer", "[unit]") {
  const auto past = static_cast<ckptd::DType>(ckptd::kDTypeCount);
  CHECK(SafetensorsDType(past).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ckptd::internal::FromProto(ckptd::v1::DTYPE_UNSPECIFIED).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ckptd::internal::FromProto(static_cast<ckptd::v1::DType>(99)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ckptd::DTypeFromName("unspecified").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ckptd::DTypeFromName("float128").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ckptd::DTypeFromName("").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
