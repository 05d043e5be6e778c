// NVIDIA cuFile: device memory moved by cuFileRead/cuFileWrite on a handle
// registered through the file's O_DIRECT descriptor.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "gdscp/backend.hpp"
#include "gdscp/cufile_driver.hpp"
#include "gdscp/file.hpp"

namespace gdscp {

// The arguments of cuFileReadAsync/cuFileWriteAsync, which must stay put until
// the stream has run the operation.
struct CuFileAsyncOp {
  size_t size = 0;
  off_t file_offset = 0;
  off_t buf_offset = 0;
  ssize_t bytes = 0;
};

class CuFileBackend final : public Backend {
 public:
  // Registers the file; throws an Error with cuFile's reason when it cannot.
  CuFileBackend(std::shared_ptr<File> file, const CuFileDriver& driver);
  ~CuFileBackend() override;
  const char* name() const noexcept override { return "cufile"; }

  size_t read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& settings,
              Request* progress) override;
  size_t write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& settings,
               Request* progress) override;

  bool has_async() const noexcept { return driver_.cuFileReadAsync && driver_.cuFileWriteAsync; }
  // Queues the operation on `stream`; false where cuFile refuses stream I/O here.
  bool enqueue(bool write, const MemoryTarget& mem, void* base, CuFileAsyncOp& op, CUstream stream);

 private:
  // The chunks `work` hands out, through cuFileRead or cuFileWrite.
  template <bool Write>
  size_t transfer(const MemoryTarget& mem, char* base, ChunkQueue& work, Request* progress);

  std::shared_ptr<File> file_;
  const CuFileDriver& driver_;
  CUfileHandle_t handle_ = nullptr;
};

// Decodes a negative cuFileRead/cuFileWrite result into a thrown Error.
[[noreturn]] void throw_cufile_io_error(ssize_t result, const char* what, const std::string& path,
                                        int64_t offset);

}  // namespace gdscp
