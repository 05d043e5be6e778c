// gdscp._core's bulk jobs (gdscp/bulk.py is their Python face).
#pragma once

#include <nanobind/nanobind.h>

namespace gdscp::bindings {

void define_bulk(nanobind::module_& core);

}  // namespace gdscp::bindings
