// gdscp's own path: pread/pwrite on the buffered descriptor (O_DIRECT for the
// aligned middle where enabled; cached reads into host memory by a mapped
// streaming copy); device memory is staged through pinned
// buffers, the next chunk's read overlapping the previous chunk's async copy.
#pragma once

#include <memory>

#include "gdscp/backend.hpp"
#include "gdscp/file.hpp"

namespace gdscp {

class PosixBackend final : public Backend {
 public:
  explicit PosixBackend(std::shared_ptr<File> file) : file_(std::move(file)) {}
  const char* name() const noexcept override { return "posix"; }

  size_t read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& settings,
              Request* progress) override;
  size_t write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& settings,
               Request* progress) override;

 private:
  // Host memory: a mapped streaming copy of cached data, else read_file.
  size_t read_host(char* dst, size_t size, int64_t off, const Settings& s, Request* progress);
  // pread (O_DIRECT for the aligned middle where asked).
  size_t read_file(char* dst, size_t size, int64_t off, const Settings& s, Request* progress);
  size_t write_host(const char* src, size_t size, int64_t off, const Settings& s, Request* progress);
  size_t read_device(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                     Request* progress);
  size_t write_device(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                      Request* progress);

  std::shared_ptr<File> file_;
};

// Loops over EINTR and short transfers. Reads stop early only at end of file;
// writes move every byte or throw. Errors name the file and the offset.
size_t pread_full(int fd, void* buf, size_t size, int64_t offset, const std::string& path);
size_t pwrite_full(int fd, const void* buf, size_t size, int64_t offset, const std::string& path);

}  // namespace gdscp
