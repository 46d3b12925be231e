#include "tier/remote_tier.h"

#include <pthread.h>

#include <algorithm>
#include <future>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/align.h"
#include "common/limits.h"
#include "common/log.h"
#include "common/owner_map.h"
#include "format/blob_encoding.h"
#include "format/manifest.h"
#include "format/names.h"
#include "index/keys.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

// Backoff before attempt n+1 after n failures: 1 s, 2 s, 4 s, ... capped.
absl::Duration Backoff(uint32_t failures, uint64_t max_ms) {
  uint64_t ms = 1000;
  for (uint32_t i = 1; i < failures && ms < max_ms; ++i) ms *= 2;
  return absl::Milliseconds(std::min(ms, max_ms));
}

std::string Name(const std::string& job, uint64_t step) { return absl::StrCat(job, "/", step); }

MetaStore::Write RowWrite(const std::string& job, uint64_t step, const std::string& dir,
                          const v1::Upload& state) {
  v1::UploadRecord rec;
  *rec.mutable_upload() = state;
  rec.mutable_upload()->set_bytes_done(0);  // progress is not kept
  rec.set_dir(dir);
  return MetaStore::Write{keys::Upload(job, step), rec.SerializeAsString()};
}

}  // namespace

RemoteTier::RemoteTier(const DaemonOptions* options, MetaStore* meta, Committer* committer,
                       Storage* local, Storage* remote)
    : options_(options),
      meta_(meta),
      committer_(committer),
      local_(local),
      store_(remote != nullptr ? std::make_unique<EncodedStore>(remote) : nullptr),
      remote_(store_.get()) {
  // One read in flight per upload thread and for the cluster thread's CopyBlobs.
  if (enabled()) {
    const size_t n = options_->upload_threads + 1;
    readers_ = std::make_unique<WorkerPool>("upload-read", n, n);
  }
}

RemoteTier::~RemoteTier() { Stop(); }

MetaStore::Write RemoteTier::NewRow(const std::string& job, uint64_t step, const std::string& dir,
                                    uint64_t bytes_total, v1::UploadState state) const {
  v1::Upload u;
  u.set_state(state);
  u.set_bytes_total(bytes_total);
  u.set_store(remote_ != nullptr ? remote_->Describe() : "");
  return RowWrite(job, step, dir, u);
}

absl::Status RemoteTier::Start() {
  if (!enabled()) return absl::OkStatus();
  CKPTD_RETURN_IF_ERROR(RefillFromIndex());
  for (uint32_t i = 0; i < options_->upload_threads; ++i) {
    threads_.emplace_back([this, i] {
      pthread_setname_np(pthread_self(), absl::StrCat("upload-", i).c_str());
      ThreadMain();
    });
  }
  return absl::OkStatus();
}

absl::Status RemoteTier::RefillFromIndex() {
  std::vector<std::shared_ptr<Upload>> found;
  {
    absl::MutexLock lock(&mu_);
    refill_ = false;
  }
  CKPTD_RETURN_IF_ERROR(meta_->Scan(
      keys::AllUploadsPrefix(), "", 0, [&](std::string_view key, std::string_view value) {
        absl::StatusOr<std::pair<std::string, uint64_t>> id = keys::DecodeUpload(key);
        v1::UploadRecord rec;
        if (!id.ok() || !rec.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          spdlog::warn("remote tier: an upload row that does not parse is skipped");
          return true;
        }
        if (rec.upload().state() == v1::UPLOAD_DURABLE) return true;
        auto u = std::make_shared<Upload>();
        u->job = id->first;
        u->step = id->second;
        u->dir = rec.dir();
        u->state = rec.upload();
        u->state.set_state(v1::UPLOAD_PENDING);
        found.push_back(std::move(u));
        return found.size() < limits::kUploadsTrackedMax;
      }));
  absl::MutexLock lock(&mu_);
  for (std::shared_ptr<Upload>& u : found) {
    if (tracked_.size() >= limits::kUploadsTrackedMax) {
      refill_ = true;
      break;
    }
    Key key{u->job, u->step};
    if (tracked_.contains(key)) continue;
    spdlog::info("remote tier: upload of {} to {} queued", Name(u->job, u->step),
                 remote_->Describe());
    tracked_.emplace(std::move(key), std::move(u));
  }
  if (found.size() >= limits::kUploadsTrackedMax) refill_ = true;
  changed_.SignalAll();
  return absl::OkStatus();
}

void RemoteTier::Track(const std::string& job, uint64_t step, const std::string& dir) {
  CKPTD_CHECK(enabled());
  absl::MutexLock lock(&mu_);
  if (tracked_.size() >= limits::kUploadsTrackedMax) {
    refill_ = true;  // its PENDING row is durable: taken up when a tracked upload finishes
    return;
  }
  auto u = std::make_shared<Upload>();
  u->job = job;
  u->step = step;
  u->dir = dir;
  u->state.set_state(v1::UPLOAD_PENDING);
  u->state.set_store(remote_->Describe());
  tracked_.emplace(Key{job, step}, std::move(u));
  changed_.SignalAll();
}

absl::StatusOr<std::optional<v1::UploadRecord>> RemoteTier::ReadRow(const std::string& job,
                                                                    uint64_t step) const {
  CKPTD_ASSIGN_OR_RETURN(std::optional<std::string> value, meta_->Get(keys::Upload(job, step)));
  if (!value) return std::nullopt;
  v1::UploadRecord rec;
  if (!rec.ParseFromString(*value)) {
    return absl::DataLossError(
        absl::StrCat("the upload row of ", Name(job, step), " in the index does not parse"));
  }
  return rec;
}

absl::StatusOr<std::map<uint64_t, v1::UploadRecord>> RemoteTier::ReadRows(
    const std::string& job) const {
  std::map<uint64_t, v1::UploadRecord> rows;
  CKPTD_RETURN_IF_ERROR(meta_->Scan(
      keys::UploadPrefix(job), "", 0, [&](std::string_view key, std::string_view value) {
        absl::StatusOr<std::pair<std::string, uint64_t>> id = keys::DecodeUpload(key);
        v1::UploadRecord rec;
        if (id.ok() && id->first == job &&
            rec.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
          rows.emplace(id->second, std::move(rec));
        }
        return true;
      }));
  return rows;
}

void RemoteTier::Fill(const std::string& job, uint64_t step,
                      const std::optional<v1::UploadRecord>& row, v1::Tiers* out) const {
  if (!row) return;
  *out->mutable_upload() = row->upload();
  {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(Key{job, step});
    if (it != tracked_.end()) {
      *out->mutable_upload() = it->second->state;
      out->mutable_upload()->set_bytes_done(it->second->bytes_done.load());
    }
  }
  out->set_remote(out->upload().state() == v1::UPLOAD_DURABLE);
}

absl::Status RemoteTier::WaitDurable(const std::string& job, uint64_t step, absl::Time deadline) {
  const std::string name = Name(job, step);
  while (true) {
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::UploadRecord> row, ReadRow(job, step));
    if (!row) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", name,
          " has no remote copy or upload (its tier policy is local, or local+peer with a step "
          "that is not a multiple of remote_every)"));
    }
    if (row->upload().state() == v1::UPLOAD_DURABLE) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(Key{job, step});
    if (it != tracked_.end() && it->second->state.state() == v1::UPLOAD_REFUSED) {
      return absl::PermissionDeniedError(absl::StrCat("checkpoint ", name, " will not be on ",
                                                      it->second->state.store(), ": ",
                                                      it->second->state.error()));
    }
    if (absl::Now() >= deadline) {
      v1::Upload s = it != tracked_.end() ? it->second->state : row->upload();
      uint64_t done = it != tracked_.end() ? it->second->bytes_done.load() : 0;
      return absl::DeadlineExceededError(absl::StrCat(
          "checkpoint ", name, " is not durable on ", s.store(), " yet: upload ",
          v1::UploadState_Name(s.state()), ", ", done, " of ", s.bytes_total(), " bytes",
          s.error().empty() ? "" : absl::StrCat(", last attempt failed: ", s.error())));
    }
    // Wakes when an upload finishes; re-reads the row at least every 100 ms (an upload the
    // tracked set could not take yet is not signalled).
    changed_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
  }
}

absl::Status RemoteTier::ClaimStoreOwner(const std::string& job, const v1::Owner& owner) {
  CKPTD_CHECK(enabled());
  const std::string path = absl::StrCat(job, "/", kJobOwnerFileName);
  CKPTD_ASSIGN_OR_RETURN(const uint32_t uid, options_->owners.LocalUid(owner));
  {
    absl::MutexLock lock(&mu_);
    if (auto it = store_owners_.find(job); it != store_owners_.end() && it->second == uid) {
      return absl::OkStatus();
    }
  }
  absl::Status put = remote_->PutIfAbsent(path, owner.SerializeAsString());
  if (!put.ok() && !absl::IsAlreadyExists(put)) {
    return Annotate(put,
                    absl::StrCat("recording the owner of job ", job, " on ", remote_->Describe()));
  }
  if (absl::IsAlreadyExists(put)) {
    CKPTD_ASSIGN_OR_RETURN(std::optional<uint32_t> there, StoreOwnerUid(job));
    if (!there.has_value()) {
      return absl::UnavailableError(
          absl::StrCat(remote_->Describe(), "/", path, " vanished after it was found; try again"));
    }
    if (*there != uid) {
      return absl::PermissionDeniedError(absl::StrCat(
          "job ", job, " on ", remote_->Describe(), " belongs to uid ", *there,
          " here; this node's job of that name (", OwnerMap::Describe(owner),
          ") may not write there (rename the job, or see docs/SECURITY.md \"Ownership\")"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (store_owners_.size() >= limits::kStoreOwnersCachedMax) store_owners_.clear();
  store_owners_[job] = uid;
  return absl::OkStatus();
}

absl::StatusOr<bool> RemoteTier::StoreOwnedByOther(const std::string& job, uint32_t uid) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = store_owners_.find(job); it != store_owners_.end() && it->second == uid) {
      return false;  // verified (or claimed) by this daemon: no read
    }
  }
  absl::StatusOr<std::optional<uint32_t>> there = StoreOwnerUid(job);
  // A record that maps to no uid here, or does not parse, is nobody's of this node.
  if (absl::IsPermissionDenied(there.status()) || absl::IsDataLoss(there.status())) return true;
  CKPTD_RETURN_IF_ERROR(there.status());
  return there->has_value() && **there != uid;
}

absl::StatusOr<std::optional<uint32_t>> RemoteTier::StoreOwnerUid(const std::string& job) {
  const std::string path = absl::StrCat(job, "/", kJobOwnerFileName);
  absl::StatusOr<std::string> there = remote_->Get(path);
  if (absl::IsNotFound(there.status())) return std::nullopt;
  CKPTD_RETURN_IF_ERROR(
      Annotate(there.status(), absl::StrCat("reading ", path, " on ", remote_->Describe())));
  v1::Owner recorded;
  if (there->size() > limits::kStoreOwnerFileBytesMax || !recorded.ParseFromString(*there)) {
    return absl::DataLossError(absl::StrCat(remote_->Describe(), "/", path,
                                            " is not an owner record (", there->size(),
                                            " bytes); nothing of job ", job, " is written there"));
  }
  absl::StatusOr<uint32_t> uid = options_->owners.LocalUid(recorded);
  if (!uid.ok()) {
    return Annotate(uid.status(), absl::StrCat("the owner of job ", job, " on ",
                                               remote_->Describe(), " is no uid here"));
  }
  return *uid;
}

absl::Status RemoteTier::Remove(const std::string& job, uint64_t step, const std::string& dir,
                                std::optional<uint32_t> owner_uid) {
  if (!enabled()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    auto it = tracked_.find(Key{job, step});
    if (it != tracked_.end()) {
      std::shared_ptr<Upload> u = it->second;
      u->cancel = true;
      while (u->running) changed_.Wait(&mu_);
      tracked_.erase(Key{job, step});
    }
  }
  // A copy on the store of a job the store records for another owner is theirs: left there.
  bool theirs = false;
  if (owner_uid.has_value()) {
    CKPTD_ASSIGN_OR_RETURN(
        theirs, Annotate(StoreOwnedByOther(job, *owner_uid),
                         absl::StrCat("checking the owner of ", Name(job, step), " on the store")));
  }
  if (theirs) {
    spdlog::warn(
        "remote tier: {} on {} is left there: the store records job {} for another "
        "owner than uid {}",
        Name(job, step), remote_->Describe(), job, *owner_uid);
    std::vector<MetaStore::Write> row{{keys::Upload(job, step), std::nullopt}};
    return committer_->Commit(keys::Checkpoint(job, step), std::move(row));
  }
  // The manifest first: a store left with blobs and no manifest shows nothing to load.
  CKPTD_RETURN_IF_ERROR(Annotate(remote_->RemoveAll(absl::StrCat(dir, "/", kManifestFileName)),
                                 absl::StrCat("removing the remote copy of ", Name(job, step))));
  CKPTD_RETURN_IF_ERROR(Annotate(remote_->RemoveAll(dir),
                                 absl::StrCat("removing the remote copy of ", Name(job, step))));
  std::vector<MetaStore::Write> row{{keys::Upload(job, step), std::nullopt}};
  return committer_->Commit(keys::Checkpoint(job, step), std::move(row));
}

std::vector<std::pair<std::string, uint64_t>> RemoteTier::Tracked() const {
  absl::MutexLock lock(&mu_);
  std::vector<Key> keys;
  keys.reserve(tracked_.size());
  for (const auto& [key, u] : tracked_) keys.push_back(key);
  return keys;
}

std::vector<std::pair<std::pair<std::string, uint64_t>, v1::Upload>> RemoteTier::Drain(
    absl::Time deadline) {
  std::vector<std::pair<Key, v1::Upload>> left;
  if (!enabled()) return left;
  absl::MutexLock lock(&mu_);
  // Waited for: uploads running, queued (refill_: rows the tracked set could not take yet), or
  // retrying while one of them still makes progress. Once every one left failed its last attempt
  // and none runs, the store is refusing them: the rest of the grace is not spent on it.
  auto waiting = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (refill_) return true;
    for (const auto& [key, u] : tracked_) {
      const v1::UploadState s = u->state.state();
      if (u->running || (s != v1::UPLOAD_RETRYING && s != v1::UPLOAD_REFUSED)) return true;
    }
    return false;
  };
  while (waiting() && !stopping_ && absl::Now() < deadline) {
    changed_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
  }
  for (const auto& [key, u] : tracked_) {
    v1::Upload s = u->state;
    s.set_bytes_done(u->bytes_done.load());
    left.emplace_back(key, std::move(s));
  }
  return left;
}

void RemoteTier::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

uint64_t RemoteTier::durable_count() const {
  absl::MutexLock lock(&mu_);
  return durable_count_;
}

std::shared_ptr<RemoteTier::Upload> RemoteTier::NextLocked(absl::Time now, absl::Time* wake) {
  std::shared_ptr<Upload> best;
  *wake = absl::InfiniteFuture();
  for (auto& [key, u] : tracked_) {
    if (u->running || u->cancel) continue;
    if (u->next_attempt > now) {
      *wake = std::min(*wake, u->next_attempt);
      continue;
    }
    if (best == nullptr || u->next_attempt < best->next_attempt) best = u;
  }
  return best;
}

void RemoteTier::ThreadMain() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (refill_) {
      mu_.Unlock();
      absl::Status st = RefillFromIndex();
      mu_.Lock();
      if (!st.ok()) spdlog::warn("remote tier: reading the uploads to resume: {}", st.ToString());
    }
    absl::Time wake;
    std::shared_ptr<Upload> u = NextLocked(absl::Now(), &wake);
    if (u == nullptr) {
      changed_.WaitWithDeadline(&mu_, wake);
      continue;
    }
    u->running = true;
    u->state.set_state(v1::UPLOAD_RUNNING);
    u->bytes_done = 0;
    mu_.Unlock();
    absl::Status st = Attempt(*u);
    mu_.Lock();
    Finished(u, st);
  }
}

void RemoteTier::Finished(const std::shared_ptr<Upload>& u, const absl::Status& st) {
  u->running = false;
  changed_.SignalAll();
  const std::string name = Name(u->job, u->step);
  if (u->cancel) return;                  // Remove erases it
  if (absl::IsCancelled(st) && !stop_) {  // its checkpoint was deleted: nothing to upload
    tracked_.erase(Key{u->job, u->step});
    return;
  }
  if (st.ok()) {
    LogScope fields;
    fields.Str("job", u->job).Num("step", u->step).Str("event", "remote_durable");
    fields.Num("bytes", u->state.bytes_total()).Num("upload_ms", u->state.upload_ms());
    fields.Num("failed_attempts", u->state.attempts());
    spdlog::info("remote tier: {} is durable on {} ({} bytes, {} failed attempts before)", name,
                 remote_->Describe(), u->state.bytes_total(), u->state.attempts());
    tracked_.erase(Key{u->job, u->step});
    ++durable_count_;
    refill_ = refill_ || tracked_.size() + 1 >= limits::kUploadsTrackedMax;
    return;
  }
  if (stop_) return;  // abandoned by Stop: the row stays, the next start redoes it
  u->state.set_attempts(u->state.attempts() + 1);
  u->state.set_error(std::string(st.message()));
  if (absl::IsPermissionDenied(st)) {  // another owner's job on the store: never retried here
    u->state.set_state(v1::UPLOAD_REFUSED);
    u->next_attempt = absl::InfiniteFuture();
    spdlog::error("remote tier: upload of {} to {} refused (not retried until restart): {}", name,
                  remote_->Describe(), st.ToString());
    return;
  }
  u->state.set_state(v1::UPLOAD_RETRYING);
  const absl::Duration wait = Backoff(u->state.attempts(), options_->upload_retry_max_ms);
  u->next_attempt = absl::Now() + wait;
  spdlog::warn("remote tier: upload of {} to {} failed (attempt {}), retrying in {}: {}", name,
               remote_->Describe(), u->state.attempts(), absl::FormatDuration(wait), st.ToString());
}

absl::Status RemoteTier::WriteRow(const Upload& u, const v1::Upload& state) {
  std::vector<MetaStore::Write> row{RowWrite(u.job, u.step, u.dir, state)};
  return committer_->Commit(keys::Checkpoint(u.job, u.step), std::move(row));
}

absl::Status RemoteTier::Attempt(Upload& u) {
  const absl::Time started = absl::Now();
  const std::string name = Name(u.job, u.step);
  const std::string manifest_path = absl::StrCat(u.dir, "/", kManifestFileName);
  absl::StatusOr<std::string> read = local_->Get(manifest_path);
  if (absl::IsNotFound(read.status())) {
    // Deleted meanwhile (its row taken up from the index just before the delete removed it)?
    CKPTD_ASSIGN_OR_RETURN(std::optional<v1::UploadRecord> row, ReadRow(u.job, u.step));
    if (!row) return absl::CancelledError(absl::StrCat(name, " was deleted"));
    // Committed at the peer tier, and stopped before its local copy of the manifest: the store
    // has the manifest (only such a checkpoint has one there before its upload).
    absl::StatusOr<std::string> far = remote_->Get(manifest_path);
    absl::StatusOr<Manifest> decoded =
        far.ok() ? DecodeManifest(*far, manifest_path) : far.status();
    if (decoded.ok() && decoded->header.blobs_on_nodes()) read = std::move(far);
  }
  CKPTD_ASSIGN_OR_RETURN(
      std::string manifest,
      Annotate(std::move(read), absl::StrCat("reading the local manifest of ", name)));
  CKPTD_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(manifest, manifest_path));
  // Committed at the peer tier (blobs_on_nodes): the manifest is on the store already, and this
  // node uploads its own blobs alone (each node its own: remote_every).
  const bool own_part = m.header.blobs_on_nodes();
  uint64_t total = own_part ? 0 : manifest.size();
  std::vector<std::pair<std::string, uint64_t>> blobs;
  for (const v1::BlobInfo& b : m.header.blobs()) {
    if (own_part && b.node() != options_->node_id) continue;
    total += b.size_bytes();
    blobs.emplace_back(b.name(), b.size_bytes());
  }
  {
    absl::MutexLock lock(&mu_);
    u.state.set_bytes_total(total);
  }
  // The job's owner on the store first: nothing of another owner's job is overwritten.
  if (m.header.has_owner()) CKPTD_RETURN_IF_ERROR(ClaimStoreOwner(u.job, m.header.owner()));
  CKPTD_RETURN_IF_ERROR(StoreBlobs(u, own_part, blobs, &m, &manifest));
  CKPTD_SYNC_POINT("upload.blobs_copied");
  if (u.cancel || stop_) return absl::CancelledError(absl::StrCat("upload of ", name, " stopped"));
  if (!own_part) {
    CKPTD_RETURN_IF_ERROR(
        Annotate(remote_->PutAtomic(manifest_path, manifest),
                 absl::StrCat("writing the manifest of ", name, " to ", remote_->Describe())));
    u.bytes_done += manifest.size();
  } else {
    // This node's part is on the store: the checkpoint is there whole once every node of it
    // wrote this (CheckpointService::Survives reads them).
    const std::string marker = NodeUploadedPath(u.dir, options_->node_id);
    CKPTD_RETURN_IF_ERROR(Annotate(remote_->PutAtomic(marker, ""),
                                   absl::StrCat("writing ", marker, " to ", remote_->Describe())));
  }
  CKPTD_SYNC_POINT("upload.manifest_put");
  v1::Upload durable;
  {
    absl::MutexLock lock(&mu_);
    durable = u.state;
  }
  durable.set_state(v1::UPLOAD_DURABLE);
  durable.clear_error();
  const absl::Time now = absl::Now();
  durable.set_durable_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(now)));
  durable.set_upload_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(now - started)));
  CKPTD_RETURN_IF_ERROR(WriteRow(u, durable));
  {
    absl::MutexLock lock(&mu_);
    u.state.set_durable_unix_ms(durable.durable_unix_ms());
    u.state.set_upload_ms(durable.upload_ms());
  }
  CKPTD_SYNC_POINT("upload.durable");
  return absl::OkStatus();
}

absl::Status RemoteTier::CopyBlobs(const std::string& dir,
                                   const std::vector<std::pair<std::string, uint64_t>>& blobs) {
  CKPTD_CHECK(enabled());
  Upload u;  // progress and cancellation of this call only
  u.dir = dir;
  return CopyAll(u, dir, blobs);
}

absl::Status RemoteTier::CopyAll(Upload& u, const std::string& dir,
                                 const std::vector<std::pair<std::string, uint64_t>>& blobs) {
  for (size_t start = 0; start < blobs.size(); start += limits::kUploadBatchBlobsMax) {
    const size_t end = std::min<size_t>(blobs.size(), start + limits::kUploadBatchBlobsMax);
    std::vector<std::unique_ptr<BlobReader>> readers;
    std::vector<BlobCopy> copies;
    for (size_t i = start; i < end; ++i) {
      const std::string path = absl::StrCat(dir, "/", blobs[i].first);
      absl::StatusOr<std::unique_ptr<BlobReader>> reader = local_->OpenBlob(path);
      // A rank whose shards were all replicas (or empty) wrote no blob.
      if (!reader.ok() && absl::IsNotFound(reader.status()) && blobs[i].second == 0) continue;
      CKPTD_RETURN_IF_ERROR(
          Annotate(reader.status(), absl::StrCat("reading ", path, " from local storage")));
      copies.push_back({path, reader->get()});
      readers.push_back(*std::move(reader));
    }
    absl::Status st =
        remote_->CopyBlobsFrom(copies, &u.bytes_done, [&] { return u.cancel || stop_; });
    if (absl::IsUnimplemented(st)) {
      for (const BlobCopy& c : copies) CKPTD_RETURN_IF_ERROR(CopyBlob(u, c.path, *c.source));
      continue;
    }
    CKPTD_RETURN_IF_ERROR(Annotate(st, absl::StrCat("copying ", copies.size(), " blobs of ", dir,
                                                    " to ", remote_->Describe())));
  }
  return absl::OkStatus();
}

absl::Status RemoteTier::StoreBlobs(Upload& u, bool own_part,
                                    const std::vector<std::pair<std::string, uint64_t>>& blobs,
                                    Manifest* m, std::string* manifest) {
  // remote_codec: blobs stored encoded and the store's manifest records how. Not for a node's
  // own part (the manifest on the store is shared by every node and written before: its blobs
  // stay raw), nor for a checkpoint whose frames would not fit one manifest header.
  const std::optional<uint64_t> chunk =
      options_->remote_codec == "zstd" && !own_part ? EncodedChunkBytes(*m) : std::nullopt;
  if (!chunk.has_value()) return CopyAll(u, u.dir, blobs);
  CKPTD_RETURN_IF_ERROR(EncodeAll(u, u.dir, *chunk, m));
  const uint64_t raw_manifest_bytes = manifest->size();
  CKPTD_ASSIGN_OR_RETURN(
      *manifest,
      Annotate(EncodeManifest(*m), absl::StrCat("the store's manifest of ", Name(u.job, u.step))));
  absl::MutexLock lock(&mu_);  // the total counted the local manifest
  u.state.set_bytes_total(u.state.bytes_total() - raw_manifest_bytes + manifest->size());
  return absl::OkStatus();
}

absl::Status RemoteTier::EncodeAll(Upload& u, const std::string& dir, uint64_t chunk, Manifest* m) {
  uint64_t raw = 0, stored = 0;
  for (v1::BlobInfo& b : *m->header.mutable_blobs()) {
    if (b.size_bytes() == 0) continue;  // no object: nothing to encode
    const std::string path = absl::StrCat(dir, "/", b.name());
    CKPTD_ASSIGN_OR_RETURN(
        std::unique_ptr<BlobReader> reader,
        Annotate(local_->OpenBlob(path), absl::StrCat("reading ", path, " from local storage")));
    CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> writer,
                           Annotate(remote_->CreateBlob(path),
                                    absl::StrCat("creating ", path, " on ", remote_->Describe())));
    const std::vector<uint8_t> planes = ChunkPlanes(*m, b.id(), b.size_bytes(), chunk);
    const EncodeBlobJob job{
        .path = path,
        .size_bytes = b.size_bytes(),
        .chunk_bytes = chunk,
        .planes = planes,
        .zstd_level = options_->remote_codec_level,
        .piece_bytes = std::max(chunk, options_->upload_chunk_bytes / chunk * chunk)};
    CKPTD_ASSIGN_OR_RETURN(
        *b.mutable_encoding(),
        Annotate(EncodeBlob(job, *reader, *writer, readers_.get(), &u.bytes_done,
                            [&] { return u.cancel || stop_; }),
                 absl::StrCat("storing ", path, " encoded on ", remote_->Describe())));
    raw += b.size_bytes();
    stored += b.encoding().encoded_bytes();
  }
  spdlog::info("remote tier: {} stored encoded on {}: {} of {} bytes ({:.3f}x)", dir,
               remote_->Describe(), stored, raw,
               stored == 0 ? 1.0 : static_cast<double>(raw) / static_cast<double>(stored));
  return absl::OkStatus();
}

absl::Status RemoteTier::CopyBlob(Upload& u, const std::string& path, BlobReader& reader) {
  const uint64_t size = reader.size_bytes();
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobWriter> writer,
                         Annotate(remote_->CreateBlob(path),
                                  absl::StrCat("creating ", path, " on ", remote_->Describe())));
  const uint64_t chunk = std::max<uint64_t>(
      std::min<uint64_t>(options_->upload_chunk_bytes, RoundUp(size, 4096)), 4096);
  // Two buffers: the read pool fills one with the next chunk while the store takes the other.
  AlignedBuffer bufs[2] = {AllocateAligned(chunk),
                           size > chunk ? AllocateAligned(chunk) : AlignedBuffer()};
  if (bufs[0] == nullptr || (size > chunk && bufs[1] == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uploading ", path, ": no memory for two ", chunk, "-byte buffers"));
  }
  // Declared after the buffers and the reader, so it is destroyed first: an early return waits
  // for the read in flight before the memory it fills goes away.
  struct ReadAhead {
    std::future<absl::Status> done;
    ~ReadAhead() {
      if (done.valid()) done.wait();
    }
  } ahead;
  BlobReader* const r = &reader;
  const std::string what = absl::StrCat("reading ", path, " from local storage");
  auto start_read = [&](int buf, uint64_t off) -> absl::Status {
    IoSlice slice{bufs[buf].get(), std::min(chunk, size - off), off};
    CKPTD_ASSIGN_OR_RETURN(
        ahead.done,
        Annotate(
            readers_->Submit([r, slice] { return r->Read(std::span<const IoSlice>(&slice, 1)); },
                             WorkerPool::WhenFull::kWait),
            what));
    return absl::OkStatus();
  };
  if (size > 0) CKPTD_RETURN_IF_ERROR(start_read(0, 0));
  int cur = 0;
  for (uint64_t off = 0; off < size;) {
    CKPTD_RETURN_IF_ERROR(Annotate(ahead.done.get(), what));
    const uint64_t len = std::min(chunk, size - off);
    if (off + len < size) CKPTD_RETURN_IF_ERROR(start_read(1 - cur, off + len));
    if (u.cancel || stop_)
      return absl::CancelledError(absl::StrCat("upload of ", path, " stopped"));
    if (options_->debug_upload_delay_ms > 0) {  // testing: a slow store
      absl::SleepFor(absl::Milliseconds(options_->debug_upload_delay_ms));
    }
    IoSlice slice{bufs[cur].get(), len, off};
    CKPTD_RETURN_IF_ERROR(Annotate(writer->Write(std::span<const IoSlice>(&slice, 1)),
                                   absl::StrCat("writing ", path, " to ", remote_->Describe())));
    u.bytes_done += len;
    off += len;
    cur = 1 - cur;
  }
  return Annotate(writer->Sync(), absl::StrCat("syncing ", path, " on ", remote_->Describe()));
}

}  // namespace ckptd
