#include "cuda/cuda_driver.h"

#include <dlfcn.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace ckptd::cuda {
namespace {

constexpr CUresult kErrorInvalidValue = 1;
constexpr CUresult kErrorOutOfMemory = 2;
constexpr CUresult kErrorInvalidDevice = 101;
constexpr CUresult kErrorInvalidHandle = 400;
constexpr CUresult kErrorNotSupported = 801;

struct Loaded {
  DriverApi api{};
  absl::Status status;
};

template <typename Fn>
bool Bind(void* lib, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr && missing->empty()) *missing = name;
  return *fn != nullptr;
}

Loaded Load() {
  Loaded out;
  // The handle is never closed: the function pointers live as long as the process.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    out.status = absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver: libcuda.so.1 does not load (", err ? err : "unknown",
                     "); this node has no NVIDIA GPU driver visible to this process"));
    return out;
  }
  DriverApi& a = out.api;
  std::string missing;
  Bind(lib, "cuInit", &a.cuInit, &missing);
  Bind(lib, "cuGetErrorName", &a.cuGetErrorName, &missing);
  Bind(lib, "cuGetErrorString", &a.cuGetErrorString, &missing);
  Bind(lib, "cuDeviceGetCount", &a.cuDeviceGetCount, &missing);
  Bind(lib, "cuDeviceGet", &a.cuDeviceGet, &missing);
  Bind(lib, "cuDeviceGetUuid_v2", &a.cuDeviceGetUuid, &missing);
  Bind(lib, "cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain, &missing);
  Bind(lib, "cuCtxSetCurrent", &a.cuCtxSetCurrent, &missing);
  Bind(lib, "cuCtxGetCurrent", &a.cuCtxGetCurrent, &missing);
  Bind(lib, "cuIpcGetMemHandle", &a.cuIpcGetMemHandle, &missing);
  Bind(lib, "cuIpcOpenMemHandle_v2", &a.cuIpcOpenMemHandle, &missing);
  Bind(lib, "cuIpcCloseMemHandle", &a.cuIpcCloseMemHandle, &missing);
  Bind(lib, "cuMemGetAddressRange_v2", &a.cuMemGetAddressRange, &missing);
  Bind(lib, "cuMemHostRegister_v2", &a.cuMemHostRegister, &missing);
  Bind(lib, "cuMemHostUnregister", &a.cuMemHostUnregister, &missing);
  Bind(lib, "cuStreamCreate", &a.cuStreamCreate, &missing);
  Bind(lib, "cuCtxGetStreamPriorityRange", &a.cuCtxGetStreamPriorityRange, &missing);
  Bind(lib, "cuStreamCreateWithPriority", &a.cuStreamCreateWithPriority, &missing);
  Bind(lib, "cuStreamSynchronize", &a.cuStreamSynchronize, &missing);
  Bind(lib, "cuStreamDestroy_v2", &a.cuStreamDestroy, &missing);
  Bind(lib, "cuMemcpyDtoHAsync_v2", &a.cuMemcpyDtoHAsync, &missing);
  Bind(lib, "cuMemcpyHtoDAsync_v2", &a.cuMemcpyHtoDAsync, &missing);
  Bind(lib, "cuMemcpyDtoH_v2", &a.cuMemcpyDtoH, &missing);
  Bind(lib, "cuMemcpyHtoD_v2", &a.cuMemcpyHtoD, &missing);
  if (!missing.empty()) {
    out.status = absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver (libcuda.so.1) has no ", missing, "; ckptd needs a driver of CUDA 11.4+"));
    return out;
  }
  CUresult r = a.cuInit(0);
  if (r != kSuccess) {
    out.status = absl::FailedPreconditionError(
        Check(a, r, "cuInit (is a GPU present and the driver loaded?)").message());
    return out;
  }
  int count = 0;
  r = a.cuDeviceGetCount(&count);
  if (r != kSuccess || count == 0) {
    out.status = absl::FailedPreconditionError(
        r != kSuccess ? std::string(Check(a, r, "cuDeviceGetCount").message())
                      : "the CUDA driver sees no GPU (CUDA_VISIBLE_DEVICES?)");
  }
  return out;
}

const Loaded& Get() {
  static const Loaded* loaded = new Loaded(Load());
  return *loaded;
}

}  // namespace

absl::StatusOr<const DriverApi*> Driver() {
  const Loaded& l = Get();
  if (!l.status.ok()) return l.status;
  return &l.api;
}

absl::Status Check(const DriverApi& api, CUresult r, std::string_view what) {
  if (r == kSuccess) return absl::OkStatus();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(r, &name) != kSuccess) name = nullptr;
  if (api.cuGetErrorString == nullptr || api.cuGetErrorString(r, &text) != kSuccess) text = nullptr;
  std::string code = name != nullptr ? std::string(name) : absl::StrCat("CUDA error ", r);
  std::string msg = absl::StrCat(std::string(what), ": ", code, " (",
                                 text != nullptr ? text : "no description", ")");
  switch (r) {
    case kErrorOutOfMemory:
      return absl::ResourceExhaustedError(msg);
    case kErrorInvalidValue:
    case kErrorInvalidDevice:
    case kErrorInvalidHandle:
      return absl::InvalidArgumentError(msg);
    case kErrorNotSupported:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status UseDevice(const DriverApi& api, int device) {
  constexpr int kDevicesMax = 64;
  static absl::Mutex mu;
  static std::array<CUcontext, kDevicesMax> contexts ABSL_GUARDED_BY(mu){};
  int count = 0;
  if (api.cuDeviceGetCount(&count) != kSuccess) count = 0;
  if (device < 0 || device >= count || device >= kDevicesMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist here (", count, " visible)"));
  }
  CUcontext ctx = nullptr;
  {
    absl::MutexLock lock(&mu);
    ctx = contexts[device];
    if (ctx == nullptr) {
      CUdevice dev = 0;
      absl::Status st = Check(api, api.cuDeviceGet(&dev, device), "cuDeviceGet");
      if (st.ok())
        st = Check(api, api.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      if (!st.ok()) return st;
      contexts[device] = ctx;
    }
  }
  return Check(api, api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

absl::Status ScopedDevice::Enter(const DriverApi& api, int device) {
  if (api.cuCtxGetCurrent(&previous_) != kSuccess) previous_ = nullptr;
  api_ = &api;
  return UseDevice(api, device);
}

ScopedDevice::~ScopedDevice() {
  if (api_ != nullptr) api_->cuCtxSetCurrent(previous_);
}

absl::StatusOr<std::string> DeviceUuid(const DriverApi& api, int device) {
  CUdevice dev = 0;
  absl::Status st = Check(api, api.cuDeviceGet(&dev, device), "cuDeviceGet");
  if (!st.ok()) return st;
  CUuuid uuid{};
  st = Check(api, api.cuDeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
  if (!st.ok()) return st;
  return std::string(uuid.bytes, kUuidBytes);
}

std::string FormatUuid(std::string_view uuid_bytes) {
  std::string_view b = uuid_bytes;
  if (b.size() != kUuidBytes) return absl::StrCat("<", b.size(), "-byte GPU uuid>");
  std::string out = "GPU-";
  for (size_t i = 0; i < kUuidBytes; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(b[i]));
  }
  return out;
}

}  // namespace ckptd::cuda
