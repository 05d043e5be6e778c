// The small interface every I/O backend implements: move the chunks a worker
// claims from a request's queue between the file and memory, blocking, on the
// calling thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gdscp/memory.hpp"
#include "gdscp/plan.hpp"
#include "gdscp/settings.hpp"

namespace gdscp {

class Request;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const noexcept = 0;

  // Reads every chunk it claims from `work` into `base + chunk.buf_offset`;
  // returns the bytes read (a chunk comes up short only at end of file).
  // `progress`, when given, hears of bytes as they land.
  virtual size_t read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& settings,
                      Request* progress) = 0;
  // Writes every chunk it claims, all bytes or a throw.
  virtual size_t write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& settings,
                       Request* progress) = 0;
};

}  // namespace gdscp
