// The CUDA driver API (libcuda.so.1), loaded with dlopen on first use — the one place the daemon
// and the client library reach CUDA. Nothing links CUDA: one binary runs on CPU-only nodes, and in
// a process that already uses CUDA (PyTorch) dlopen returns the driver it loaded, so both share
// its primary contexts and allocations.
//
// The declarations below are the driver's stable C ABI (cuda.h), restated so that nothing needs
// the CUDA toolkit to compile; the versioned entry points (_v2) are the ones cuda.h maps the plain
// names to since CUDA 11.
//
// Thread safety: Driver() and UseDevice() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::cuda {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;  // NOLINT(google-runtime-int): the driver's type

inline constexpr size_t kIpcHandleBytes = 64;  // CU_IPC_HANDLE_SIZE
inline constexpr size_t kUuidBytes = 16;
struct CUipcMemHandle {
  char reserved[kIpcHandleBytes];
};
struct CUuuid {
  char bytes[kUuidBytes];
};

inline constexpr CUresult kSuccess = 0;
inline constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
inline constexpr unsigned kStreamNonBlocking = 0x1;        // CU_STREAM_NON_BLOCKING
inline constexpr unsigned kHostRegisterPortable = 0x1;     // CU_MEMHOSTREGISTER_PORTABLE

struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*cuMemHostRegister)(void*, size_t, unsigned);
  CUresult (*cuMemHostUnregister)(void*);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  // (leastPriority, greatestPriority) of the current context: the least is the largest number.
  CUresult (*cuCtxGetStreamPriorityRange)(int*, int*);
  CUresult (*cuStreamCreateWithPriority)(CUstream*, unsigned, int);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
};

// The driver, loaded and initialised (cuInit) once per process. FAILED_PRECONDITION naming the
// cause when it cannot be: no libcuda.so.1 (no NVIDIA driver), a missing entry point (a driver
// older than CUDA 11.4), or cuInit's error (no device, driver/kernel mismatch). The answer of the
// first call is kept.
absl::StatusOr<const DriverApi*> Driver();

// `what` failed with `r`: "<what>: CUDA_ERROR_X (<description>)". Codes map onto the status codes
// (out of memory → RESOURCE_EXHAUSTED, an invalid value or handle → INVALID_ARGUMENT, the rest →
// FAILED_PRECONDITION or INTERNAL). OK for kSuccess.
absl::Status Check(const DriverApi& api, CUresult r, std::string_view what);

// Makes the primary context of device ordinal `device` current on the calling thread (each
// device's is retained once per process and kept). INVALID_ARGUMENT for a device that does not
// exist.
absl::Status UseDevice(const DriverApi& api, int device);

// UseDevice for a scope, then the thread's previous context again — for calls made on a
// caller's thread (the client library), whose current device must not change under it.
class ScopedDevice {
 public:
  // OK or UseDevice's error; the previous context is restored either way.
  absl::Status Enter(const DriverApi& api, int device);
  ~ScopedDevice();

 private:
  const DriverApi* api_ = nullptr;
  CUcontext previous_ = nullptr;
};

// The device's 16-byte UUID as raw bytes.
absl::StatusOr<std::string> DeviceUuid(const DriverApi& api, int device);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it (for messages).
std::string FormatUuid(std::string_view uuid_bytes);

}  // namespace ckptd::cuda
