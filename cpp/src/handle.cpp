#include "gdscp/handle.hpp"

#include <algorithm>
#include <vector>

#include "gdscp/detail/backend.hpp"
#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/dispatch.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/host_destination.hpp"
#include "gdscp/detail/plan.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp {
namespace detail {

// Everything an open file owns. Requests keep it alive, so close() during a
// transfer never pulls a descriptor from under a running task.
struct OpenFile {
  std::shared_ptr<File> file;
  Backends backends;
};

}  // namespace detail

namespace {

using detail::Backend;
using detail::Chunk;
using detail::ChunkQueue;
using detail::MemoryTarget;
using detail::OpenFile;
using detail::Request;

// Reads into host memory this large, on at most this many tasks, check
// whether the destination is fresh, and if so map it ahead of the copy
// (host_destination.hpp); smaller ones fault too few pages to matter, and on
// more tasks the faults inside the copies are faster.
constexpr size_t kPrepareMin = 8u << 20;
constexpr size_t kPrepareMaxTasks = 4;

MemoryTarget target_for(uintptr_t ptr, bool device) {
  return device ? detail::resolve_device_pointer(ptr) : MemoryTarget{};
}

MemoryTarget raw_target(uintptr_t base) {
  const MemoryTarget mem = detail::resolve_device_pointer(base);
  if (!mem.device) throw_invalid("raw I/O needs device memory; this buffer is host memory");
  return mem;
}

// An append's reserved range (File::reserve_append) once the write into it
// has ended: kept whole, or given back unless every byte was written, so an
// append that fails or is cancelled leaves the file as it was and reports
// nothing appended. Returns the bytes the append reports.
size_t settle_append(const detail::File& f, int64_t start, size_t n, size_t moved, bool failed) noexcept {
  if (!failed && moved == n) {
    f.keep_append(start);
    return n;
  }
  f.release_append(start, n);
  return 0;
}

// Runs `step`, which writes (or queues the writes) into the range an append
// reserved at `start`; a throw gives the range back on its way out.
template <class Step>
auto releasing_on_throw(const detail::File& f, int64_t start, size_t n, const Step& step) -> decltype(step()) {
  try {
    return step();
  } catch (...) {
    f.release_append(start, n);
    throw;
  }
}

// Runs `step`, which writes the whole of the range an append reserved at
// `start` on the calling thread, and settles the range by its outcome: kept
// if every byte was written, else given back (a throw, or a short write).
template <class Step>
size_t appending_now(const detail::File& f, int64_t start, size_t n, const Step& step) {
  return settle_append(f, start, n, releasing_on_throw(f, start, n, step), false);
}

// One transfer on the calling thread through the file's device backend. The
// chunk's staging is bounded by the settings' task size, as a chunk of a
// parallel request would be.
size_t raw_transfer(const OpenFile& st, const MemoryTarget& mem, bool write, uintptr_t base, size_t size,
                    int64_t file_offset, int64_t dev_offset, const Settings& s) {
  ChunkQueue one({Chunk{static_cast<size_t>(dev_offset), file_offset, size}}, s.task_size);
  char* p = reinterpret_cast<char*>(base);
  Backend& b = *st.backends.device;
  const size_t n = write ? b.write(mem, p, one, s, nullptr) : b.read(mem, p, one, s, nullptr);
  return std::min(n, one.moved());
}

// submit() once the file is chosen: the request's tasks, queued.
std::unique_ptr<Future> submit_tasks(const std::shared_ptr<const OpenFile>& st, Backend* backend, MemoryTarget mem,
                                     char* base, bool write, size_t size, int64_t offset, bool appending,
                                     const Settings& s) {
  detail::Dispatch d = detail::plan_dispatch(offset, size, s);
  if (!write && !mem.device && size >= kPrepareMin && d.tasks <= kPrepareMaxTasks &&
      detail::destination_unmapped(base, size)) {
    // Only what the file holds now: the read leaves pages past its end untouched.
    const int64_t file_size = st->file->size();
    mem.populate_bytes = file_size > offset ? std::min<size_t>(size, static_cast<size_t>(file_size - offset)) : 0;
  }
  auto req = std::make_shared<Request>(d.tasks, st);
  auto work = std::make_shared<ChunkQueue>(std::move(d.chunks), d.chunk_size, req->cancel_flag(), d.tasks);
  req->count_contiguous(work);
  if (appending)
    req->settle_with([file = st->file, offset, size](size_t moved, bool failed) {
      return settle_append(*file, offset, size, moved, failed);
    });

  // Every task of the request runs this over the shared queue; the request
  // keeps the file (and `backend`) alive until the last one ends.
  detail::run_tasks(req, d, [backend, mem, s, write, base, req, work] {
    return write ? backend->write(mem, base, *work, s, req.get()) : backend->read(mem, base, *work, s, req.get());
  });
  return std::make_unique<Future>(std::move(req));
}

// raw_async() at a resolved file offset.
std::unique_ptr<StreamFuture> raw_async_at(const std::shared_ptr<const OpenFile>& st, const MemoryTarget& mem,
                                           bool write, uintptr_t base, size_t size, int64_t file_offset,
                                           int64_t dev_offset, uintptr_t stream, const Settings& s) {
  const auto cu_stream = reinterpret_cast<CUstream>(stream);
  Backend& backend = *st->backends.device;
  if (size > 0 && backend.supports_async()) {
    auto op = std::make_unique<detail::AsyncOp>();
    op->size = size;
    op->file_offset = file_offset;
    op->buf_offset = dev_offset;
    const CudaDriver& drv = CudaDriver::require();
    ScopedContext scope(drv, mem.ctx);
    // The per-thread default stream names the calling thread's own stream: an
    // event recorded on it just after the transfer finds the transfer from
    // any thread. Made before the transfer is queued, so that a failure
    // leaves nothing queued.
    CUevent done = nullptr;
    if (cu_stream == CU_STREAM_PER_THREAD)
      drv.check(drv.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    const auto drop_event = [&] {
      if (done) drv.cuEventDestroy(done);
      done = nullptr;
    };
    bool queued = false;
    try {
      queued = backend.submit_async(write, mem, reinterpret_cast<void*>(base), *op, cu_stream);
    } catch (...) {
      drop_event();
      throw;
    }
    if (queued) {
      if (done && drv.cuEventRecord(done, cu_stream) != CUDA_SUCCESS) {
        // No event to find the transfer by from another thread, whose own
        // per-thread stream is another: wait for it here, on this thread's.
        drop_event();
        drv.cuStreamSynchronize(cu_stream);
      }
      return std::make_unique<StreamFuture>(st, &backend, cu_stream, mem.ctx, 0, std::move(op), done);
    }
    drop_event();
  }
  // Stream-ordered fallback: let the stream's earlier work finish, then move the
  // bytes before returning, so later work on the stream sees them.
  const CudaDriver& drv = CudaDriver::require();
  {
    ScopedContext scope(drv, mem.ctx);
    drv.check(drv.cuStreamSynchronize(cu_stream), "cuStreamSynchronize");
  }
  const size_t n = size == 0 ? 0 : raw_transfer(*st, mem, write, base, size, file_offset, dev_offset, s);
  return std::make_unique<StreamFuture>(st, &backend, cu_stream, mem.ctx, n, nullptr);
}

}  // namespace

Handle::Handle(std::string path, std::string_view flags, const Settings& s, const std::string& cufile_library)
    : path_(std::move(path)) {
  // Deferred: where no backend can be had (compat_mode OFF without cuFile,
  // say), the open fails without having truncated or created the file.
  auto file = std::make_shared<detail::File>(path_, flags, /*deferred=*/true);
  detail::Backends backends;
  try {
    backends = detail::choose_backends(file, s.compat_mode, cufile_library);
    file->commit();
  } catch (...) {
    file->discard();
    throw;
  }
  backend_ = backends.device->name();
  reason_ = std::move(backends.reason);
  open_ = std::make_shared<const OpenFile>(OpenFile{std::move(file), std::move(backends)});
}

void Handle::close() {
  std::shared_ptr<const OpenFile> last;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    last = std::move(open_);
  }
  // Descriptors close once the last request holding them ends; where none
  // runs, here, outside the lock: closing (close(2) flushing to a network
  // filesystem, cuFileHandleDeregister) can take a while, and closed() and
  // fileno(), called with the GIL held, would wait that long for the lock.
  last.reset();
}

bool Handle::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !open_;
}

std::shared_ptr<const OpenFile> Handle::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!open_) throw Error(ErrorKind::closed, 0, "I/O operation on closed file '" + path_ + "'");
  return open_;
}

std::shared_ptr<const OpenFile> Handle::open_for(bool write) const {
  std::shared_ptr<const OpenFile> st = state();
  if (write) st->file->require_writable(); else st->file->require_readable();
  return st;
}

int Handle::fileno() const {
  // -1 once closed, as KvikIO's: code that checks the descriptor keeps working.
  std::lock_guard<std::mutex> lock(mutex_);
  return open_ ? open_->file->fd() : -1;
}
int Handle::open_flags() const { return state()->file->open_flags(); }
std::string Handle::path() const { return path_; }
bool Handle::direct_io_supported() const {
  // False once closed, as KvikIO's (no descriptor, no O_DIRECT): not I/O, so no ClosedFileError.
  std::lock_guard<std::mutex> lock(mutex_);
  return open_ && open_->file->direct_fd() >= 0;
}

std::unique_ptr<Future> Handle::submit(bool write, uintptr_t buf, bool device, size_t size, int64_t offset,
                                       const Settings& s) {
  std::shared_ptr<const OpenFile> st = open_for(write);
  if (size == 0) return Future::ready(0);
  MemoryTarget mem = target_for(buf, device);
  Backend* backend = mem.device ? st->backends.device.get() : st->backends.host.get();
  char* base = reinterpret_cast<char*>(buf);
  if (!write || !st->file->mode().append) return submit_tasks(st, backend, mem, base, write, size, offset, false, s);
  if (backend->append_whole(mem, base, size)) return Future::ready(size);
  offset = st->file->reserve_append(size);
  return releasing_on_throw(*st->file, offset, size,
                            [&] { return submit_tasks(st, backend, mem, base, write, size, offset, true, s); });
}

std::unique_ptr<Future> Handle::pread(uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                      const Settings& s) {
  return submit(false, buf, device, size, file_offset, s);
}

std::unique_ptr<Future> Handle::pwrite(uintptr_t buf, bool device, size_t size, int64_t file_offset,
                                       const Settings& s) {
  return submit(true, buf, device, size, file_offset, s);
}

size_t Handle::transfer_now(bool write, uintptr_t buf, bool device, size_t size, int64_t offset,
                            const Settings& s) {
  if (!runs_inline(size, s)) throw_invalid("an inline transfer must fit one task below gds_threshold");
  std::shared_ptr<const OpenFile> st = open_for(write);
  if (size == 0) return 0;
  const MemoryTarget mem = target_for(buf, device);
  Backend* backend = mem.device ? st->backends.device.get() : st->backends.host.get();
  char* base = reinterpret_cast<char*>(buf);
  // The one chunk submit() would plan for this size, run as its one task would.
  if (!write) return backend->read_one(mem, base, size, offset, s);
  auto write_one = [&] {
    ChunkQueue one({Chunk{0, offset, size}}, size);
    return backend->write(mem, base, one, s, nullptr);
  };
  if (!st->file->mode().append) return write_one();
  if (backend->append_whole(mem, base, size)) return size;
  offset = st->file->reserve_append(size);
  return appending_now(*st->file, offset, size, write_one);
}

size_t Handle::read_now(uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s) {
  return transfer_now(false, buf, device, size, file_offset, s);
}

size_t Handle::write_now(uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s) {
  return transfer_now(true, buf, device, size, file_offset, s);
}

size_t Handle::raw(bool write, uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset,
                   const Settings& s) {
  std::shared_ptr<const OpenFile> st = open_for(write);
  // Nothing to move: no memory to ask CUDA about (an empty GPU array has no
  // address, an empty view's may be the end of its allocation).
  if (size == 0) return 0;
  const MemoryTarget mem = raw_target(base);
  const auto move = [&] { return raw_transfer(*st, mem, write, base, size, file_offset, dev_offset, s); };
  if (!write || !st->file->mode().append) return move();
  file_offset = st->file->reserve_append(size);
  return appending_now(*st->file, file_offset, size, move);
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
  // Nothing moves (an empty GPU array, or view): nothing to order on the stream.
  if (size == 0) return std::make_unique<StreamFuture>(st, nullptr, nullptr, nullptr, 0, nullptr);
  const MemoryTarget mem = raw_target(base);
  const auto queue = [&] { return raw_async_at(st, mem, write, base, size, file_offset, dev_offset, stream, s); };
  if (!write || !st->file->mode().append) return queue();
  // An append that fails before it is queued gives its range back at once;
  // one queued on the stream (cuFile), once its outcome is known.
  file_offset = st->file->reserve_append(size);
  auto future = releasing_on_throw(*st->file, file_offset, size, queue);
  future->settle_with([st, start = file_offset, size](size_t moved, bool failed) {
    return settle_append(*st->file, start, size, moved, failed);
  });
  return future;
}

std::unique_ptr<StreamFuture> Handle::raw_read_async(uintptr_t base, size_t size, int64_t file_offset,
                                                     int64_t dev_offset, uintptr_t stream, const Settings& s) {
  return raw_async(false, base, size, file_offset, dev_offset, stream, s);
}

std::unique_ptr<StreamFuture> Handle::raw_write_async(uintptr_t base, size_t size, int64_t file_offset,
                                                      int64_t dev_offset, uintptr_t stream, const Settings& s) {
  return raw_async(true, base, size, file_offset, dev_offset, stream, s);
}

}  // namespace gdscp
