// gdscp._core.testing: hooks for the test suite only (fault injection,
// counters, a planning simulator, the mapped copy on an explicit range).
// Nothing in the gdscp package uses them.
#pragma once

#include <nanobind/nanobind.h>

namespace gdscp::bindings {

void define_testing(nanobind::module_& core);

}  // namespace gdscp::bindings
