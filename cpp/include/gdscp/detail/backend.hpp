// The table of operations every I/O backend fills in (as fio's ioengines do),
// and the one place that picks a backend for a file. The engine (handle.cpp,
// future.cpp) sees backends only through this header.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

// The arguments and result of one stream-ordered transfer, which must stay put
// until the stream has run it (cuFileReadAsync reads them from the stream).
struct AsyncOp {
  size_t size = 0;
  off_t file_offset = 0;
  off_t buf_offset = 0;
  ssize_t bytes = 0;  // written by the stream: bytes moved, or a negative error
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "cufile" or "posix": what CuFile.backend reports.
  virtual const char* name() const noexcept = 0;

  // Reads every chunk it claims from `work` into `base + chunk.buf_offset`,
  // blocking, on the calling thread; returns the bytes read (a chunk comes up
  // short only at end of file). `req`, when given, hears of bytes as they land.
  virtual size_t read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req) = 0;
  // One range read on the calling thread, as read() would read a queue of
  // that one chunk (the bytes read, short only at end of file). Backends
  // with a shorter way for it override this.
  virtual size_t read_one(const MemoryTarget& mem, char* dst, size_t size, int64_t file_offset, const Settings& s) {
    ChunkQueue one({Chunk{0, file_offset, size}}, size);
    return std::min(read(mem, dst, one, s, nullptr), one.moved());
  }
  // Writes every chunk it claims, all bytes or a throw.
  virtual size_t write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                       Request* req) = 0;

  // Append mode: writes all `size` bytes at the end of the file with one
  // O_APPEND write, which no other writer can split or overlap, where the
  // backend can (small requests from host memory) and returns true; false
  // where it cannot, and the caller reserves the range and writes into it.
  virtual bool append_whole(const MemoryTarget& mem, const char* base, size_t size) = 0;

  // Whether submit_async can queue transfers on a CUDA stream here at all.
  virtual bool supports_async() const noexcept = 0;
  // Queues one transfer of device memory at `base` on `stream`; false where
  // the backend cannot order this one on the stream (the caller then does).
  virtual bool submit_async(bool write, const MemoryTarget& mem, void* base, AsyncOp& op, CUstream stream) = 0;
  // Once the stream has run `op`: the bytes it moved, or a throw that says
  // what failed, where and why.
  virtual size_t async_result(const AsyncOp& op) const = 0;
};

// The backends an open file moves its bytes through.
struct Backends {
  std::shared_ptr<Backend> host;    // host memory: always gdscp's POSIX path
  std::shared_ptr<Backend> device;  // device memory: cuFile, or the same POSIX backend
  std::string reason;               // why `device` is what it is
};

// compat_mode ON: never cuFile. AUTO: cuFile only where GPUDirect Storage
// really works (nvidia-fs loaded and the file registers), else POSIX with the
// reason. OFF: cuFile, or an error that says why it cannot be had.
Backends choose_backends(const std::shared_ptr<File>& file, CompatMode compat, const std::string& cufile_library);

}  // namespace gdscp::detail
