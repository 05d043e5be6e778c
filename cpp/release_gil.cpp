#include "release_gil.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace gdscp::bindings {

namespace {
// Threads inside a ReleaseGil scope now, and whether the interpreter's exit
// has begun (its atexit functions run). Both change with the GIL held.
std::atomic<int> g_released{0};
std::atomic<bool> g_exiting{false};
}  // namespace

void note_interpreter_exit() noexcept {
  g_exiting = true;
  // A daemon thread still inside an engine call never comes back for its
  // frames' objects: nanobind would report them as leaks of the bindings.
  if (g_released > 0) nanobind::set_leak_warnings(false);
}

[[noreturn]] void park_forever() noexcept {
  // What this thread's Python frames hold is never released: nanobind would
  // report those objects at exit as leaks of the bindings.
  nanobind::set_leak_warnings(false);
  // Process signals go to the threads that still run; this one only waits
  // for the process to end.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  for (;;) ::pause();
}

ReleaseGil::ReleaseGil() noexcept : state_(nullptr) {
  ++g_released;
  if (g_exiting) nanobind::set_leak_warnings(false);  // this call may outlast the interpreter
  state_ = PyEval_SaveThread();
}

ReleaseGil::~ReleaseGil() {
  // The forced unwind starts inside PyEval_RestoreThread (C, which throws
  // nothing else); caught here it never reaches a noexcept frame. The thread
  // holds no GIL at that point. (catch (...) rather than the documented
  // catch (abi::__forced_unwind&): there is no object to bind a reference to.)
  try {
    PyEval_RestoreThread(state_);
  } catch (...) {
    park_forever();
  }
  --g_released;
}

}  // namespace gdscp::bindings
