#include "gdscp/device_buffer.hpp"

#include <string>

#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp {

// One cuMemAlloc, freed under the context it came from.
struct DeviceBuffer::Allocation {
  Allocation(size_t nbytes, int gpu) : ordinal(gpu) {
    const CudaDriver& drv = CudaDriver::require();
    ctx = detail::primary_context(ordinal);
    if (nbytes == 0) return;  // cuMemAlloc refuses 0 bytes; nothing to point at
    ScopedContext scope(drv, ctx);
    drv.check(drv.cuMemAlloc(&ptr, nbytes),
              ("cuMemAlloc (" + std::to_string(nbytes) + " bytes on GPU " + std::to_string(ordinal) + ")").c_str());
  }
  ~Allocation() {
    if (!ptr) return;
    if (const CudaDriver* drv = CudaDriver::get()) {
      try {
        ScopedContext scope(*drv, ctx);
        drv->cuMemFree(ptr);
      } catch (...) {
      }
    }
  }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;

  int ordinal;
  CUcontext ctx = nullptr;
  CUdeviceptr ptr = 0;
};

DeviceBuffer::DeviceBuffer(size_t nbytes, int ordinal)
    : alloc_(std::make_shared<Allocation>(nbytes, ordinal)), size_(nbytes) {}

uintptr_t DeviceBuffer::ptr() const noexcept { return alloc_->ptr ? static_cast<uintptr_t>(alloc_->ptr) + offset_ : 0; }

int DeviceBuffer::ordinal() const noexcept { return alloc_->ordinal; }

DeviceBuffer DeviceBuffer::slice(size_t start, size_t stop) const {
  if (start > stop || stop > size_)
    throw_invalid("slice [" + std::to_string(start) + ", " + std::to_string(stop) + ") of a " +
                  std::to_string(size_) + "-byte device buffer");
  return DeviceBuffer(alloc_, offset_ + start, stop - start);
}

void DeviceBuffer::check_range(size_t offset, size_t n, const char* what) const {
  if (offset > size_ || n > size_ - offset)
    throw_invalid(std::string(what) + ": " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                  " do not fit in a " + std::to_string(size_) + "-byte device buffer");
}

void DeviceBuffer::fill(uint8_t value) {
  if (size_ == 0) return;
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, alloc_->ctx);
  drv.check(drv.cuMemsetD8(static_cast<CUdeviceptr>(ptr()), value, size_), "cuMemsetD8");
  // The memset is asynchronous; the engine's streams would wait for it, but
  // cuFile's need not.
  drv.check(drv.cuCtxSynchronize(), "cuCtxSynchronize");
}

void DeviceBuffer::copy_from_host(size_t offset, const void* src, size_t n) {
  check_range(offset, n, "copy to device memory");
  if (n == 0) return;
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, alloc_->ctx);
  drv.check(drv.cuMemcpyHtoD(static_cast<CUdeviceptr>(ptr() + offset), src, n), "cuMemcpyHtoD");
  // From pageable memory the copy may return before its DMA has landed.
  drv.check(drv.cuCtxSynchronize(), "cuCtxSynchronize");
}

void DeviceBuffer::copy_to_host(size_t offset, void* dst, size_t n) const {
  check_range(offset, n, "copy from device memory");
  if (n == 0) return;
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, alloc_->ctx);
  drv.check(drv.cuMemcpyDtoH(dst, static_cast<CUdeviceptr>(ptr() + offset), n), "cuMemcpyDtoH");
}

DeviceMemoryInfo device_memory_info(int ordinal) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, detail::primary_context(ordinal));
  size_t free = 0, total = 0;
  drv.check(drv.cuMemGetInfo(&free, &total), "cuMemGetInfo");
  return {free, total};
}

void device_synchronize(int ordinal) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, detail::primary_context(ordinal));
  drv.check(drv.cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace gdscp
