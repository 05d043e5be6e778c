#include "gdscp/posix_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "gdscp/cuda_driver.hpp"
#include "gdscp/error.hpp"
#include "gdscp/fault.hpp"
#include "gdscp/mapped_read.hpp"
#include "gdscp/pinned_pool.hpp"
#include "gdscp/plan.hpp"
#include "gdscp/request.hpp"

namespace gdscp {
namespace {

constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectMin = 1u << 20;  // below this O_DIRECT costs more than it saves
// In automatic mode, writes this large go O_DIRECT: with fsync included they
// reached the disk's own rate (2.57 against 1.78 GB/s buffered on the H200
// machine, docs/benchmarks.md).
constexpr size_t kDirectWriteMin = 4u << 20;
constexpr size_t kMaxWritePiece = 64u << 20;  // bounds the staging memory a writing worker holds
constexpr int kMaxDepth = 8;  // staging buffers per worker: read into one while others copy
constexpr size_t kMappedMin = 1u << 20;  // below this mapping costs more than streaming saves

ssize_t sys_pread(int fd, void* buf, size_t n, int64_t off) {
  if (int err = fault::check(fault::Op::pread)) {
    errno = err;
    return -1;
  }
  return ::pread(fd, buf, n, off);
}

ssize_t sys_pwrite(int fd, const void* buf, size_t n, int64_t off) {
  if (int err = fault::check(fault::Op::pwrite)) {
    errno = err;
    return -1;
  }
  return ::pwrite(fd, buf, n, off);
}

// O_DIRECT part of a transfer: moves what it can, stops at the first short or
// refused call and leaves the rest to the buffered descriptor.
template <bool Write>
size_t direct_transfer(int fd, char* buf, size_t size, int64_t off, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t r = Write ? sys_pwrite(fd, buf + done, size - done, off + done)
                            : sys_pread(fd, buf + done, size - done, off + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL) break;  // this filesystem or range refuses O_DIRECT after all
      throw_os_error(errno, Write ? "pwrite (O_DIRECT)" : "pread (O_DIRECT)", path, off + done);
    }
    done += static_cast<size_t>(r);
    if (r == 0 || static_cast<size_t>(r) % kDirectAlign != 0) break;
  }
  return done;
}

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
  void finish() {
    CUstream s = s_;
    s_ = nullptr;
    drv_.check(drv_.cuStreamSynchronize(s), "cuStreamSynchronize");
  }

 private:
  const CudaDriver& drv_;
  CUstream s_;
};

size_t finish(size_t bytes, Request* progress) {
  if (progress) progress->add_progress(bytes);
  return bytes;
}

// Writes stage whole chunks (up to task_size), not bounce-sized pieces: the
// disk, not host memory, limits them, and it prefers large requests.
size_t write_piece(const Settings& s) {
  return std::max(s.bounce_buffer_size, std::min(s.task_size, kMaxWritePiece));
}

size_t pipeline_depth(const Settings& s) {
  return static_cast<size_t>(std::clamp(s.pipeline_depth, 2, kMaxDepth));
}

}  // namespace

size_t pread_full(int fd, void* buf, size_t size, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < size) {
    const ssize_t r = sys_pread(fd, p + done, size - done, offset + static_cast<int64_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_os_error(errno, "pread", path, offset + static_cast<int64_t>(done));
    }
    if (r == 0) break;  // end of file
    done += static_cast<size_t>(r);
  }
  return done;
}

size_t pwrite_full(int fd, const void* buf, size_t size, int64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < size) {
    const ssize_t r = sys_pwrite(fd, p + done, size - done, offset + static_cast<int64_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_os_error(errno, "pwrite", path, offset + static_cast<int64_t>(done));
    }
    if (r == 0) throw_os_error(EIO, "pwrite wrote nothing to", path, offset + static_cast<int64_t>(done));
    done += static_cast<size_t>(r);
  }
  return done;
}

size_t PosixBackend::read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                          Request* progress) {
  if (mem.device) return read_device(mem, base, work, s, progress);
  size_t total = 0;
  Chunk c;
  while (work.next(c)) total += read_host(base + c.buf_offset, c.size, c.file_offset, s, progress);
  return total;
}

size_t PosixBackend::write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                           Request* progress) {
  if (mem.device) return write_device(mem, base, work, s, progress);
  size_t total = 0;
  Chunk c;
  while (work.next(c)) total += write_host(base + c.buf_offset, c.size, c.file_offset, s, progress);
  return total;
}

size_t PosixBackend::read_host(char* dst, size_t size, int64_t off, const Settings& s, Request* progress) {
  // Cached data goes straight from the page cache with streaming stores. Not
  // for staging buffers (read_file): they are small, reused and still in the
  // CPU cache, where pread's cached copy wins (hot file -> GPU 52 against
  // 38-43 GB/s with streaming stores into them, docs/benchmarks.md).
  size_t copied = 0;
  if (s.mapped_reads && s.direct_io != DirectIO::on && size >= kMappedMin &&
      mapped_read(file_->fd(), dst, size, off, file_->path(), copied))
    return finish(copied, progress);
  return read_file(dst, size, off, s, progress);
}

size_t PosixBackend::read_file(char* dst, size_t size, int64_t off, const Settings& s, Request* progress) {
  const File& f = *file_;
  // Reads go O_DIRECT only when asked ("on"): with 16 workers, buffered reads
  // and the kernel's readahead beat O_DIRECT on cold data in interleaved runs
  // on the H200 machine (docs/benchmarks.md), and hot data needs the cache.
  size_t done = 0;
  if (s.direct_io == DirectIO::on && f.direct_fd() >= 0 && size >= kDirectMin) {
    const size_t rest = size - done;
    const int64_t rest_off = off + static_cast<int64_t>(done);
    const AlignedSplit part = align_split(rest_off, rest, kDirectAlign);
    if (part.middle >= kDirectMin) {
      const size_t head = pread_full(f.fd(), dst + done, part.head, rest_off, f.path());
      done += head;
      if (head < part.head) return finish(done, progress);  // end of file inside the head
      char* mid = dst + done;
      const int64_t mid_off = off + static_cast<int64_t>(done);
      size_t moved = 0;
      if (reinterpret_cast<uintptr_t>(mid) % kDirectAlign == 0) {
        moved = direct_transfer<false>(f.direct_fd(), mid, part.middle, mid_off, f.path());
      } else {
        // Unaligned user memory: O_DIRECT into an aligned bounce, then copy.
        auto bounce = BufferPool::aligned().acquire(std::min(s.bounce_buffer_size, part.middle));
        while (moved < part.middle) {
          const size_t n = std::min(bounce.size(), part.middle - moved);
          const size_t got = direct_transfer<false>(f.direct_fd(), static_cast<char*>(bounce.get()), n,
                                                    mid_off + static_cast<int64_t>(moved), f.path());
          std::memcpy(mid + moved, bounce.get(), got);
          moved += got;
          if (got < n) break;
        }
      }
      done += moved;
    }
  }
  // Whatever is left (all of it when O_DIRECT is off): the buffered descriptor,
  // which also finishes a short O_DIRECT read at end of file.
  done += pread_full(f.fd(), dst + done, size - done, off + static_cast<int64_t>(done), f.path());
  return finish(done, progress);
}

size_t PosixBackend::write_host(const char* src, size_t size, int64_t off, const Settings& s,
                                Request* progress) {
  const File& f = *file_;
  const bool direct = s.direct_io == DirectIO::on ? size >= kDirectMin
                      : s.direct_io == DirectIO::automatic && size >= kDirectWriteMin;
  if (direct && f.direct_fd() >= 0) {
    const AlignedSplit part = align_split(off, size, kDirectAlign);
    if (part.middle >= kDirectMin) {
      pwrite_full(f.fd(), src, part.head, off, f.path());
      const char* mid = src + part.head;
      const int64_t mid_off = off + static_cast<int64_t>(part.head);
      size_t moved = 0;
      if (reinterpret_cast<uintptr_t>(mid) % kDirectAlign == 0) {
        moved = direct_transfer<true>(f.direct_fd(), const_cast<char*>(mid), part.middle, mid_off, f.path());
      } else {
        // Unaligned user memory: copy into an aligned bounce, then O_DIRECT.
        auto bounce = BufferPool::aligned().acquire(std::min(write_piece(s), part.middle));
        while (moved < part.middle) {
          const size_t n = std::min(bounce.size(), part.middle - moved);
          std::memcpy(bounce.get(), mid + moved, n);
          const size_t put = direct_transfer<true>(f.direct_fd(), static_cast<char*>(bounce.get()), n,
                                                   mid_off + static_cast<int64_t>(moved), f.path());
          moved += put;
          if (put < n) break;  // refused after all: the buffered descriptor takes the rest
        }
      }
      const size_t done = part.head + moved;
      pwrite_full(f.fd(), src + done, size - done, off + static_cast<int64_t>(done), f.path());
      return finish(size, progress);
    }
  }
  pwrite_full(f.fd(), src, size, off, f.path());
  return finish(size, progress);
}

size_t PosixBackend::read_device(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                                 Request* progress) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, mem.ctx);
  StreamState& st = stream_state(drv, mem.ctx);
  const size_t depth = pipeline_depth(s);
  BufferPool::Lease bufs[kMaxDepth];
  StreamDrain drain(drv, st.stream);
  const auto dev = reinterpret_cast<CUdeviceptr>(base);
  PieceStream pieces(work, s.bounce_buffer_size, s.task_size, /*stagger=*/true);
  size_t total = 0;
  Chunk p;
  // Read piece i into slot i % depth while the copies of the pieces before it
  // are still running; the pipeline runs on across chunks, draining once.
  for (size_t i = 0; pieces.next(p); ++i) {
    const size_t slot = i % depth;
    if (i >= depth) drv.check(drv.cuEventSynchronize(st.events[slot]), "cuEventSynchronize");
    if (!bufs[slot].get()) bufs[slot] = BufferPool::pinned().acquire(s.bounce_buffer_size);
    char* staging = static_cast<char*>(bufs[slot].get());
    const size_t got = read_file(staging, p.size, p.file_offset, s, nullptr);
    if (got > 0) {
      drv.check(drv.cuMemcpyHtoDAsync(dev + p.buf_offset, staging, got, st.stream), "cuMemcpyHtoDAsync");
      drv.check(drv.cuEventRecord(st.events[slot], st.stream), "cuEventRecord");
    }
    total += got;
    if (progress) progress->add_progress(got);
  }
  drain.finish();
  return total;
}

size_t PosixBackend::write_device(const MemoryTarget& mem, const char* base, ChunkQueue& work,
                                  const Settings& s, Request* progress) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, mem.ctx);
  StreamState& st = stream_state(drv, mem.ctx);
  const size_t depth = pipeline_depth(s);
  BufferPool::Lease bufs[kMaxDepth];
  Chunk pending[kMaxDepth];
  StreamDrain drain(drv, st.stream);
  const auto dev = reinterpret_cast<CUdeviceptr>(base);
  const size_t piece = write_piece(s);
  PieceStream pieces(work, piece, s.task_size, /*stagger=*/false);
  auto issue_copy = [&](size_t slot) {
    if (!bufs[slot].get()) bufs[slot] = BufferPool::pinned().acquire(piece);
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
    write_host(static_cast<const char*>(bufs[slot].get()), p.size, p.file_offset, s, nullptr);
    total += p.size;
    if (progress) progress->add_progress(p.size);
    if (pieces.next(pending[slot])) {
      issue_copy(slot);
      ++issued;
    }
  }
  drain.finish();
  return total;
}

}  // namespace gdscp
