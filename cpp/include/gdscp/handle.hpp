// An open file and the requests that move bytes through it. A parallel
// request is planned (detail/plan.hpp), its chunks queued for the workers of
// the process's pool, and the caller waits on a Future; raw transfers run on
// the calling thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "gdscp/future.hpp"
#include "gdscp/settings.hpp"

namespace gdscp {

namespace detail {
struct OpenFile;
}

class Handle {
 public:
  // Opens `path` with Python open() `flags` and picks the backend for device
  // memory by `s.compat_mode`; `cufile_library`: where to find libcufile if
  // the system has none.
  Handle(std::string path, std::string_view flags, const Settings& s, const std::string& cufile_library);

  void close();
  bool closed() const;
  int fileno() const;
  int open_flags() const;
  std::string path() const;
  // Whether the filesystem gave the file an O_DIRECT descriptor.
  bool direct_io_supported() const;
  // Which backend device memory goes through ("cufile" or "posix"), and why.
  const std::string& backend() const noexcept { return backend_; }
  const std::string& backend_reason() const noexcept { return reason_; }

  // Parallel transfers between the file and host (`device` false) or device memory.
  std::unique_ptr<Future> pread(uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s);
  std::unique_ptr<Future> pwrite(uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s);

  // Whether a request of `size` bytes runs as one task of one chunk: below
  // `gds_threshold` and no larger than `task_size`. Such a request runs on the
  // calling thread whichever way it is made, so read_now/write_now may take it.
  static bool runs_inline(size_t size, const Settings& s) noexcept {
    return size < s.gds_threshold && size <= s.task_size;
  }
  // A request for which runs_inline holds, run on the calling thread without
  // a Future or a Request: the bytes moved, or the exception that the Future's
  // get() would have thrown. Bad arguments throw as pread/pwrite do.
  size_t read_now(uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s);
  size_t write_now(uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s);

  // One transfer on the calling thread, device memory only.
  size_t raw_read(uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s);
  size_t raw_write(uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s);
  // The same, ordered on a CUDA stream.
  std::unique_ptr<StreamFuture> raw_read_async(uintptr_t base, size_t size, int64_t file_offset,
                                               int64_t dev_offset, uintptr_t stream, const Settings& s);
  std::unique_ptr<StreamFuture> raw_write_async(uintptr_t base, size_t size, int64_t file_offset,
                                                int64_t dev_offset, uintptr_t stream, const Settings& s);

 private:
  std::shared_ptr<const detail::OpenFile> state() const;  // throws once closed
  // state(), checked for reading or writing.
  std::shared_ptr<const detail::OpenFile> open_for(bool write) const;
  std::unique_ptr<Future> submit(bool write, uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                 const Settings& s);
  size_t transfer_now(bool write, uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s);
  size_t raw(bool write, uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s);
  std::unique_ptr<StreamFuture> raw_async(bool write, uintptr_t base, size_t size, int64_t file_offset,
                                          int64_t dev_offset, uintptr_t stream, const Settings& s);

  mutable std::mutex mutex_;
  std::shared_ptr<const detail::OpenFile> open_;
  std::string path_;
  std::string backend_;
  std::string reason_;
};

}  // namespace gdscp
