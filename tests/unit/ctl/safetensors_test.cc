// ckptctl's safetensors planner as pure code: packing at the exact size limit, names, headers,
// the index, byte sizes, and the inputs it must refuse.
#include "safetensors.h"

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"
#include "common/json_escape.h"

using Catch::Matchers::Contains;
using ckptd::DType;
namespace st = ckptctl::safetensors;

namespace {

st::Tensor T(std::string name, DType dtype, std::vector<uint64_t> shape) {
  uint64_t n = ckptd::DTypeSize(dtype);
  for (uint64_t d : shape) n *= d;
  return {std::move(name), dtype, std::move(shape), n};
}

uint64_t HeaderLength(const std::string& header) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(header[i]);
  return n;
}

const std::map<std::string, std::string> kMeta = {{"format", "pt"}};

}  // namespace

TEST_CASE("safetensors plan: one file, header framing and offsets", "[unit]") {
  auto files = st::Plan(
      {T("b", DType::kBFloat16, {2, 3}), T("a", DType::kFloat32, {}), T("c", DType::kBool, {0, 4})},
      st::kMaxFileBytesDefault, kMeta);
  REQUIRE(files.ok());
  REQUIRE(files->size() == 1);
  const st::FilePlan& f = (*files)[0];
  CHECK(f.name == "model.safetensors");
  CHECK(HeaderLength(f.header) == f.header.size() - 8);
  CHECK(f.header.size() % 8 == 0);
  CHECK(f.header.substr(8).rfind(
            "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[],"
            "\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],"
            "\"data_offsets\":[4,16]},\"c\":{\"dtype\":\"BOOL\",\"shape\":[0,4],"
            "\"data_offsets\":[16,16]}}",
            0) == 0);
  CHECK(f.data_bytes == 16);
  CHECK(st::IndexJson(*files, {T("b", DType::kBFloat16, {2, 3}), T("a", DType::kFloat32, {}),
                               T("c", DType::kBool, {0, 4})})
            .find("\"total_size\": 16") != std::string::npos);
}

TEST_CASE("safetensors plan: files never pass the limit, except one tensor alone", "[unit]") {
  std::vector<st::Tensor> ts;
  for (int i = 0; i < 40; ++i) {
    ts.push_back(T("layer." + std::to_string(100 + i), DType::kFloat32, {100 + i * 7ull, 3}));
  }
  ts.push_back(T("huge", DType::kFloat64, {2000}));  // 16000 B > the limit
  for (uint64_t limit : {4096ull, 5000ull, 9999ull, 16384ull}) {
    auto files = st::Plan(ts, limit, kMeta);
    REQUIRE(files.ok());
    size_t tensors = 0;
    std::string last;
    for (size_t i = 0; i < files->size(); ++i) {
      const st::FilePlan& f = (*files)[i];
      INFO(limit << " " << f.name);
      CHECK(f.name == absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, files->size()));
      CHECK((f.file_bytes() <= limit || f.tensors.size() == 1));
      for (const auto& p : f.tensors) {
        CHECK(ts[p.tensor].name > last);  // name order across files
        last = ts[p.tensor].name;
      }
      tensors += f.tensors.size();
    }
    CHECK(tensors == ts.size());
  }
  // A file may be filled to exactly the limit, not one byte past it.
  auto one = st::Plan({T("x", DType::kUInt8, {5000}), T("y", DType::kUInt8, {1})},
                      st::kMaxFileBytesDefault, kMeta);
  REQUIRE(one.ok());
  const uint64_t exact = (*one)[0].file_bytes();
  auto same = st::Plan({T("x", DType::kUInt8, {5000}), T("y", DType::kUInt8, {1})}, exact, kMeta);
  REQUIRE(same.ok());
  CHECK(same->size() == 1);
  auto two =
      st::Plan({T("x", DType::kUInt8, {5000}), T("y", DType::kUInt8, {1})}, exact - 1, kMeta);
  REQUIRE(two.ok());
  CHECK(two->size() == 2);
}

TEST_CASE("safetensors plan: refuses what a safetensors file cannot hold", "[unit]") {
  auto bad = [](std::vector<st::Tensor> ts) { return st::Plan(ts, 1 << 20, kMeta).status(); };
  CHECK_THAT(std::string(bad({}).message()), Contains("no tensors"));
  CHECK_THAT(std::string(bad({T("__metadata__", DType::kFloat32, {1})}).message()),
             Contains("reserves"));
  CHECK_THAT(std::string(bad({T("a\xff", DType::kFloat32, {1})}).message()),
             Contains("not valid UTF-8") && Contains("\\xff"));
  CHECK_THAT(std::string(bad({T("a", DType::kInt8, {1}), T("a", DType::kInt8, {1})}).message()),
             Contains("twice"));
  st::Tensor wrong = T("w", DType::kFloat32, {3});
  wrong.bytes = 11;
  CHECK_THAT(std::string(bad({wrong}).message()), Contains("do not match"));
  CHECK(st::Plan({T("a", DType::kInt8, {1})}, 100, kMeta).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(st::ValidateUtf8("\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", "n").ok());
  for (const char* s : {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    CHECK_FALSE(st::ValidateUtf8(s, "n").ok());
  }
}

TEST_CASE("safetensors: JSON strings and byte sizes", "[unit]") {
  CHECK(ckptd::JsonString("a\"b\\c\n\x01\xc3\xa9") == "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\"");
  CHECK(*st::ParseByteSize("5GiB") == (5ull << 30));
  CHECK(*st::ParseByteSize("5GB") == 5000000000ull);
  CHECK(*st::ParseByteSize("64kib") == 65536);
  CHECK(*st::ParseByteSize("4096") == 4096);
  CHECK(*st::ParseByteSize("10B") == 10);
  for (const char* s : {"", "0", "GiB", "5 GiB", "5XB", "-1", "1.5GiB", "99999999999TiB"}) {
    INFO(s);
    CHECK(st::ParseByteSize(s).status().code() == absl::StatusCode::kInvalidArgument);
  }
}
