#include "nogil.h"

#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace ckptd::py_binding {
namespace {

std::mutex g_mu;
std::condition_variable g_cv;
bool g_exiting = false;   // guarded by g_mu
int g_reacquiring = 0;    // threads between "not exiting" and holding the GIL; guarded by g_mu
// The thread that ran the hook: it finalizes Python, which never ends its own thread, so its calls
// (later atexit handlers, finalizers) take the GIL back as usual. Guarded by g_mu.
std::thread::id g_exit_thread;

[[noreturn]] void Park() {
  for (;;) pause();  // the process is exiting: its end ends this thread
}

}  // namespace

ReleasedGil::ReleasedGil() : state_(PyEval_SaveThread()) {}

ReleasedGil::~ReleasedGil() {
  bool park;
  {
    std::lock_guard<std::mutex> l(g_mu);
    park = g_exiting && std::this_thread::get_id() != g_exit_thread;
    if (!park) ++g_reacquiring;
  }
  if (park) Park();  // holding nothing: other threads still reach this point
  PyEval_RestoreThread(state_);
  std::lock_guard<std::mutex> l(g_mu);
  if (--g_reacquiring == 0) g_cv.notify_all();
}

void OnPythonExit() {
  PyThreadState* state = PyEval_SaveThread();
  {
    std::unique_lock<std::mutex> l(g_mu);
    g_exiting = true;
    g_exit_thread = std::this_thread::get_id();
    g_cv.wait(l, [] { return g_reacquiring == 0; });
  }
  PyEval_RestoreThread(state);
}

}  // namespace ckptd::py_binding
