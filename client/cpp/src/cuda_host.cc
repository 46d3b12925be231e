#include "cuda_host.h"

#include <dlfcn.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace ckptd::internal {

namespace {

// The three entry points used, with the runtime's C signatures (cudaError_t is an int enum).
using RegisterFn = int (*)(void*, size_t, unsigned int);
using UnregisterFn = int (*)(void*);
using ErrorStringFn = const char* (*)(int);
constexpr unsigned int kCudaHostRegisterPortable = 1;

struct CudaRuntime {
  RegisterFn host_register = nullptr;
  UnregisterFn host_unregister = nullptr;
  ErrorStringFn error_string = nullptr;
  std::string load_error;  // why the runtime is unusable; empty when loaded
};

const CudaRuntime& Runtime() {
  static const CudaRuntime runtime = [] {
    CudaRuntime rt;
    // A runtime already in the process (PyTorch's) first, so registrations are shared with it.
    constexpr const char* kNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
    void* lib = nullptr;
    for (const char* name : kNames) {
      lib = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
      if (lib != nullptr) break;
    }
    std::string errors;
    for (const char* name : kNames) {
      if (lib != nullptr) break;
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        const char* err = dlerror();
        absl::StrAppend(&errors, errors.empty() ? "" : "; ", err != nullptr ? err : name);
      }
    }
    if (lib == nullptr) {
      rt.load_error = absl::StrCat("no CUDA runtime could be loaded (", errors, ")");
      return rt;
    }
    // The library stays loaded for the life of the process: pinned memory outlives any caller.
    rt.host_register = reinterpret_cast<RegisterFn>(dlsym(lib, "cudaHostRegister"));
    rt.host_unregister = reinterpret_cast<UnregisterFn>(dlsym(lib, "cudaHostUnregister"));
    rt.error_string = reinterpret_cast<ErrorStringFn>(dlsym(lib, "cudaGetErrorString"));
    if (rt.host_register == nullptr || rt.host_unregister == nullptr ||
        rt.error_string == nullptr) {
      rt.load_error = "the CUDA runtime lacks cudaHostRegister/cudaHostUnregister";
    }
    return rt;
  }();
  return runtime;
}

}  // namespace

absl::Status CudaHostRegister(void* base, size_t bytes, const std::string& what) {
  const CudaRuntime& rt = Runtime();
  if (!rt.load_error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pinning ", what, " for CUDA: ", rt.load_error));
  }
  int err = rt.host_register(base, bytes, kCudaHostRegisterPortable);
  if (err != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("pinning ", what, " for CUDA: cudaHostRegister(", bytes,
                     " bytes) failed: ", rt.error_string(err), " (error ", err, ")"));
  }
  return absl::OkStatus();
}

void CudaHostUnregister(void* base, const std::string& what) {
  const CudaRuntime& rt = Runtime();
  if (!rt.load_error.empty()) return;  // nothing can have been registered
  int err = rt.host_unregister(base);
  if (err != 0) {
    std::fprintf(stderr, "ckptd client: cudaHostUnregister(%s): %s (error %d)\n", what.c_str(),
                 rt.error_string(err), err);
  }
}

}  // namespace ckptd::internal
