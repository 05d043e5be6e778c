// GPU memory that gdscp allocates itself, through the driver it already
// loads, for callers without an array library: the command line and the
// benchmark work on a GPU with nothing but gdscp installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace gdscp {

// A view of device memory allocated with cuMemAlloc in a GPU's primary
// context. Views of one allocation share it; it is freed with the last.
// Fills and copies are synchronous: once they return, any stream (gdscp's
// own, or cuFile's) sees the bytes.
class DeviceBuffer {
 public:
  // `nbytes` (0 allowed) on GPU `ordinal`; throws a CUDA error (out of
  // memory, no such GPU) or a state error without CUDA.
  DeviceBuffer(size_t nbytes, int ordinal);

  uintptr_t ptr() const noexcept;  // 0 for an empty buffer
  size_t size() const noexcept { return size_; }
  int ordinal() const noexcept;

  // Bytes [start, stop) of this view; the caller keeps start <= stop <= size().
  DeviceBuffer slice(size_t start, size_t stop) const;

  // Every byte of the view set to `value`.
  void fill(uint8_t value);
  // `n` host bytes to [offset, offset + n) of the view, and back.
  void copy_from_host(size_t offset, const void* src, size_t n);
  void copy_to_host(size_t offset, void* dst, size_t n) const;

 private:
  struct Allocation;
  DeviceBuffer(std::shared_ptr<Allocation> alloc, size_t offset, size_t size)
      : alloc_(std::move(alloc)), offset_(offset), size_(size) {}
  void check_range(size_t offset, size_t n, const char* what) const;

  std::shared_ptr<Allocation> alloc_;
  size_t offset_ = 0;
  size_t size_ = 0;
};

struct DeviceMemoryInfo {
  uint64_t free = 0;
  uint64_t total = 0;
};

// Free and total memory of GPU `ordinal`.
DeviceMemoryInfo device_memory_info(int ordinal);

// Waits for all work queued on GPU `ordinal`'s primary context.
void device_synchronize(int ordinal);

}  // namespace gdscp
