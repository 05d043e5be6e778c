// The GIL released around a blocking engine call, and taken back in a way
// that survives interpreter exit.
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <memory>
#include <type_traits>
#include <utility>

namespace gdscp::bindings {

// A thread that CPython ends at interpreter exit stays parked here until the
// process is gone.
[[noreturn]] void park_forever() noexcept;

// Registered with atexit as the module loads: where daemon threads still run
// as the interpreter exits, nanobind's leak report is turned off, since one
// blocked in an engine call keeps its frames' objects to the end.
void note_interpreter_exit();

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

// What Python holds of work in flight (a Future, a StreamFuture, a BulkJob).
// Its engine object waits for the work as it goes, since the Python side
// keeps the buffers alive only as long as this object: dropped before the
// work ends, it waits with the GIL released, so that the process's other
// threads run meanwhile.
template <class F>
struct Held {
  std::unique_ptr<F> f;
  explicit Held(std::unique_ptr<F> p) : f(std::move(p)) {}
  Held(Held&&) noexcept = default;
  Held& operator=(Held&&) = delete;
  ~Held() {
    if (f && !finished()) {
      const ReleaseGil unlocked;
      f.reset();
    }
  }
  template <class G, class = void>
  struct can_tell : std::false_type {};
  template <class G>
  struct can_tell<G, std::void_t<decltype(std::declval<G&>().done())>> : std::true_type {};
  bool finished() const {
    if constexpr (can_tell<F>::value) {
      try {
        return f->done();
      } catch (const std::exception&) {
        return true;  // a Future of the process this one forked from: nothing to wait for here
      }
    }
    return false;  // a StreamFuture's stream is asked only by waiting on it
  }
};

}  // namespace gdscp::bindings
