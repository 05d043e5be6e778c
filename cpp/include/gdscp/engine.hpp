// The engine: an open file with its chosen backend, and the requests that move
// bytes through it. Plans each request (plan.hpp), hands the tasks to the
// thread pool, and lets the caller wait on a Future.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "gdscp/backend.hpp"
#include "gdscp/cufile_backend.hpp"
#include "gdscp/file.hpp"
#include "gdscp/posix_backend.hpp"
#include "gdscp/request.hpp"
#include "gdscp/settings.hpp"

namespace gdscp {

// What the caller holds for a pread/pwrite. Destroying it waits for the tasks,
// which may still be writing into the caller's memory.
class Future {
 public:
  explicit Future(std::shared_ptr<Request> req) : req_(std::move(req)) {}
  ~Future() {
    if (req_) req_->wait_for(-1);
  }
  Future(const Future&) = delete;
  Future& operator=(const Future&) = delete;

  size_t get() { return req_->get(); }
  bool done() const { return req_->done(); }
  bool wait_for(double seconds) const { return req_->wait_for(seconds); }
  void cancel() { req_->cancel(); }
  size_t progress() const { return req_->progress(); }

 private:
  std::shared_ptr<Request> req_;
};

// Everything an open file owns. Requests keep it alive, so close() during a
// transfer never pulls a descriptor from under a running task.
struct OpenFile {
  std::shared_ptr<File> file;
  std::shared_ptr<PosixBackend> posix;
  std::shared_ptr<CuFileBackend> cufile;  // null unless cuFile was chosen
  Backend* device_backend() const { return cufile ? static_cast<Backend*>(cufile.get()) : posix.get(); }
};

// A raw_read_async/raw_write_async in flight on a CUDA stream.
class StreamFuture {
 public:
  StreamFuture(std::shared_ptr<const OpenFile> keep, CUstream stream, CUcontext ctx, size_t ready_bytes,
               std::unique_ptr<CuFileAsyncOp> op);
  ~StreamFuture();
  StreamFuture(const StreamFuture&) = delete;
  StreamFuture& operator=(const StreamFuture&) = delete;
  // Synchronises the stream, then returns the bytes moved or throws.
  size_t check_bytes_done();

 private:
  std::shared_ptr<const OpenFile> keep_;
  CUstream stream_;
  CUcontext ctx_;
  size_t ready_bytes_;
  std::unique_ptr<CuFileAsyncOp> op_;  // null: the transfer already ran (stream-ordered fallback)
  bool synced_ = false;
};

class Handle {
 public:
  Handle(std::string path, std::string_view flags, CompatMode compat, const std::string& cufile_library);

  void close();
  bool closed() const;
  int fileno() const;
  int open_flags() const;
  std::string path() const;
  // Which backend device memory goes through ("cufile" or "posix"), and why.
  const std::string& backend() const noexcept { return backend_; }
  const std::string& backend_reason() const noexcept { return reason_; }

  std::unique_ptr<Future> pread(uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                size_t task_size, const Settings& s);
  std::unique_ptr<Future> pwrite(uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                 size_t task_size, const Settings& s);

  // One transfer on the calling thread, device memory only.
  size_t raw_read(uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s);
  size_t raw_write(uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s);
  std::unique_ptr<StreamFuture> raw_read_async(uintptr_t base, size_t size, int64_t file_offset,
                                               int64_t dev_offset, uintptr_t stream, const Settings& s);
  std::unique_ptr<StreamFuture> raw_write_async(uintptr_t base, size_t size, int64_t file_offset,
                                                int64_t dev_offset, uintptr_t stream, const Settings& s);

 private:
  std::shared_ptr<const OpenFile> state() const;  // throws once closed
  // state(), checked for reading or writing.
  std::shared_ptr<const OpenFile> open_for(bool write) const;
  std::unique_ptr<Future> submit(bool write, uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                 size_t task_size, const Settings& s);
  size_t raw(bool write, uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset,
             const Settings& s);
  std::unique_ptr<StreamFuture> raw_async(bool write, uintptr_t base, size_t size, int64_t file_offset,
                                          int64_t dev_offset, uintptr_t stream, const Settings& s);

  mutable std::mutex mutex_;
  std::shared_ptr<const OpenFile> open_;
  std::string path_;
  std::string backend_;
  std::string reason_;
};

// Sets the process-wide pool's size (gdscp.defaults num_threads).
void set_num_threads(unsigned n);
unsigned num_threads();
unsigned busy_threads();  // workers running a task now (tests: none may be stuck)

}  // namespace gdscp
