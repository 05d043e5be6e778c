// The knobs one request runs with: resolved once by the caller (gdscp.defaults)
// and passed down by value, so a change never affects a request in flight.
// The member initialisers are the defaults, for C++ and Python alike
// (gdscp.defaults reads them from a default-constructed Settings).
#pragma once

#include <cstddef>

namespace gdscp {

// Which backend device memory goes through: ON: never cuFile; OFF: cuFile or an
// error; AUTO: cuFile where GPUDirect Storage really works.
enum class CompatMode { off = 0, on = 1, automatic = 2 };

// O_DIRECT for host-side transfers of 1 MiB and more: never; always (the
// aligned middle of reads and writes); or for writes of 4 MiB and more.
enum class DirectIO { off = 0, on = 1, automatic = 2 };

// The pinned staging buffer size unless the caller sets one: the default
// workers' buffers (pipeline depth 2) share 128 MiB, from 1 to 4 MiB each.
size_t default_bounce_buffer_size();

struct Settings {
  CompatMode compat_mode = CompatMode::automatic;  // read when a file is opened
  size_t task_size = 16u << 20;           // largest chunk a worker claims at once
  size_t gds_threshold = 1u << 20;        // below this a request runs on the calling thread
  size_t bounce_buffer_size = default_bounce_buffer_size();  // pinned staging buffer size
  size_t min_task_size = 256u << 10;      // medium requests are split down to this
  DirectIO direct_io = DirectIO::automatic;
  int pipeline_depth = 2;                 // staging buffers in flight per worker (2..8)
  bool mapped_reads = true;               // cached chunks into host memory: map + streaming copy
};

// The worker pool's size unless the caller sets one: one worker per CPU, at
// least 4 (so a small machine still overlaps I/O waits) and at most 32.
unsigned default_num_threads();

// The most workers the pool may be given (gdscp.defaults num_threads, the
// command line's --threads). More only costs memory and start-up: every chunk
// is smaller than a worker's share long before. A larger count is refused
// before any thread starts, instead of the pool starting threads until the
// system refuses (and keeping them, which leaves the machine none to spare).
constexpr unsigned kMaxNumThreads = 4096;

}  // namespace gdscp
