// `ckptctl export --format safetensors` through the real daemon: a checkpoint saved in shards by
// several ranks is exported consolidated into size-limited files plus the index, and each file
// is parsed back here (header length, JSON header through protobuf's JSON parser, offsets, sizes)
// and compared bit-exact with the regenerated tensors. Error cases and crash safety too. The
// Python tier reads the same kind of export with the `safetensors` library itself.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;
using ckptd::DType;

namespace {

namespace fs = std::filesystem;
using google::protobuf::Struct;
using google::protobuf::Value;

// The safetensors dtype names, written out independently of ckptctl's table.
const std::map<DType, std::string>& SafetensorsNames() {
  static const std::map<DType, std::string> names = {{DType::kFloat32, "F32"},
                                                     {DType::kFloat64, "F64"},
                                                     {DType::kFloat16, "F16"},
                                                     {DType::kBFloat16, "BF16"},
                                                     {DType::kFloat8E4M3FN, "F8_E4M3"},
                                                     {DType::kFloat8E5M2, "F8_E5M2"},
                                                     {DType::kInt8, "I8"},
                                                     {DType::kUInt8, "U8"},
                                                     {DType::kInt16, "I16"},
                                                     {DType::kInt32, "I32"},
                                                     {DType::kInt64, "I64"},
                                                     {DType::kBool, "BOOL"},
                                                     {DType::kUInt16, "U16"},
                                                     {DType::kUInt32, "U32"},
                                                     {DType::kUInt64, "U64"}};
  return names;
}

// A tensor larger than the export's chunk (a quarter of a 16 MiB arena), saved as uneven flat
// ranges by the 4 ranks, so the export loads it in several chunks across shard boundaries.
const TensorItem kBig{"model.zz.big", DType::kFloat32, {2560, 1024}};  // 10 MiB
constexpr uint64_t kDaemonArenaBytes = 16ull << 20;

ckptd::Region BigRange(uint32_t rank) {
  const uint64_t n = ElementCount(kBig.shape);
  auto cut = [&](uint32_t i) { return i == 0 ? 0 : i == 4 ? n : n * i / 4 + 1234 * i; };
  return ckptd::Region::Flat(cut(rank), cut(rank + 1) - cut(rank));
}

// Saves the state dict (row blocks, replicas, 0-d, empty, objects) plus kBig from 4 ranks.
void SaveForExport(const Daemon& d, const std::string& job, uint64_t step, uint64_t seed) {
  for (uint32_t rank = 0; rank < 4; ++rank) {
    auto client = d.Connect();
    RankPayload p = MakeRankPayload(rank, 4, seed);
    ckptd::Region r = BigRange(rank);
    std::vector<uint8_t> big(r.flat_count * 4);
    FillElements(kBig.name, kBig.dtype, r.flat_start, r.flat_count, seed, big.data());
    p.tensors.push_back({kBig.name, kBig.dtype, kBig.shape, r, big.data(), big.size()});
    auto saved = client->Save(job, step, rank, 4, p.tensors, p.objects);
    INFO(saved.status().ToString());
    REQUIRE(saved.ok());
  }
  absl::Status s = d.Connect()->WaitCommitted(job, step, 30000);
  INFO(s.ToString() << "\n" << d.Log());
  REQUIRE(s.ok());
}

Struct ParseJson(const std::string& text, const std::string& what) {
  Struct out;
  auto s = google::protobuf::util::JsonStringToMessage(text, &out);
  INFO(what << ": " << s.ToString() << "\n" << text.substr(0, 500));
  REQUIRE(s.ok());
  return out;
}

uint64_t Num(const Value& v) { return static_cast<uint64_t>(v.number_value()); }

struct ParsedTensor {
  std::string file;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

// Parses one safetensors file strictly: header length, padding, JSON, metadata, and offsets
// that tile the data exactly. Returns its tensors; `names` gets them in data order.
std::map<std::string, ParsedTensor> ParseFile(const std::string& path, uint64_t job_step,
                                              std::vector<std::string>* names) {
  const std::string raw = ReadFile(path);
  INFO(path);
  REQUIRE(raw.size() >= 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(raw[i]);
  REQUIRE(header_len % 8 == 0);
  REQUIRE(8 + header_len <= raw.size());
  const std::string header = raw.substr(8, header_len);
  REQUIRE(header.front() == '{');
  Struct json = ParseJson(header, path);
  const auto& fields = json.fields();
  REQUIRE(fields.count("__metadata__") == 1);
  const auto& meta = fields.at("__metadata__").struct_value().fields();
  CHECK(meta.at("format").string_value() == "pt");
  CHECK(meta.at("ckptd_step").string_value() == std::to_string(job_step));
  std::set<std::tuple<uint64_t, uint64_t, std::string>> by_offset;  // (begin, end, name)
  std::map<std::string, ParsedTensor> out;
  const uint64_t data_len = raw.size() - 8 - header_len;
  for (const auto& [name, v] : fields) {
    if (name == "__metadata__") continue;
    const auto& f = v.struct_value().fields();
    ParsedTensor t{fs::path(path).filename().string(), f.at("dtype").string_value(), {}, {}};
    for (const Value& d : f.at("shape").list_value().values()) t.shape.push_back(Num(d));
    const auto& off = f.at("data_offsets").list_value().values();
    REQUIRE(off.size() == 2);
    const uint64_t begin = Num(off[0]), end = Num(off[1]);
    REQUIRE(begin <= end);
    REQUIRE(end <= data_len);
    t.bytes.assign(raw.begin() + 8 + header_len + begin, raw.begin() + 8 + header_len + end);
    by_offset.insert({begin, end, name});
    out[name] = std::move(t);
  }
  uint64_t at = 0;  // the data is tiled exactly: no gap, no overlap, nothing after the last
  for (const auto& [begin, end, name] : by_offset) {
    INFO(name);
    CHECK(begin == at);
    at = end;
    names->push_back(name);
  }
  CHECK(at == data_len);
  return out;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Checks the whole export in `dir` against the saved tensors.
void CheckExport(const std::string& dir, uint64_t step, uint64_t seed, uint64_t max_file_bytes,
                 size_t files_min) {
  std::vector<TensorItem> expected = StateDict();
  expected.push_back(kBig);
  Struct index = ParseJson(ReadFile(dir + "/model.safetensors.index.json"), "index");
  const auto& weight_map = index.fields().at("weight_map").struct_value().fields();
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file.string_value());
  REQUIRE(files.size() >= files_min);
  std::set<std::string> listed;
  for (const std::string& n : ListDir(dir)) listed.insert(n);
  std::set<std::string> want_listed = files;
  want_listed.insert("model.safetensors.index.json");
  CHECK(listed == want_listed);  // nothing else: no temp files left

  std::map<std::string, ParsedTensor> parsed;
  std::vector<std::string> order;  // names in file order, then data order
  for (size_t i = 1; i <= files.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, files.size());
    REQUIRE(files.count(name) == 1);
    std::vector<std::string> names;
    auto in_file = ParseFile(dir + "/" + name, step, &names);
    const uint64_t size = fs::file_size(dir + "/" + name);
    // Only a file holding a single tensor too large for the limit may exceed it.
    if (size > max_file_bytes) {
      CHECK(in_file.size() == 1);
      CHECK(size < in_file.begin()->second.bytes.size() + 4096);
    }
    order.insert(order.end(), names.begin(), names.end());
    parsed.insert(in_file.begin(), in_file.end());
  }
  CHECK(std::is_sorted(order.begin(), order.end()));  // name order across and within files

  uint64_t total = 0;
  REQUIRE(parsed.size() == expected.size());
  for (const TensorItem& t : expected) {
    INFO(t.name);
    REQUIRE(parsed.count(t.name) == 1);
    const ParsedTensor& p = parsed.at(t.name);
    CHECK(weight_map.at(t.name).string_value() == p.file);
    CHECK(p.dtype == SafetensorsNames().at(t.dtype));
    CHECK(p.shape == t.shape);
    std::vector<uint8_t> want = GlobalBytes(t, seed);
    REQUIRE(p.bytes.size() == want.size());
    CHECK((p.bytes == want));
    total += want.size();
  }
  CHECK(Num(index.fields().at("metadata").struct_value().fields().at("total_size")) == total);
}

}  // namespace

TEST_CASE("export: shards of 4 ranks export consolidated to size-limited safetensors files",
          "[integration]") {
  Daemon d({.staging_bytes_max = kDaemonArenaBytes});
  SaveForExport(d, "exp", 5, 21);
  TempDir out;
  const std::string dir = out.path() + "/hf/model";  // parents are created
  CommandResult r = RunCtl(
      d, {"export", "exp", "5", "--format", "safetensors", "--max_file_bytes", "16KiB", dir});
  INFO(r.output << "\n" << d.Log());
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("skipped 2 object item(s)") && Contains("extra.config") &&
                           Contains("extra.rng"));
  CheckExport(dir, 5, 21, 16 * 1024, 4);

  // --json, "latest", the default format and size: one file, still with the index; --force
  // replaces the earlier export and removes its now stale files.
  r = RunCtl(d, {"--json", "export", "exp", "latest", "--force", dir});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Contains("\"skipped_objects\": [\"extra.config\", \"extra.rng\"]"));
  CHECK(ListDir(dir) ==
        std::vector<std::string>{"model.safetensors", "model.safetensors.index.json"});
  std::vector<std::string> names;
  auto all = ParseFile(dir + "/model.safetensors", 5, &names);
  CHECK(all.size() == StateDict().size() + 1);
  CHECK(GlobalBytes(kBig, 21) == all.at(kBig.name).bytes);
}

TEST_CASE("export: usage and daemon errors exit 2 and 1 with clear messages", "[integration]") {
  Daemon d;
  SaveCommitted(d, "ok", 1, 3);
  TempDir out;
  const std::string dir = out.path() + "/x";
  auto run = [&](std::vector<std::string> args) {
    CommandResult r = RunCtl(d, std::move(args));
    UNSCOPED_INFO(r.output);
    return r;
  };
  CommandResult r = run({"export", "ok", "1", "--format", "gguf", dir});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Contains("--format needs safetensors"));
  for (const char* bad : {"0", "12XB", "-5", "99999999999999999999", "1KiB"}) {
    r = run({"export", "ok", "1", "--max_file_bytes", bad, dir});
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.output, Contains("--max_file_bytes"));
  }
  CHECK(run({"export", "ok", "1"}).exit_code == 2);
  CHECK(run({"export", "ok", "one", dir}).exit_code == 2);
  CHECK(run({"ls", "--max_file_bytes", "1MiB"}).exit_code == 2);
  CHECK_FALSE(PathExists(dir));  // nothing was created by a refused command

  r = run({"export", "nojob", "1", dir});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("NOT_FOUND"));
  r = run({"export", "ok", "7", dir});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("NOT_FOUND") && Contains("ok/7"));

  // Not committed: rank 0 of 2 staged only.
  auto client = d.Connect();
  REQUIRE(SaveRank(*client, "ok", 2, 0, 2, 3).ok());
  r = run({"export", "ok", "2", dir});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("FAILED_PRECONDITION") && Contains("only COMMITTED"));

  // Only objects: nothing to export.
  ckptd::ObjectShard obj{"extra.only", false, "bytes"};
  REQUIRE(client->Save("objs", 1, 0, 1, {}, std::span(&obj, 1)).ok());
  REQUIRE(client->WaitCommitted("objs", 1, 30000).ok());
  r = run({"export", "objs", "1", dir});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("no tensor items"));

  // A directory that cannot be created.
  const std::string file = out.path() + "/a-file";
  std::ofstream(file) << "x";
  r = run({"export", "ok", "1", file + "/sub"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("creating directory") && Contains(file + "/sub"));

  // An existing export is refused without --force and left as it was.
  REQUIRE(run({"export", "ok", "1", dir}).exit_code == 0);
  const std::string before = ReadFile(dir + "/model.safetensors");
  r = run({"export", "ok", "latest", dir});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("already holds an export") && Contains("--force"));
  CHECK(ReadFile(dir + "/model.safetensors") == before);
}

TEST_CASE("export: a failed export leaves no file that looks complete", "[integration]") {
  // The RAM tier off: the export reads the corrupted blob from disk.
  Daemon d(DaemonConfig{.extra_flags = {"--ram_tier_keep_per_job=0"}});
  // Three tensors, each saved by its own rank into its own blob; the last (by name) is corrupted
  // on disk, so the export fails after the first files were written.
  auto save = [&](uint64_t step) {
    auto client = d.Connect();
    for (uint32_t rank = 0; rank < 3; ++rank) {
      std::vector<float> v(4096, static_cast<float>(step * 10 + rank));
      ckptd::TensorShard s{std::string(1, static_cast<char>('a' + rank)) + ".w",
                           DType::kFloat32,
                           {64, 64},
                           ckptd::Region::Whole(),
                           v.data(),
                           v.size() * 4};
      REQUIRE(client->Save("crash", step, rank, 3, std::span(&s, 1)).ok());
    }
    REQUIRE(client->WaitCommitted("crash", step, 30000).ok());
  };
  save(1);
  save(2);
  const std::string blob = d.data_dir() + "/crash/" + StepDir(2) + "/r00002.blob";
  REQUIRE(PathExists(blob));
  {
    std::fstream f(blob, std::ios::in | std::ios::out | std::ios::binary);
    std::string junk(4096, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  TempDir out;
  const std::string dir = out.path() + "/e";
  CommandResult r = RunCtl(d, {"export", "crash", "2", "--max_file_bytes", "20000", dir});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains("c.w"));
  CHECK(ListDir(dir).empty());  // no final file, no temp file

  // A forced export over a good one that fails keeps the good one whole.
  REQUIRE(RunCtl(d, {"export", "crash", "1", "--max_file_bytes", "20000", dir}).exit_code == 0);
  const std::vector<std::string> good = ListDir(dir);
  CHECK(good.size() == 4);  // 3 files + index
  const std::string index = ReadFile(dir + "/model.safetensors.index.json");
  r = RunCtl(d, {"export", "crash", "2", "--force", "--max_file_bytes", "20000", dir});
  CHECK(r.exit_code == 1);
  CHECK(ListDir(dir) == good);
  CHECK(ReadFile(dir + "/model.safetensors.index.json") == index);
  std::vector<std::string> names;
  auto c = ParseFile(dir + "/model-00003-of-00003.safetensors", 1, &names);
  std::vector<float> want(4096, 12.0f);
  CHECK(std::memcmp(c.at("c.w").bytes.data(), want.data(), 4096 * 4) == 0);
}

TEST_CASE("export: a busy staging arena makes the chunks smaller instead of failing",
          "[integration]") {
  // Chunks start at a quarter of the 16 MiB arena (4 MiB); with 13 MiB of it held by another
  // client, a 4 MiB load is RESOURCE_EXHAUSTED after the short reserve wait, and the export
  // goes on with 2 MiB chunks.
  // (The holder and the export are one uid: its arena share is off, as on a one-uid node.)
  Daemon d({.staging_bytes_max = kDaemonArenaBytes,
            .extra_flags = {"--reserve_timeout_ms=200", "--uid_arena_share_percent=100"}});
  SaveForExport(d, "busy", 1, 5);
  auto hog = d.Connect();
  auto held = hog->Allocate(13ull << 20);
  REQUIRE(held.ok());
  TempDir out;
  CommandResult r = RunCtl(d, {"export", "busy", "1", out.path() + "/e"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> names;
  auto all = ParseFile(out.path() + "/e/model.safetensors", 1, &names);
  CHECK(all.at(kBig.name).bytes == GlobalBytes(kBig, 5));
  CHECK(hog->Release(*held).ok());
}
