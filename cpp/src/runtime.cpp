#include "gdscp/runtime.hpp"

#include <string>

#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/numa.hpp"
#include "gdscp/detail/staging.hpp"
#include "gdscp/detail/thread_pool.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp {

void set_num_threads(unsigned n) {
  if (n > kMaxNumThreads)
    throw_invalid("num_threads must be at most " + std::to_string(kMaxNumThreads) + " (got " + std::to_string(n) +
                  ")");
  detail::ThreadPool::process_default().resize(n);
}

unsigned num_threads() { return detail::ThreadPool::process_default().size(); }

void prepare_device(int ordinal, const Settings& s, size_t workers) {
  detail::prepare_staging(ordinal, s, workers);
}

size_t trim_pools() { return detail::BufferPool::trim_pinned() + detail::BufferPool::aligned().trim(); }

int gpu_numa_node(int ordinal) { return detail::gpu_numa_node(ordinal); }

void stream_synchronize(uintptr_t stream, uintptr_t ptr) {
  const CudaDriver& drv = CudaDriver::require();
  const auto handle = reinterpret_cast<CUstream>(stream);
  if (handle == CU_STREAM_PER_THREAD && ptr != 0) {
    // Under the memory's context, whichever is current on this thread (if any).
    const detail::MemoryTarget mem = detail::resolve_device_pointer(ptr);
    if (mem.ctx) {
      ScopedContext scope(drv, mem.ctx);
      drv.check(drv.cuStreamSynchronize(handle), "cuStreamSynchronize (per-thread default stream)");
      return;
    }
  }
  drv.check(drv.cuStreamSynchronize(handle), "cuStreamSynchronize");
}

}  // namespace gdscp
