#include "gdscp/posix_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "gdscp/cuda_driver.hpp"
#include "gdscp/error.hpp"
#include "gdscp/fault.hpp"
#include "gdscp/pinned_pool.hpp"
#include "gdscp/plan.hpp"
#include "gdscp/request.hpp"

namespace gdscp {
namespace {

constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectMin = 1u << 20;  // below this O_DIRECT costs more than it saves
constexpr int kMaxDepth = 8;             // staging buffers per worker: read into one while others copy

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
// wait for work the caller queued on the legacy default stream.
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

size_t PosixBackend::read(const MemoryTarget& mem, void* dst, size_t size, int64_t off,
                          const Settings& s, Request* progress) {
  return mem.device ? read_device(mem, dst, size, off, s, progress)
                    : read_host(static_cast<char*>(dst), size, off, s, progress);
}

size_t PosixBackend::write(const MemoryTarget& mem, const void* src, size_t size, int64_t off,
                           const Settings& s, Request* progress) {
  return mem.device ? write_device(mem, src, size, off, s, progress)
                    : write_host(static_cast<const char*>(src), size, off, s, progress);
}

size_t PosixBackend::read_host(char* dst, size_t size, int64_t off, const Settings& s, Request* progress) {
  const File& f = *file_;
  size_t done = 0;
  if (s.direct_io && f.direct_fd() >= 0 && size >= kDirectMin) {
    const AlignedSplit part = align_split(off, size, kDirectAlign);
    if (part.middle >= kDirectMin) {
      done = pread_full(f.fd(), dst, part.head, off, f.path());
      if (done < part.head) return done;  // end of file inside the head
      char* mid = dst + part.head;
      const int64_t mid_off = off + static_cast<int64_t>(part.head);
      size_t moved = 0;
      if (reinterpret_cast<uintptr_t>(mid) % kDirectAlign == 0) {
        moved = direct_transfer<false>(f.direct_fd(), mid, part.middle, mid_off, f.path());
      } else {
        // Unaligned user memory: O_DIRECT into an aligned bounce, then copy.
        auto bounce = BufferPool::aligned().acquire(std::min(s.bounce_buffer_size, part.middle));
        while (moved < part.middle) {
          const size_t n = std::min(bounce.size(), part.middle - moved);
          const size_t got = direct_transfer<false>(f.direct_fd(), static_cast<char*>(bounce.get()), n,
                                                    mid_off + moved, f.path());
          std::memcpy(mid + moved, bounce.get(), got);
          moved += got;
          if (got < n) break;
        }
      }
      done += moved;
      if (progress) progress->add_progress(done);
      const size_t rest = size - done;
      const size_t got = pread_full(f.fd(), dst + done, rest, off + static_cast<int64_t>(done), f.path());
      if (progress) progress->add_progress(got);
      return done + got;
    }
  }
  done = pread_full(f.fd(), dst, size, off, f.path());
  if (progress) progress->add_progress(done);
  return done;
}

size_t PosixBackend::write_host(const char* src, size_t size, int64_t off, const Settings& s,
                                Request* progress) {
  const File& f = *file_;
  if (s.direct_io && f.direct_fd() >= 0 && size >= kDirectMin) {
    const AlignedSplit part = align_split(off, size, kDirectAlign);
    const char* mid = src + part.head;
    if (part.middle >= kDirectMin && reinterpret_cast<uintptr_t>(mid) % kDirectAlign == 0) {
      pwrite_full(f.fd(), src, part.head, off, f.path());
      const int64_t mid_off = off + static_cast<int64_t>(part.head);
      const size_t moved = direct_transfer<true>(f.direct_fd(), const_cast<char*>(mid), part.middle,
                                                 mid_off, f.path());
      const size_t done = part.head + moved;
      pwrite_full(f.fd(), src + done, size - done, off + static_cast<int64_t>(done), f.path());
      if (progress) progress->add_progress(size);
      return size;
    }
  }
  pwrite_full(f.fd(), src, size, off, f.path());
  if (progress) progress->add_progress(size);
  return size;
}

size_t PosixBackend::read_device(const MemoryTarget& mem, void* dst, size_t size, int64_t off,
                                 const Settings& s, Request* progress) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, mem.ctx);
  StreamState& st = stream_state(drv, mem.ctx);
  const size_t chunk = std::min(s.bounce_buffer_size, size);
  const int depth = static_cast<int>(std::min<size_t>(pipeline_depth(s), (size + chunk - 1) / chunk));
  BufferPool::Lease bufs[kMaxDepth];
  for (int i = 0; i < depth; ++i) bufs[i] = BufferPool::pinned().acquire(s.bounce_buffer_size);

  StreamDrain drain(drv, st.stream);
  const auto base = reinterpret_cast<CUdeviceptr>(dst);
  size_t done = 0;
  for (int i = 0; done < size; ++i) {
    const int slot = i % depth;
    if (i >= depth) drv.check(drv.cuEventSynchronize(st.events[slot]), "cuEventSynchronize");
    const size_t n = std::min(chunk, size - done);
    char* staging = static_cast<char*>(bufs[slot].get());
    const size_t got = read_host(staging, n, off + static_cast<int64_t>(done), s, nullptr);
    if (got > 0) {
      drv.check(drv.cuMemcpyHtoDAsync(base + done, staging, got, st.stream), "cuMemcpyHtoDAsync");
      drv.check(drv.cuEventRecord(st.events[slot], st.stream), "cuEventRecord");
    }
    done += got;
    if (progress) progress->add_progress(got);
    if (got < n) break;  // end of file
  }
  drain.finish();
  return done;
}

size_t PosixBackend::write_device(const MemoryTarget& mem, const void* src, size_t size, int64_t off,
                                  const Settings& s, Request* progress) {
  const CudaDriver& drv = CudaDriver::require();
  ScopedContext scope(drv, mem.ctx);
  StreamState& st = stream_state(drv, mem.ctx);
  const size_t chunk = std::min(s.bounce_buffer_size, size);
  const int depth = static_cast<int>(std::min<size_t>(pipeline_depth(s), (size + chunk - 1) / chunk));
  BufferPool::Lease bufs[kMaxDepth];
  for (int i = 0; i < depth; ++i) bufs[i] = BufferPool::pinned().acquire(s.bounce_buffer_size);

  StreamDrain drain(drv, st.stream);
  const auto base = reinterpret_cast<CUdeviceptr>(src);
  const size_t pieces = (size + chunk - 1) / chunk;
  auto issue_copy = [&](size_t piece) {
    const int slot = static_cast<int>(piece % depth);
    const size_t at = piece * chunk;
    drv.check(drv.cuMemcpyDtoHAsync(bufs[slot].get(), base + at, std::min(chunk, size - at), st.stream),
              "cuMemcpyDtoHAsync");
    drv.check(drv.cuEventRecord(st.events[slot], st.stream), "cuEventRecord");
  };
  // Keep `depth` chunks coming off the GPU while earlier ones go to the file.
  for (size_t k = 0; k < std::min<size_t>(depth, pieces); ++k) issue_copy(k);
  size_t done = 0;
  for (size_t k = 0; k < pieces; ++k) {
    const int slot = static_cast<int>(k % depth);
    const size_t n = std::min(chunk, size - done);
    drv.check(drv.cuEventSynchronize(st.events[slot]), "cuEventSynchronize");
    write_host(static_cast<const char*>(bufs[slot].get()), n, off + static_cast<int64_t>(done), s, nullptr);
    done += n;
    if (progress) progress->add_progress(n);
    if (k + depth < pieces) issue_copy(k + depth);
  }
  drain.finish();
  return done;
}

}  // namespace gdscp
