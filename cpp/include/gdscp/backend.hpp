// The small interface every I/O backend implements: move one task's bytes
// between a file range and memory, blocking, on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdscp/memory.hpp"
#include "gdscp/settings.hpp"

namespace gdscp {

class Request;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const noexcept = 0;

  // Reads up to `size` bytes at `file_offset` into `dst`; fewer only at end of
  // file. `progress`, when given, hears of bytes as they land.
  virtual size_t read(const MemoryTarget& mem, void* dst, size_t size, int64_t file_offset,
                      const Settings& settings, Request* progress) = 0;
  // Writes all `size` bytes or throws.
  virtual size_t write(const MemoryTarget& mem, const void* src, size_t size, int64_t file_offset,
                       const Settings& settings, Request* progress) = 0;
};

}  // namespace gdscp
