// The engine's process-wide services beside open files: the worker pool's
// size, the idle staging buffers, and a wait on a CUDA stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdscp/settings.hpp"

namespace gdscp {

// Sets the process-wide pool's size (gdscp.defaults num_threads); safe while
// transfers run. More than kMaxNumThreads is an invalid-argument Error that
// changes nothing. Where the system refuses new threads it throws, and the
// pool runs the workers it could start (num_threads() says how many).
void set_num_threads(unsigned n);
unsigned num_threads();

// Makes the workers' CUDA streams and pinned staging for GPU `ordinal` now
// for `workers` workers (0: all; detail::prepare_staging), so that the first
// transfer does not.
void prepare_device(int ordinal, const Settings& s, size_t workers);

// Frees the idle pinned and aligned staging buffers; the bytes freed.
size_t trim_pools();

// The NUMA node nearest GPU `ordinal`, where pinned staging for it is placed;
// -1 on a machine of one node, or where sysfs does not say.
int gpu_numa_node(int ordinal);

// Waits for the work queued on a CUDA stream (a CUstream as an integer). The
// per-thread default stream (2) is the calling thread's own in a context: that
// of the device memory at `ptr` where one is given.
void stream_synchronize(uintptr_t stream, uintptr_t ptr = 0);

}  // namespace gdscp
