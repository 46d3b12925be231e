#include "slab.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <random>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "convert.h"
#include "nogil.h"

namespace ckptd::py_binding {
namespace {

constexpr const char* kSlabPrefix = "ckptd-py-";  // in /dev/shm, without the leading '/'

absl::Mutex g_slabs_mu;
// Names of the slabs alive in this process and the process that made each (unlinked at its
// interpreter exit; a forked child inherits the map but not the slabs).
std::map<std::string, pid_t>* LiveSlabs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_slabs_mu) {
  static auto* live = new std::map<std::string, pid_t>();  // never destroyed: used at exit
  return live;
}

std::string NewSlabName() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("/%s%d-%d-%016x", kSlabPrefix, getpid(), counter++, rng());
}

}  // namespace

void SweepOrphanSlabs() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const uid_t me = geteuid();
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(kSlabPrefix, 0) != 0) continue;
    struct stat st {};
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != me ||
        !S_ISREG(st.st_mode) || st.st_size == 0) {
      continue;  // another uid's, or one being created right now (sized after its lock)
    }
    const std::string shm = "/" + name;
    int fd = shm_open(shm.c_str(), O_RDWR, 0);
    if (fd < 0) continue;
    // Nobody holds it: its creator is gone (a live slab's creator keeps an exclusive lock).
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) shm_unlink(shm.c_str());
    close(fd);
  }
  closedir(dir);
}

void UnlinkSlabsAtExit() {
  absl::MutexLock l(&g_slabs_mu);
  const pid_t self = getpid();
  for (const auto& [name, maker] : *LiveSlabs()) {
    if (maker == self) shm_unlink(name.c_str());  // a parent's slab is not a forked child's
  }
  LiveSlabs()->clear();
}

ShmSlab::ShmSlab(std::shared_ptr<Client> client, uint64_t bytes)
    : client_(std::move(client)), bytes_(bytes) {
  static absl::once_flag swept;
  absl::call_once(swept, [] { SweepOrphanSlabs(); });
  name_ = NewSlabName();
  fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd_ < 0) Throw(absl::InternalError("shm_open " + name_ + ": " + std::strerror(errno)));
  auto fail = [&](const absl::Status& s) {
    if (data_ != nullptr) munmap(data_, bytes_);
    shm_unlink(name_.c_str());
    close(fd_);
    Throw(s);
  };
  // Locked before it has a size: a sweeping process skips it until then, and never takes it after.
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    fail(absl::InternalError("flock " + name_ + ": " + std::strerror(errno)));
  }
  if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    fail(absl::ResourceExhaustedError("ftruncate " + name_ + ": " + std::strerror(errno)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    fail(absl::ResourceExhaustedError("mmap " + name_ + ": " + std::strerror(errno)));
  }
  data_ = p;
  absl::StatusOr<uint64_t> handle;
  {
    ReleasedGil released;
    handle = client_->RegisterShm(name_, bytes, data_);  // Save/Load then find views in it
  }
  if (!handle.ok()) fail(handle.status());
  handle_ = *handle;
  absl::MutexLock l(&g_slabs_mu);
  LiveSlabs()->emplace(name_, pid_);
}

ShmSlab::~ShmSlab() {
  if (getpid() != pid_) {
    // A forked child's copy: the registration and the name are the parent's (and gRPC cannot
    // run here: ckptd._client, fork); only this process's mapping and descriptor go. The client
    // reference is leaked: it may be the last one (the Python client collected before the fork),
    // and the client's destructor says goodbye over gRPC, which hangs in a forked child.
    munmap(data_, bytes_);
    close(fd_);
    new std::shared_ptr<Client>(std::move(client_));  // NOLINT: never freed, on purpose
    return;
  }
  {
    ReleasedGil released;
    (void)client_->Unregister(handle_);
  }
  munmap(data_, bytes_);
  {
    absl::MutexLock l(&g_slabs_mu);
    LiveSlabs()->erase(name_);
  }
  shm_unlink(name_.c_str());  // ENOENT after UnlinkSlabsAtExit: nothing to do
  close(fd_);
}

}  // namespace ckptd::py_binding
