#include "release_gil.hpp"

#include <signal.h>
#include <unistd.h>

namespace gdscp::bindings {

void note_interpreter_exit() {
  // By the atexit functions, every thread but the daemons has been joined. A
  // daemon thread (in an engine call, or about to make one) never comes back
  // for its frames' objects: nanobind would report them as leaks of the bindings.
  if (nanobind::cast<int>(nanobind::module_::import_("threading").attr("active_count")()) > 1)
    nanobind::set_leak_warnings(false);
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

ReleaseGil::ReleaseGil() noexcept : state_(PyEval_SaveThread()) {}

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
}

}  // namespace gdscp::bindings
