#include "gdscp/settings.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstddef>

namespace gdscp {

// One worker per CPU: on the 16-CPU host of an H200 with PCIe Gen5, hot reads
// into GPU memory are level from 12 to 20 workers and lose from 24 on, and
// into host memory 16 workers beat 32 (docs/performance.md, num_threads).
unsigned default_num_threads() {
  static const unsigned cpus = static_cast<unsigned>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  return std::max(4u, std::min(cpus, 32u));
}

// All the staging of a process in 128 MiB: on the 32-CPU host of two H200,
// two hot files loaded into the two GPUs at 32 workers ran at 91 GB/s with
// 2 MiB buffers and 72 with 4 MiB (256 MiB in all; 2 MiB at depth 4 lost as
// much), and one file into one GPU ran level or faster; on the 16-CPU host of
// one H200, 4 MiB was best (docs/performance.md, bounce_buffer_size).
size_t default_bounce_buffer_size() {
  constexpr size_t kStaging = size_t{128} << 20;
  constexpr size_t kMiB = size_t{1} << 20;
  const size_t share = kStaging / (2 * size_t{default_num_threads()}) / kMiB * kMiB;
  return std::clamp(share, kMiB, 4 * kMiB);
}

}  // namespace gdscp
