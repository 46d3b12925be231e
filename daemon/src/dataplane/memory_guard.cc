#include "dataplane/memory_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"

namespace ckptd {
namespace {

// initial-exec: read from the signal handler without calling into the TLS allocator.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_guard = nullptr;

void OnSigbus(int sig, siginfo_t*, void*) {
  sigjmp_buf* guard = t_guard;
  if (guard != nullptr) {
    t_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  // Not a guarded access: a bug of ours. Die the default way (core dump).
  signal(sig, SIG_DFL);
  raise(sig);
}

struct CopyArgs {
  void* dst;
  const void* src;
  uint64_t n;
};

}  // namespace

void InstallMemoryGuard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    CKPTD_CHECK(sigaction(SIGBUS, &sa, nullptr) == 0);
  });
}

absl::Status GuardClientMemory(void (*fn)(void*), void* arg, std::string_view what) {
  CKPTD_CHECK(t_guard == nullptr);  // guards do not nest
  sigjmp_buf env;
  // savemask=1: the handler ran with SIGBUS unblocked (SA_NODEFER), but restore the mask anyway.
  if (sigsetjmp(env, 1) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(std::string(what),
                     ": the client's shared memory vanished under the daemon (truncated, or "
                     "unbacked on a full tmpfs)"));
  }
  t_guard = &env;
  fn(arg);
  t_guard = nullptr;
  return absl::OkStatus();
}

absl::Status GuardedCopy(void* dst, const void* src, uint64_t n, std::string_view what) {
  CopyArgs a{dst, src, n};
  return GuardClientMemory(
      [](void* p) {
        auto* c = static_cast<CopyArgs*>(p);
        std::memcpy(c->dst, c->src, c->n);
      },
      &a, what);
}

absl::Status GuardedZero(void* dst, uint64_t n, std::string_view what) {
  CopyArgs a{dst, nullptr, n};
  return GuardClientMemory(
      [](void* p) {
        auto* c = static_cast<CopyArgs*>(p);
        std::memset(c->dst, 0, c->n);
      },
      &a, what);
}

}  // namespace ckptd
