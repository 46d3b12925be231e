// tier/delta.h: which shards of a rank's flush may be referenced in the previous checkpoint —
// only an exact match (item, kind, dtype, shape, region, length, rank, every block checksum) in a
// file that rank wrote, grouped by file, a file kept only when enough of it is referenced, at
// most kDeltaLinkedBlobsPerRankMax files, the most referenced first.
#include "tier/delta.h"

#include <catch2/catch.hpp>

#include "common/limits.h"
#include "format/names.h"

namespace ckptd {
namespace {

constexpr uint64_t kPage = 4096;

v1::Region Box(uint64_t start, uint64_t len) {
  v1::Region r;
  r.mutable_box()->add_offsets(start);
  r.mutable_box()->add_lengths(len);
  return r;
}

// A base checkpoint of step 7: item name → (blob id, offset, length, crcs), all fp32 [1024].
struct BaseShard {
  std::string item;
  uint32_t blob = 0;
  uint64_t offset = 0;
  uint64_t length = kPage;
  std::vector<uint32_t> crcs = {1};
  uint32_t rank = 0;
};

DeltaBase Base(const std::vector<BaseShard>& shards, const std::vector<v1::BlobInfo>& blobs,
               uint32_t live_min_percent = 50) {
  auto m = std::make_shared<Manifest>();
  m->header.set_step(7);
  for (const v1::BlobInfo& b : blobs) *m->header.add_blobs() = b;
  std::map<std::string, v1::ItemEntry> items;
  for (const BaseShard& s : shards) {
    v1::ItemEntry& it = items[s.item];
    it.set_name(s.item);
    it.set_kind(v1::TENSOR);
    it.set_dtype(v1::FLOAT32);
    it.clear_shape();
    it.add_shape(s.length / 4);
    v1::ShardEntry* e = it.add_shards();
    *e->mutable_region() = Box(0, s.length / 4);
    e->set_blob_id(s.blob);
    e->set_offset(s.offset);
    e->set_length(s.length);
    for (uint32_t c : s.crcs) e->add_block_crc32c(c);
    e->set_saved_by_rank(s.rank);
  }
  for (auto& [name, it] : items) m->items.push_back(it);
  return DeltaBase{
      .step = 7, .dir = "j/step-7", .manifest = m, .live_min_percent = live_min_percent};
}

v1::BlobInfo Blob(uint32_t id, std::string name, uint64_t size) {
  v1::BlobInfo b;
  b.set_id(id);
  b.set_name(std::move(name));
  b.set_size_bytes(size);
  return b;
}

// A staged shard of rank `rank` with its stored entry's crcs filled (as ReferenceUnchanged does).
void AddStaged(v1::RankRecord* rec, const std::string& item, uint64_t length,
               std::vector<uint32_t> crcs, bool replica = false) {
  v1::StagedShard* s = rec->add_shards();
  s->mutable_spec()->set_item(item);
  v1::TensorShardSpec* t = s->mutable_spec()->mutable_tensor();
  t->set_dtype(v1::FLOAT32);
  t->add_global_shape(length / 4);
  *t->mutable_region() = Box(0, length / 4);
  s->mutable_spec()->mutable_data()->set_length(length);
  s->set_replica(replica);
  v1::ShardEntry* e = s->mutable_stored();
  e->set_length(length);
  *e->mutable_region() = Box(0, length / 4);
  for (uint32_t c : crcs) e->add_block_crc32c(c);
  e->set_saved_by_rank(rec->rank());
}

TEST_CASE("deltas: only exact matches in the rank's own files are referenced", "[unit]") {
  // Rank 0's blob (16 KiB): a, b, c, d of a page each; rank 1's blob holds e.
  DeltaBase base = Base({{.item = "a", .offset = 0},
                         {.item = "b", .offset = kPage, .crcs = {2}},
                         {.item = "c", .offset = 2 * kPage},
                         {.item = "d", .offset = 3 * kPage},
                         {.item = "e", .blob = 1, .rank = 1}},
                        {Blob(0, BlobName(0), 4 * kPage), Blob(1, BlobName(1), kPage)});
  v1::RankRecord rec;
  rec.set_rank(0);
  AddStaged(&rec, "a", kPage, {1});         // 0: same
  AddStaged(&rec, "b", kPage, {9});         // 1: changed (crc)
  AddStaged(&rec, "c", 2 * kPage, {1, 1});  // 2: another length
  AddStaged(&rec, "d", kPage, {1});         // 3: same
  AddStaged(&rec, "e", kPage, {1});         // 4: saved by rank 1 in the base
  AddStaged(&rec, "new", kPage, {1});       // 5: not in the base
  AddStaged(&rec, "d", kPage, {1}, true);   // 6: a replica (not stored by this rank)
  std::vector<DeltaGroup> g = PlanDelta(rec, base);
  REQUIRE(g.size() == 1);
  CHECK(g[0].base_name == "r00000.blob");
  CHECK(g[0].written_at_step == 7);
  CHECK(g[0].shards == std::vector<int>{0, 3});
  CHECK(g[0].offsets == std::vector<uint64_t>{0, 3 * kPage});
  CHECK(g[0].bytes == 2 * kPage);

  // Below live_min_percent of the file (2 of 4 pages is 50%): not shared at 51%.
  CHECK(PlanDelta(rec, Base({{.item = "a"}, {.item = "d", .offset = 3 * kPage}},
                            {Blob(0, BlobName(0), 4 * kPage)}, 51))
            .empty());
}

TEST_CASE("deltas: a file linked before keeps the step that wrote it, other files are refused",
          "[unit]") {
  v1::BlobInfo linked = Blob(LinkedBlobId(0, 0), LinkedBlobName(0, 3), kPage);
  linked.set_written_at_step(3);
  DeltaBase base =
      Base({{.item = "a", .blob = LinkedBlobId(0, 0)},
            {.item = "b", .blob = 5},
            {.item = "c", .blob = 6}},
           {linked, Blob(5, "../../etc/passwd", kPage), Blob(6, LinkedBlobName(1, 3), kPage)});
  v1::RankRecord rec;
  rec.set_rank(0);
  AddStaged(&rec, "a", kPage, {1});
  AddStaged(&rec, "b", kPage, {1});
  AddStaged(&rec, "c", kPage, {1});
  std::vector<DeltaGroup> g = PlanDelta(rec, base);
  REQUIRE(g.size() == 1);
  CHECK(g[0].base_name == LinkedBlobName(0, 3));
  CHECK(g[0].written_at_step == 3);
}

TEST_CASE("deltas: at most kDeltaLinkedBlobsPerRankMax files, the most referenced first",
          "[unit]") {
  std::vector<BaseShard> shards;
  std::vector<v1::BlobInfo> blobs;
  v1::RankRecord rec;
  rec.set_rank(2);
  const uint32_t files = limits::kDeltaLinkedBlobsPerRankMax + 3;
  for (uint32_t f = 0; f < files; ++f) {
    v1::BlobInfo b = Blob(LinkedBlobId(2, f % 8) + 8 * limits::kWorldSizeMax * (f / 8),
                          LinkedBlobName(2, f + 1), (f + 1) * kPage);
    b.set_written_at_step(f + 1);
    blobs.push_back(b);
    const std::string item = "i" + std::to_string(100 + f);
    shards.push_back(
        {.item = item, .blob = b.id(), .length = (f + 1) * kPage, .crcs = {f}, .rank = 2});
    AddStaged(&rec, item, (f + 1) * kPage, {f});
  }
  std::vector<DeltaGroup> g = PlanDelta(rec, Base(shards, blobs));
  REQUIRE(g.size() == limits::kDeltaLinkedBlobsPerRankMax);
  CHECK(g.front().written_at_step == files);
  CHECK(g.back().written_at_step == files - limits::kDeltaLinkedBlobsPerRankMax + 1);
  CHECK(LinkedBlobId(2, 0) != LinkedBlobId(3, 0));
  CHECK(LinkedBlobId(65535, limits::kDeltaLinkedBlobsPerRankMax - 1) > 65535);
  CHECK(RankOfBlobId(LinkedBlobId(65535, limits::kDeltaLinkedBlobsPerRankMax - 1)) == 65535);
  CHECK(RankOfBlobId(LinkedBlobId(7, 0)) == 7);
  CHECK(RankOfBlobId(7) == 7);
}

}  // namespace
}  // namespace ckptd
