#include "gdscp/detail/staging.hpp"

#include <algorithm>
#include <unordered_map>

#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/posix_io.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {
namespace {

constexpr int kMaxDepth = 8;  // staging buffers per worker: read into one while others copy

size_t pipeline_depth(const Settings& s) { return static_cast<size_t>(std::clamp(s.pipeline_depth, 2, kMaxDepth)); }

// Per thread and context: the stream staged copies go on, and one event per
// staging slot. Created blocking (not CU_STREAM_NON_BLOCKING) so that copies
// wait for work the caller queued on the legacy default stream. Never
// destroyed: at thread exit (process exit included) the context may already be
// gone, so a thread that did device I/O leaves one stream and its events behind.
struct StreamState {
  CUstream stream = nullptr;
  CUevent events[kMaxDepth] = {};
};

StreamState& stream_state(const CudaDriver& drv, CUcontext ctx) {
  thread_local std::unordered_map<CUcontext, StreamState> states;
  auto it = states.find(ctx);
  if (it != states.end()) return it->second;
  StreamState st;
  drv.check(drv.cuStreamCreate(&st.stream, CU_STREAM_DEFAULT), "cuStreamCreate");
  for (auto& ev : st.events) drv.check(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  return states.emplace(ctx, st).first->second;
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

}  // namespace

size_t staged_read(const File& f, const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                   Request* req) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, mem.ctx);
  StreamState& st = stream_state(drv, mem.ctx);
  const size_t depth = pipeline_depth(s);
  BufferPool::Lease bufs[kMaxDepth];
  StreamDrain drain(drv, st.stream);
  const auto dev = reinterpret_cast<CUdeviceptr>(base);
  PieceStream pieces(work, s.bounce_buffer_size, /*stagger=*/true);
  size_t total = 0;
  Chunk p;
  // Read piece i into slot i % depth while the copies of the pieces before it
  // are still running; the pipeline runs on across chunks, draining once.
  for (size_t i = 0; pieces.next(p); ++i) {
    const size_t slot = i % depth;
    if (i >= depth) drv.check(drv.cuEventSynchronize(st.events[slot]), "cuEventSynchronize");
    if (!bufs[slot].get()) bufs[slot] = BufferPool::pinned().acquire(s.bounce_buffer_size);
    char* staging = static_cast<char*>(bufs[slot].get());
    // Not a mapped read: staging buffers are small, reused and still in the
    // CPU cache, where pread's cached copy beats streaming stores (hot file ->
    // GPU 52 against 38-43 GB/s).
    const size_t got = read_range(f, staging, p.size, p.file_offset, s.direct_io, s.bounce_buffer_size);
    if (got > 0) {
      drv.check(drv.cuMemcpyHtoDAsync(dev + p.buf_offset, staging, got, st.stream), "cuMemcpyHtoDAsync");
      drv.check(drv.cuEventRecord(st.events[slot], st.stream), "cuEventRecord");
    }
    total += got;
    if (req) req->add_progress(got);
  }
  drain.finish();
  return total;
}

size_t staged_write(const File& f, const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                    Request* req) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, mem.ctx);
  StreamState& st = stream_state(drv, mem.ctx);
  const size_t depth = pipeline_depth(s);
  BufferPool::Lease bufs[kMaxDepth];
  Chunk pending[kMaxDepth];
  StreamDrain drain(drv, st.stream);
  const auto dev = reinterpret_cast<CUdeviceptr>(base);
  const size_t slice = write_slice(s.bounce_buffer_size, work.chunk_size());
  PieceStream pieces(work, slice, /*stagger=*/false);
  auto issue_copy = [&](size_t slot) {
    if (!bufs[slot].get()) bufs[slot] = BufferPool::pinned().acquire(slice);
    const Chunk& p = pending[slot];
    drv.check(drv.cuMemcpyDtoHAsync(bufs[slot].get(), dev + p.buf_offset, p.size, st.stream), "cuMemcpyDtoHAsync");
    drv.check(drv.cuEventRecord(st.events[slot], st.stream), "cuEventRecord");
  };
  // Keep `depth` pieces coming off the GPU while earlier ones go to the file.
  size_t issued = 0;
  while (issued < depth && pieces.next(pending[issued])) issue_copy(issued++);
  size_t total = 0;
  for (size_t written = 0; written < issued; ++written) {
    const size_t slot = written % depth;
    drv.check(drv.cuEventSynchronize(st.events[slot]), "cuEventSynchronize");
    const Chunk& p = pending[slot];
    write_range(f, static_cast<const char*>(bufs[slot].get()), p.size, p.file_offset, s.direct_io, slice);
    total += p.size;
    if (req) req->add_progress(p.size);
    if (pieces.next(pending[slot])) {
      issue_copy(slot);
      ++issued;
    }
  }
  drain.finish();
  return total;
}

}  // namespace gdscp::detail
