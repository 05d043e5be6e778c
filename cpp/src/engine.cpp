#include "gdscp/engine.hpp"

#include <cerrno>
#include <functional>
#include <vector>

#include "gdscp/cuda_driver.hpp"
#include "gdscp/cufile_driver.hpp"
#include "gdscp/error.hpp"
#include "gdscp/memory.hpp"
#include "gdscp/plan.hpp"
#include "gdscp/thread_pool.hpp"

namespace gdscp {
namespace {

struct Choice {
  std::shared_ptr<CuFileBackend> cufile;
  std::string reason;
};

// compat_mode ON: never cuFile. AUTO: cuFile only where GDS really works
// (nvidia-fs loaded and the file registers). OFF: cuFile or a clear error.
Choice choose_backend(const std::shared_ptr<File>& file, CompatMode compat, const std::string& lib) {
  const std::string posix = "gdscp's POSIX path (pread/pwrite through pinned staging buffers)";
  if (compat == CompatMode::on) return {nullptr, "compat_mode is ON: " + posix};
  if (compat == CompatMode::automatic) {
    if (!nvidia_fs_present())
      return {nullptr, "nvidia-fs kernel module not loaded, so GPUDirect Storage cannot work here: " + posix};
    if (file->direct_fd() < 0) return {nullptr, "the filesystem refuses O_DIRECT: " + posix};
    const CuFileDriver* drv = CuFileDriver::get(lib);
    if (!drv) return {nullptr, CuFileDriver::error() + ": " + posix};
    try {
      return {std::make_shared<CuFileBackend>(file, *drv),
              "GPUDirect Storage: nvidia-fs is loaded and cuFile registered the file"};
    } catch (const Error& e) {
      return {nullptr, std::string("cuFile refused the file (") + e.what() + "): " + posix};
    }
  }
  const CuFileDriver* drv = CuFileDriver::get(lib);
  if (!drv) throw Error(ErrorKind::state, 0, "compat_mode is OFF, which requires cuFile, but " + CuFileDriver::error());
  try {
    auto backend = std::make_shared<CuFileBackend>(file, *drv);
    return {backend, nvidia_fs_present()
                         ? "compat_mode is OFF: cuFile with GPUDirect Storage"
                         : "compat_mode is OFF: cuFile (no nvidia-fs, so libcufile runs in its own compatibility mode)"};
  } catch (const Error& e) {
    throw Error(e.kind(), e.code(), std::string("compat_mode is OFF, which requires cuFile, but ") + e.what(),
                e.path());
  }
}

MemoryTarget target_for(uintptr_t ptr, bool device) {
  return device ? resolve_device_pointer(ptr) : MemoryTarget{};
}

MemoryTarget raw_target(uintptr_t base) {
  const MemoryTarget mem = resolve_device_pointer(base);
  if (!mem.device) throw_invalid("raw I/O needs device memory; this buffer is host memory");
  return mem;
}

// One transfer on the calling thread through the file's device backend.
size_t raw_transfer(const OpenFile& st, const MemoryTarget& mem, bool write, uintptr_t base, size_t size,
                    int64_t file_offset, int64_t dev_offset, const Settings& s) {
  ChunkQueue one({Chunk{static_cast<size_t>(dev_offset), file_offset, size}});
  char* p = reinterpret_cast<char*>(base);
  Backend* b = st.device_backend();
  return write ? b->write(mem, p, one, s, nullptr) : b->read(mem, p, one, s, nullptr);
}

std::unique_ptr<Future> finished(size_t bytes) {
  auto req = std::make_shared<Request>(1);
  req->task_done(bytes);
  return std::make_unique<Future>(std::move(req));
}

}  // namespace

Handle::Handle(std::string path, std::string_view flags, CompatMode compat, const std::string& cufile_library)
    : path_(std::move(path)) {
  auto file = std::make_shared<File>(path_, flags);
  auto posix = std::make_shared<PosixBackend>(file);
  Choice choice = choose_backend(file, compat, cufile_library);
  backend_ = choice.cufile ? "cufile" : "posix";
  reason_ = std::move(choice.reason);
  open_ = std::make_shared<const OpenFile>(OpenFile{std::move(file), std::move(posix), std::move(choice.cufile)});
}

void Handle::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  open_.reset();  // descriptors close once the last request holding them ends
}

bool Handle::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !open_;
}

std::shared_ptr<const OpenFile> Handle::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!open_) throw Error(ErrorKind::invalid, 0, "I/O operation on closed file '" + path_ + "'");
  return open_;
}

std::shared_ptr<const OpenFile> Handle::open_for(bool write) const {
  std::shared_ptr<const OpenFile> st = state();
  if (write) st->file->require_writable(); else st->file->require_readable();
  return st;
}

int Handle::fileno() const { return state()->file->fd(); }
int Handle::open_flags() const { return state()->file->open_flags(); }
std::string Handle::path() const { return path_; }

std::unique_ptr<Future> Handle::submit(bool write, uintptr_t buf, bool device, size_t size, int64_t offset,
                                       size_t task_size, const Settings& s) {
  std::shared_ptr<const OpenFile> st = open_for(write);
  if (size == 0) return finished(0);
  if (write && st->file->mode().append) offset = st->file->reserve_append(size);
  const MemoryTarget mem = target_for(buf, device);
  Backend* backend = mem.device ? st->device_backend() : st->posix.get();
  char* base = reinterpret_cast<char*>(buf);

  ThreadPool& pool = ThreadPool::process_default();
  const unsigned pool_size = pool.size();
  const size_t piece = effective_task_size(size, task_size, pool_size, s.min_task_size);
  std::vector<Chunk> chunks = split(offset, size, piece);
  const size_t workers = std::min<size_t>(pool_size, chunks.size());
  // Small requests run here: a hand-off to a worker would cost more than it saves.
  const bool inline_run = size < s.gds_threshold || workers == 1;
  auto req = std::make_shared<Request>(inline_run ? 1 : workers, st);
  Settings rs = s;
  rs.task_size = piece;  // what the backends see: this request's chunk size
  auto work = std::make_shared<ChunkQueue>(std::move(chunks), req->cancel_flag(), inline_run ? 1 : workers);

  // Every worker of the request runs this over the shared queue; the request
  // keeps the file (and `backend`) alive until the last one ends.
  auto run = [backend, mem, rs, write, base, req, work] {
    try {
      const size_t n = write ? backend->write(mem, base, *work, rs, req.get())
                             : backend->read(mem, base, *work, rs, req.get());
      req->task_done(n);
    } catch (...) {
      req->task_failed(std::current_exception());
    }
  };
  if (inline_run) {
    run();
  } else {
    std::vector<std::function<void()>> tasks(workers, run);
    pool.submit_many(std::move(tasks));
  }
  return std::make_unique<Future>(std::move(req));
}

std::unique_ptr<Future> Handle::pread(uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                      size_t task_size, const Settings& s) {
  return submit(false, buf, device, size, file_offset, task_size, s);
}

std::unique_ptr<Future> Handle::pwrite(uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                       size_t task_size, const Settings& s) {
  return submit(true, buf, device, size, file_offset, task_size, s);
}

size_t Handle::raw(bool write, uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset,
                   const Settings& s) {
  std::shared_ptr<const OpenFile> st = open_for(write);
  const MemoryTarget mem = raw_target(base);
  if (size == 0) return 0;
  if (write && st->file->mode().append) file_offset = st->file->reserve_append(size);
  return raw_transfer(*st, mem, write, base, size, file_offset, dev_offset, s);
}

size_t Handle::raw_read(uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s) {
  return raw(false, base, size, file_offset, dev_offset, s);
}

size_t Handle::raw_write(uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, const Settings& s) {
  return raw(true, base, size, file_offset, dev_offset, s);
}

std::unique_ptr<StreamFuture> Handle::raw_async(bool write, uintptr_t base, size_t size, int64_t file_offset,
                                                int64_t dev_offset, uintptr_t stream, const Settings& s) {
  std::shared_ptr<const OpenFile> st = open_for(write);
  const MemoryTarget mem = raw_target(base);
  if (write && st->file->mode().append && size > 0) file_offset = st->file->reserve_append(size);
  const auto cu_stream = reinterpret_cast<CUstream>(stream);
  if (st->cufile && size > 0) {
    auto op = std::make_unique<CuFileAsyncOp>();
    op->size = size;
    op->file_offset = file_offset;
    op->buf_offset = dev_offset;
    if (st->cufile->enqueue(write, mem, reinterpret_cast<void*>(base), *op, cu_stream))
      return std::make_unique<StreamFuture>(st, cu_stream, mem.ctx, 0, std::move(op));
  }
  // Stream-ordered fallback: let the stream's earlier work finish, then move the
  // bytes before returning, so later work on the stream sees them.
  const CudaDriver& drv = CudaDriver::require();
  {
    ScopedContext scope(drv, mem.ctx);
    drv.check(drv.cuStreamSynchronize(cu_stream), "cuStreamSynchronize");
  }
  const size_t n = size == 0 ? 0 : raw_transfer(*st, mem, write, base, size, file_offset, dev_offset, s);
  return std::make_unique<StreamFuture>(st, cu_stream, mem.ctx, n, nullptr);
}

std::unique_ptr<StreamFuture> Handle::raw_read_async(uintptr_t base, size_t size, int64_t file_offset,
                                                     int64_t dev_offset, uintptr_t stream, const Settings& s) {
  return raw_async(false, base, size, file_offset, dev_offset, stream, s);
}

std::unique_ptr<StreamFuture> Handle::raw_write_async(uintptr_t base, size_t size, int64_t file_offset,
                                                      int64_t dev_offset, uintptr_t stream, const Settings& s) {
  return raw_async(true, base, size, file_offset, dev_offset, stream, s);
}

StreamFuture::StreamFuture(std::shared_ptr<const OpenFile> keep, CUstream stream, CUcontext ctx, size_t ready_bytes,
                           std::unique_ptr<CuFileAsyncOp> op)
    : keep_(std::move(keep)), stream_(stream), ctx_(ctx), ready_bytes_(ready_bytes), op_(std::move(op)) {}

StreamFuture::~StreamFuture() {
  if (op_ && !synced_) {
    if (const CudaDriver* drv = CudaDriver::get()) {
      try {
        ScopedContext scope(*drv, ctx_);
        drv->cuStreamSynchronize(stream_);
      } catch (...) {
      }
    }
  }
}

size_t StreamFuture::check_bytes_done() {
  if (!op_) return ready_bytes_;
  if (!synced_) {
    const CudaDriver& drv = CudaDriver::require();
    ScopedContext scope(drv, ctx_);
    drv.check(drv.cuStreamSynchronize(stream_), "cuStreamSynchronize");
    synced_ = true;
  }
  // The I/O ran on the stream: this thread's errno says nothing about a -1.
  if (op_->bytes == -1)
    throw_os_error(EIO, "cuFile stream I/O (failed; its errno is lost on the stream) on", keep_->file->path(),
                   op_->file_offset);
  if (op_->bytes < 0) throw_cufile_io_error(op_->bytes, "cuFile stream I/O on", keep_->file->path(), op_->file_offset);
  return static_cast<size_t>(op_->bytes);
}

void set_num_threads(unsigned n) { ThreadPool::process_default().resize(n); }
unsigned num_threads() { return ThreadPool::process_default().size(); }
unsigned busy_threads() { return ThreadPool::process_default().busy(); }

}  // namespace gdscp
