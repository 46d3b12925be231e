// Client memory can never crash the daemon (docs/DESIGN.md invariant 4).
//
// The daemon reads and writes client-visible shared memory (the staging arena and registered
// regions) in place. Its owner can shrink that memory (ftruncate) or leave it unbacked (a sparse
// object on a full tmpfs) at any moment; a CPU access to such a page raises SIGBUS. Checking the
// size first (regions are fstat'ed at every lease) catches the common case with a clear error,
// but not a shrink racing the access. So every CPU access the daemon makes to client memory runs
// inside GuardClientMemory: a SIGBUS raised on that thread inside the guarded call returns from
// it as FAILED_PRECONDITION naming the memory, instead of killing the process. (Kernel accesses
// — io_uring / O_DIRECT I/O straight from or into client memory — fail with EFAULT instead of a
// signal, and surface as I/O errors.) SIGBUS anywhere else keeps its default action.
//
// The guarded function is left with siglongjmp: it must only touch memory — no locks, no
// allocation, no objects with destructors — as memcpy, memset and BlockCrcsInto do.
//
// Thread safety: any thread; guards do not nest.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace ckptd {

// Installs the SIGBUS handler (idempotent; the daemon calls it at start, tests may too).
void InstallMemoryGuard();

// Runs fn(arg). FAILED_PRECONDITION "<what>: the client's shared memory vanished under the daemon
// (truncated, or unbacked on a full tmpfs)" when it faulted.
absl::Status GuardClientMemory(void (*fn)(void*), void* arg, std::string_view what);

// Guarded memcpy/memset for the common cases.
absl::Status GuardedCopy(void* dst, const void* src, uint64_t n, std::string_view what);
absl::Status GuardedZero(void* dst, uint64_t n, std::string_view what);

}  // namespace ckptd
