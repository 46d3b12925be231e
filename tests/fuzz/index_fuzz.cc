// Index rows (index/keys.h, proto/ckptd/v1/index.proto) as recovery reads them. Input: a mode
// byte, then
//   mode 0: a RocksDB key. Every Decode* either fails or returns parts that encode back to the
//           key exactly; at most one kind decodes it.
//   mode 1: fuzzer-chosen jobs (no NUL), steps, ranks and names. Keys decode to what encoded
//           them; key order is (job, step, rank) order; a job's prefixes are prefixes of its
//           keys only (scans never interleave jobs).
//   mode 2: u32le length-prefixed values: a CheckpointRecord, then RankRecords. As recovery and
//           commit use them: the record's key round-trips, and the ranks' persisted shards become
//           a manifest (BuildManifest's way) that ValidateManifest judges without crashing;
//           if it accepts, the manifest round-trips through EncodeManifest / DecodeManifest.
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "ckptd/v1/index.pb.h"
#include "common/align.h"
#include "format/names.h"
#include "fuzz_util.h"
#include "index/keys.h"

namespace ckptd::fuzz {
namespace {

void CheckKey(std::string_view key) {
  int kinds = 0;
  if (auto job = keys::DecodeJob(key); job.ok()) {
    ++kinds;
    FUZZ_CHECK(keys::Job(*job) == key, "DecodeJob round trip");
  }
  if (auto c = keys::DecodeCheckpoint(key); c.ok()) {
    ++kinds;
    FUZZ_CHECK(keys::Checkpoint(c->first, c->second) == key, "DecodeCheckpoint round trip");
  }
  if (auto r = keys::DecodeRank(key); r.ok()) {
    ++kinds;
    const auto& [job, step, rank] = *r;
    FUZZ_CHECK(keys::Rank(job, step, rank) == key, "DecodeRank round trip");
  }
  for (bool item : {true, false}) {
    auto tail = item ? keys::DecodeItem(key) : keys::DecodeBlob(key);
    if (!tail.ok()) continue;
    ++kinds;
    FUZZ_CHECK(!tail->empty() && tail->size() < key.size() &&
                   key.substr(key.size() - tail->size()) == *tail,
               "Decode%s: \"%s\" is not the key's tail", item ? "Item" : "Blob", tail->c_str());
    // The rest is tag job \0 be64(step): the same as a checkpoint key's.
    std::string head(key.substr(0, key.size() - tail->size()));
    head[0] = keys::kCheckpointTag;
    auto c = keys::DecodeCheckpoint(head);
    FUZZ_CHECK(c.ok(), "Decode%s accepted a key without a job and step", item ? "Item" : "Blob");
    const std::string again =
        item ? keys::Item(c->first, c->second, *tail) : keys::Blob(c->first, c->second, *tail);
    FUZZ_CHECK(again == key, "Decode%s round trip", item ? "Item" : "Blob");
  }
  FUZZ_CHECK(kinds <= 1, "%d kinds of key decode the same bytes", kinds);
}

std::string ConsumeJob(FuzzedDataProvider& fdp) {
  std::string job = fdp.ConsumeRandomLengthString(24);
  std::erase(job, '\0');  // ValidateJobName never lets one in
  if (job.empty()) job = "j";
  return job;
}

template <typename T>
int Cmp(const T& a, const T& b) {
  return a < b ? -1 : (b < a ? 1 : 0);
}

void CheckEncodings(FuzzedDataProvider& fdp) {
  const std::string j1 = ConsumeJob(fdp), j2 = ConsumeJob(fdp);
  const auto s1 = fdp.ConsumeIntegral<uint64_t>(), s2 = fdp.ConsumeIntegral<uint64_t>();
  const auto r1 = fdp.ConsumeIntegral<uint32_t>(), r2 = fdp.ConsumeIntegral<uint32_t>();
  const std::string name = fdp.ConsumeRandomLengthString(32);

  FUZZ_CHECK(keys::DecodeJob(keys::Job(j1)).value() == j1, "job key");
  FUZZ_CHECK(keys::DecodeCheckpoint(keys::Checkpoint(j1, s1)).value() == std::make_pair(j1, s1),
             "checkpoint key");
  FUZZ_CHECK(keys::DecodeRank(keys::Rank(j1, s1, r1)).value() == std::make_tuple(j1, s1, r1),
             "rank key");
  if (!name.empty()) {
    FUZZ_CHECK(keys::DecodeItem(keys::Item(j1, s1, name)).value() == name, "item key");
    FUZZ_CHECK(keys::DecodeBlob(keys::Blob(j1, s1, name)).value() == name, "blob key");
  }
  CheckKey(keys::Item(j1, s1, name));
  CheckKey(keys::Meta(name));

  // Byte order of keys is the order of what they encode (std::string compares bytes unsigned).
  const int want = Cmp(std::make_tuple(j1, s1, r1), std::make_tuple(j2, s2, r2));
  FUZZ_CHECK(Cmp(keys::Rank(j1, s1, r1), keys::Rank(j2, s2, r2)) == want, "rank key order");
  FUZZ_CHECK(Cmp(keys::Checkpoint(j1, s1), keys::Checkpoint(j2, s2)) ==
                 Cmp(std::make_pair(j1, s1), std::make_pair(j2, s2)),
             "checkpoint key order");
  FUZZ_CHECK(Cmp(keys::Job(j1), keys::Job(j2)) == Cmp(j1, j2), "job key order");

  // Prefix scans: a job's (and a step's) prefix starts exactly its own keys.
  const bool same_job = j1 == j2, same_step = same_job && s1 == s2;
  FUZZ_CHECK(keys::Checkpoint(j2, s2).starts_with(keys::CheckpointPrefix(j1)) == same_job,
             "checkpoint prefix of another job");
  FUZZ_CHECK(keys::Rank(j2, s2, r2).starts_with(keys::RankPrefix(j1, s1)) == same_step,
             "rank prefix of another checkpoint");
  FUZZ_CHECK(keys::Item(j2, s2, name).starts_with(keys::ItemPrefix(j1, s1)) == same_step,
             "item prefix of another checkpoint");
  FUZZ_CHECK(keys::Blob(j2, s2, name).starts_with(keys::BlobPrefix(j1, s1)) == same_step,
             "blob prefix of another checkpoint");
  FUZZ_CHECK(keys::Checkpoint(j1, s1).starts_with(keys::AllCheckpointsPrefix()) &&
                 keys::Job(j1).starts_with(keys::JobPrefix()),
             "kind prefixes");
}

// The manifest commit would write for these journal rows (commit.cc BuildManifest, without
// replicas' crc comparison): items by name, their shards as flushed, one blob per rank.
Manifest BuildManifest(const v1::CheckpointRecord& rec, const std::vector<v1::RankRecord>& ranks) {
  const v1::CheckpointSummary& s = rec.summary();
  Manifest m;
  v1::ManifestHeader& h = m.header;
  h.set_format_version(kManifestFormatVersion);
  h.set_job(s.job());
  h.set_step(s.step());
  h.set_world_size(s.world_size());
  h.set_partial(s.partial());
  // RankBlockBytes (checkpoint_service.h): records of older versions have 0, meaning 1 MiB.
  const uint32_t block = ranks.empty() || ranks[0].checksum_block_bytes() == 0
                             ? limits::kLegacyChecksumBlockBytes
                             : ranks[0].checksum_block_bytes();
  h.set_checksum_block_bytes(block);
  std::map<uint32_t, const v1::RankRecord*> by_rank;  // recovery keeps one record per rank
  for (const v1::RankRecord& r : ranks) by_rank.emplace(r.rank(), &r);
  std::map<std::string, v1::ItemEntry> items;
  for (const auto& [r, rr] : by_rank) {
    h.add_ranks_present(r);
    uint64_t blob_bytes = 0;  // 64-bit arithmetic, as commit.cc's (ValidateManifest bounds it)
    for (const v1::StagedShard& sh : rr->shards()) {
      if (sh.replica()) continue;
      const v1::ShardSpec& spec = sh.spec();
      v1::ItemEntry& item = items[spec.item()];
      if (item.name().empty()) {
        item.set_name(spec.item());
        item.set_kind(spec.has_tensor() ? v1::TENSOR : v1::OBJECT);
        if (spec.has_tensor()) {
          item.set_dtype(spec.tensor().dtype());
          *item.mutable_shape() = spec.tensor().global_shape();
        } else {
          item.set_scope(spec.object().scope());
        }
      }
      *item.add_shards() = sh.stored();
      if (sh.stored().length() > 0) {
        blob_bytes = std::max(blob_bytes, sh.stored().offset() + RoundUp(sh.stored().length(),
                                                                         limits::kAlignmentBytes));
      }
    }
    v1::BlobInfo* b = h.add_blobs();
    b->set_id(r);
    b->set_name(rr->blob_name());
    b->set_size_bytes(blob_bytes);
  }
  for (auto& [name, item] : items) m.items.push_back(std::move(item));
  h.set_item_count(m.items.size());
  return m;
}

void CheckRecords(std::string_view in) {
  std::vector<std::string_view> values;
  while (in.size() >= 4 && values.size() < 64) {
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= uint32_t{static_cast<uint8_t>(in[i])} << (8 * i);
    in.remove_prefix(4);
    len = std::min<uint32_t>(len, static_cast<uint32_t>(in.size()));
    values.push_back(in.substr(0, len));
    in.remove_prefix(len);
  }
  if (values.empty()) return;
  v1::CheckpointRecord rec;
  if (!rec.ParseFromArray(values[0].data(), static_cast<int>(values[0].size()))) return;
  const v1::CheckpointSummary& s = rec.summary();
  if (!s.job().empty() && s.job().find('\0') == std::string::npos) {
    FUZZ_CHECK(keys::DecodeCheckpoint(keys::Checkpoint(s.job(), s.step())).value() ==
                   std::make_pair(s.job(), s.step()),
               "checkpoint key of the record");
  }
  (void)CheckpointDir(s.job(), s.step());
  std::vector<v1::RankRecord> ranks;
  uint64_t shards = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    ranks.emplace_back();
    // As ResumePending: a record that does not parse is kept as far as it parsed.
    ranks.back().ParseFromArray(values[i].data(), static_cast<int>(values[i].size()));
    shards += ranks.back().shards_size();
  }
  if (shards > 4096) return;
  Manifest m = BuildManifest(rec, ranks);
  absl::Status valid = ValidateManifest(m);
  if (!valid.ok()) {
    FUZZ_CHECK(valid.code() == absl::StatusCode::kFailedPrecondition, "ValidateManifest: %s",
               valid.ToString().c_str());
    return;
  }
  CheckRoundTrip(m);
}

}  // namespace
}  // namespace ckptd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckptd::fuzz;
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      CheckKey(rest);
      break;
    case 1: {
      FuzzedDataProvider fdp(data + 1, size - 1);
      CheckEncodings(fdp);
      break;
    }
    default:
      CheckRecords(rest);
      break;
  }
  return 0;
}
