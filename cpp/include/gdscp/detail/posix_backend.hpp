// gdscp's own path, for every file: host memory by pread/pwrite (posix_io.hpp)
// or, for cached reads, a mapped streaming copy (mapped_read.hpp); device
// memory through pinned staging buffers (staging.hpp). This class only
// dispatches between them.
#pragma once

#include <memory>

#include "gdscp/detail/backend.hpp"
#include "gdscp/detail/file.hpp"

namespace gdscp::detail {

class PosixBackend final : public Backend {
 public:
  explicit PosixBackend(std::shared_ptr<File> file) : file_(std::move(file)) {}
  const char* name() const noexcept override { return "posix"; }

  size_t read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req) override;
  size_t write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
               Request* req) override;
  // Host memory: read_host straight away, without a queue.
  size_t read_one(const MemoryTarget& mem, char* dst, size_t size, int64_t file_offset, const Settings& s) override;

  // Host memory below kAtomicAppendMax (posix_io.hpp).
  bool append_whole(const MemoryTarget& mem, const char* base, size_t size) override;

  // No stream-ordered I/O: the engine orders such transfers itself.
  bool supports_async() const noexcept override { return false; }
  bool submit_async(bool write, const MemoryTarget& mem, void* base, AsyncOp& op, CUstream stream) override;
  size_t async_result(const AsyncOp& op) const override;

 private:
  // One chunk into host memory: a mapped streaming copy of cached data, else
  // read_range (`ahead`: the bytes after the chunk to ask of the disk with it
  // where it is cold).
  size_t read_host(char* dst, size_t size, int64_t off, const Settings& s, size_t ahead = 0);

  std::shared_ptr<File> file_;
};

}  // namespace gdscp::detail
