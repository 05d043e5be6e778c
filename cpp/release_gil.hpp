// The GIL released around a blocking engine call, and taken back in a way
// that survives interpreter exit.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>

namespace gdscp::bindings {

// A thread that CPython ends at interpreter exit stays parked here until the
// process is gone.
[[noreturn]] void park_forever() noexcept;

// Use instead of nb::gil_scoped_release (as nb::call_guard<ReleaseGil>, or as
// a scoped object). At interpreter exit CPython ends a daemon thread that
// asks for the GIL back by pthread_exit(), which unwinds the thread's stack
// with a forced-unwind exception. From gil_scoped_release's destructor
// (noexcept) that unwind calls std::terminate, and nanobind's dispatch, which
// catches everything and does not rethrow, could not let it pass anyway: the
// process aborted. ReleaseGil instead parks such a thread for good (as
// CPython 3.14 does itself), so the interpreter exits normally.
class ReleaseGil {
 public:
  ReleaseGil() noexcept;
  ~ReleaseGil();
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

// Runs `call`, which runs Python code with the GIL held (and so may meet
// interpreter exit where that code lets the GIL go), with the same protection.
template <class F>
void exit_safe(F&& call) {
  try {
    call();
  } catch (const std::exception&) {
    throw;  // every C++ error, nanobind's python_error included
  } catch (...) {
    park_forever();  // the forced unwind, which has no object of any type
  }
}

}  // namespace gdscp::bindings
