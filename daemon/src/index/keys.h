// The key schema of the daemon's RocksDB index and journal (one key space, no column families).
//
// Every key starts with a one-byte tag naming the record kind; the value is the serialized
// protobuf record from proto/ckptd/v1/index.proto named below.
//
//   key                              value             what it is for
//   'J' job                          JobRecord         one per job: owner uid, created time.
//                                                      Scanning "J" lists the jobs by name.
//   'C' job \0 be64(step)            CheckpointRecord  one per checkpoint: summary (state, tiers
//                                                      reached, bytes, error) and its directory.
//                                                      Scanning 'C' job \0 lists a job's steps in
//                                                      numeric order (latest = the last COMMITTED
//                                                      one); scanning "C" lists every checkpoint
//                                                      of every job (recovery).
//   'R' job \0 be64(step) be32(rank) RankRecord        the staging journal: one rank's Save (its
//                                                      staged shards, arena extents and arena
//                                                      generation), written with a synced write
//                                                      before the client hears "staged", so a
//                                                      daemon restart can finish the checkpoint;
//                                                      deleted when the checkpoint commits or
//                                                      aborts.
//   'I' job \0 be64(step) item       ItemRecord        the items of a COMMITTED checkpoint (dtype,
//                                                      shape, shard count, bytes), so Inspect
//                                                      pages through them by name with
//                                                      Scan(start_after = last item key).
//   'B' job \0 be64(step) blob       BlobRecord        every data file a checkpoint being saved
//                                                      may have written, recorded before it is
//                                                      created, so an abort (or recovery)
//                                                      collects exactly those files.
//   'U' job \0 be64(step)            UploadRecord      the remote tier's upload of a checkpoint
//                                                      committed locally: PENDING (in the batch
//                                                      that records COMMITTED), DURABLE once the
//                                                      manifest is on the store; restart resumes
//                                                      the others (tier/remote_tier.h).
//   'H' job \0 be64(step)            HotRecord         the RAM tier's copy of a COMMITTED
//                                                      checkpoint (tier/ram_tier.h): which arena
//                                                      bytes hold which blob bytes, so a restarted
//                                                      daemon finds them again (and verifies them
//                                                      before use). Written unsynced after the
//                                                      commit, deleted before the extents are
//                                                      freed; a row that names bytes no longer
//                                                      there fails verification and is dropped.
//   'M' name                         (per name)        daemon metadata: schema version, ...
//
// Encoding rules, and why:
//   - be64(step) / be32(rank) are big-endian and fixed width, so byte order is numeric order:
//     step 2 < step 10 < step 2^40 in a prefix scan.
//   - Every key that continues after the job name has it terminated by '\0'. Job names never
//     contain '\0' (ValidateJobName), and '\0' sorts before every other byte, so all keys of job
//     "a" sort together, before those of "a\x01..." or "ab": prefix scans never interleave jobs.
//     'J' keys end with the name and need no terminator.
//   - Item and blob names are the key's tail, taken as is (any bytes).
//   - The tag comes first, so one prefix scan lists one record kind.
//
// What is NOT in the index: the shards of committed checkpoints. They live in the checkpoint's
// manifest on storage, which is the source of truth (a checkpoint directory is self-contained
// and portable); while a checkpoint is being saved its shards are in the 'R' journal rows.
// Everything here except that journal can be rebuilt from the manifests.
//
// Atomicity: a state change touching several keys (COMMITTED: the checkpoint record, its item
// records, deleting its rank records) is one MetaStore::Commit, i.e. one WriteBatch.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"

namespace ckptd::keys {

inline constexpr char kJobTag = 'J';
inline constexpr char kCheckpointTag = 'C';
inline constexpr char kRankTag = 'R';
inline constexpr char kItemTag = 'I';
inline constexpr char kBlobTag = 'B';
inline constexpr char kMetaTag = 'M';
inline constexpr char kUploadTag = 'U';
inline constexpr char kHotTag = 'H';

std::string Job(std::string_view job);
std::string JobPrefix();  // "J"
std::string Checkpoint(std::string_view job, uint64_t step);
std::string CheckpointPrefix(std::string_view job);  // 'C' job '\0'
std::string AllCheckpointsPrefix();                  // "C"
std::string Rank(std::string_view job, uint64_t step, uint32_t rank);
std::string RankPrefix(std::string_view job, uint64_t step);
std::string Item(std::string_view job, uint64_t step, std::string_view item);
std::string ItemPrefix(std::string_view job, uint64_t step);
std::string Blob(std::string_view job, uint64_t step, std::string_view blob);
std::string BlobPrefix(std::string_view job, uint64_t step);
std::string Upload(std::string_view job, uint64_t step);
std::string UploadPrefix(std::string_view job);  // 'U' job '\0'
std::string AllUploadsPrefix();                  // "U"
std::string Hot(std::string_view job, uint64_t step);
std::string AllHotPrefix();  // "H"
std::string Meta(std::string_view name);

// INVALID_ARGUMENT for keys of another kind or malformed ones.
absl::StatusOr<std::string> DecodeJob(std::string_view key);
absl::StatusOr<std::pair<std::string, uint64_t>> DecodeCheckpoint(std::string_view key);
absl::StatusOr<std::pair<std::string, uint64_t>> DecodeUpload(std::string_view key);
absl::StatusOr<std::pair<std::string, uint64_t>> DecodeHot(std::string_view key);
absl::StatusOr<std::tuple<std::string, uint64_t, uint32_t>> DecodeRank(std::string_view key);
// The item name (the tail after job and step).
absl::StatusOr<std::string> DecodeItem(std::string_view key);
// The blob name (the tail after job and step).
absl::StatusOr<std::string> DecodeBlob(std::string_view key);

}  // namespace ckptd::keys
