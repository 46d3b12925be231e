#include "safetensors.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/json_escape.h"

namespace ckptctl::safetensors {

namespace {

using ckptd::DType;

// Printable form of a name for error messages, whatever bytes it holds.
std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

std::string MetadataJson(const std::map<std::string, std::string>& metadata) {
  std::string out = "{";
  for (const auto& [key, value] : metadata) {
    if (out.size() > 1) out += ",";
    absl::StrAppend(&out, ckptd::JsonString(key), ":", ckptd::JsonString(value));
  }
  return out + "}";
}

std::string EntryJson(const Tensor& t, const std::string& dtype, uint64_t begin, uint64_t end) {
  return absl::StrCat(ckptd::JsonString(t.name), ":{\"dtype\":\"", dtype, "\",\"shape\":[",
                      absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", begin, ",", end, "]}");
}

uint64_t Pad8(uint64_t n) { return (n + 7) / 8 * 8; }

// The 8-byte little-endian length, then the JSON padded with spaces to a multiple of 8 (so the
// data starts 8-aligned, as the Hugging Face writer does).
std::string FramedHeader(std::string json) {
  json.resize(Pad8(json.size()), ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

absl::Status CheckTensor(const Tensor& t) {
  if (absl::Status s = ValidateUtf8(t.name, "tensor name"); !s.ok()) return s;
  if (t.name == "__metadata__") {
    return absl::InvalidArgumentError(
        "a tensor named \"__metadata__\" cannot be exported: safetensors reserves that key");
  }
  absl::StatusOr<std::string> dtype = SafetensorsDType(t.dtype);
  if (!dtype.ok()) return dtype.status();
  uint64_t numel = 1;
  for (uint64_t d : t.shape) {
    if (d != 0 && numel > UINT64_MAX / d) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": shape [",
                                                     absl::StrJoin(t.shape, ","), "] overflows"));
    }
    numel *= d;
  }
  const uint64_t esize = ckptd::DTypeSize(t.dtype);
  if (numel > UINT64_MAX / esize || numel * esize != t.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", t.bytes,
                                                   " bytes do not match ", *dtype, " shape [",
                                                   absl::StrJoin(t.shape, ","), "]"));
  }
  return absl::OkStatus();
}

// Greedy packing in name order: the tensors of each file, as indices into `tensors`.
std::vector<std::vector<size_t>> Pack(const std::vector<Tensor>& tensors,
                                      const std::vector<size_t>& order,
                                      const std::vector<std::string>& dtypes,
                                      uint64_t max_file_bytes, uint64_t metadata_json_bytes) {
  // JSON bytes of a file with no tensor: {"__metadata__":{...}}
  const uint64_t empty_json = 2 + 15 + metadata_json_bytes;
  std::vector<std::vector<size_t>> files(1);
  uint64_t json = empty_json, data = 0;
  for (size_t i : order) {
    const Tensor& t = tensors[i];
    auto entry = [&] { return 1 + EntryJson(t, dtypes[i], data, data + t.bytes).size(); };
    const uint64_t size = 8 + Pad8(json + entry()) + data + t.bytes;
    if (!files.back().empty() &&
        (size > max_file_bytes || Pad8(json + entry()) > kHeaderBytesMax)) {
      files.emplace_back();
      json = empty_json;
      data = 0;
    }
    json += entry();
    data += t.bytes;
    files.back().push_back(i);
  }
  return files;
}

}  // namespace

absl::StatusOr<std::string> SafetensorsDType(DType dtype) {
  if (static_cast<size_t>(dtype) >= ckptd::kDTypeCount) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(dtype), " has no safetensors equivalent"));
  }
  return std::string(ckptd::DTypeSafetensorsName(dtype));
}

absl::Status ValidateUtf8(const std::string& s, const std::string& what) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t k = 1; ok && k < n; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc & 0xc0) == 0x80;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMinForLength[n] && cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " \"", Printable(s), "\" is not valid UTF-8 (at byte ", i,
                       "), which a safetensors header (JSON) cannot hold"));
    }
    i += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  static const std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                            {"B", 1},
                                                            {"KB", 1000},
                                                            {"MB", 1000 * 1000},
                                                            {"GB", 1000ull * 1000 * 1000},
                                                            {"TB", 1000ull * 1000 * 1000 * 1000},
                                                            {"KIB", 1ull << 10},
                                                            {"MIB", 1ull << 20},
                                                            {"GIB", 1ull << 30},
                                                            {"TIB", 1ull << 40}};
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  const std::string unit = absl::AsciiStrToUpper(text.substr(digits));
  uint64_t n = 0;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte size \"", Printable(text), "\": ", why,
                     " (want a positive integer with an optional unit: B, KB, MB, GB, TB, KiB, "
                     "MiB, GiB, TiB; e.g. 5GiB)"));
  };
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &n)) return bad("no number");
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    if (n == 0) return bad("it is zero");
    if (n > UINT64_MAX / scale) return bad("it overflows 64 bits");
    return n * scale;
  }
  return bad("unknown unit");
}

absl::StatusOr<std::vector<FilePlan>> Plan(const std::vector<Tensor>& tensors,
                                           uint64_t max_file_bytes,
                                           const std::map<std::string, std::string>& metadata) {
  if (tensors.empty()) return absl::InvalidArgumentError("no tensors to export");
  if (max_file_bytes < kMaxFileBytesMin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max file size ", max_file_bytes, " bytes is below the minimum of ", kMaxFileBytesMin));
  }
  for (const auto& [key, value] : metadata) {
    if (absl::Status s = ValidateUtf8(key + value, "metadata"); !s.ok()) return s;
  }
  std::vector<std::string> dtypes;
  std::set<std::string> names;
  for (const Tensor& t : tensors) {
    if (absl::Status s = CheckTensor(t); !s.ok()) return s;
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" appears twice"));
    }
    dtypes.push_back(*SafetensorsDType(t.dtype));
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  const std::string meta = MetadataJson(metadata);
  std::vector<std::vector<size_t>> packed =
      Pack(tensors, order, dtypes, max_file_bytes, meta.size());
  if (packed.size() > kFilesMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("the export would need ", packed.size(), " files of at most ", max_file_bytes,
                     " bytes; the limit is ", kFilesMax, ": raise --max_file_bytes"));
  }
  std::vector<FilePlan> files;
  for (const std::vector<size_t>& members : packed) {
    FilePlan f;
    f.name = packed.size() == 1 ? "model.safetensors"
                                : absl::StrFormat("model-%05d-of-%05d.safetensors",
                                                  files.size() + 1, packed.size());
    std::string json = absl::StrCat("{\"__metadata__\":", meta);
    for (size_t i : members) {
      const uint64_t begin = f.data_bytes, end = begin + tensors[i].bytes;
      absl::StrAppend(&json, ",", EntryJson(tensors[i], dtypes[i], begin, end));
      f.tensors.push_back({i, begin, end});
      f.data_bytes = end;
    }
    f.header = FramedHeader(json + "}");
    files.push_back(std::move(f));
  }
  return files;
}

std::string IndexJson(const std::vector<FilePlan>& files, const std::vector<Tensor>& tensors) {
  uint64_t total = 0;
  std::string map;
  for (const FilePlan& f : files) {
    for (const TensorPlacement& p : f.tensors) {
      total += tensors[p.tensor].bytes;
      absl::StrAppend(&map, map.empty() ? "\n" : ",\n", "    ",
                      ckptd::JsonString(tensors[p.tensor].name), ": ", ckptd::JsonString(f.name));
    }
  }
  return absl::StrCat("{\n  \"metadata\": {\n    \"total_size\": ", total,
                      "\n  },\n  \"weight_map\": {", map, "\n  }\n}\n");
}

}  // namespace ckptctl::safetensors
