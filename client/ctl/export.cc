#include "export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckptd/client.h"
#include "common/json_escape.h"
#include "table.h"

namespace ckptctl {

namespace {

namespace fs = std::filesystem;
namespace st = safetensors;

constexpr const char* kIndexName = "model.safetensors.index.json";
// Tensors stream in chunks of the client library's load batch (Client::load_batch_bytes: the one
// load batching policy, which leaves room in the arena to trainers saving at the same time).
// When the arena is busy (RESOURCE_EXHAUSTED) chunks halve down to this before giving up.
constexpr uint64_t kChunkBytesMin = 64ull << 10;

absl::Status ErrnoError(int err, const std::string& what, const std::string& path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

// Puts `prefix` (what was being done) in front of a daemon or I/O error, keeping its code.
absl::Status WithContext(const absl::Status& s, const std::string& prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

// A file descriptor closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close() reports deferred write errors (NFS, quotas): the caller checks it.
  int Close() {
    int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, const uint8_t* data, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, std::min<uint64_t>(n, 1ull << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return ErrnoError(w < 0 ? errno : EIO, "writing", path);
    data += w;
    n -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, "opening directory", dir);
  if (::fsync(fd.get()) != 0) return ErrnoError(errno, "fsync of directory", dir);
  return absl::OkStatus();
}

// Files this export writes under temporary names; those not yet renamed are removed on
// destruction, so a failed export leaves nothing that looks like an export file.
class TempFiles {
 public:
  explicit TempFiles(std::string dir) : dir_(std::move(dir)) {}
  ~TempFiles() {
    for (const std::string& t : pending_) ::unlink(t.c_str());
  }
  std::string TempPath(const std::string& name) {
    std::string path = absl::StrCat(dir_, "/.", name, ".", ::getpid(), ".tmp");
    pending_.push_back(path);
    return path;
  }
  // Renames every pending temp file to its final name (the part between "/." and ".<pid>.tmp").
  absl::Status RenameAll(const std::vector<std::string>& final_names) {
    for (size_t i = 0; i < pending_.size(); ++i) {
      std::string to = absl::StrCat(dir_, "/", final_names[i]);
      if (::rename(pending_[i].c_str(), to.c_str()) != 0) {
        return ErrnoError(errno, absl::StrCat("renaming ", pending_[i], " to"), to);
      }
      pending_[i].clear();  // unlink("") fails harmlessly
    }
    pending_.clear();
    return FsyncDir(dir_);
  }

 private:
  std::string dir_;
  std::vector<std::string> pending_;
};

bool IsExportFile(const std::string& name) {
  return name == kIndexName || (absl::EndsWith(name, ".safetensors") && name[0] != '.');
}

// Creates `dir` if missing; returns the export files already in it. FAILED_PRECONDITION when
// there are some and no --force.
absl::StatusOr<std::vector<std::string>> PrepareDir(const std::string& dir, bool force) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ErrnoError(ec.value(), "creating directory", dir);
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return ErrnoError(errno, "cannot write to directory", dir);
  }
  std::vector<std::string> existing;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (IsExportFile(name)) existing.push_back(name);
  }
  if (ec) return ErrnoError(ec.value(), "listing directory", dir);
  std::sort(existing.begin(), existing.end());
  if (!existing.empty() && !force) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " already holds an export (", absl::StrJoin(existing, ", "),
                     "): choose another directory or pass --force to replace it"));
  }
  return existing;
}

// Streams tensors from the daemon in chunks of at most chunk_bytes (halved while the arena is
// busy), so memory stays one chunk whatever the tensor size.
class TensorStreamer {
 public:
  TensorStreamer(ckptd::Client& client, std::string job, uint64_t step, uint64_t chunk_bytes)
      : client_(client), job_(std::move(job)), step_(step), chunk_bytes_(chunk_bytes) {}

  absl::Status Copy(const st::Tensor& t, int fd, const std::string& path) {
    const uint64_t esize = ckptd::DTypeSize(t.dtype);
    const uint64_t numel = t.bytes / esize;
    for (uint64_t start = 0; start < numel;) {
      const uint64_t count = std::min(numel - start, std::max<uint64_t>(1, chunk_bytes_ / esize));
      const uint64_t bytes = count * esize;
      if (buffer_.size() < bytes) buffer_.resize(bytes);
      ckptd::LoadTarget target{
          t.name, count == numel ? ckptd::Region::Whole() : ckptd::Region::Flat(start, count),
          buffer_.data(), bytes};
      absl::StatusOr<ckptd::LoadResult> r = client_.Load(job_, step_, 0, std::span(&target, 1));
      if (!r.ok() && r.status().code() == absl::StatusCode::kResourceExhausted &&
          chunk_bytes_ / 2 >= kChunkBytesMin) {
        chunk_bytes_ /= 2;  // someone else holds the arena: retry smaller
        continue;
      }
      if (!r.ok()) {
        return WithContext(r.status(), absl::StrCat("loading tensor \"", t.name, "\" elements [",
                                                    start, ", ", start + count, ")"));
      }
      if (r->item_bytes.size() != 1 || r->item_bytes[0] != bytes) {
        return absl::InternalError(absl::StrCat("loading tensor \"", t.name, "\": the daemon ",
                                                "returned a wrong byte count for ", bytes));
      }
      if (absl::Status s = WriteAll(fd, buffer_.data(), bytes, path); !s.ok()) return s;
      start += count;
    }
    return absl::OkStatus();
  }

 private:
  ckptd::Client& client_;
  std::string job_;
  uint64_t step_;
  uint64_t chunk_bytes_;
  std::vector<uint8_t> buffer_;
};

// Writes one planned file to `path`: header, tensors, then checks its size and fsyncs it.
absl::Status WriteFile(const st::FilePlan& file, const std::vector<st::Tensor>& tensors,
                       TensorStreamer& streamer, const std::string& path) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError(errno, "creating", path);
  // Reserve the space first where the file system can (fallocate, not posix_fallocate: no slow
  // emulation by writing zeros), so a full disk fails before any load.
  if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(file.file_bytes())) != 0 &&
      errno != EOPNOTSUPP && errno != ENOSYS) {
    return ErrnoError(errno, absl::StrCat("reserving ", file.file_bytes(), " bytes for"), path);
  }
  absl::Status s = WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(file.header.data()),
                            file.header.size(), path);
  for (size_t i = 0; s.ok() && i < file.tensors.size(); ++i) {
    s = streamer.Copy(tensors[file.tensors[i].tensor], fd.get(), path);
  }
  if (!s.ok()) return s;
  struct stat sb {};
  if (::fstat(fd.get(), &sb) != 0) return ErrnoError(errno, "stat of", path);
  if (static_cast<uint64_t>(sb.st_size) != file.file_bytes()) {
    return absl::InternalError(
        absl::StrCat(path, " has ", sb.st_size, " bytes, planned ", file.file_bytes()));
  }
  if (::fsync(fd.get()) != 0) return ErrnoError(errno, "fsync of", path);
  if (fd.Close() != 0) return ErrnoError(errno, "closing", path);
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& text, const std::string& path) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError(errno, "creating", path);
  absl::Status s =
      WriteAll(fd.get(), reinterpret_cast<const uint8_t*>(text.data()), text.size(), path);
  if (!s.ok()) return s;
  if (::fsync(fd.get()) != 0) return ErrnoError(errno, "fsync of", path);
  if (fd.Close() != 0) return ErrnoError(errno, "closing", path);
  return absl::OkStatus();
}

struct Source {
  uint64_t step = 0;
  std::vector<st::Tensor> tensors;
  std::vector<std::string> skipped_objects;
};

// Resolves the step, checks it is COMMITTED and lists its tensors (objects are skipped).
absl::StatusOr<Source> ReadSource(ckptd::Client& client, const ExportOptions& o) {
  Source src;
  absl::StatusOr<uint64_t> step = client.ResolveStep(o.job, o.step);
  if (!step.ok()) return WithContext(step.status(), absl::StrCat("latest step of ", o.job));
  src.step = *step;
  const std::string name = absl::StrCat(o.job, "/", src.step);
  absl::StatusOr<ckptd::CheckpointInfo> info = client.GetStatus(o.job, src.step);
  if (!info.ok()) return WithContext(info.status(), name);
  if (info->state != ckptd::CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is ", ckptd::CheckpointStateName(info->state),
                     ": only COMMITTED checkpoints can be exported"));
  }
  absl::StatusOr<std::vector<ckptd::ItemInfo>> items = client.Inspect(o.job, src.step);
  if (!items.ok()) return WithContext(items.status(), name);
  for (const ckptd::ItemInfo& item : *items) {
    if (item.kind == ckptd::ItemInfo::kObject) {
      src.skipped_objects.push_back(item.name);
      continue;
    }
    uint64_t numel = 1;
    for (uint64_t d : item.shape) numel *= d;  // the daemon bounds it (kTensorElementsMax)
    src.tensors.push_back(
        {item.name, item.dtype, item.shape, numel * ckptd::DTypeSize(item.dtype)});
  }
  if (src.tensors.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " has no tensor items: nothing to export to safetensors"));
  }
  return src;
}

// Removes files of an earlier export (--force) that this one did not rewrite, so the directory
// holds one consistent export.
absl::Status RemoveStale(const std::string& dir, const std::vector<std::string>& existing,
                         const std::vector<std::string>& written) {
  std::set<std::string> keep(written.begin(), written.end());
  keep.insert(kIndexName);
  bool removed = false;
  for (const std::string& name : existing) {
    if (keep.count(name) != 0) continue;
    std::string path = absl::StrCat(dir, "/", name);
    if (::unlink(path.c_str()) != 0) return ErrnoError(errno, "removing stale", path);
    removed = true;
  }
  return removed ? FsyncDir(dir) : absl::OkStatus();
}

void PrintResult(const Context& ctx, const ExportOptions& o, const Source& src,
                 const std::vector<st::FilePlan>& files) {
  uint64_t total = 0;
  for (const st::Tensor& t : src.tensors) total += t.bytes;
  if (ctx.json) {
    std::vector<std::string> fj, sj;
    for (const st::FilePlan& f : files) {
      fj.push_back(absl::StrCat("{\"name\": ", ckptd::JsonString(f.name), ", \"tensors\": ",
                                f.tensors.size(), ", \"bytes\": ", f.file_bytes(), "}"));
    }
    for (const std::string& s : src.skipped_objects) sj.push_back(ckptd::JsonString(s));
    std::cout << "{\"job\": " << ckptd::JsonString(o.job) << ", \"step\": " << src.step
              << ", \"dir\": " << ckptd::JsonString(o.dir) << ", \"format\": \"safetensors\""
              << ", \"tensors\": " << src.tensors.size() << ", \"total_size\": " << total
              << ", \"index\": \"" << kIndexName << "\", \"files\": [" << absl::StrJoin(fj, ", ")
              << "], \"skipped_objects\": [" << absl::StrJoin(sj, ", ") << "]}\n";
    return;
  }
  Table t({"FILE", ">TENSORS", ">BYTES"});
  for (const st::FilePlan& f : files) {
    t.AddRow({f.name, absl::StrCat(f.tensors.size()), HumanBytes(f.file_bytes())});
  }
  std::cout << "exported " << o.job << "/" << src.step << " to " << o.dir << ": "
            << src.tensors.size() << " tensors, " << HumanBytes(total) << " in " << files.size()
            << " file(s) + " << kIndexName << "\n\n"
            << t.Render();
  if (!src.skipped_objects.empty()) {
    std::cout << "\nskipped " << src.skipped_objects.size()
              << " object item(s) (safetensors holds tensors only): "
              << absl::StrJoin(src.skipped_objects, ", ") << "\n";
  }
}

absl::Status WriteExport(ckptd::Client& client, const ExportOptions& o, const Source& src,
                         const std::vector<st::FilePlan>& files,
                         const std::vector<std::string>& existing) {
  TensorStreamer streamer(client, o.job, src.step,
                          std::max(client.load_batch_bytes(), kChunkBytesMin));
  TempFiles temps(o.dir);
  std::vector<std::string> names;
  for (const st::FilePlan& f : files) {
    if (absl::Status s = WriteFile(f, src.tensors, streamer, temps.TempPath(f.name)); !s.ok()) {
      return s;
    }
    names.push_back(f.name);
  }
  // With --force, the old index goes before any old file is replaced: were the export to fail
  // half-renamed, no index would pair new files with old ones.
  if (o.force && std::count(existing.begin(), existing.end(), kIndexName) != 0) {
    const std::string old_index = absl::StrCat(o.dir, "/", kIndexName);
    if (::unlink(old_index.c_str()) != 0) return ErrnoError(errno, "removing old", old_index);
  }
  if (absl::Status s = temps.RenameAll(names); !s.ok()) return s;
  // The index last: a reader that finds it finds every file it names complete.
  TempFiles index_temp(o.dir);
  absl::Status s = WriteText(st::IndexJson(files, src.tensors), index_temp.TempPath(kIndexName));
  if (s.ok()) s = index_temp.RenameAll({kIndexName});
  if (s.ok() && o.force) s = RemoveStale(o.dir, existing, names);
  return s;
}

}  // namespace

absl::Status Export(Context& ctx, const ExportOptions& o) {
  if (o.format != "safetensors") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown export format \"", o.format, "\": the only format is safetensors"));
  }
  if (o.dir.empty()) return absl::InvalidArgumentError("export needs a directory");
  if (o.max_file_bytes < st::kMaxFileBytesMin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_file_bytes ", o.max_file_bytes, " is below the minimum of ", st::kMaxFileBytesMin));
  }
  ckptd::ClientOptions copts;
  copts.socket_path = absl::StartsWith(ctx.target, "unix:") ? ctx.target.substr(5) : ctx.target;
  copts.client_name = absl::StrCat("ckptctl-export/", ::getpid());
  absl::StatusOr<std::unique_ptr<ckptd::Client>> client = ckptd::Client::Connect(copts);
  if (!client.ok()) return client.status();
  absl::StatusOr<Source> src = ReadSource(**client, o);
  if (!src.ok()) return src.status();
  const std::string what = absl::StrCat("exporting ", o.job, "/", src->step, " to ", o.dir);
  absl::StatusOr<std::vector<st::FilePlan>> files =
      st::Plan(src->tensors, o.max_file_bytes,
               {{"format", "pt"}, {"ckptd_job", o.job}, {"ckptd_step", absl::StrCat(src->step)}});
  if (!files.ok()) return WithContext(files.status(), what);
  absl::StatusOr<std::vector<std::string>> existing = PrepareDir(o.dir, o.force);
  if (!existing.ok()) return WithContext(existing.status(), what);
  if (absl::Status s = WriteExport(**client, o, *src, *files, *existing); !s.ok()) {
    return WithContext(s, what);
  }
  PrintResult(ctx, o, *src, *files);
  return absl::OkStatus();
}

}  // namespace ckptctl
