#include "gdscp/detail/staging.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/posix_io.hpp"
#include "gdscp/detail/thread_pool.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {
namespace {

constexpr int kMaxDepth = 8;  // staging buffers per worker: read into one while others copy

size_t pipeline_depth(const Settings& s) { return static_cast<size_t>(std::clamp(s.pipeline_depth, 2, kMaxDepth)); }

// Per thread and context: the stream staged copies go on, and one event per
// staging slot. Created blocking (not CU_STREAM_NON_BLOCKING) so that copies
// wait for work the caller queued on the legacy default stream. Never
// destroyed: at thread exit (process exit included) the context may already be
// gone. A thread that ends hands its streams and events on to the next thread
// that needs them instead (every staged transfer drains its stream before it
// returns), so that a program starting a thread per request does not leave a
// stream behind for every thread.
struct StreamState {
  CUstream stream = nullptr;
  CUevent events[kMaxDepth] = {};
};

// The streams of threads that have ended, by context. Never freed (threads
// end during static destruction too); bypassed in a forked child, where a
// thread of the parent may have held the lock at the fork.
class SpareStreams {
 public:
  static SpareStreams& get() {
    static SpareStreams* spare = new SpareStreams;
    return *spare;
  }
  bool take(CUcontext ctx, StreamState& out) {
    if (::getpid() != owner_) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = spare_.find(ctx);
    if (it == spare_.end() || it->second.empty()) return false;
    out = it->second.back();
    it->second.pop_back();
    return true;
  }
  void give(const std::unordered_map<CUcontext, StreamState>& states) noexcept {
    if (::getpid() != owner_) return;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [ctx, st] : states) spare_[ctx].push_back(st);
    } catch (...) {
      // Out of memory: the streams stay behind, as they did before.
    }
  }

 private:
  const pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::unordered_map<CUcontext, std::vector<StreamState>> spare_;
};

struct ThreadStreams {
  std::unordered_map<CUcontext, StreamState> states;
  ~ThreadStreams() { SpareStreams::get().give(states); }
};

StreamState& stream_state(const CudaDriver& drv, CUcontext ctx) {
  thread_local ThreadStreams mine;
  auto it = mine.states.find(ctx);
  if (it != mine.states.end()) return it->second;
  StreamState st;
  if (!SpareStreams::get().take(ctx, st)) {
    drv.check(drv.cuStreamCreate(&st.stream, CU_STREAM_DEFAULT), "cuStreamCreate");
    for (auto& ev : st.events) drv.check(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  return mine.states.emplace(ctx, st).first->second;
}

// Waits for the stream on every exit path: a staging buffer must not return to
// the pool while a copy out of or into it is in flight.
class StreamDrain {
 public:
  StreamDrain(const CudaDriver& drv, CUstream s) : drv_(drv), s_(s) {}
  ~StreamDrain() {
    if (s_) drv_.cuStreamSynchronize(s_);
  }
  StreamDrain(const StreamDrain&) = delete;
  StreamDrain& operator=(const StreamDrain&) = delete;
  void finish() {
    CUstream s = s_;
    s_ = nullptr;
    drv_.check(drv_.cuStreamSynchronize(s), "cuStreamSynchronize");
  }

 private:
  const CudaDriver& drv_;
  CUstream s_;
};

// What one worker's staged transfer holds while it runs, in the order it must
// be let go: the drain first (no copy may still use a buffer), then the
// buffers back to the pool, then the caller's context restored.
struct Pipeline {
  Pipeline(const MemoryTarget& mem, const Settings& s)
      : drv(CudaDriver::require()),
        scope(drv, mem.ctx),
        st(stream_state(drv, mem.ctx)),
        depth(pipeline_depth(s)),
        drain(drv, st.stream) {}

  const CudaDriver& drv;
  ScopedContext scope;
  StreamState& st;
  const size_t depth;
  BufferPool::Lease bufs[kMaxDepth];
  StreamDrain drain;
};

}  // namespace

size_t staged_upload(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req,
                     const StageFill& fill) {
  Pipeline pl(mem, s);
  const CudaDriver& drv = pl.drv;
  const auto dev = reinterpret_cast<CUdeviceptr>(base);
  PieceStream pieces(work, s.bounce_buffer_size, /*stagger=*/true);
  size_t total = 0;
  Chunk p;
  // Read piece i into slot i % depth while the copies of the pieces before it
  // are still running; the pipeline runs on across chunks, draining once.
  // A slot's event is recorded only once a later piece comes (nothing has
  // been queued on the stream since that slot's copy): a request of one
  // piece, such as a small read, records none.
  bool unrecorded = false;  // a copy queued since the last event record
  size_t last = 0;    // the slot of the newest queued copy
  for (size_t i = 0; pieces.next(p); ++i) {
    const size_t slot = i % pl.depth;
    if (unrecorded) {
      drv.check(drv.cuEventRecord(pl.st.events[last], pl.st.stream), "cuEventRecord");
      unrecorded = false;
    }
    if (i >= pl.depth) drv.check(drv.cuEventSynchronize(pl.st.events[slot]), "cuEventSynchronize");
    if (!pl.bufs[slot].get()) pl.bufs[slot] = BufferPool::pinned_near(mem.ordinal).acquire(s.bounce_buffer_size);
    char* staging = static_cast<char*>(pl.bufs[slot].get());
    const size_t got = fill(staging, p.size, p.file_offset, pieces.ahead());
    if (got < p.size) work.came_short(p, got);
    if (got > 0) {
      drv.check(drv.cuMemcpyHtoDAsync(dev + p.buf_offset, staging, got, pl.st.stream), "cuMemcpyHtoDAsync");
      unrecorded = true;
      last = slot;
    }
    total += got;
    if (req) req->add_progress(got);
  }
  pl.drain.finish();
  return total;
}

void prepare_staging(int ordinal, const Settings& s, size_t workers) {
  const CudaDriver& drv = CudaDriver::require();
  const CUcontext ctx = primary_context(ordinal);
  ThreadPool& pool = ThreadPool::process_default();
  BufferPool& staging = BufferPool::pinned_near(ordinal);
  const size_t piece = std::max<size_t>(1, s.bounce_buffer_size);
  const size_t pool_size = pool.size();
  const size_t buffers = (workers ? std::min(workers, pool_size) : pool_size) * pipeline_depth(s);
  staging.want(piece, ordinal, buffers);
  // One task per buffer: every worker takes some, so each makes its stream
  // and events, and the buffers are mapped and registered side by side.
  struct Done {
    std::mutex mutex;
    std::condition_variable cv;
    size_t left;
    std::exception_ptr error;
  };
  auto done = std::make_shared<Done>();
  done->left = buffers;
  // The first error moves to the waiter, which moves it out in turn: the
  // exception it rethrows is then referenced only from its own thread. A
  // worker or the last owner of `done` dropping a copy later would be ordered
  // correctly by the exception's reference count, but that count lives in
  // the uninstrumented C++ runtime, so ThreadSanitizer reports the free as a
  // race with the waiter's reading of the message.
  std::vector<std::function<void()>> tasks(buffers, [&drv, ctx, &staging, piece, done] {
    std::exception_ptr error;
    try {
      ScopedContext scope(drv, ctx);
      stream_state(drv, ctx);
      staging.stock(piece);  // up to every prepared GPU's share, read as each buffer is made
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(done->mutex);
    if (error && !done->error) done->error = std::move(error);
    if (--done->left == 0) done->cv.notify_all();
  });
  pool.submit_many(std::move(tasks));
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(done->mutex);
    done->cv.wait(lock, [&] { return done->left == 0; });
    error = std::move(done->error);
  }
  if (error) std::rethrow_exception(error);
}

StageFill file_fill(const File& f, const Settings& s) {
  // Not a mapped read: staging buffers are small, reused and still in the
  // CPU cache, where pread's ordinary stores beat streaming ones.
  return [&f, &s](char* dst, size_t n, int64_t off, size_t ahead) {
    return read_range(f, dst, n, off, s.direct_io, s.bounce_buffer_size, ahead);
  };
}

size_t staged_read(const File& f, const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                   Request* req) {
  return staged_upload(mem, base, work, s, req, file_fill(f, s));
}

size_t staged_write(const File& f, const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                    Request* req) {
  Pipeline pl(mem, s);
  const CudaDriver& drv = pl.drv;
  Chunk pending[kMaxDepth];
  const auto dev = reinterpret_cast<CUdeviceptr>(base);
  const size_t piece = write_piece_size(s.bounce_buffer_size, work.chunk_size());
  PieceStream pieces(work, piece, /*stagger=*/false);
  auto issue_copy = [&](size_t slot) {
    if (!pl.bufs[slot].get()) pl.bufs[slot] = BufferPool::pinned_near(mem.ordinal).acquire(piece);
    const Chunk& p = pending[slot];
    drv.check(drv.cuMemcpyDtoHAsync(pl.bufs[slot].get(), dev + p.buf_offset, p.size, pl.st.stream),
              "cuMemcpyDtoHAsync");
    drv.check(drv.cuEventRecord(pl.st.events[slot], pl.st.stream), "cuEventRecord");
  };
  // Keep `depth` pieces coming off the GPU while earlier ones go to the file.
  size_t issued = 0;
  while (issued < pl.depth && pieces.next(pending[issued])) issue_copy(issued++);
  size_t total = 0;
  for (size_t written = 0; written < issued; ++written) {
    const size_t slot = written % pl.depth;
    drv.check(drv.cuEventSynchronize(pl.st.events[slot]), "cuEventSynchronize");
    const Chunk& p = pending[slot];
    write_range(f, static_cast<const char*>(pl.bufs[slot].get()), p.size, p.file_offset, s.direct_io, piece);
    total += p.size;
    if (req) req->add_progress(p.size);
    if (pieces.next(pending[slot])) {
      issue_copy(slot);
      ++issued;
    }
  }
  pl.drain.finish();
  return total;
}

UploadRing::UploadRing(const Settings& s)
    : depth_(pipeline_depth(s)),
      piece_(std::max<size_t>(1, s.bounce_buffer_size)),
      bufs_(depth_),
      busy_(depth_, 0),
      waiting_(depth_) {}

UploadRing::~UploadRing() { drain(); }

void UploadRing::wait_slot(size_t k) noexcept {
  if (busy_[k]) {
    const CudaDriver& drv = CudaDriver::require();
    try {
      drv.check(drv.cuEventSynchronize(stream_state(drv, ctx_).events[k]), "cuEventSynchronize");
    } catch (...) {
      if (!copy_error_) copy_error_ = std::current_exception();
    }
    busy_[k] = 0;
  }
  if (!waiting_[k].landed) return;
  Waiting w = std::move(waiting_[k]);
  waiting_[k].landed = nullptr;
  std::exception_ptr copy_error = std::move(copy_error_);
  copy_error_ = nullptr;
  try {
    w.landed(w.got, w.error ? w.error : copy_error);
  } catch (...) {
    // A callback must not throw; nothing here could report it.
  }
}

void UploadRing::drain() noexcept {
  if (!ctx_) return;
  try {
    ScopedContext scope(CudaDriver::require(), ctx_);
    // Oldest first: the copies complete in stream order.
    for (size_t i = 0; i < depth_; ++i) wait_slot((next_ + i) % depth_);
  } catch (...) {
  }
}

void UploadRing::upload(const MemoryTarget& mem, char* dst, size_t n, int64_t file_offset, const StageFill& fill,
                        Landed landed) {
  size_t got = 0;
  std::exception_ptr error;
  size_t last = depth_;  // the slot of this chunk's last queued copy; depth_: none
  try {
    const CudaDriver& drv = CudaDriver::require();
    if (ctx_ != mem.ctx) {
      // Another GPU (or the first use): the queued copies finish under their own context.
      drain();
      if (ordinal_ != mem.ordinal)
        for (auto& b : bufs_) b.release();
      ctx_ = mem.ctx;
      ordinal_ = mem.ordinal;
    }
    ScopedContext scope(drv, ctx_);
    StreamState& st = stream_state(drv, ctx_);
    const auto dev = reinterpret_cast<CUdeviceptr>(dst);
    while (got < n) {
      const size_t k = next_;
      wait_slot(k);
      if (!bufs_[k].get()) bufs_[k] = BufferPool::pinned_near(mem.ordinal).acquire(piece_);
      char* staging = static_cast<char*>(bufs_[k].get());
      const size_t want = std::min(piece_, n - got);
      const size_t r = fill(staging, want, file_offset + static_cast<int64_t>(got), got == 0 ? n - want : 0);
      if (r > 0) {
        drv.check(drv.cuMemcpyHtoDAsync(dev + got, staging, r, st.stream), "cuMemcpyHtoDAsync");
        drv.check(drv.cuEventRecord(st.events[k], st.stream), "cuEventRecord");
        busy_[k] = 1;
        last = k;
        next_ = (k + 1) % depth_;
      }
      got += r;
      if (r < want) break;  // end of the source
    }
  } catch (...) {
    error = std::current_exception();
    // Whatever failed, no copy may still be reading a buffer that is refilled next.
    if (ctx_) {
      try {
        const CudaDriver& drv = CudaDriver::require();
        ScopedContext scope(drv, ctx_);
        drv.cuStreamSynchronize(stream_state(drv, ctx_).stream);
      } catch (...) {
      }
    }
  }
  if (last == depth_) {
    try {
      landed(got, error);
    } catch (...) {
    }
    return;
  }
  waiting_[last] = {std::move(landed), got, error};
}

void copy_to_device(const MemoryTarget& mem, char* dst, const void* src, size_t n) {
  if (n == 0) return;
  Pipeline pl(mem, Settings{});
  pl.drv.check(pl.drv.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), src, n, pl.st.stream),
               "cuMemcpyHtoDAsync");
  pl.drain.finish();
}

void copy_to_host(const MemoryTarget& mem, void* dst, const char* src, size_t n) {
  if (n == 0) return;
  Pipeline pl(mem, Settings{});
  pl.drv.check(pl.drv.cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(src), n, pl.st.stream),
               "cuMemcpyDtoHAsync");
  pl.drain.finish();
}

void copy_peer(const MemoryTarget& dst_mem, char* dst, const MemoryTarget& src_mem, const char* src, size_t n) {
  if (n == 0) return;
  Pipeline pl(src_mem, Settings{});
  pl.drv.check(pl.drv.cuMemcpyPeerAsync(reinterpret_cast<CUdeviceptr>(dst), dst_mem.ctx,
                                        reinterpret_cast<CUdeviceptr>(src), src_mem.ctx, n, pl.st.stream),
               "cuMemcpyPeerAsync");
  pl.drain.finish();
}

}  // namespace gdscp::detail
