// FaultIo's power-loss model (fault_io.h explains what it keeps). The model is kept beside the
// real files: data that a power loss would keep is remembered as a copy taken at each sync, and
// removed entries wait in the trash directory until their directory is synced.
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "io/fault_io.h"

namespace ckptd {
namespace {

std::string ParentOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool IsUnder(const std::string& path, const std::string& root) {
  return path == root || absl::StartsWith(path, root + "/");
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("power-loss model: cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::Status WriteWholeFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("power-loss model: cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status FaultIo::EnablePowerLoss(const std::string& trash_dir) {
  absl::MutexLock lock(&pl_mu_);
  CKPTD_RETURN_IF_ERROR(base_->MkdirAll(trash_dir));
  trash_dir_ = trash_dir;
  synced_.clear();
  ops_.clear();
  crashed_ = false;
  tracking_ = true;
  return absl::OkStatus();
}

void FaultIo::Crash() { crashed_ = true; }

absl::Status FaultIo::CheckCrashed(const std::string& what) const {
  if (!crashed_.load()) return absl::OkStatus();
  return ErrnoStatus(EIO, absl::StrCat(what, " (crashed: the disk is fenced)"));
}

std::string FaultIo::NextTrashLocked() { return absl::StrCat(trash_dir_, "/", ++trash_seq_); }

absl::Status FaultIo::TrackOpenLocked(const std::string& path) {
  if (synced_.contains(path)) return absl::OkStatus();
  CKPTD_ASSIGN_OR_RETURN(bool exists, base_->Exists(path));
  if (exists) {
    CKPTD_ASSIGN_OR_RETURN(synced_[path], ReadWholeFile(path));
    return absl::OkStatus();
  }
  synced_[path] = std::nullopt;
  ops_.push_back(NamespaceOp{NamespaceOp::kCreate, path, "", "", std::nullopt});
  return absl::OkStatus();
}

absl::Status FaultIo::TrackSyncLocked(const std::string& path) {
  CKPTD_ASSIGN_OR_RETURN(synced_[path], ReadWholeFile(path));
  return absl::OkStatus();
}

absl::Status FaultIo::TrackRenameLocked(const std::string& from, const std::string& to) {
  CKPTD_RETURN_IF_ERROR(TrackOpenLocked(from));  // an untracked file is durable as it is
  NamespaceOp op{NamespaceOp::kRename, to, from, "", std::nullopt};
  CKPTD_ASSIGN_OR_RETURN(bool replaces, base_->Exists(to));
  if (replaces) {
    CKPTD_RETURN_IF_ERROR(TrackOpenLocked(to));
    op.trash = NextTrashLocked();
    op.displaced_synced = synced_[to];
    CKPTD_RETURN_IF_ERROR(base_->Rename(to, op.trash));
  }
  absl::Status renamed = base_->Rename(from, to);
  if (!renamed.ok()) {
    if (replaces) base_->Rename(op.trash, to).IgnoreError();
    return renamed;
  }
  synced_[to] = synced_[from];
  synced_.erase(from);
  ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status FaultIo::TrackRemoveLocked(const std::string& path) {
  NamespaceOp op{NamespaceOp::kRemove, path, "", NextTrashLocked(), std::nullopt};
  CKPTD_RETURN_IF_ERROR(base_->Rename(path, op.trash));
  ops_.push_back(std::move(op));
  return absl::OkStatus();
}

absl::Status FaultIo::TrackMkdirLocked(const std::string& dir) {
  // The directories MkdirAll creates, each durable because its parent is synced (Io's contract).
  std::vector<std::string> created;
  for (std::string d = dir; !d.empty() && d != "." && d != "/"; d = ParentOf(d)) {
    CKPTD_ASSIGN_OR_RETURN(bool exists, base_->Exists(d));
    if (exists) break;
    created.push_back(d);
  }
  CKPTD_RETURN_IF_ERROR(base_->MkdirAll(dir));
  for (const std::string& d : created) CommitDirLocked(ParentOf(d));
  return absl::OkStatus();
}

void FaultIo::CommitDirLocked(const std::string& dir) {
  std::vector<NamespaceOp> kept;
  for (NamespaceOp& op : ops_) {
    if (ParentOf(op.path) != dir) {
      kept.push_back(std::move(op));
      continue;
    }
    if (!op.trash.empty()) base_->RemoveAll(op.trash).IgnoreError();
    if (op.kind != NamespaceOp::kRemove) continue;
    // Removed for good: nothing of it or under it is put back, and earlier changes under it
    // are moot.
    for (auto it = synced_.begin(); it != synced_.end();) {
      it = IsUnder(it->first, op.path) ? synced_.erase(it) : std::next(it);
    }
    std::erase_if(kept, [&](const NamespaceOp& k) { return IsUnder(k.path, op.path); });
  }
  ops_ = std::move(kept);
}

absl::Status FaultIo::UndoLocked(const NamespaceOp& op) {
  switch (op.kind) {
    case NamespaceOp::kCreate:
      synced_.erase(op.path);
      return base_->RemoveAll(op.path);
    case NamespaceOp::kRename: {
      CKPTD_RETURN_IF_ERROR(base_->Rename(op.path, op.from));
      synced_[op.from] = synced_[op.path];
      synced_.erase(op.path);
      if (op.trash.empty()) return absl::OkStatus();
      synced_[op.path] = op.displaced_synced;
      return base_->Rename(op.trash, op.path);
    }
    case NamespaceOp::kRemove:
      return base_->Rename(op.trash, op.path);
  }
  return absl::OkStatus();
}

absl::Status FaultIo::PowerLoss() {
  absl::MutexLock lock(&pl_mu_);
  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    CKPTD_RETURN_IF_ERROR(Annotate(UndoLocked(*it), "power-loss model: undoing a change"));
  }
  ops_.clear();
  for (const auto& [path, data] : synced_) {
    CKPTD_ASSIGN_OR_RETURN(bool exists, base_->Exists(path));
    if (exists) CKPTD_RETURN_IF_ERROR(WriteWholeFile(path, data.value_or("")));
  }
  synced_.clear();
  CKPTD_RETURN_IF_ERROR(base_->RemoveAll(trash_dir_));
  CKPTD_RETURN_IF_ERROR(base_->MkdirAll(trash_dir_));
  crashed_ = false;
  return absl::OkStatus();
}

}  // namespace ckptd
