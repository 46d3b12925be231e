// Page-locks ("pins") host memory for CUDA, so device<->host copies into the staging arena run as
// DMA at full PCIe/NVLink speed and cudaMemcpyAsync into it is truly asynchronous.
//
// The CUDA runtime is loaded with dlopen, not linked: the client library and the Python extension
// then load on machines without CUDA, and in a process that already uses CUDA (PyTorch) the
// runtime it loaded is the one used, so both see the same registration. Thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace ckptd::internal {

// cudaHostRegister(base, bytes, cudaHostRegisterPortable): pinned for every CUDA context.
// FAILED_PRECONDITION when no CUDA runtime can be loaded or the runtime refuses (no GPU, driver
// too old, memory limit); the message names the call, the size and CUDA's error string.
absl::Status CudaHostRegister(void* base, size_t bytes, const std::string& what);

// cudaHostUnregister(base) for memory CudaHostRegister pinned; failures are logged to stderr
// (it runs from destructors, where there is nothing to return them to).
void CudaHostUnregister(void* base, const std::string& what);

}  // namespace ckptd::internal
