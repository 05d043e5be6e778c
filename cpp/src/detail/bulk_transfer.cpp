#include "gdscp/detail/bulk_transfer.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "gdscp/detail/fault.hpp"
#include "gdscp/detail/posix_io.hpp"
#include "gdscp/detail/staging.hpp"
#include "gdscp/detail/thread_pool.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {
namespace {

// Below this, with host memory, plain descriptors and pread/pwrite: a File's
// second (O_DIRECT) descriptor and mapped reads pay off only from 1 MiB.
constexpr int64_t kFileMin = 1 << 20;
constexpr size_t kVerifyBlock = 1u << 20;
// From this size a copy inside the kernel starts each chunk's writeback once
// copied: 1 GiB on a disk of 2.4 GB/s took 0.70 s copied then fsynced, 0.45 s
// so. (Small files are left to their batch's syncfs: see finish_data.)
constexpr int64_t kWritebackMin = 8 << 20;

[[noreturn]] void fail_state(const std::string& message, const std::string& path) {
  throw Error(ErrorKind::state, 0, message, path);
}

int open_plain(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// The backend of `file` for memory `mem`: device memory by compat_mode
// (cuFile where it works), host memory always the POSIX path.
void choose_backend(const TransferContext& cx, const std::shared_ptr<File>& file, const MemoryTarget& mem,
                    Backends& backends, Backend*& backend) {
  backends = choose_backends(file, mem.device ? cx.s.compat_mode : CompatMode::on, cx.opt.cufile_library);
  if (!mem.device) backends.reason = "host memory always takes the POSIX path";
  backend = mem.device ? backends.device.get() : backends.host.get();
}

void open_file(const TransferContext& cx, const std::string& path, const char* mode, const MemoryTarget& mem,
               std::shared_ptr<File>& file, Backends& backends, Backend*& backend) {
  file = std::make_shared<File>(path, mode);
  choose_backend(cx, file, mem, backends, backend);
}

// Waits until `fd` is ready for `events` (POLLIN: something to read, data or
// the end; POLLOUT: room to write), in slices, so that a cancel of the job
// ends the wait; false if cancelled first. Beyond a first look, the wait is
// the pool's Blocking: what the other end waits for may be a task queued
// behind this worker (another job's copy out of, or into, the same FIFO).
bool wait_ready(int fd, short events, const std::atomic<bool>& cancelled) {
  std::optional<ThreadPool::Blocking> blocking;
  for (int slice_ms = 0;; slice_ms = 100) {
    if (cancelled.load(std::memory_order_relaxed)) return false;
    struct pollfd p = {fd, events, 0};
    const int r = ::poll(&p, 1, slice_ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return true;  // let the read report it
    if (!blocking) blocking.emplace(ThreadPool::process_default());
  }
}

// Whether `st` (of `fd`) is a file of a kernel filesystem whose sizes say
// nothing of the content: sysfs gives 4096 for an attribute of a few bytes,
// procfs 0 or a guess. Such files are read front to back to their end, as cp
// does. (Only anonymous devices are asked: disk filesystems are none.)
bool size_is_made_up(int fd, const struct stat& st) {
  if (major(st.st_dev) != 0) return false;
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case SYSFS_MAGIC:
    case PROC_SUPER_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
      return true;
    default:
      return false;
  }
}

// The source is not the file the caller found (a tree's walk): another took
// its name. As cp, the item fails; nothing is written.
[[noreturn]] void replaced(const Transfer& t, const std::string& path) {
  fail_state("'" + path + "' was replaced while being " + (t.item->kind == BulkKind::copy ? "copied" : "read"),
             path);
}

// The same, found on opening it. A whole-file copy under no_clobber is decided
// by its destination (open_destination): an existing one is kept whatever the
// source has become, so nothing would have been written and the copy is
// skipped as any other; where none is kept, it fails there. Anything else
// fails at once.
void source_replaced(const TransferContext& cx, Transfer& t, const std::string& path) {
  if (t.item->kind != BulkKind::copy || t.item->part || !cx.opt.no_clobber) replaced(t, path);
  t.src_replaced = true;
}

// The source of a read or copy: opened, its size found, the way to read it chosen.
void open_source(const TransferContext& cx, Transfer& t, const std::string& path) {
  const BulkItem& item = *t.item;
  // Non-blocking, so that a FIFO without a writer does not hold the worker in
  // open(2) where no cancel reaches it. Files and block devices then block as
  // usual; anything else keeps O_NONBLOCK, and read_some waits for it in
  // slices (a terminal, a FIFO whose writer is slow). A source whose file the
  // caller found (BulkItem::has_src_id) is not opened through a link put in
  // its place.
  if (const int err = fault::short_of_descriptors()) throw_os_error(err, "cannot open", path);  // tests only
  t.src_fd = open_plain(path, O_RDONLY | O_NONBLOCK | (item.has_src_id ? O_NOFOLLOW : 0));
  if (t.src_fd < 0) {
    if (item.has_src_id && errno == ELOOP) return source_replaced(cx, t, path);
    throw_os_error(errno, "cannot open", path);
  }
  struct stat& st = t.src_stat;
  if (::fstat(t.src_fd, &st) != 0) throw_os_error(errno, "cannot stat", path);
  if (item.has_src_id && (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_dev) != item.src_dev ||
                           static_cast<uint64_t>(st.st_ino) != item.src_ino))
    return source_replaced(cx, t, path);
  if (S_ISDIR(st.st_mode)) throw_os_error(EISDIR, "cannot read", path);
  if (cx.opt.verify && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)))
    fail_state("cannot verify what was read from '" + path + "': a FIFO or character device cannot be read again",
               path);
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
    if (::fcntl(t.src_fd, F_SETFL, 0) != 0) throw_os_error(errno, "cannot open", path);
  } else if (S_ISFIFO(st.st_mode)) {
    // Opened without blocking, a FIFO with no writer yet reads as empty: wait
    // for one (its first bytes, or its close) as a blocking open would.
    wait_ready(t.src_fd, POLLIN, cx.cancelled);
  }
  // A range of the file, not all of it from its start.
  const bool ranged = item.part || item.exact || item.offset > 0;
  int64_t length = -1;  // -1: no size to go by (FIFOs none, procfs 0 for files with content)
  if (S_ISREG(st.st_mode) && !size_is_made_up(t.src_fd, st)) {
    // An empty file is still read to its end, as cp does, unless a range of
    // it is asked for: that is held to the size the file reports.
    if (st.st_size > 0 || ranged) length = st.st_size;
  } else if (S_ISBLK(st.st_mode)) {
    length = ::lseek(t.src_fd, 0, SEEK_END);
    if (length < 0) throw_os_error(errno, "cannot find the length of", path);
  }
  t.src_sized = length >= 0;
  // A range that starts past the end fails, as one that runs past it does
  // where its length is asked for (every copied range; a read's unless it is
  // to the end). One that starts at the end is empty: done, 0 bytes.
  const auto missing = [&](const char* to) {
    const std::string bytes = item.size < 0 ? "from offset " + std::to_string(item.offset) + " on"
                                            : "[" + std::to_string(item.offset) + ", " +
                                                  std::to_string(item.offset + item.size) + ")";
    const std::string why = !t.src_sized         ? " (it has no size to go by: it is read whole, to its end)"
                            : item.offset > length ? ": the range starts past its end (it has " +
                                                         std::to_string(length) + ")"
                                                   : " (it has " + std::to_string(length) + ")";
    return "'" + path + "' has no bytes " + bytes + " to " + to + why;
  };
  if (item.kind == BulkKind::read) {
    t.offset = item.offset;
    if (t.src_sized) {
      if (item.offset > length || (item.exact && item.offset + item.size > length))
        fail_state(missing("read"), path);
      const int64_t rest = length - item.offset;
      t.size = item.size < 0 ? rest : (item.exact ? item.size : std::min(item.size, rest));
    } else {
      t.size = item.size;  // at most this much, or to the end
      if (item.offset > 0 && ::lseek(t.src_fd, item.offset, SEEK_SET) < 0)
        throw_os_error(errno, "cannot seek in", path, item.offset);
    }
  } else if (item.part) {
    if (!t.src_sized || item.offset < 0 || item.size < 0 || item.offset + item.size > length)
      fail_state(missing("copy"), path);
    t.offset = item.offset;
    t.size = item.size;
  } else {
    t.offset = 0;
    t.size = t.src_sized ? length : -1;
  }
  if (t.src_sized && (t.mem.device || t.size >= kFileMin)) {
    // A File of the descriptor measured above, not of the path opened again:
    // a file renamed over the path meanwhile would be read for the size of
    // this one, or in part, its bytes mixed with this one's.
    fault::source_measured(path);
    const int fd = ::fcntl(t.src_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw_os_error(errno, "cannot open", path);
    t.src_file = std::make_shared<File>(path, fd);
    choose_backend(cx, t.src_file, t.mem, t.src_backends, t.src_backend);
  }
}

// Opens a FIFO for writing without blocking forever on a missing reader: the
// job can still be cancelled while it waits. It stays non-blocking, so that
// a reader that stops reading holds no worker where a cancel cannot reach it
// (write_all waits for room in slices).
int open_fifo(const TransferContext& cx, const std::string& path) {
  std::optional<ThreadPool::Blocking> blocking;  // its reader may be a task queued behind this worker
  for (;;) {
    const int fd = open_plain(path, O_WRONLY | O_NONBLOCK);
    if (fd >= 0) return fd;
    if (errno != ENXIO) return -1;
    if (cx.cancelled.load(std::memory_order_relaxed)) {
      errno = ECANCELED;
      return -1;
    }
    if (!blocking) blocking.emplace(ThreadPool::process_default());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The destination of a write or copy: where it lands, whether it is there
// already, and the descriptor the bytes go to. False: skipped (no_clobber).
bool open_destination(const TransferContext& cx, Transfer& t, std::string& note) {
  const BulkItem& item = *t.item;
  t.dst = item.dst;
  struct stat st{};
  bool exists = ::lstat(t.dst.c_str(), &st) == 0;
  if (exists && S_ISLNK(st.st_mode)) {
    // Like cp, write to what a link points at; and, like GNU cp, not through
    // a dangling link (whose target, wherever it points, would be created).
    if (::stat(t.dst.c_str(), &st) != 0) {
      if (errno == ENOENT) fail_state("not writing through dangling symbolic link '" + item.dst + "'", item.dst);
      throw_os_error(errno, "cannot stat", item.dst);
    }
    // A pipe or a device (/dev/stdout, /dev/fd/N) is opened through the link:
    // what it points at may have no name to open (pipe:[...]).
    if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)) {
      char* real = ::realpath(item.dst.c_str(), nullptr);
      if (!real) throw_os_error(errno, "cannot resolve", item.dst);
      t.dst = real;
      std::free(real);
    }
  } else if (!exists && errno != ENOENT) {
    throw_os_error(errno, "cannot stat", t.dst);
  }
  // A source replaced since it was found (source_replaced) is skipped only
  // where no_clobber keeps what is here (below).
  if (t.src_replaced && (!exists || S_ISDIR(st.st_mode))) replaced(t, item.src);
  t.dir = dir_of(t.dst);
  if (is_temporary_name(base_of(t.dst)))
    fail_state("will not write '" + t.dst + "': its name is that of a gdscp temporary file, which the next run "
                   "into its directory would remove as a dead run's",
               t.dst);
  t.mode = item.mode;
  const struct stat& src = t.src_stat;
  const bool from_source = item.kind == BulkKind::copy;
  if (from_source && cx.opt.preserve) {
    t.mode = static_cast<int>(src.st_mode & 07777);
    t.atime = src.st_atim;
    t.mtime = src.st_mtim;
    t.set_times = true;
  } else if (from_source && t.mode < 0) {
    t.mode = static_cast<int>(src.st_mode & 0777 & ~cx.umask);
  }
  if (item.set_times) {
    t.atime = {static_cast<time_t>(item.atime_ns / 1000000000), static_cast<long>(item.atime_ns % 1000000000)};
    t.mtime = {static_cast<time_t>(item.mtime_ns / 1000000000), static_cast<long>(item.mtime_ns % 1000000000)};
    t.set_times = true;
  }
  if (exists) {
    if (S_ISDIR(st.st_mode))
      fail_state(item.src.empty() ? "cannot write '" + t.dst + "': it is a directory"
                                  : "cannot overwrite directory '" + t.dst + "' with non-directory '" + item.src + "'",
                 t.dst);
    // As cp -n: what is there is kept, even the source itself (nothing to lose).
    if (cx.opt.no_clobber) {
      note = "exists";
      return false;
    }
    if (from_source && src.st_dev == st.st_dev && src.st_ino == st.st_ino)
      fail_state("'" + item.src + "' and '" + item.dst + "' are the same file", item.dst);  // as named, as cp
    if (!S_ISREG(st.st_mode)) {
      if (S_ISSOCK(st.st_mode)) fail_state("cannot write to '" + t.dst + "': it is a socket", t.dst);
      // A block device is read back from its start as far as it was written
      // (it is longer, as a rule).
      t.block_device = S_ISBLK(st.st_mode);
      if (cx.opt.verify && !t.block_device)
        fail_state("cannot verify a copy into '" + t.dst + "': a FIFO or character device cannot be read back",
                   t.dst);
      // A device or FIFO is written in place, front to back, as cp does.
      t.in_place = true;
      t.sequential = true;
      t.dst_fd = S_ISFIFO(st.st_mode) ? open_fifo(cx, t.dst)
                                      : open_plain(t.dst, cx.opt.verify ? O_RDWR : O_WRONLY);
      if (t.dst_fd < 0) throw_os_error(errno, "cannot open for writing", t.dst);
      t.own_dst_fd = true;
      return true;
    }
    if (cx.opt.atomic) check_replaceable(t.dst);
    if (item.keep_mode && !(from_source && cx.opt.preserve)) t.mode = static_cast<int>(st.st_mode & 07777);
    // As cp, which writes into the existing file: the copy that replaces it
    // keeps its owner and group where this process may give them (root may;
    // others only a group of their own).
    t.chown = cx.opt.atomic && (st.st_uid != ::geteuid() || st.st_gid != ::getegid());
    t.uid = st.st_uid;
    t.gid = st.st_gid;
  }
  // Preserving, as cp -p: the source's owner and group where this process may
  // give them (see finish_data for the set-ID bits where it may not).
  if (from_source && cx.opt.preserve && cx.opt.atomic) {
    t.chown = src.st_uid != ::geteuid() || src.st_gid != ::getegid();
    t.uid = src.st_uid;
    t.gid = src.st_gid;
  }
  if (t.mode < 0) t.mode = static_cast<int>(0666 & ~cx.umask);
  // Whether a File opens the file written again by its path (see
  // open_transfer), to read and write it there: its owner may not do so under
  // a mode without those bits (the copy of a read-only file) or a umask that
  // takes them (0277). Such a file that this job makes is made 0600, and gets
  // its mode once written.
  const bool by_path = t.mem.device || t.size >= kFileMin;
  if (cx.opt.atomic) {
    // Created with its final mode where the umask leaves it so (a new copy's
    // usual case): one fchmod less per file.
    const unsigned create = static_cast<unsigned>(t.mode) & 0777;
    t.chmod = (create & ~cx.umask) != static_cast<unsigned>(t.mode) || (by_path && (create & 0600) != 0600);
    // A new file that no File opens again by its path needs no name until it
    // is complete: an unnamed one, linked into place.
    const unsigned tmp_mode = t.chmod ? 0600 : create;
    const bool by_fd = !exists && !by_path;
    t.tmp = by_fd ? TempFile::unnamed(t.dst, tmp_mode) : TempFile(t.dst, tmp_mode);
    if (by_path && (0600 & ~cx.umask) != 0600 && ::fchmod(t.tmp.fd(), 0600) != 0)
      throw_os_error(errno, "cannot set the mode of", t.tmp.path());
    t.dst_fd = t.tmp.fd();
    static std::atomic<uint64_t> opened{0};
    t.dst_opened = opened.fetch_add(1, std::memory_order_relaxed);
    t.dev = t.tmp.device();
  } else {
    // Not emptied first: the buffer may be a mapping of this very file (a
    // memmap written back to its file), whose bytes a truncation would take
    // before they are read. Cut to its new size once written.
    t.chmod = false;
    if (!exists && by_path) {
      // Made here (not by another at the same moment, which O_EXCL tells).
      t.dst_fd = open_plain(t.dst, O_RDWR | O_CREAT | O_EXCL, 0600);
      t.chmod = t.dst_fd >= 0;
    }
    if (t.dst_fd < 0) t.dst_fd = open_plain(t.dst, O_RDWR | O_CREAT, static_cast<mode_t>(t.mode));
    if (t.dst_fd < 0) throw_os_error(errno, "cannot create", t.dst);
    t.own_dst_fd = true;
    t.cut_to_size = true;
    if (t.chmod && (0600 & ~cx.umask) != 0600 && ::fchmod(t.dst_fd, 0600) != 0)
      throw_os_error(errno, "cannot set the mode of", t.dst);
    struct stat made{};
    if (::fstat(t.dst_fd, &made) == 0) t.dev = made.st_dev;
  }
  return true;
}

// The destination of a part: an existing regular file, opened to be written
// in place at the part's offsets.
void open_part_destination(Transfer& t) {
  const BulkItem& item = *t.item;
  t.dst = item.dst;
  t.dir = dir_of(t.dst);
  t.part = true;
  t.chmod = false;
  t.dst_fd = open_plain(t.dst, O_RDWR);
  if (t.dst_fd < 0) throw_os_error(errno, "cannot open for writing", t.dst);
  t.own_dst_fd = true;
  struct stat st{};
  if (::fstat(t.dst_fd, &st) != 0) throw_os_error(errno, "cannot stat", t.dst);
  if (!S_ISREG(st.st_mode)) fail_state("cannot write part of '" + t.dst + "': it is not a regular file", t.dst);
  t.dev = st.st_dev;
  if (item.kind == BulkKind::write) {
    if (item.offset < 0) fail_state("a part of '" + t.dst + "' cannot start before the file", t.dst);
    t.offset = item.offset;
  }
}

// The bytes of [off, off + n) of the source into `base` (memory `mem`);
// fewer only at end of file.
size_t read_chunk(const TransferContext& cx, Transfer& t, const MemoryTarget& mem, char* base, int64_t off, size_t n) {
  if (t.src_backend) {
    ChunkQueue one({Chunk{0, off, n}}, n);
    return t.src_backend->read(mem, base, one, cx.s, nullptr);
  }
  return pread_full(t.src_fd, base, n, off, t.item->src);
}

void write_chunk(const TransferContext& cx, Transfer& t, const MemoryTarget& mem, const char* base, int64_t off,
                 size_t n) {
  if (t.dst_backend) {
    ChunkQueue one({Chunk{0, off, n}}, n);
    t.dst_backend->write(mem, base, one, cx.s, nullptr);
    return;
  }
  pwrite_full(t.dst_fd, base, n, off, t.dst);
}

// write(2) until every byte is out (devices and FIFOs cannot seek), or the
// job is cancelled while a non-blocking descriptor has no room.
void write_all(int fd, const char* p, size_t n, int64_t pos, const std::string& path,
               const std::atomic<bool>& cancelled) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::write(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_ready(fd, POLLOUT, cancelled)) return;  // the job's cancel decides the file's end
        continue;
      }
      throw_os_error(errno, "cannot write to", path, pos + static_cast<int64_t>(done));
    }
    done += static_cast<size_t>(r);
  }
}

// read(2) until `n` bytes or end of file.
size_t read_some(int fd, char* p, size_t n, int64_t pos, const std::string& path,
                 const std::atomic<bool>& cancelled) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::read(fd, p + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_ready(fd, POLLIN, cancelled)) break;  // short, but the job's cancel decides the file's end
        continue;
      }
      throw_os_error(errno, "cannot read", path, pos + static_cast<int64_t>(done));
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

// The offset of the first byte where `a` and `b` differ, within `n` (`n` if none).
size_t first_difference(const char* a, const char* b, size_t n) {
  return static_cast<size_t>(std::mismatch(a, a + n, b).first - a);
}

// Compares `n` bytes that landed at `got` (memory `mem`) with a plain read of
// the source at `off`.
void verify_landed(Transfer& t, const MemoryTarget& mem, const char* got, int64_t off, size_t n) {
  if (!mem.device && n > 0 && fault::check(fault::Op::land)) const_cast<char*>(got)[0] ^= 0xFF;
  auto expect = BufferPool::aligned().acquire(kVerifyBlock);
  // Host memory is compared where it landed; device memory is copied back first.
  BufferPool::Lease landed;
  if (mem.device) landed = BufferPool::aligned().acquire(kVerifyBlock);
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(kVerifyBlock, n - done);
    const int64_t at = off + static_cast<int64_t>(done);
    char* e = static_cast<char*>(expect.get());
    if (pread_full(t.source_fd(), e, k, at, t.item->src) != k)
      fail_state("verify: '" + t.item->src + "' ended at offset " + std::to_string(at) + " during the check",
                 t.item->src);
    const char* g = got + done;
    if (mem.device) {
      copy_to_host(mem, landed.get(), g, k);
      g = static_cast<const char*>(landed.get());
    }
    if (std::memcmp(e, g, k) != 0) {
      const size_t i = first_difference(e, g, k);
      fail_state("verify failed: the bytes read from '" + t.item->src + "' differ at offset " +
                     std::to_string(at + static_cast<int64_t>(i)),
                 t.item->src);
    }
    done += k;
  }
}

// A part's range, read from storage, against the same range of the source;
// cut short by a cancel of the job (which then decides the file's end).
void verify_part(Transfer& t, const std::atomic<bool>& cancelled) {
  ::posix_fadvise(t.dst_fd, t.offset, t.size, POSIX_FADV_DONTNEED);
  auto a = BufferPool::aligned().acquire(kVerifyBlock);
  auto b = BufferPool::aligned().acquire(kVerifyBlock);
  char* x = static_cast<char*>(a.get());
  char* y = static_cast<char*>(b.get());
  for (int64_t done = 0; done < t.size;) {
    if (cancelled.load(std::memory_order_relaxed)) return;
    const size_t want = static_cast<size_t>(std::min<int64_t>(kVerifyBlock, t.size - done));
    const int64_t pos = t.offset + done;
    const size_t n = pread_full(t.source_fd(), x, want, pos, t.item->src);
    const size_t m = pread_full(t.dst_fd, y, want, pos, t.dst);
    if (m > 0 && fault::check(fault::Op::land)) y[0] ^= 0xFF;
    const size_t k = std::min(n, m);
    if (n != want || m != want || std::memcmp(x, y, k) != 0) {
      const size_t i = first_difference(x, y, k);
      fail_state("verify failed: the copy of '" + t.item->src + "' differs at offset " +
                     std::to_string(pos + static_cast<int64_t>(i)),
                 t.dst);
    }
    done += static_cast<int64_t>(want);
  }
}

// The file written from a buffer, read from storage (its cached pages
// dropped first), against the buffer; cut short by a cancel of the job.
void verify_written(Transfer& t, const std::atomic<bool>& cancelled) {
  ::posix_fadvise(t.dst_fd, 0, 0, POSIX_FADV_DONTNEED);
  auto a = BufferPool::aligned().acquire(kVerifyBlock);
  BufferPool::Lease b;  // device memory, copied back
  if (t.mem.device) b = BufferPool::aligned().acquire(kVerifyBlock);
  const char* buf = reinterpret_cast<const char*>(t.item->buf);
  for (int64_t pos = 0; pos < t.size;) {
    if (cancelled.load(std::memory_order_relaxed)) return;
    const size_t want = static_cast<size_t>(std::min<int64_t>(kVerifyBlock, t.size - pos));
    char* y = static_cast<char*>(a.get());
    const size_t m = pread_full(t.dst_fd, y, want, pos, t.dst);
    if (m > 0 && fault::check(fault::Op::land)) y[0] ^= 0xFF;
    const char* x = buf + pos;
    if (t.mem.device) {
      copy_to_host(t.mem, b.get(), x, want);
      x = static_cast<const char*>(b.get());
    }
    if (m != want || std::memcmp(x, y, want) != 0) {
      const size_t i = first_difference(x, y, m);
      fail_state("verify failed: '" + t.dst + "' read back differs from its buffer at offset " +
                     std::to_string(pos + static_cast<int64_t>(i)) + (t.tmp ? "; it was not put in place" : ""),
                 t.dst);
    }
    pos += static_cast<int64_t>(want);
  }
  uint8_t end;
  if (!t.block_device && pread_full(t.dst_fd, reinterpret_cast<char*>(&end), 1, t.size, t.dst) != 0)
    fail_state("verify failed: '" + t.dst + "' read back is longer than its buffer" +
                   (t.tmp ? "; it was not put in place" : ""),
               t.dst);
}

// The copy in its temporary file (or on a block device, the device's first
// bytes), read from storage, against the source.
void verify_copy(Transfer& t, const std::atomic<bool>& cancelled) {
  ::posix_fadvise(t.dst_fd, 0, 0, POSIX_FADV_DONTNEED);
  auto a = BufferPool::aligned().acquire(kVerifyBlock);
  auto b = BufferPool::aligned().acquire(kVerifyBlock);
  char* x = static_cast<char*>(a.get());
  char* y = static_cast<char*>(b.get());
  const int src = t.src_sized ? t.source_fd() : open_plain(t.item->src, O_RDONLY);
  if (src < 0) throw_os_error(errno, "cannot open", t.item->src);
  struct Closer {
    int fd;
    bool own;
    ~Closer() {
      if (own) ::close(fd);
    }
  } closer{src, !t.src_sized};
  for (int64_t pos = 0;;) {
    if (cancelled.load(std::memory_order_relaxed)) return;
    const size_t n = pread_full(src, x, kVerifyBlock, pos, t.item->src);
    const size_t m = pread_full(t.dst_fd, y, kVerifyBlock, pos, t.dst);
    if (m > 0 && fault::check(fault::Op::land)) y[0] ^= 0xFF;
    const size_t k = std::min(n, m);
    if (std::memcmp(x, y, k) != 0 || n > m || (n < m && !t.block_device)) {
      const size_t i = first_difference(x, y, k);
      fail_state("verify failed: the copy of '" + t.item->src + "' differs at offset " +
                     std::to_string(pos + static_cast<int64_t>(i)) +
                     (t.in_place ? "" : "; '" + t.dst + "' was not changed"),
                 t.dst);
    }
    if (n < kVerifyBlock) return;
    pos += static_cast<int64_t>(n);
  }
}

[[noreturn]] void truncated(const Transfer& t, int64_t at) {
  const bool copy = t.item->kind == BulkKind::copy;
  fail_state("'" + t.item->src + "' ended at offset " + std::to_string(at) + " while being " +
                 (copy ? "copied" : "read") + " (was it truncated?)",
             t.item->src);
}

}  // namespace

char* BulkWorker::staging() { return device_slot ? device_slot : host(); }

char* BulkWorker::host() {
  if (!host_lease.get()) host_lease = BufferPool::aligned().acquire(slot_size);
  return static_cast<char*>(host_lease.get());
}

Transfer::~Transfer() {
  if (src_fd >= 0) ::close(src_fd);
  if (own_dst_fd && dst_fd >= 0) ::close(dst_fd);
}

void Transfer::release_endpoints() noexcept {
  src_backend = nullptr;
  dst_backend = nullptr;
  src_backends = {};
  dst_backends = {};
  src_file.reset();
  dst_file.reset();
  if (src_fd >= 0) ::close(src_fd);
  src_fd = -1;
}

void Transfer::fail(std::exception_ptr e) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!error) error = e;
  has_error.store(true, std::memory_order_release);
}

void Transfer::landed_short(const Chunk& c, size_t got) noexcept {
  if (got >= c.size) return;
  const int64_t at = c.file_offset + static_cast<int64_t>(got);
  int64_t seen = ends_at.load(std::memory_order_relaxed);
  while (at < seen && !ends_at.compare_exchange_weak(seen, at, std::memory_order_relaxed)) {
  }
}

uint64_t Transfer::reported_bytes() const noexcept {
  const uint64_t moved = bytes.load();
  const int64_t end = ends_at.load();
  if (end == INT64_MAX) return moved;
  return std::min<uint64_t>(moved, static_cast<uint64_t>(std::max<int64_t>(end - offset, 0)));
}

void Transfer::share_chunks(size_t groups, size_t owner) {
  if (groups <= 1 || chunks.size() <= 1) return;
  group_begin.assign(groups + 1, chunks.size());
  group_next = std::make_unique<std::atomic<size_t>[]>(groups);
  if (owner < groups) {
    for (size_t k = 0; k <= owner; ++k) group_begin[k] = 0;
    for (size_t k = 0; k < groups; ++k) group_next[k].store(group_begin[k]);
    return;
  }
  // Contiguous ranges of (nearly) equal bytes: every chunk but the last is full.
  uint64_t total = 0;
  for (const Chunk& c : chunks) total += c.size;
  uint64_t seen = 0;
  size_t g = 0;
  group_begin[0] = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    while (g + 1 < groups && seen * groups >= total * (g + 1)) group_begin[++g] = i;
    seen += chunks[i].size;
  }
  for (size_t k = 0; k < groups; ++k) group_next[k].store(group_begin[k]);
}

size_t Transfer::claim(size_t g) {
  if (!group_next) return next.fetch_add(1);
  const size_t i = group_next[g].fetch_add(1);
  return i < group_begin[g + 1] ? i : chunks.size();
}

bool Transfer::has_chunks(size_t g) const {
  if (!group_next) return next.load() < chunks.size();
  return group_next[g].load() < group_begin[g + 1];
}

std::shared_ptr<Transfer> open_transfer(const TransferContext& cx, size_t index, const BulkItem& item,
                                        const MemoryTarget& item_mem, const MemoryTarget& staging_mem,
                                        const std::vector<MemoryTarget>& replica_mem, bool peer, std::string& note) {
  auto t = std::make_shared<Transfer>();
  t->index = index;
  t->item = &item;
  t->start = BulkClock::now();
  t->scratch = item.kind == BulkKind::copy || (item.kind == BulkKind::read && item.buf == 0);
  t->mem = t->scratch ? staging_mem : item_mem;
  for (size_t r = 0; r < item.replicas.size(); ++r)
    t->replicas.push_back({reinterpret_cast<char*>(item.replicas[r]), replica_mem[r]});
  t->peer = peer;
  if (item.kind != BulkKind::write) {
    open_source(cx, *t, item.src);
  } else {
    t->size = item.size;
  }
  if (item.kind != BulkKind::read && item.part) {
    open_part_destination(*t);
    if (t->mem.device || t->size >= kFileMin)
      open_file(cx, t->dst, "r+", t->mem, t->dst_file, t->dst_backends, t->dst_backend);
  } else if (item.kind != BulkKind::read) {
    if (!open_destination(cx, *t, note)) return nullptr;
    if (!t->in_place && (t->mem.device || t->size >= kFileMin)) {
      try {
        if (t->tmp) fault::destination_made(dir_of(t->dst));  // tests only: disarmed, one relaxed load
        open_file(cx, t->tmp ? t->tmp.path() : t->dst, "r+", t->mem, t->dst_file, t->dst_backends, t->dst_backend);
      } catch (const Error& e) {
        // The temporary file, just made, is opened again by its path: gone
        // from there, its directory was moved or removed meanwhile (as a
        // later failure of the transfer says it).
        if (t->tmp && e.kind() == ErrorKind::os && e.code() == ENOENT && t->tmp.directory_moved(t->dst))
          throw_directory_moved(t->dst, item.kind == BulkKind::copy ? "the copy" : "the write");
        throw;
      }
    }
  }
  if (!t->src_sized) t->sequential = true;
  // cp's way for a plain host copy: no trip through user memory, and shared
  // extents where the filesystem can reflink. Not where O_DIRECT was asked
  // for (it would go through the page cache), nor while a test fault is armed.
  t->kernel_copy = item.kind == BulkKind::copy && !t->mem.device && !t->sequential && !t->in_place &&
                   S_ISREG(t->src_stat.st_mode) && cx.s.direct_io != DirectIO::on && !fault::io_armed();
  // Its pages go to the disk while the rest is copied, not all at the fsync.
  t->early_writeback = t->kernel_copy && cx.opt.sync != BulkSync::none && t->size >= kWritebackMin;
  // As cp keeps a sparse file sparse (a disk image, a preallocated
  // checkpoint): copies without a GPU skip the holes.
  if (t->kernel_copy && !t->part && t->size > 0 && t->src_stat.st_blocks * 512 < t->size) {
    if (::ftruncate(t->dst_fd, t->size) != 0) throw_os_error(errno, "cannot size", t->dst);
    t->sparse = true;
  }
  if (t->sequential && !t->replicas.empty())
    fail_state("cannot replicate '" + item.src + "': it has no size (a FIFO or procfs file is read front to back)",
               item.src);
  if (t->sequential) return t;
  // Chunks: through staging at most a slot each; into or out of the caller's
  // memory at most a task, split further so that every worker gets a share.
  const size_t size = static_cast<size_t>(t->size);
  const size_t cap = t->scratch ? cx.chunk_cap : cx.s.task_size;
  // Cut a file below the cap into shares for the workers only where the job's
  // files are too few to keep them all busy: otherwise each chunk costs a
  // claim and a queue entry for nothing.
  const size_t chunk = cx.items >= cx.workers ? std::min(cap, std::max<size_t>(size, 1))
                                              : effective_task_size(size, cap, cx.workers, cx.s.min_task_size);
  t->chunks = split(t->offset, size, chunk);
  t->left = t->chunks.size();
  return t;
}

namespace {

// The memory a worker moves `t`'s bytes through: its group's staging for a
// transfer through staging, else the item's buffer.
const MemoryTarget& memory_of(const Transfer& t, const BulkWorker& w) {
  return t.scratch && w.staging_mem.device ? w.staging_mem : t.mem;
}

// One chunk of a read with replicas: into every GPU's buffer, read once.
size_t move_replicated(const TransferContext& cx, Transfer& t, const Chunk& c, size_t index) {
  const BulkItem& item = *t.item;
  const size_t ndest = t.replicas.size() + 1;
  auto base_of = [&](size_t k) {
    return (k == 0 ? reinterpret_cast<char*>(item.buf) : t.replicas[k - 1].base) + c.buf_offset;
  };
  auto mem_of = [&](size_t k) -> const MemoryTarget& { return k == 0 ? t.mem : t.replicas[k - 1].mem; };
  size_t got;
  if (t.peer) {
    // Lands on the GPUs in turn (every GPU's PCIe link carries a share), then
    // GPU to GPU over NVLink or PCIe peer to peer.
    const size_t k = index % ndest;
    got = read_chunk(cx, t, mem_of(k), base_of(k), c.file_offset, c.size);
    for (size_t j = 0; j < ndest; ++j)
      if (j != k) copy_peer(mem_of(j), base_of(j), mem_of(k), base_of(k), got);
  } else {
    // No peer access: the same pinned host chunk copied to every GPU.
    BufferPool::Lease lease;
    {
      ScopedContext scope(CudaDriver::require(), t.mem.ctx);  // pinned memory is allocated under a context
      lease = BufferPool::pinned_near(t.mem.ordinal).acquire(c.size);
    }
    char* host = static_cast<char*>(lease.get());
    got = pread_full(t.source_fd(), host, c.size, c.file_offset, item.src);
    for (size_t j = 0; j < ndest; ++j) copy_to_device(mem_of(j), base_of(j), host, got);
  }
  if (got < c.size && item.exact) truncated(t, c.file_offset + static_cast<int64_t>(got));
  if (cx.opt.verify)
    for (size_t j = 0; j < ndest; ++j) verify_landed(t, mem_of(j), base_of(j), c.file_offset, got);
  return got;
}

// Copies [off, off + n) of the source to the destination inside the kernel;
// returns the bytes copied. Fewer when the source ended, or when the kernel
// declined (it cannot copy between these files: the transfer stops asking,
// and the caller moves the rest through memory, where any real error shows
// with the right file's name).
size_t copy_in_kernel(Transfer& t, int64_t off, size_t n) {
  size_t done = 0;
  while (done < n) {
    loff_t in = off + static_cast<loff_t>(done);
    loff_t out = in;
    const int injected = fault::check(fault::Op::kernel_copy);
    if (injected > 0) errno = injected;
    const ssize_t r = injected == fault::kEndOfFile ? 0
                      : injected                    ? -1
                                                    : ::copy_file_range(t.source_fd(), &in, t.dst_fd, &out, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) t.kernel_copy.store(false, std::memory_order_relaxed);
    break;  // 0: the end of the source, or a file whose size the kernel cannot copy by
  }
  // A failure shows at the fsync, which waits for this writeback too.
  if (t.early_writeback && done > 0) ::sync_file_range(t.dst_fd, off, static_cast<off_t>(done), SYNC_FILE_RANGE_WRITE);
  t.kernel_bytes.fetch_add(done, std::memory_order_relaxed);
  return done;
}

// A chunk of a copy through host memory: inside the kernel while it copies,
// the rest through the worker's staging (allocated only then: a copy the
// kernel makes needs none), which also tells a real end of the source from
// a kernel that copied nothing.
size_t copy_chunk(const TransferContext& cx, Transfer& t, const MemoryTarget& mem, BulkWorker& w, int64_t off,
                  size_t n) {
  size_t done = t.kernel_copy.load(std::memory_order_relaxed) ? copy_in_kernel(t, off, n) : 0;
  if (done < n) {
    char* staging = w.staging();
    const int64_t at = off + static_cast<int64_t>(done);
    const size_t got = read_chunk(cx, t, mem, staging, at, n - done);
    write_chunk(cx, t, mem, staging, at, got);
    t.memory_bytes.fetch_add(got, std::memory_order_relaxed);
    done += got;
  }
  return done;
}

// A chunk of a sparse source: each run of data in [off, off + n) copied,
// the holes left as the destination has them (it was sized to the whole
// file). Returns n, or where the source now ends if it ended inside the chunk.
size_t copy_sparse_chunk(const TransferContext& cx, Transfer& t, const MemoryTarget& mem, BulkWorker& w, int64_t off,
                         size_t n) {
  const int fd = t.source_fd();
  const int64_t end = off + static_cast<int64_t>(n);
  int64_t pos = off;
  while (pos < end) {
    const off_t data = ::lseek(fd, pos, SEEK_DATA);
    if (data < 0 && errno != ENXIO) return (pos - off) + copy_chunk(cx, t, mem, w, pos, end - pos);
    if (data < 0 || data >= end) break;  // ENXIO: no data from pos to the end of the file
    off_t hole = ::lseek(fd, data, SEEK_HOLE);
    if (hole < 0) hole = end;
    const size_t len = static_cast<size_t>(std::min<int64_t>(hole, end) - data);
    const size_t got = copy_chunk(cx, t, mem, w, data, len);
    if (got < len) return static_cast<size_t>(data - off) + got;
    pos = data + static_cast<int64_t>(len);
  }
  // Ended in a hole: the rest is one, unless the source was cut short meanwhile.
  struct stat st {};
  if (pos < end && ::fstat(fd, &st) == 0 && st.st_size < end)
    return static_cast<size_t>(std::max<int64_t>(st.st_size - off, 0));
  return n;
}

}  // namespace

void move_chunk(const TransferContext& cx, Transfer& t, size_t index, BulkWorker& w, std::atomic<uint64_t>& moved) {
  const Chunk& c = t.chunks[index];
  const BulkItem& item = *t.item;
  const MemoryTarget& mem = memory_of(t, w);
  size_t n = c.size;
  if (!t.replicas.empty()) {
    n = move_replicated(cx, t, c, index);
  } else if (item.kind == BulkKind::write) {
    write_chunk(cx, t, mem, reinterpret_cast<const char*>(item.buf) + c.buf_offset, c.file_offset, n);
  } else if (item.kind == BulkKind::copy && !mem.device) {
    const size_t got = t.sparse ? copy_sparse_chunk(cx, t, mem, w, c.file_offset, n)
                                : copy_chunk(cx, t, mem, w, c.file_offset, n);
    if (got < n) truncated(t, c.file_offset + static_cast<int64_t>(got));
    n = got;
  } else {
    char* base = t.scratch ? w.staging() : reinterpret_cast<char*>(item.buf) + c.buf_offset;
    const size_t got = read_chunk(cx, t, mem, base, c.file_offset, n);
    if (got < n && (item.kind == BulkKind::copy || item.exact)) truncated(t, c.file_offset + static_cast<int64_t>(got));
    n = got;
    if (item.kind == BulkKind::copy) {
      write_chunk(cx, t, mem, base, c.file_offset, n);
    } else if (cx.opt.verify) {
      verify_landed(t, mem, base, c.file_offset, n);
    }
  }
  t.landed_short(c, n);
  count_moved(t, w, moved, n);
}

void count_moved(Transfer& t, const BulkWorker& w, std::atomic<uint64_t>& moved, size_t n) {
  t.bytes.fetch_add(n, std::memory_order_relaxed);
  moved.fetch_add(n, std::memory_order_relaxed);
  if (w.group_moved) w.group_moved->fetch_add(n, std::memory_order_relaxed);
}

std::exception_ptr short_read(const Transfer& t, size_t index, size_t got) {
  const Chunk& c = t.chunks[index];
  if (got >= c.size || !t.item->exact) return nullptr;
  try {
    truncated(t, c.file_offset + static_cast<int64_t>(got));
  } catch (...) {
    return std::current_exception();
  }
}

bool upload_chunk(const TransferContext& cx, Transfer& t, size_t index, BulkWorker& w, UploadRing::Landed landed) {
  const BulkItem& item = *t.item;
  const MemoryTarget& mem = memory_of(t, w);
  if (item.kind != BulkKind::read || !mem.device || !t.replicas.empty() || cx.opt.verify || !t.src_file ||
      !t.src_backend || std::strcmp(t.src_backend->name(), "posix") != 0)
    return false;
  if (!w.ring) w.ring = std::make_unique<UploadRing>(cx.s);
  const Chunk& c = t.chunks[index];
  char* base = t.scratch ? w.staging() : reinterpret_cast<char*>(item.buf) + c.buf_offset;
  w.ring->upload(mem, base, c.size, c.file_offset, file_fill(*t.src_file, cx.s), std::move(landed));
  return true;
}

void move_sequential(const TransferContext& cx, Transfer& t, BulkWorker& w, std::atomic<uint64_t>& moved) {
  const BulkItem& item = *t.item;
  const MemoryTarget& mem = memory_of(t, w);
  const int64_t limit = t.size;  // -1: to the end of the source
  int64_t done = 0;
  for (;;) {
    fault::hold(cx.cancelled);  // tests only: disarmed, one relaxed load
    if (cx.cancelled.load(std::memory_order_relaxed)) return;
    size_t want = w.slot_size;
    if (limit >= 0) want = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(want), limit - done));
    if (want == 0) break;
    const int64_t pos = t.offset + done;
    // Get the next bytes somewhere the destination can take them from.
    const char* host = nullptr;  // the bytes in host memory, when they are there
    const char* landed = nullptr;
    size_t got;
    if (item.kind == BulkKind::write) {
      landed = reinterpret_cast<const char*>(item.buf) + done;
      got = want;
      if (!mem.device) host = landed;
    } else if (!t.src_sized) {
      // No size: read(2) front to back into host memory, then into place.
      char* into = mem.device ? w.host() : t.scratch ? w.staging() : reinterpret_cast<char*>(item.buf) + done;
      got = read_some(t.src_fd, into, want, pos, item.src, cx.cancelled);
      host = into;
      if (mem.device && item.kind == BulkKind::read) {
        char* dev = t.scratch ? w.staging() : reinterpret_cast<char*>(item.buf) + done;
        copy_to_device(mem, dev, into, got);
        landed = dev;
      } else {
        landed = into;
      }
    } else {
      char* into = t.scratch ? w.staging() : reinterpret_cast<char*>(item.buf) + done;
      got = read_chunk(cx, t, mem, into, pos, want);
      landed = into;
      if (!mem.device) host = into;
    }
    if (item.kind == BulkKind::read && cx.opt.verify && got > 0) verify_landed(t, mem, landed, pos, got);
    if (item.kind != BulkKind::read && got > 0) {
      if (t.in_place) {
        if (!host) {
          copy_to_host(mem, w.host(), landed, got);
          host = w.host();
        }
        write_all(t.dst_fd, host, got, done, t.dst, cx.cancelled);
      } else if (host && mem.device) {
        pwrite_full(t.dst_fd, host, got, done, t.dst);  // bytes of an unsized source, still in host memory
      } else {
        write_chunk(cx, t, mem, landed, done, got);
      }
    }
    done += static_cast<int64_t>(got);
    count_moved(t, w, moved, got);
    if (got < want) {
      if (t.src_sized && item.kind == BulkKind::copy) truncated(t, pos + static_cast<int64_t>(got));
      break;  // end of the source
    }
  }
  if (cx.cancelled.load(std::memory_order_relaxed)) return;  // the file ends as cancelled, however far it got
  if (item.kind == BulkKind::read && item.exact && limit >= 0 && done < limit)
    fail_state("'" + item.src + "' ended after " + std::to_string(done) + " bytes; " + std::to_string(limit) +
                   " were asked for",
               item.src);
}

namespace {

// With --verify, the destination's bytes read back against what was meant
// for it: the source's for a copy, the buffer's for a write.
void verify(const TransferContext& cx, Transfer& t) {
  if (!cx.opt.verify) return;
  if (t.item->kind == BulkKind::copy) verify_copy(t, cx.cancelled);
  if (t.item->kind == BulkKind::write) verify_written(t, cx.cancelled);
}

}  // namespace

void finish_data(const TransferContext& cx, Transfer& t, bool group) {
  const BulkItem& item = *t.item;
  if (item.kind == BulkKind::read) return;
  const bool sync = cx.opt.sync != BulkSync::none;
  if (t.in_place) {
    if (t.block_device && (sync || cx.opt.verify) && ::fsync(t.dst_fd) != 0)
      throw_os_error(errno, "cannot fsync", t.dst);
    if (t.block_device) verify(cx, t);
    return;
  }
  if (t.part) {
    // Its own fsync whatever the grouping: no batch renames a part.
    if ((sync || cx.opt.verify) && ::fsync(t.dst_fd) != 0) throw_os_error(errno, "cannot fsync", t.dst);
    t.synced = true;
    if (cx.opt.verify && item.kind == BulkKind::copy) verify_part(t, cx.cancelled);
    return;
  }
  if (t.cut_to_size && ::ftruncate(t.dst_fd, t.size) != 0) throw_os_error(errno, "cannot size", t.dst);
  if (t.chown) {
    // Not permitted (another owner, for a user other than root): the group
    // alone, else the copy stays this process's, as a new file would be.
    bool owner = true, group = true;
    if (::fchown(t.dst_fd, t.uid, t.gid) != 0) {
      owner = false;
      group = errno == EPERM && ::fchown(t.dst_fd, static_cast<uid_t>(-1), t.gid) == 0;
    }
    // As cp: a set-user-ID (set-group-ID) bit only for the owner (group) it
    // was set for. Kept for another, a user's program would run as root.
    if (!owner) t.mode &= ~static_cast<int>(S_ISUID);
    if (!group) t.mode &= ~static_cast<int>(S_ISGID);
    t.chmod = true;  // a change of owner clears the set-user-ID and set-group-ID bits
  }
  if (t.chmod && ::fchmod(t.dst_fd, static_cast<mode_t>(t.mode)) != 0)
    throw_os_error(errno, "cannot set the mode of", t.dst);
  if (t.set_times) {
    const struct timespec times[2] = {t.atime, t.mtime};
    if (::futimens(t.dst_fd, times) != 0) throw_os_error(errno, "cannot set the times of", t.dst);
  }
  // Grouped files are left to their batch's syncfs. (Starting each one's
  // writeback as it is written, with sync_file_range, cost more than it saved:
  // 5,000 small files on ext4 took longer, and more CPU, than one syncfs.)
  if (cx.opt.verify || (sync && !group)) {
    if (::fsync(t.dst_fd) != 0) throw_os_error(errno, "cannot fsync", t.dst);
    t.synced = true;
  }
  verify(cx, t);
}

}  // namespace gdscp::detail
