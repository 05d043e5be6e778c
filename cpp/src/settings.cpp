#include "gdscp/settings.hpp"

#include <unistd.h>

#include <algorithm>

namespace gdscp {

// One worker per CPU: on the 16-CPU host of an H200 with PCIe Gen5, hot reads
// into GPU memory are level from 12 to 20 workers and lose from 24 on, and
// into host memory 16 workers beat 32 (docs/performance.md, num_threads).
unsigned default_num_threads() {
  static const unsigned cpus = static_cast<unsigned>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  return std::max(4u, std::min(cpus, 32u));
}

}  // namespace gdscp
