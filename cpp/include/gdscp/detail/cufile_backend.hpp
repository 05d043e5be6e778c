// NVIDIA cuFile: device memory moved by cuFileRead/cuFileWrite on a handle
// registered through the file's O_DIRECT descriptor.
#pragma once

#include <memory>
#include <string>

#include "gdscp/detail/backend.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/shim/cufile_driver.hpp"

namespace gdscp::detail {

class CuFileBackend final : public Backend {
 public:
  // Registers the file; throws an Error with cuFile's reason when it cannot.
  CuFileBackend(std::shared_ptr<File> file, const CuFileDriver& driver);
  ~CuFileBackend() override;
  CuFileBackend(const CuFileBackend&) = delete;
  CuFileBackend& operator=(const CuFileBackend&) = delete;
  const char* name() const noexcept override { return "cufile"; }

  size_t read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req) override;
  size_t write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
               Request* req) override;

  // Device memory never goes whole through an O_APPEND descriptor.
  bool append_whole(const MemoryTarget&, const char*, size_t) override { return false; }

  // cuFileReadAsync/cuFileWriteAsync, where this libcufile has them.
  bool supports_async() const noexcept override { return driver_.cuFileReadAsync && driver_.cuFileWriteAsync; }
  // False where cuFile refuses stream I/O here.
  bool submit_async(bool write, const MemoryTarget& mem, void* base, AsyncOp& op, CUstream stream) override;
  size_t async_result(const AsyncOp& op) const override;

 private:
  // The chunks `work` hands out, through cuFileRead or cuFileWrite.
  template <bool Write>
  size_t transfer(const MemoryTarget& mem, char* base, ChunkQueue& work, Request* req);

  std::shared_ptr<File> file_;
  const CuFileDriver& driver_;
  CUfileHandle_t handle_ = nullptr;
};

}  // namespace gdscp::detail
