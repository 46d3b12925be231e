#include "dataplane/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/limits.h"

namespace ckptd {
namespace {

// Register's second phase: the client's shm object `name` opened (never through a symlink) and
// checked before it is mapped — a regular file of the caller's uid (`owner_uid`), not one of the
// daemon's arena segments under another name, at least size_bytes long. Its descriptor, or the
// refusal (PERMISSION_DENIED, INVALID_ARGUMENT, or the errno's).
absl::StatusOr<int> OpenShmRegion(const std::string& name, uint32_t owner_uid, uint64_t size_bytes,
                                  const ForbiddenRegions& forbidden) {
  int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::PermissionDeniedError(absl::StrCat("region ", name, " is a symlink"));
    }
    return ErrnoStatus(errno, absl::StrCat("region shm_open ", name));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("region fstat ", name));
  }
  absl::Status refused;
  if (!S_ISREG(st.st_mode)) {
    refused = absl::PermissionDeniedError(absl::StrCat("region ", name, " is not a regular file"));
  } else if (st.st_uid != owner_uid) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        "region ", name, " is owned by uid ", st.st_uid, ", not by the caller's uid ", owner_uid));
  } else if (forbidden.is_arena && forbidden.is_arena(st.st_dev, st.st_ino)) {
    refused = absl::PermissionDeniedError(
        absl::StrCat("region ", name, " is the daemon's staging arena"));
  } else if (static_cast<uint64_t>(st.st_size) < size_bytes) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        "region ", name, " is ", st.st_size, " bytes, smaller than size_bytes ", size_bytes));
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  return fd;
}

}  // namespace

MappedRegion::~MappedRegion() {
  if (base != nullptr) munmap(base, size_bytes);
  if (fd >= 0) close(fd);
}

IpcMapping::~IpcMapping() {
  if (forget) forget();
}

RegionRegistry::~RegionRegistry() {
  // Regions (and their CUDA mappings) still registered are released here, outside mu_.
  absl::flat_hash_map<uint64_t, std::shared_ptr<MappedRegion>> regions;
  {
    absl::MutexLock lock(&mu_);
    regions.swap(regions_);
  }
}

absl::Status RegionRegistry::CheckCountLocked(const std::string& session, bool cuda) const {
  size_t n = 0;
  for (const auto& [id, r] : regions_) n += (r->session == session && r->on_device() == cuda);
  const uint64_t max = cuda ? limits::kCudaRegionsPerSessionMax : limits::kRegionsPerSessionMax;
  if (n >= max) {
    return absl::ResourceExhaustedError(absl::StrCat("session has ", n, cuda ? " CUDA" : " shm",
                                                     " regions registered, the limit is ", max));
  }
  return absl::OkStatus();
}

uint64_t RegionRegistry::AddLocked(std::shared_ptr<MappedRegion> r) {
  r->id = next_id_++;
  const uint64_t id = r->id;
  regions_[id] = std::move(r);
  return id;
}

absl::StatusOr<std::shared_ptr<IpcMapping>> RegionRegistry::OpenIpc(int device,
                                                                    const std::string& handle) {
  std::string key = absl::StrCat(device, ":", handle);
  absl::MutexLock lock(&ipc_->mu);
  while (true) {
    auto it = ipc_->open.find(key);
    if (it == ipc_->open.end()) break;
    if (std::shared_ptr<IpcMapping> m = it->second.lock()) return m;
    // Expired: its last region is being destroyed and the close waits for this lock. Opening
    // the handle again before that close would map it twice in one context.
    ipc_->closed.Wait(&ipc_->mu);
  }
  absl::StatusOr<GpuMapping> opened = gpu_->OpenIpc(device, handle);
  if (!opened.ok()) return opened.status();
  auto m = std::make_shared<IpcMapping>();
  m->gpu = gpu_;
  m->device = device;
  m->device_addr = opened->device_addr;
  m->allocation_bytes = opened->allocation_bytes;
  // Runs when the last region using the allocation is destroyed: drops the index entry (unless a
  // newer mapping replaced it) and closes the handle, both under the index's lock.
  m->forget = [index = ipc_, key, gpu = gpu_, device, addr = opened->device_addr] {
    absl::MutexLock l(&index->mu);
    if (auto it = index->open.find(key); it != index->open.end() && it->second.expired()) {
      index->open.erase(it);
    }
    gpu->CloseIpc(device, addr);
    index->closed.SignalAll();
  };
  ipc_->open[key] = m;
  return m;
}

absl::StatusOr<uint64_t> RegionRegistry::RegisterCuda(const std::string& session,
                                                      const v1::RegisterRegionRequest& req) {
  if (gpu_ == nullptr) {
    return absl::FailedPreconditionError("this daemon was started without GPU support");
  }
  absl::Status usable = gpu_->Available();
  if (!usable.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA IPC regions need a GPU the daemon can use: ", usable.message()));
  }
  if (req.cuda_ipc_handle().size() != 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_ipc_handle is ", req.cuda_ipc_handle().size(), " bytes; a CUDA IPC handle is 64"));
  }
  if (req.cuda_device_uuid().size() != 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_device_uuid is ", req.cuda_device_uuid().size(), " bytes; a GPU UUID is 16"));
  }
  if (req.size_bytes() == 0) {
    return absl::InvalidArgumentError("CUDA region: size_bytes is 0");
  }
  {
    absl::MutexLock lock(&mu_);
    CKPTD_RETURN_IF_ERROR(CheckCountLocked(session, /*cuda=*/true));
  }
  CKPTD_ASSIGN_OR_RETURN(int device, gpu_->DeviceOf(req.cuda_device_uuid()));
  absl::StatusOr<std::shared_ptr<IpcMapping>> m = OpenIpc(device, req.cuda_ipc_handle());
  if (!m.ok()) {
    // The handle is client input: a driver error other than running out of something or a
    // precondition (peer access, no IPC across these namespaces) means this handle is no good —
    // INVALID_ARGUMENT, which makes the client copy that allocation itself.
    absl::StatusCode code = m.status().code();
    if (code != absl::StatusCode::kResourceExhausted &&
        code != absl::StatusCode::kFailedPrecondition) {
      code = absl::StatusCode::kInvalidArgument;
    }
    return absl::Status(code, absl::StrCat("opening the CUDA IPC handle of the client's device ",
                                           req.cuda_device(), ": ", m.status().message()));
  }
  if (req.size_bytes() > (*m)->allocation_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA region of ", req.size_bytes(), " bytes is larger than its allocation (",
                     (*m)->allocation_bytes, " bytes on device ", device, ")"));
  }
  auto r = std::make_shared<MappedRegion>();
  r->session = session;
  r->kind = v1::CUDA_IPC;
  r->shm_name = absl::StrCat("cuda:", device);
  r->size_bytes = req.size_bytes();
  r->ipc = *std::move(m);
  absl::MutexLock lock(&mu_);
  return AddLocked(std::move(r));
}

absl::StatusOr<uint64_t> RegionRegistry::Register(const std::string& session, uint32_t owner_uid,
                                                  const v1::RegisterRegionRequest& req) {
  if (req.kind() == v1::CUDA_IPC) return RegisterCuda(session, req);
  if (req.kind() != v1::SHM) {
    return absl::InvalidArgumentError("region kind must be SHM or CUDA_IPC");
  }
  const std::string& name = req.shm_name();
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region shm name \"", name, "\" must be \"/name\" with no other '/' (at most 255 bytes)"));
  }
  if (req.size_bytes() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("region ", name, ": size_bytes is 0"));
  }
  {
    absl::MutexLock lock(&mu_);
    CKPTD_RETURN_IF_ERROR(CheckCountLocked(session, /*cuda=*/false));
  }
  if (!forbidden_.shm_prefix.empty() && name.rfind(forbidden_.shm_prefix, 0) == 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("region ", name, ": the daemon's own shared memory cannot be registered"));
  }
  CKPTD_ASSIGN_OR_RETURN(int fd, OpenShmRegion(name, owner_uid, req.size_bytes(), forbidden_));
  void* p = mmap(nullptr, req.size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("region mmap ", name));
  }
  // The daemon's page tables for the whole region now, in one call: a load into a fresh region
  // otherwise takes a fault per 4 KiB page inside its copy (most of a restore's time into newly
  // allocated tensors on this kind of machine). It commits the region's pages, which its owner
  // made to hold tensors. Best effort: a full tmpfs is caught at access by the SIGBUS guard.
  (void)madvise(p, req.size_bytes(), MADV_POPULATE_WRITE);
  auto r = std::make_shared<MappedRegion>();
  r->session = session;
  r->shm_name = name;
  r->base = static_cast<uint8_t*>(p);
  r->size_bytes = req.size_bytes();
  r->fd = fd;
  absl::MutexLock lock(&mu_);
  return AddLocked(std::move(r));
}

absl::Status RegionRegistry::Unregister(const std::string& session, uint64_t id,
                                        absl::Duration timeout) {
  std::shared_ptr<MappedRegion> gone;  // unmapped / closed after mu_ is released
  absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second->session != session) {
    return absl::NotFoundError(absl::StrCat("unknown region ", id));
  }
  while (it->second.use_count() > 1) {
    if (released_.WaitWithDeadline(&mu_, deadline)) {
      return absl::FailedPreconditionError(absl::StrCat("region ", id, " (", it->second->shm_name,
                                                        ") is still in use by a save or load"));
    }
    it = regions_.find(id);
    if (it == regions_.end()) return absl::OkStatus();
  }
  gone = std::move(it->second);
  regions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<RegionLease> RegionRegistry::Acquire(const std::string& session, uint64_t id,
                                                    uint64_t offset, uint64_t length) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second->session != session) {
    return absl::NotFoundError(absl::StrCat("unknown region ", id,
                                            " (not registered by this "
                                            "session)"));
  }
  const MappedRegion& r = *it->second;
  if (offset > r.size_bytes || length > r.size_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset, "+", length,
                                              ") are outside region ", id, " (", r.shm_name, ", ",
                                              r.size_bytes, " bytes)"));
  }
  struct stat st;
  if (!r.on_device() &&
      (fstat(r.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < r.size_bytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat("region ", id, " (", r.shm_name, ") shrank to ", st.st_size,
                     " bytes after it was registered with ", r.size_bytes, "; register it again"));
  }
  // The deleter signals Unregister once the lease is dropped.
  std::shared_ptr<MappedRegion> keep = it->second;
  auto* self = const_cast<RegionRegistry*>(this);
  return RegionLease(keep.get(), [keep, self](const MappedRegion*) mutable {
    absl::MutexLock l(&self->mu_);
    keep.reset();
    self->released_.SignalAll();
  });
}

void RegionRegistry::DropSession(const std::string& session) {
  std::vector<std::shared_ptr<MappedRegion>> gone;  // unmapped / closed after mu_ is released
  absl::MutexLock lock(&mu_);
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (it->second->session == session) {
      gone.push_back(std::move(it->second));
      regions_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace ckptd
