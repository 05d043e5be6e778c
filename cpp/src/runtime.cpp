#include "gdscp/runtime.hpp"

#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/thread_pool.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp {

void set_num_threads(unsigned n) { detail::ThreadPool::process_default().resize(n); }
unsigned num_threads() { return detail::ThreadPool::process_default().size(); }

size_t trim_pools() { return detail::BufferPool::pinned().trim() + detail::BufferPool::aligned().trim(); }

void stream_synchronize(uintptr_t stream) {
  const CudaDriver& drv = CudaDriver::require();
  drv.check(drv.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "cuStreamSynchronize");
}

}  // namespace gdscp
