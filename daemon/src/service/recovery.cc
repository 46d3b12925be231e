// Recovery at start, housekeeping while running, and shutdown.
//
// The manifest on storage is the truth; the index is the node's journal. Recovery:
//   1. adopts every verified manifest whose index row is not COMMITTED (a crash between the
//      manifest rename and the COMMITTED row, or a checkpoint directory copied in from elsewhere);
//   2. resumes checkpoints journaled as STAGING/PERSISTING from the arena when the arena is the
//      one they were staged into (same generation), else ABORTs them and removes their files;
//   3. ABORTs COMMITTED rows whose manifest is gone;
//   4. ABORTs reshards that were running (their source is intact: they can simply run again).
#include <algorithm>
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/status.h"
#include "format/names.h"
#include "format/region.h"
#include "index/keys.h"
#include "common/limits.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::Status CheckpointService::Recover() {
  CKPTD_RETURN_IF_ERROR(AdoptManifests());
  CKPTD_RETURN_IF_ERROR(ResumePending());
  return CheckCommittedRows();
}

absl::Status CheckpointService::AdoptManifests() {
  CKPTD_ASSIGN_OR_RETURN(std::vector<std::string> jobs, deps_.storage->List(""));
  for (const std::string& job : jobs) {
    if (!ValidateJobName(job).ok()) continue;
    CKPTD_ASSIGN_OR_RETURN(std::vector<std::string> steps, deps_.storage->List(job));
    for (const std::string& step_dir : steps) {
      absl::StatusOr<uint64_t> step = ParseStepDirName(step_dir);
      if (!step.ok()) continue;
      std::string dir = CheckpointDir(job, *step);
      std::string path = absl::StrCat(dir, "/", kManifestFileName);
      CKPTD_ASSIGN_OR_RETURN(bool exists, deps_.storage->Exists(path));
      if (!exists) continue;
      CKPTD_ASSIGN_OR_RETURN(std::optional<v1::CheckpointRecord> rec, GetRecord(job, *step));
      if (rec && rec->summary().state() == v1::COMMITTED) continue;
      absl::StatusOr<std::string> bytes = deps_.storage->Get(path);
      absl::StatusOr<Manifest> m =
          bytes.ok() ? DecodeManifest(*bytes, path) : absl::StatusOr<Manifest>(bytes.status());
      if (m.ok() && (m->header.job() != job || m->header.step() != *step)) {
        m = absl::DataLossError(absl::StrCat("manifest names ", m->header.job(), "/",
                                             m->header.step()));
      }
      if (!m.ok()) {
        spdlog::error("recovery: not exposing {}: its manifest does not verify: {}", dir,
                      m.status().ToString());
        continue;
      }
      CKPTD_RETURN_IF_ERROR(IndexCommitted(*m, dir));
      spdlog::info("recovery: adopted {}/{} from its manifest", job, *step);
    }
  }
  return absl::OkStatus();
}

void CheckpointService::AbortRecovered(const v1::CheckpointRecord& rec,
                                       const std::string& reason) {
  const v1::CheckpointSummary& s = rec.summary();
  spdlog::warn("recovery: checkpoint {}/{} ABORTED: {}", s.job(), s.step(), reason);
  absl::Status st = deps_.storage->RemoveAll(CheckpointDir(s.job(), s.step()));
  if (!st.ok()) spdlog::error("recovery: removing files: {}", st.ToString());
  v1::CheckpointRecord out = rec;
  out.mutable_summary()->set_state(v1::ABORTED);
  out.mutable_summary()->set_error(reason);
  out.mutable_summary()->mutable_tiers()->Clear();
  st = PutRecordSync(out);
  if (st.ok()) st = deps_.meta->DeletePrefix(keys::RankPrefix(s.job(), s.step()), false);
  if (st.ok()) st = deps_.meta->DeletePrefix(keys::BlobPrefix(s.job(), s.step()), true);
  if (st.ok()) st = deps_.meta->DeletePrefix(keys::ItemPrefix(s.job(), s.step()), true);
  if (!st.ok()) spdlog::error("recovery: recording abort: {}", st.ToString());
}

absl::Status CheckpointService::ResumePending() {
  std::vector<v1::CheckpointRecord> open;
  std::vector<v1::CheckpointRecord> aborted;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::AllCheckpointsPrefix(), "", 0, [&](std::string_view, std::string_view v) {
        v1::CheckpointRecord rec;
        if (!rec.ParseFromArray(v.data(), static_cast<int>(v.size()))) return true;
        auto state = rec.summary().state();
        if (state == v1::STAGING || state == v1::PERSISTING) open.push_back(rec);
        if (state == v1::ABORTED) aborted.push_back(rec);
        return true;
      }));
  for (const v1::CheckpointRecord& rec : aborted) {
    // Collect partial data an interrupted abort may have left.
    deps_.storage->RemoveAll(CheckpointDir(rec.summary().job(), rec.summary().step()))
        .IgnoreError();
  }
  for (const v1::CheckpointRecord& rec : open) {
    if (!rec.summary().origin().empty()) {  // a reshard: not resumable, and the source remains
      AbortRecovered(rec, absl::StrCat(rec.summary().origin(),
                                       " was interrupted by a daemon restart; run it again"));
      continue;
    }
    std::vector<v1::RankRecord> ranks;
    CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
        keys::RankPrefix(rec.summary().job(), rec.summary().step()), "", 0,
        [&](std::string_view, std::string_view v) {
          ranks.emplace_back();
          ranks.back().ParseFromArray(v.data(), static_cast<int>(v.size()));
          return true;
        }));
    absl::Status st = ResumeOne(rec, ranks);
    if (!st.ok()) AbortRecovered(rec, std::string(st.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::ResumeOne(const v1::CheckpointRecord& rec,
                                          const std::vector<v1::RankRecord>& ranks) {
  const v1::CheckpointSummary& s = rec.summary();
  auto p = std::make_unique<Pending>();
  p->job = s.job();
  p->step = s.step();
  p->world_size = s.world_size();
  p->created_unix_ms = s.created_unix_ms();
  p->partial = s.partial();
  p->checksum_block_bytes = deps_.options->checksum_block_bytes;
  if (!ranks.empty()) p->checksum_block_bytes = RankBlockBytes(ranks.front());
  for (const v1::RankRecord& rr : ranks) {
    PendingRank pr;
    pr.rec = rr;
    pr.persisted = rr.persisted();
    for (int i = 0; i < rr.shards_size(); ++i) {
      const v1::StagedShard& sh = rr.shards(i);
      const v1::ShardSpec& spec = sh.spec();
      if (!pr.persisted && spec.data().length() > 0) {
        if (spec.data().target_case() != v1::MemRef::kExtentId) {
          return absl::DataLossError(absl::StrCat(
              "recovery: rank ", rr.rank(), " staged from a client region, which did not "
              "survive the restart"));
        }
        if (!deps_.arena->adopted() || rr.arena_generation() != deps_.arena->generation()) {
          return absl::DataLossError(absl::StrCat(
              "recovery: the staging arena was lost (rank ", rr.rank(), " was staged into "
              "generation ", rr.arena_generation(), ", the arena now is ",
              deps_.arena->generation(), ")"));
        }
        if (std::find(pr.extent_ids.begin(), pr.extent_ids.end(), sh.extent_id()) ==
            pr.extent_ids.end()) {
          CKPTD_RETURN_IF_ERROR(
              deps_.arena->Restore(sh.extent_id(), sh.arena_offset(), sh.extent_length()));
          pr.extent_ids.push_back(sh.extent_id());
        }
      }
      std::string rkey = StoredCopyKey(spec, rr.rank());
      if (!sh.replica()) p->stored_copy[rkey] = {rr.rank(), static_cast<size_t>(i)};
      if (!p->items.contains(spec.item())) {
        ItemMeta m;
        m.kind = spec.has_tensor() ? v1::TENSOR : v1::OBJECT;
        m.dtype = spec.tensor().dtype();
        m.shape.assign(spec.tensor().global_shape().begin(), spec.tensor().global_shape().end());
        m.scope = spec.object().scope();
        m.first_rank = rr.rank();
        p->items.emplace(spec.item(), std::move(m));
      }
    }
    p->ranks.emplace(rr.rank(), std::move(pr));
  }
  p->state = (p->partial || p->ranks.size() == p->world_size) ? v1::PERSISTING : v1::STAGING;
  spdlog::info("recovery: resuming checkpoint {}/{} ({} of {} ranks staged)", p->job, p->step,
               p->ranks.size(), p->world_size);
  absl::MutexLock lock(&mu_);
  Key key{p->job, p->step};
  Pending& pp = *pending_.emplace(key, std::move(p)).first->second;
  for (auto& [r, pr] : pp.ranks) {
    if (!pr.persisted) PostFlush(key, r);
  }
  MaybeStartCommitLocked(pp);
  return absl::OkStatus();
}

absl::Status CheckpointService::CheckCommittedRows() {
  std::vector<v1::CheckpointRecord> committed;
  CKPTD_RETURN_IF_ERROR(deps_.meta->Scan(
      keys::AllCheckpointsPrefix(), "", 0, [&](std::string_view, std::string_view v) {
        v1::CheckpointRecord rec;
        if (rec.ParseFromArray(v.data(), static_cast<int>(v.size())) &&
            rec.summary().state() == v1::COMMITTED) {
          committed.push_back(rec);
        }
        return true;
      }));
  for (const v1::CheckpointRecord& rec : committed) {
    std::string path = absl::StrCat(CheckpointDir(rec.summary().job(), rec.summary().step()), "/",
                                    kManifestFileName);
    CKPTD_ASSIGN_OR_RETURN(bool exists, deps_.storage->Exists(path));
    if (!exists) AbortRecovered(rec, "recovery: its manifest is missing from storage");
  }
  return absl::OkStatus();
}

void CheckpointService::Start() {
  housekeeper_ = std::thread([this] { Housekeeping(); });
}

void CheckpointService::Housekeeping() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    changed_.WaitWithTimeout(
        &mu_, absl::Milliseconds(std::clamp<uint64_t>(deps_.options->flush_gate_ms / 4, 10, 200)));
    if (stopping_) break;
    const uint64_t now = NowUnixMs();
    std::vector<Pending*> expired;
    for (auto& [key, p] : pending_) {
      if (p->state == v1::STAGING && !p->aborting && !p->partial &&
          now - p->created_unix_ms > deps_.options->stage_timeout_ms) {
        expired.push_back(p.get());
      }
    }
    for (auto& [key, p] : pending_) {
      if (p->first_staged_unix_ms != 0 &&
          now - p->first_staged_unix_ms >= deps_.options->flush_gate_ms) {
        PostGatedFlushesLocked(*p);
      }
    }
    for (Pending* p : expired) {
      std::vector<uint32_t> missing;
      for (uint32_t r = 0; r < p->world_size && missing.size() < 33; ++r) {
        if (!p->ranks.contains(r)) missing.push_back(r);
      }
      AbortLocked(*p, absl::StrCat("stage timeout: ranks [", absl::StrJoin(missing, ", "),
                                   missing.size() > 32 ? ", ..." : "", "] of ", p->world_size,
                                   " were not staged within ", deps_.options->stage_timeout_ms,
                                   " ms"));
    }
    // Lock order: mu_, then the session table's and the arena's own locks (never the reverse).
    size_t n = sessions_.ExpireUnattached(absl::Now(),
                                          absl::Milliseconds(limits::kSessionAttachTimeoutMs));
    if (n > 0) spdlog::info("{} sessions ended: not attached within {} ms", n,
                            limits::kSessionAttachTimeoutMs);
  }
}

bool CheckpointService::Shutdown(absl::Duration grace, bool* drained_out) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !housekeeper_.joinable()) return pending_.empty();
    stopping_ = true;
    changed_.SignalAll();
  }
  if (housekeeper_.joinable()) housekeeper_.join();
  StopReshards();
  bool drained = deps_.flush_pool->Drain(grace);
  if (drained_out != nullptr) *drained_out = drained;
  if (drained) deps_.flush_pool->Stop();
  absl::MutexLock lock(&mu_);
  if (!drained) spdlog::warn("shutdown: flushes still running after the grace period");
  return drained && pending_.empty();
}

}  // namespace ckptd
