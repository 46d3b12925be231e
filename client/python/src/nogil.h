// ReleasedGil: the binding's one way to run native code without the GIL, safe at interpreter exit.
//
// Why not py::gil_scoped_release. Its destructor takes the GIL back with PyEval_RestoreThread;
// once the interpreter is finalizing, CPython (3.10 to 3.13) ends a thread that asks for the GIL
// with pthread_exit, whose forced unwinding through that (noexcept) destructor calls
// std::terminate: "terminate called without an active exception", SIGABRT, and the exit status
// of a process whose work had succeeded is lost. That happens whenever a thread - a daemon
// thread, or any thread still in a call of ours when the main thread returns - finishes a ckptd
// call while Python shuts down.
//
// What ReleasedGil does instead. The module registers an atexit hook (OnPythonExit) that runs
// before finalization starts and before other threads can be ended. From then on, a thread whose
// native call finishes never asks for the GIL again: it parks (sleeps until the process exits,
// what Python 3.14 does to daemon threads itself), holding no lock of ours - everything declared
// after the guard is destroyed first. A thread that already decided to take the GIL back before
// the hook ran is waited for by the hook (with the GIL released), so it gets the GIL while
// Python is still whole. Nothing is left to a race. The thread that ran the hook (the one that
// finalizes, which Python never ends) keeps taking the GIL back: atexit handlers that run after
// ours, and finalizers, may still call the client.
//
// Threads: any thread that holds the GIL constructs and destroys one (RAII, not movable).
#pragma once

#include <Python.h>

namespace ckptd::py_binding {

class ReleasedGil {
 public:
  ReleasedGil();
  // Takes the GIL back, or parks this thread for good once Python is exiting.
  ~ReleasedGil();
  ReleasedGil(const ReleasedGil&) = delete;
  ReleasedGil& operator=(const ReleasedGil&) = delete;

 private:
  PyThreadState* state_;
};

// The atexit hook (registered by the module): from now on native calls that finish park their
// thread; returns once every thread already taking the GIL back has it. Called with the GIL.
void OnPythonExit();

}  // namespace ckptd::py_binding
