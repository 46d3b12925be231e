// MetaStore over RocksDB. One default column family; every write is one WriteBatch, so a state
// change spanning several keys is atomic. Synced writes fsync the WAL before returning.
#include <sys/statvfs.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "index/meta_store.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace ckptd {
namespace {

rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

// "<what> <dir>: <rocksdb message>" with the code that says what a caller can do about it.
absl::Status FromRocks(const rocksdb::Status& s, const std::string& what, const std::string& dir) {
  std::string msg = what + " (index at " + dir + "): " + s.ToString();
  switch (s.code()) {
    case rocksdb::Status::kOk:
      return absl::OkStatus();
    case rocksdb::Status::kNotFound:
      return absl::NotFoundError(msg);
    case rocksdb::Status::kCorruption:
      return absl::DataLossError(msg);
    case rocksdb::Status::kNotSupported:
      return absl::UnimplementedError(msg);
    case rocksdb::Status::kInvalidArgument:
      return absl::InvalidArgumentError(msg);
    case rocksdb::Status::kIOError:
      if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
      return absl::InternalError(msg);
    case rocksdb::Status::kMergeInProgress:
    case rocksdb::Status::kAborted:
      return absl::AbortedError(msg);
    case rocksdb::Status::kIncomplete:
    case rocksdb::Status::kShutdownInProgress:
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTryAgain:
      return absl::UnavailableError(msg);
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kExpired:
      return absl::DeadlineExceededError(msg);
    case rocksdb::Status::kColumnFamilyDropped:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// The smallest key greater than every key starting with `prefix`; empty when there is none
// (the prefix is all 0xff bytes).
std::string PrefixSuccessor(std::string_view prefix) {
  std::string s(prefix);
  while (!s.empty()) {
    auto last = static_cast<unsigned char>(s.back());
    if (last != 0xff) {
      s.back() = static_cast<char>(last + 1);
      return s;
    }
    s.pop_back();
  }
  return s;
}

class RocksDbMetaStore : public MetaStore {
 public:
  RocksDbMetaStore(std::unique_ptr<rocksdb::DB> db, std::string dir)
      : db_(std::move(db)), dir_(std::move(dir)) {}

  ~RocksDbMetaStore() override {
    // Close explicitly so background work stops before the DB object goes; an error here has
    // no caller left to act on it (synced writes are already durable).
    rocksdb::Status s = db_->Close();
    (void)s;
  }

  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ToSlice(key), &value);
    if (s.IsNotFound()) return std::optional<std::string>();
    if (!s.ok()) return FromRocks(s, "get", dir_);
    return std::optional<std::string>(std::move(value));
  }

  absl::Status Commit(std::span<const Write> writes, bool sync) override {
    rocksdb::WriteBatch batch;
    for (const Write& w : writes) {
      rocksdb::Status s = w.value ? batch.Put(w.key, *w.value) : batch.Delete(w.key);
      if (!s.ok()) return FromRocks(s, "build write batch", dir_);
    }
    return Apply(batch, sync, "commit");
  }

  absl::Status DeletePrefix(std::string_view prefix, bool sync) override {
    rocksdb::WriteBatch batch;
    std::string end = PrefixSuccessor(prefix);
    if (!end.empty()) {
      // One range tombstone, however many keys (a checkpoint may have millions of items).
      rocksdb::Status s = batch.DeleteRange(ToSlice(prefix), end);
      if (!s.ok()) return FromRocks(s, "build delete range", dir_);
    } else {
      absl::Status listed = Scan(prefix, "", 0, [&](std::string_view key, std::string_view) {
        return batch.Delete(ToSlice(key)).ok();
      });
      if (!listed.ok()) return listed;
    }
    return Apply(batch, sync, "delete prefix");
  }

  absl::Status Scan(
      std::string_view prefix, std::string_view start_after, size_t limit,
      const std::function<bool(std::string_view key, std::string_view value)>& fn) override {
    std::string end = PrefixSuccessor(prefix);
    rocksdb::Slice end_slice(end);
    rocksdb::ReadOptions options;
    if (!end.empty()) options.iterate_upper_bound = &end_slice;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options));
    bool after = !start_after.empty() && start_after >= prefix;
    it->Seek(ToSlice(after ? start_after : prefix));
    if (after && it->Valid() && it->key() == ToSlice(start_after)) it->Next();
    size_t seen = 0;
    for (; it->Valid(); it->Next()) {
      if (!it->key().starts_with(ToSlice(prefix))) break;
      if (limit != 0 && seen == limit) break;
      ++seen;
      if (!fn(std::string_view(it->key().data(), it->key().size()),
              std::string_view(it->value().data(), it->value().size()))) {
        break;
      }
    }
    rocksdb::Status s = it->status();
    if (!s.ok()) return FromRocks(s, "scan", dir_);
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> AvailableBytes() const override {
    struct statvfs v;
    if (statvfs(dir_.c_str(), &v) != 0) return ErrnoStatus(errno, "statvfs " + dir_);
    return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
  }

 private:
  absl::Status Apply(rocksdb::WriteBatch& batch, bool sync, const std::string& what) {
    // A failed write (a full volume, an I/O error) puts RocksDB into a background-error state in
    // which every later write fails; once the cause is gone, Resume() clears it. Never abort:
    // the caller gets RESOURCE_EXHAUSTED (no space) or UNAVAILABLE until the index recovers.
    if (needs_resume_.load()) {
      rocksdb::Status r = db_->Resume();
      if (r.IsBusy()) {  // RocksDB's own recovery runs (it polls for free space)
        return absl::UnavailableError(
            absl::StrCat(what, ": the index (", dir_,
                         ") is recovering from an earlier failed write; it "
                         "resumes by itself once its volume has space again, retry"));
      }
      if (!r.ok()) {
        absl::Status st = FromRocks(r, what + ": the index is read-only until it recovers", dir_);
        return st.code() == absl::StatusCode::kResourceExhausted
                   ? st
                   : absl::UnavailableError(st.message());
      }
      needs_resume_ = false;
    }
    rocksdb::WriteOptions options;
    options.sync = sync;
    rocksdb::Status s = db_->Write(options, &batch);
    if (!s.ok()) {
      needs_resume_ = true;
      return FromRocks(s, what, dir_);
    }
    return absl::OkStatus();
  }

  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
  std::atomic<bool> needs_resume_{false};
};

bool IsLockHeld(const rocksdb::Status& s) {
  if (!s.IsIOError()) return false;
  std::string msg = s.ToString();
  // Another process: "While lock file: <dir>/LOCK: Resource temporarily unavailable".
  // This process: "lock hold by current process, acquire time ... lock file: <dir>/LOCK".
  return absl::StrContains(msg, "lock file") || absl::StrContains(msg, "/LOCK");
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetaStore>> OpenRocksDbMetaStore(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  // The index is small and its writes are mostly synced single batches; keep memory modest.
  options.write_buffer_size = 16 << 20;
  options.max_background_jobs = 2;
  options.keep_log_file_num = 4;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  if (!s.ok()) {
    if (IsLockHeld(s)) {
      return absl::FailedPreconditionError("another ckptd holds the index at " + dir + ": " +
                                           s.ToString());
    }
    return FromRocks(s, "open", dir);
  }
  return std::unique_ptr<MetaStore>(
      std::make_unique<RocksDbMetaStore>(std::unique_ptr<rocksdb::DB>(raw), dir));
}

}  // namespace ckptd
