#include "nogil.h"

#include <unistd.h>

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckptd::py_binding {
namespace {

absl::Mutex g_mu;
bool g_exiting ABSL_GUARDED_BY(g_mu) = false;
// Threads between "not exiting" and holding the GIL.
int g_reacquiring ABSL_GUARDED_BY(g_mu) = 0;
// The thread that ran the hook: it finalizes Python, which never ends its own thread, so its calls
// (later atexit handlers, finalizers) take the GIL back as usual.
std::thread::id g_exit_thread ABSL_GUARDED_BY(g_mu);

[[noreturn]] void Park() {
  for (;;) pause();  // the process is exiting: its end ends this thread
}

}  // namespace

ReleasedGil::ReleasedGil() : state_(PyEval_SaveThread()) {}

ReleasedGil::~ReleasedGil() {
  bool park;
  {
    absl::MutexLock l(&g_mu);
    park = g_exiting && std::this_thread::get_id() != g_exit_thread;
    if (!park) ++g_reacquiring;
  }
  if (park) Park();  // holding nothing: other threads still reach this point
  PyEval_RestoreThread(state_);
  absl::MutexLock l(&g_mu);
  --g_reacquiring;
}

void OnPythonExit() {
  PyThreadState* state = PyEval_SaveThread();
  {
    absl::MutexLock l(&g_mu);
    g_exiting = true;
    g_exit_thread = std::this_thread::get_id();
    const int* reacquiring = &g_reacquiring;
    g_mu.Await(absl::Condition(
        +[](const int* n) { return *n == 0; }, reacquiring));
  }
  PyEval_RestoreThread(state);
}

}  // namespace ckptd::py_binding
