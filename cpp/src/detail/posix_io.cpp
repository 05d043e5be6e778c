#include "gdscp/detail/posix_io.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "gdscp/detail/ask_ahead.hpp"
#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/fault.hpp"
#include "gdscp/detail/mapped_read.hpp"
#include "gdscp/detail/plan.hpp"
#include "gdscp/error.hpp"

namespace gdscp::detail {
namespace {

constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectMin = 1u << 20;  // below this O_DIRECT costs more than it saves
// In automatic mode, writes this large go O_DIRECT: buffered writes pay for the
// page cache copy and then wait for writeback at fsync (docs/performance.md,
// direct_io).
constexpr size_t kDirectWriteMin = 4u << 20;
constexpr size_t kMaxWritePiece = 64u << 20;  // bounds the staging memory a writing worker holds
constexpr size_t kAskAheadMin = 1u << 20;  // below this a cold read is one readahead window anyway

ssize_t sys_pread(int fd, void* buf, size_t n, int64_t off) {
  if (int err = fault::check(fault::Op::pread)) {
    if (err == fault::kEndOfFile) return 0;
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

// The cached part of [off, off + size) into `dst`, without waiting for the
// disk; where the data is cold, the rest of it and `ahead` bytes after it are
// asked of the disk before the caller reads them (read_range). Returns the
// bytes read. Steps aside while a test's pread fault is armed (the fault
// lands on the read calls it counts) and on kernels or files without
// RWF_NOWAIT.
size_t read_cached_ask_rest(int fd, char* dst, size_t size, int64_t off, size_t ahead) {
  if (size + ahead < kAskAheadMin || fault::io_armed()) return 0;
  struct iovec iov {dst, size};
  ssize_t r;
  do {
    r = ::preadv2(fd, &iov, 1, off, RWF_NOWAIT);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && errno != EAGAIN) return 0;  // EOPNOTSUPP and the like: a plain read follows
  const size_t got = r > 0 ? static_cast<size_t>(r) : 0;
  // 0 is also the end of the file; the read that follows says which.
  if (got < size) ask_disk(fd, off + static_cast<int64_t>(got), size - got + ahead);
  return got;
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

size_t write_piece_size(size_t bounce_buffer_size, size_t chunk_size) {
  return std::max(bounce_buffer_size, std::min(chunk_size, kMaxWritePiece));
}

size_t read_range(const File& f, char* dst, size_t size, int64_t off, DirectIO direct, size_t bounce_size,
                  size_t ahead) {
  // Reads go O_DIRECT only when asked ("on"): buffered reads with the kernel's
  // readahead already reach the disk's rate on cold data, and O_DIRECT would
  // keep the next read of the same data at disk speed (docs/performance.md,
  // direct_io).
  size_t done = 0;
  if (direct == DirectIO::on && f.direct_fd() >= 0 && size >= kDirectMin) {
    const AlignedSplit part = align_split(off, size, kDirectAlign);
    if (part.middle >= kDirectMin) {
      const size_t head = pread_full(f.fd(), dst, part.head, off, f.path());
      done += head;
      if (head < part.head) return done;  // end of file inside the head
      char* mid = dst + done;
      const int64_t mid_off = off + static_cast<int64_t>(done);
      size_t moved = 0;
      if (reinterpret_cast<uintptr_t>(mid) % kDirectAlign == 0) {
        // Straight into `dst`, only the blocks wholly inside the file: an
        // O_DIRECT read that reaches the end of the file writes zeros into
        // the memory past it (the rest of the last block, and on ext4 the
        // whole rest of the request), where a read leaves the bytes after
        // its count as they were. The buffered read below takes the end.
        const int64_t file_size = f.size();
        const size_t inside =
            file_size > mid_off ? round_down(static_cast<size_t>(file_size - mid_off), kDirectAlign) : 0;
        moved = direct_transfer<false>(f.direct_fd(), mid, std::min(part.middle, inside), mid_off, f.path());
      } else {
        // Unaligned memory: O_DIRECT into an aligned bounce, then copy. A page
        // of `dst` that faults is EFAULT, as the kernel reports it for aligned memory.
        auto bounce = BufferPool::aligned().acquire(std::min(bounce_size, part.middle));
        while (moved < part.middle) {
          const size_t n = std::min(bounce.size(), part.middle - moved);
          const size_t got = direct_transfer<false>(f.direct_fd(), static_cast<char*>(bounce.get()), n,
                                                    mid_off + static_cast<int64_t>(moved), f.path());
          if (!copy_guarded(mid + moved, static_cast<const char*>(bounce.get()), got))
            throw_os_error(EFAULT, "pread (O_DIRECT)", f.path(), mid_off + static_cast<int64_t>(moved));
          moved += got;
          if (got < n) break;
        }
      }
      done += moved;
    }
  }
  // Whatever is left (all of it without O_DIRECT): the buffered descriptor,
  // which also finishes a short O_DIRECT read at end of file.
  if (done == 0) done = read_cached_ask_rest(f.fd(), dst, size, off, ahead);
  done += pread_full(f.fd(), dst + done, size - done, off + static_cast<int64_t>(done), f.path());
  return done;
}

size_t write_range(const File& f, const char* src, size_t size, int64_t off, DirectIO direct, size_t bounce_size) {
  const bool use_direct = direct == DirectIO::on ? size >= kDirectMin
                          : direct == DirectIO::automatic && size >= kDirectWriteMin;
  if (use_direct && f.direct_fd() >= 0) {
    const AlignedSplit part = align_split(off, size, kDirectAlign);
    if (part.middle >= kDirectMin) {
      pwrite_full(f.write_fd(), src, part.head, off, f.path());
      const char* mid = src + part.head;
      const int64_t mid_off = off + static_cast<int64_t>(part.head);
      size_t moved = 0;
      if (reinterpret_cast<uintptr_t>(mid) % kDirectAlign == 0) {
        moved = direct_transfer<true>(f.direct_fd(), const_cast<char*>(mid), part.middle, mid_off, f.path());
      } else {
        // Unaligned memory: copy into an aligned bounce, then O_DIRECT. A page
        // of `src` that faults is EFAULT, as the kernel reports it for aligned memory.
        auto bounce = BufferPool::aligned().acquire(std::min(bounce_size, part.middle));
        while (moved < part.middle) {
          const size_t n = std::min(bounce.size(), part.middle - moved);
          if (!copy_guarded(static_cast<char*>(bounce.get()), mid + moved, n))
            throw_os_error(EFAULT, "pwrite (O_DIRECT)", f.path(), mid_off + static_cast<int64_t>(moved));
          const size_t put = direct_transfer<true>(f.direct_fd(), static_cast<char*>(bounce.get()), n,
                                                   mid_off + static_cast<int64_t>(moved), f.path());
          moved += put;
          if (put < n) break;  // refused after all: the buffered descriptor takes the rest
        }
      }
      const size_t done = part.head + moved;
      pwrite_full(f.write_fd(), src + done, size - done, off + static_cast<int64_t>(done), f.path());
      return size;
    }
  }
  pwrite_full(f.write_fd(), src, size, off, f.path());
  return size;
}

size_t append_write(const File& f, const char* src, size_t size) {
  const File::AppendLock lock(f);
  size_t done = 0;
  // Where the bytes of writes that came short lie, so that they can be given
  // back if a later one fails (EFBIG, ENOSPC, EIO), for an append is all or
  // nothing: O_APPEND leaves the offset at each one's end. -1: not known to
  // lie in one piece (a writer that does not take the lock appended between
  // two of them, or lseek refused).
  int64_t start = -1;
  int64_t end = -1;
  while (done < size) {
    ssize_t r;
    if (int err = fault::check(fault::Op::pwrite)) {
      errno = err;
      r = -1;
    } else {
      r = ::write(f.fd(), src + done, size - done);
    }
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      if (start >= 0) f.release_written(lock, start, done);
      throw_os_error(err, r < 0 ? "write (append)" : "write (append) wrote nothing to", f.path());
    }
    done += static_cast<size_t>(r);
    if (done == size) break;
    const int64_t at = ::lseek(f.fd(), 0, SEEK_CUR);
    if (done == static_cast<size_t>(r))
      start = at < r ? -1 : at - r;
    else if (at - r != end)
      start = -1;
    end = at;
  }
  return size;
}

}  // namespace gdscp::detail
