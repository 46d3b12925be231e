// Verify of CheckpointService (the Verify RPC, `ckptctl verify`): re-reads a committed
// checkpoint on its tiers and checks every checksum block of every shard (or a sample,
// format/verify_sample.h) against the manifest, and each storage tier's manifest itself.
//
// What it reads: local blobs through deps_.storage (O_DIRECT where the file system allows it, so
// the device's bytes are checked, not a page-cache copy), the remote tier's through its Storage,
// and the RAM tier's hot copy in place (pinned, so an eviction meanwhile frees nothing under it).
// A checkpoint committed at the peer tier has no whole copy on one node: its tier "peer" reads
// each blob from the first node serving it (ReadThrough: this node's own from local storage, the
// others' over the peer channel), against the store's manifest.
// A blob is read in runs of sampled blocks, gathered into batches of at most
// limits::kVerifyBatchBytes in one buffer per verify: memory stays bounded whatever the
// checkpoint's size. The reference is the first storage tier's manifest that verifies; each
// tier's blobs are checked against it, so a tier whose own manifest is damaged still has its
// data checked.
//
// What it changes: nothing, with one exception. Damaged blocks are reported, never recorded: a
// load of the checkpoint still works from another tier's good copy (the loader falls back from
// local to remote on a checksum failure) and items in undamaged blobs still load, so marking the
// checkpoint CORRUPT would hide what can be restored; a load that meets a damaged block fails
// DATA_LOSS by itself. The exception is a manifest that verifies on none of the tiers read: by the
// catalog's rule (catalog.cc) such a checkpoint is CORRUPT, and verify records it as a load or
// Latest would (GetManifest), so `latest` stops picking it.
//
// Concurrency: the key is claimed in verifying_ for the whole call, so a Delete or a retention
// step on it answers ABORTED until the verify ends (CheckDeletableLocked) instead of removing
// files under it; a delete already running makes the verify ABORTED. Shutdown stops a verify
// between two batches (UNAVAILABLE), and so does a caller that went away (CANCELLED: the RPC's
// client cancelled it or passed its deadline), so an interrupted `ckptctl verify` stops reading
// and releases its claim within a batch.
#include <algorithm>
#include <functional>
#include <map>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "format/crc32c.h"
#include "format/names.h"
#include "format/verify_sample.h"
#include "service/checkpoint_service.h"
#include "service/read_through.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

constexpr char kLocal[] = "local";
constexpr char kRemote[] = "remote";
constexpr char kRam[] = "ram";
constexpr char kPeer[] = "peer";

struct ShardRef {
  const v1::ItemEntry* item;
  const v1::ShardEntry* shard;
};

// The stored shards of each blob (an empty shard holds nothing), each blob's by offset.
std::map<uint32_t, std::vector<ShardRef>> ShardsByBlob(const Manifest& m) {
  std::map<uint32_t, std::vector<ShardRef>> by_blob;
  for (const v1::ItemEntry& item : m.items) {
    for (const v1::ShardEntry& s : item.shards()) {
      if (s.length() > 0) by_blob[s.blob_id()].push_back(ShardRef{&item, &s});
    }
  }
  for (auto& [id, shards] : by_blob) {
    std::sort(shards.begin(), shards.end(), [](const ShardRef& a, const ShardRef& b) {
      return a.shard->offset() < b.shard->offset();
    });
  }
  return by_blob;
}

// One tier's verify: its counts in its VerifyTierResult, its failures in the response (the first
// limits::kVerifyFailuresMax of the whole verify listed, every one counted). Checks blocks given
// as bytes in memory; where the bytes come from is the caller's (StorageCheck, CheckHot).
class TierCheck {
 public:
  // `block_bytes`: the manifest's checksum_block_bytes (0 without a manifest: nothing is checked).
  TierCheck(uint32_t block_bytes, const BlockSample& sample, v1::VerifyResponse* resp,
            const std::string& tier)
      : sample_(sample), block_bytes_(block_bytes), resp_(resp) {
    result_ = resp->add_tiers();
    result_->set_tier(tier);
    result_->set_manifest_ok(true);
    // A run of blocks fits the batch buffer whole (the buffer is sized for one block at least).
    if (block_bytes_ > 0) {
      run_blocks_max_ = std::max<uint64_t>(limits::kVerifyBatchBytes, block_bytes_) / block_bytes_;
    }
  }

  v1::VerifyTierResult& result() { return *result_; }
  uint32_t block_bytes() const { return block_bytes_; }
  uint64_t run_blocks_max() const { return run_blocks_max_; }

  uint64_t BlockCount(const ShardRef& ref) const {
    return static_cast<uint64_t>(ref.shard->block_crc32c_size());
  }
  // Blob offset of block `i` of `ref`, and its bytes.
  uint64_t BlockOffset(const ShardRef& ref, uint64_t i) const {
    return ref.shard->offset() + i * block_bytes_;
  }
  uint64_t RunBytes(const ShardRef& ref, uint64_t first, uint64_t n) const {
    return std::min<uint64_t>((first + n) * block_bytes_, ref.shard->length()) -
           first * block_bytes_;
  }

  // Calls fn(first, n) for each run of consecutive blocks in [first, end) of `ref` that the
  // sample checks, at most run_blocks_max() blocks each, in order.
  template <typename Fn>
  void ForEachRun(const ShardRef& ref, uint64_t first, uint64_t end, Fn&& fn) const {
    const uint64_t count = BlockCount(ref);
    uint64_t run = first, n = 0;
    for (uint64_t i = first; i < end; ++i) {
      const bool checked = sample_.Checks(ref.shard->blob_id(), BlockOffset(ref, i), i, count);
      if (checked && n > 0 && run + n == i && n < run_blocks_max_) {
        ++n;
        continue;
      }
      if (n > 0) fn(run, n);
      run = i;
      n = checked ? 1 : 0;
    }
    if (n > 0) fn(run, n);
  }
  // How many blocks in [first, end) of `ref` the sample checks.
  uint64_t Sampled(const ShardRef& ref, uint64_t first, uint64_t end) const {
    uint64_t total = 0;
    ForEachRun(ref, first, end, [&](uint64_t, uint64_t n) { total += n; });
    return total;
  }

  void Count(uint64_t blocks) { result_->set_blocks_checked(result_->blocks_checked() + blocks); }
  void AddTotal(uint64_t blocks) { result_->set_blocks_total(result_->blocks_total() + blocks); }
  void AddBytes(uint64_t bytes) { result_->set_bytes_read(result_->bytes_read() + bytes); }

  // A failure naming block `block` of `ref` in the blob named `blob`.
  v1::VerifyFailure ShardFailure(v1::VerifyProblem problem, const ShardRef& ref,
                                 const std::string& blob, uint64_t block,
                                 std::string detail) const {
    v1::VerifyFailure f;
    f.set_problem(problem);
    f.set_item(ref.item->name());
    f.set_rank(ref.shard->saved_by_rank());
    f.set_blob(blob);
    f.set_block(block);
    f.set_offset(BlockOffset(ref, block));
    f.set_detail(std::move(detail));
    return f;
  }
  // Records `f` (this tier's), which makes `bad_blocks` blocks bad.
  void Fail(v1::VerifyFailure f, uint64_t bad_blocks) {
    result_->set_blocks_bad(result_->blocks_bad() + bad_blocks);
    resp_->set_failures_total(resp_->failures_total() + 1);
    if (static_cast<uint64_t>(resp_->failures_size()) >= limits::kVerifyFailuresMax) return;
    f.set_tier(result_->tier());
    *resp_->add_failures() = std::move(f);
  }

  // Checks blocks [first, first + n) of `ref`, whose bytes are at `data`: each whose crc32c is
  // not the manifest's is a CHECKSUM_MISMATCH.
  void CheckBlocks(const ShardRef& ref, const std::string& blob, const uint8_t* data,
                   uint64_t first, uint64_t n) {
    crcs_.resize(n);
    BlockCrcsInto(data, RunBytes(ref, first, n), block_bytes_, crcs_.data());
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t want = ref.shard->block_crc32c(static_cast<int>(first + i));
      if (crcs_[i] == want) continue;
      v1::VerifyFailure f =
          ShardFailure(v1::CHECKSUM_MISMATCH, ref, blob, first + i,
                       absl::StrFormat("crc32c expected 0x%08x actual 0x%08x", want, crcs_[i]));
      f.set_expected_crc32c(want);
      f.set_actual_crc32c(crcs_[i]);
      Fail(std::move(f), 1);
    }
  }

 private:
  const BlockSample& sample_;
  const uint32_t block_bytes_;
  uint64_t run_blocks_max_ = 1;
  v1::VerifyResponse* resp_;
  v1::VerifyTierResult* result_ = nullptr;
  std::vector<uint32_t> crcs_;  // reused for every run
};

// Verifies the blobs of one storage tier through one buffer: the sampled runs of a blob are
// gathered into batches (one Read each, adjacent runs in one slice) and checked once read.
class StorageCheck {
 public:
  StorageCheck(TierCheck& tier, Storage& storage, std::string dir, uint8_t* buf, uint64_t buf_bytes,
               const std::function<bool()>& stopping)
      : tier_(tier),
        storage_(storage),
        dir_(std::move(dir)),
        buf_(buf),
        buf_bytes_(buf_bytes),
        stopping_(stopping) {}

  // Verifies the shards `shards` of blob `info`. False once `stopping` said so (the daemon
  // stopping, or the caller gone).
  bool Blob(const v1::BlobInfo& info, const std::vector<ShardRef>& shards) {
    blob_ = &info;
    for (const ShardRef& ref : shards) tier_.AddTotal(tier_.BlockCount(ref));
    absl::StatusOr<std::unique_ptr<BlobReader>> reader =
        storage_.OpenBlob(absl::StrCat(dir_, "/", info.name()));
    if (!reader.ok()) {
      const bool missing = absl::IsNotFound(reader.status());
      for (const ShardRef& ref : shards) {
        const uint64_t n = tier_.Sampled(ref, 0, tier_.BlockCount(ref));
        tier_.Count(n);
        tier_.Fail(tier_.ShardFailure(
                       missing ? v1::BLOB_MISSING : v1::READ_ERROR, ref, info.name(), 0,
                       missing ? "blob missing"
                               : absl::StrCat("opening the blob: ", reader.status().message())),
                   n);
      }
      return !stopping_();
    }
    reader_ = *std::move(reader);
    for (const ShardRef& ref : shards) {
      const uint64_t count = tier_.BlockCount(ref);
      const uint64_t whole = BlocksInFile(ref);
      if (whole < count) {
        const uint64_t lost = tier_.Sampled(ref, whole, count);
        tier_.Count(lost);
        v1::VerifyFailure f =
            tier_.ShardFailure(v1::BLOB_TRUNCATED, ref, info.name(), whole,
                               absl::StrCat("blob truncated: ", reader_->size_bytes(),
                                            " bytes, manifest says ", info.size_bytes()));
        f.set_blob_bytes(reader_->size_bytes());
        f.set_blob_bytes_expected(info.size_bytes());
        tier_.Fail(std::move(f), lost);
      }
      tier_.ForEachRun(ref, 0, whole, [&](uint64_t first, uint64_t n) { Add(ref, first, n); });
      if (stopped_) break;
    }
    Flush();
    reader_.reset();
    return !stopped_;
  }

 private:
  // A run of blocks read into the buffer at `at`.
  struct Piece {
    const ShardRef* ref;
    uint64_t first;
    uint64_t n;
    uint64_t at;
  };

  // The leading blocks of `ref` that lie wholly in the blob's file.
  uint64_t BlocksInFile(const ShardRef& ref) const {
    const uint64_t size = reader_->size_bytes(), offset = ref.shard->offset();
    if (offset + ref.shard->length() <= size) return tier_.BlockCount(ref);
    return offset >= size ? 0 : (size - offset) / tier_.block_bytes();
  }

  // Adds blocks [first, first + n) of `ref` to the batch (reading the batch first when they do
  // not fit). Reads are widened to 4 KiB pages (O_DIRECT), but never past the end of the file.
  void Add(const ShardRef& ref, uint64_t first, uint64_t n) {
    if (stopped_) return;
    tier_.Count(n);
    const uint64_t start = tier_.BlockOffset(ref, first);
    const uint64_t end = start + tier_.RunBytes(ref, first, n);
    const uint64_t read_start = RoundDown(start, limits::kAlignmentBytes);
    const uint64_t read_end =
        std::min(RoundUp(end, limits::kAlignmentBytes), reader_->size_bytes());
    const uint64_t span = read_end - read_start;
    if (used_ + RoundUp(span, limits::kAlignmentBytes) > buf_bytes_) Flush();
    IoSlice* last = slices_.empty() ? nullptr : &slices_.back();
    if (last != nullptr && last->offset + last->len == read_start &&
        static_cast<uint8_t*>(last->buf) + last->len == buf_ + used_) {
      last->len += span;  // the next bytes of the file: one read
    } else {
      slices_.push_back(IoSlice{buf_ + used_, span, read_start});
    }
    pieces_.push_back(Piece{&ref, first, n, used_ + (start - read_start)});
    used_ += RoundUp(span, limits::kAlignmentBytes);
  }

  // Reads the batch and checks its blocks; a failed read makes each of its runs a READ_ERROR.
  void Flush() {
    if (pieces_.empty()) return;
    if (stopping_()) {
      stopped_ = true;
    } else {
      absl::Status st = reader_->Read(slices_);
      for (const IoSlice& s : slices_) {
        if (st.ok()) tier_.AddBytes(s.len);
      }
      for (const Piece& p : pieces_) {
        if (st.ok()) {
          tier_.CheckBlocks(*p.ref, blob_->name(), buf_ + p.at, p.first, p.n);
        } else {
          tier_.Fail(tier_.ShardFailure(
                         v1::READ_ERROR, *p.ref, blob_->name(), p.first,
                         absl::StrCat("reading ", p.n, " blocks from here: ", st.message())),
                     p.n);
        }
      }
    }
    slices_.clear();
    pieces_.clear();
    used_ = 0;
  }

  TierCheck& tier_;
  Storage& storage_;
  const std::string dir_;
  uint8_t* const buf_;
  const uint64_t buf_bytes_;
  const std::function<bool()>& stopping_;
  const v1::BlobInfo* blob_ = nullptr;
  std::unique_ptr<BlobReader> reader_;
  std::vector<IoSlice> slices_;
  std::vector<Piece> pieces_;
  uint64_t used_ = 0;  // bytes of the buffer the batch takes
  bool stopped_ = false;
};

// Verifies what the RAM tier's copy `hot` holds (a shard it does not hold is read from storage
// by loads, and is no part of this tier).
void CheckHot(TierCheck& tier, const HotCopy& hot,
              const std::map<uint32_t, std::vector<ShardRef>>& by_blob,
              const std::map<uint32_t, const v1::BlobInfo*>& blobs) {
  for (const auto& [id, shards] : by_blob) {
    const std::string& name = blobs.at(id)->name();
    for (const ShardRef& ref : shards) {
      const uint8_t* p = hot.Find(id, ref.shard->offset(), ref.shard->length());
      if (p == nullptr) continue;
      tier.AddTotal(tier.BlockCount(ref));
      tier.ForEachRun(ref, 0, tier.BlockCount(ref), [&](uint64_t first, uint64_t n) {
        tier.Count(n);
        tier.AddBytes(tier.RunBytes(ref, first, n));
        tier.CheckBlocks(ref, name, p + first * tier.block_bytes(), first, n);
      });
    }
  }
}

// A storage tier to verify and what reading its manifest there gave.
struct StorageTier {
  const char* name;
  Storage* storage;
  absl::Status manifest;
};

// FAILED_PRECONDITION when the one tier `asked` names holds no copy to verify: the RAM tier
// (`no_hot`), or the peer, local or remote tier (`no_storage`, of StorageTiers' answer).
absl::Status CheckAskedTier(v1::VerifyTier asked, bool no_storage, bool no_hot,
                            const absl::StatusOr<std::vector<Storage*>>& readable,
                            const std::string& what) {
  if (asked == v1::VERIFY_TIER_RAM && no_hot) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is not in the RAM tier (ckptctl prefetch brings it there)"));
  }
  if (asked == v1::VERIFY_TIER_PEER && no_storage) {
    return absl::FailedPreconditionError(
        absl::StrCat(what,
                     " is not committed at the peer tier on a daemon with peers (--tier peer reads "
                     "checkpoints of the policy local+peer across the nodes)"));
  }
  if ((asked == v1::VERIFY_TIER_LOCAL || asked == v1::VERIFY_TIER_REMOTE) && no_storage) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has no ", asked == v1::VERIFY_TIER_LOCAL ? "local" : "durable remote",
                     " copy this daemon can read",
                     readable.ok() ? "" : absl::StrCat(" (", readable.status().message(), ")")));
  }
  return absl::OkStatus();
}

// The storage tiers of `rec` to verify (`readable`: ReadTiers' answer) that `asked` names.
// `nodes`: the checkpoint across the nodes (ReadThrough), for one committed at the peer tier.
std::vector<StorageTier> StorageTiers(const v1::CheckpointRecord& rec,
                                      const absl::StatusOr<std::vector<Storage*>>& readable,
                                      Storage* local, Storage* remote, Storage* nodes,
                                      v1::VerifyTier asked) {
  std::vector<StorageTier> tiers;
  if (!readable.ok()) return tiers;
  const bool all = asked == v1::VERIFY_TIER_ALL;
  if (rec.summary().tiers().local() && (all || asked == v1::VERIFY_TIER_LOCAL)) {
    tiers.push_back(StorageTier{kLocal, local, absl::OkStatus()});
  }
  // (A checkpoint committed at the peer tier reads its manifest there, and no blob.)
  const bool remote_durable =
      remote != nullptr && HasRemoteTier(rec.summary().tier_policy()) &&
      std::find(readable->begin(), readable->end(), remote) != readable->end();
  if (remote_durable && (all || asked == v1::VERIFY_TIER_REMOTE)) {
    tiers.push_back(StorageTier{kRemote, remote, absl::OkStatus()});
  }
  // Across the nodes when asked, or when no whole copy is here (ALL).
  if (nodes != nullptr && (asked == v1::VERIFY_TIER_PEER || (all && tiers.empty()))) {
    tiers.push_back(StorageTier{kPeer, nodes, absl::OkStatus()});
  }
  return tiers;
}

// Reads and decodes each tier's manifest (recorded in its `manifest`); the first that verifies
// is the reference (null: none did). *damaged: some tier's did not verify (DATA_LOSS).
std::shared_ptr<const Manifest> ReadManifests(std::vector<StorageTier>& tiers,
                                              const std::string& job, uint64_t step,
                                              bool* damaged) {
  std::shared_ptr<const Manifest> ref;
  for (StorageTier& t : tiers) {
    absl::StatusOr<Manifest> m = ReadManifest(*t.storage, job, step);
    t.manifest = m.status();
    *damaged = *damaged || absl::IsDataLoss(m.status());
    if (m.ok() && ref == nullptr) ref = std::make_shared<const Manifest>(*std::move(m));
  }
  return ref;
}

// The tier's manifest as a failure (and manifest_ok false) when it does not verify or could not
// be read.
void ReportManifest(TierCheck& tier, const absl::Status& st) {
  if (st.ok()) return;
  tier.result().set_manifest_ok(false);
  v1::VerifyFailure f;
  const bool damaged =
      absl::IsNotFound(st) || absl::IsDataLoss(st) || absl::IsFailedPrecondition(st);
  f.set_problem(damaged ? v1::MANIFEST_INVALID : v1::READ_ERROR);
  f.set_blob(kManifestFileName);
  f.set_detail(absl::IsNotFound(st) ? "manifest missing" : std::string(st.message()));
  tier.Fail(std::move(f), 0);
}

// Verifies the storage tiers (their manifests, and their blobs against `ref` when there is one)
// and the hot copy (`hot`, when there is one and a reference), in that order, into *resp.
// The status of `stop` (UNAVAILABLE: the daemon is stopping; CANCELLED: the caller went away)
// when it said so before a blob or between two batches; RESOURCE_EXHAUSTED when the batch buffer
// cannot be allocated.
absl::Status RunVerify(const std::string& dir, const std::vector<StorageTier>& storage,
                       const HotCopy* hot, const Manifest* ref, const BlockSample& sample,
                       const std::function<absl::Status()>& stop, v1::VerifyResponse* resp) {
  const uint32_t block = ref == nullptr ? 0 : ref->header.checksum_block_bytes();
  if (block > limits::kChecksumBlockBytesMax) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its manifest has checksum blocks of ", block,
        " bytes; this daemon verifies blocks of at most ", limits::kChecksumBlockBytesMax));
  }
  resp->set_checksum_block_bytes(block);
  std::map<uint32_t, std::vector<ShardRef>> by_blob;
  std::map<uint32_t, const v1::BlobInfo*> blobs;
  if (ref != nullptr) {
    by_blob = ShardsByBlob(*ref);
    for (const v1::BlobInfo& b : ref->header.blobs()) blobs[b.id()] = &b;
  }
  // One buffer for every batch: a block at least, whatever the alignment slack of its run.
  const uint64_t buf_bytes =
      std::max<uint64_t>(limits::kVerifyBatchBytes, block) + limits::kAlignmentBytes;
  AlignedBuffer buf;
  if (ref != nullptr && !storage.empty()) {
    buf = AllocateAligned(buf_bytes);
    if (buf == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("verify: no memory for its ", buf_bytes, "-byte read buffer"));
    }
  }
  const std::function<bool()> stopping = [&stop] { return !stop().ok(); };
  for (const StorageTier& t : storage) {
    TierCheck tier(block, sample, resp, t.name);
    ReportManifest(tier, t.manifest);
    if (ref == nullptr) continue;
    StorageCheck check(tier, *t.storage, dir, buf.get(), buf_bytes, stopping);
    for (const auto& [id, shards] : by_blob) {
      CKPTD_RETURN_IF_ERROR(stop());  // also between blobs with nothing to read
      if (!check.Blob(*blobs.at(id), shards)) {
        absl::Status st = stop();  // stays set once set
        return st.ok() ? absl::UnavailableError("verify: stopped") : st;
      }
    }
  }
  if (hot != nullptr && ref != nullptr) {
    TierCheck tier(block, sample, resp, kRam);
    CheckHot(tier, *hot, by_blob, blobs);
  }
  return absl::OkStatus();
}

uint64_t PickSeed(uint64_t asked) {
  if (asked != 0) return asked;
  std::random_device rd;
  const uint64_t seed = (uint64_t{rd()} << 32) | rd();
  return seed == 0 ? 1 : seed;
}

// "local: 1200 of 1200 blocks checked, 1 bad; ram: ...", for the log.
std::string Summary(const v1::VerifyResponse& resp) {
  std::vector<std::string> parts;
  for (const v1::VerifyTierResult& t : resp.tiers()) {
    parts.push_back(absl::StrCat(t.tier(), ": ", t.blocks_checked(), " of ", t.blocks_total(),
                                 " blocks checked, ", t.blocks_bad(), " bad",
                                 t.manifest_ok() ? "" : ", manifest bad"));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace

absl::StatusOr<v1::CheckpointRecord> CheckpointService::ClaimForVerify(const Key& key) {
  const std::string what = CkptName(key.first, key.second);
  absl::MutexLock lock(&mu_);
  CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> row,
                         ReadRowLocked(key, /*corrupt_is_error=*/false));
  if (auto busy = rewriting_.find(key); busy != rewriting_.end()) {
    return absl::AbortedError(
        absl::StrCat(what, " is ", busy->second, "; retry once that has finished"));
  }
  if (!row) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  const v1::CheckpointState state = row->summary().state();
  if (state != v1::COMMITTED && state != v1::CORRUPT) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is ", v1::CheckpointState_Name(state),
                     "; only COMMITTED (and CORRUPT) checkpoints are verified"));
  }
  ++verifying_[key];
  return *std::move(row);
}

void CheckpointService::ReleaseVerify(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = verifying_.find(key);
  CKPTD_CHECK(it != verifying_.end());
  if (--it->second == 0) verifying_.erase(it);
}

absl::StatusOr<uint64_t> CheckpointService::VerifyStep(const Caller& caller,
                                                       const v1::VerifyRequest& req) {
  CKPTD_RETURN_IF_ERROR(ValidateJobName(req.job()));
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  if (req.sample() != 0.0) CKPTD_RETURN_IF_ERROR(BlockSample::ValidateFraction(req.sample()));
  if (!v1::VerifyTier_IsValid(req.tier())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown verify tier ", req.tier()));
  }
  uint64_t step = req.step();
  if (req.which_case() != v1::VerifyRequest::kStep) {
    CKPTD_ASSIGN_OR_RETURN(step, LatestReadable(caller, req.job()));
  }
  // A checkpoint another daemon committed to the store is adopted first, as for a load.
  CKPTD_RETURN_IF_ERROR(ReadRecordOrAdopt(req.job(), step).status());
  // Again once adopted and found (owners.cc): the check above passes for a job with no owner.
  CKPTD_RETURN_IF_ERROR(CheckAccess(caller, req.job(), Access::kRead));
  return step;
}

absl::Status CheckpointService::Verify(const Caller& caller, const v1::VerifyRequest& req,
                                       v1::VerifyResponse* resp,
                                       const std::function<bool()>& cancelled) {
  CKPTD_ASSIGN_OR_RETURN(const uint64_t step, VerifyStep(caller, req));
  const Key key{req.job(), step};
  const std::string what = CkptName(req.job(), step);
  CKPTD_ASSIGN_OR_RETURN(v1::CheckpointRecord rec, ClaimForVerify(key));
  absl::Cleanup release = [&] { ReleaseVerify(key); };
  resp->set_step(step);

  // The tiers it is on, filtered by the one asked for.
  const v1::VerifyTier asked = req.tier();
  absl::StatusOr<std::vector<Storage*>> readable = ReadTiers(rec);
  std::unique_ptr<ReadThrough> nodes;
  if (readable.ok() && rec.summary().tier_policy() == v1::TIER_LOCAL_AND_PEER &&
      deps_.peers != nullptr) {
    nodes = std::make_unique<ReadThrough>(WithPeers(rec, *readable));
  }
  std::vector<StorageTier> storage =
      StorageTiers(rec, readable, deps_.storage, remote_.remote(), nodes.get(), asked);
  std::shared_ptr<const HotCopy> hot;
  if (asked == v1::VERIFY_TIER_ALL || asked == v1::VERIFY_TIER_RAM) hot = ram_tier_.Pin(key);
  CKPTD_RETURN_IF_ERROR(CheckAskedTier(asked, storage.empty(), hot == nullptr, readable, what));
  if (storage.empty() && hot == nullptr) return readable.status();

  bool damaged = false;
  std::shared_ptr<const Manifest> ref = ReadManifests(storage, req.job(), step, &damaged);
  if (storage.empty()) {  // the RAM tier alone: checked against the manifest loads use
    CKPTD_ASSIGN_OR_RETURN(
        ref, GetManifest(req.job(), step, readable.ok() ? std::optional(*readable) : std::nullopt));
  }
  if (ref == nullptr && damaged) {
    // No tier's manifest verifies: CORRUPT, as GetManifest records it for a load.
    absl::Status marked = MarkCorrupt(
        req.job(), step, absl::DataLossError("verify: the manifest verifies on no tier"));
    if (!marked.ok()) spdlog::error("{}", marked.ToString());
  }

  BlockSample sample;
  if (req.sample() != 0.0 && req.sample() < 1.0) {
    resp->set_seed(PickSeed(req.seed()));
    sample = BlockSample(req.sample(), resp->seed());
  }
  // Polled between batches: the daemon stopping, or the caller gone (its tool interrupted, or
  // past its deadline), ends the reading there.
  const std::function<absl::Status()> stop = [this, &cancelled] {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("verify: the daemon is stopping");
    }
    if (cancelled && cancelled()) {
      return absl::CancelledError("verify: the caller went away (cancelled, or past its deadline)");
    }
    return absl::OkStatus();
  };
  CKPTD_RETURN_IF_ERROR(Annotate(
      RunVerify(CheckpointDir(req.job(), step), storage, hot.get(), ref.get(), sample, stop, resp),
      what));
  if (resp->failures_total() == 0) {
    spdlog::info("verify of {}: {}", what, Summary(*resp));
  } else {
    spdlog::warn("verify of {}: {} failures ({})", what, resp->failures_total(), Summary(*resp));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
