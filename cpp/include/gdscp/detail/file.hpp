// The descriptors behind a CuFile: a buffered descriptor opened as Python's
// open() would, plus an O_DIRECT descriptor where the filesystem allows one
// (and, in append mode, a buffered one without O_APPEND for positioned
// writes), and the reservation of appended ranges. No I/O policy lives here.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace gdscp::detail {

struct OpenMode {
  int flags = 0;          // open(2) flags for the buffered descriptor
  bool readable = false;
  bool writable = false;
  bool append = false;    // "a": every write lands at the current end of the file (flags hold O_APPEND)
};

// Parses Python open() modes: exactly one of r/w/a/x, optionally '+', optionally 'b'.
OpenMode parse_open_mode(std::string_view mode);

// The bytes the file open as `fd` holds, `st` being its fstat: st_size, but
// for a block device, whose st_size is 0, the device's size (asked without
// moving the descriptor's offset). `path` names the file in errors.
int64_t content_size(int fd, const struct stat& st, const std::string& path);

class File {
 public:
  // `deferred`: the open may still fail after this (its backend is chosen
  // next), so "w" does not truncate yet, and a file the open creates is
  // noted: commit() then truncates, discard() removes the created file.
  File(std::string path, std::string_view mode, bool deferred = false);
  // Read-only, of `fd` (which it takes): a regular file or block device
  // opened already as `path`. Its O_DIRECT twin is opened through the
  // descriptor, not the path, so the File reads the file `fd` is, whatever
  // has been renamed over `path` since.
  File(std::string path, int fd);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_; }
  int direct_fd() const noexcept { return direct_fd_; }  // -1 where O_DIRECT is refused
  // For pwrite: fd() but in append mode, where fd() has O_APPEND, with which
  // Linux's pwrite ignores the offset and appends.
  int write_fd() const noexcept { return write_fd_; }
  const OpenMode& mode() const noexcept { return mode_; }
  int open_flags() const;  // fcntl(F_GETFL) of the buffered descriptor

  int64_t size() const;    // current size from fstat

  // Held while an append takes its place at the end of the file: this
  // File's mutex (threads sharing the handle) and an exclusive flock() on the
  // file (other handles, other processes). Every gdscp append takes it.
  class AppendLock {
   public:
    explicit AppendLock(const File& f);
    ~AppendLock();
    AppendLock(const AppendLock&) = delete;
    AppendLock& operator=(const AppendLock&) = delete;

   private:
    std::lock_guard<std::mutex> mutex_;
    int locked_fd_ = -1;
  };

  // Append mode: reserves [start, start + n) at the true end of the file and
  // returns start. Under the AppendLock the file is extended over the range
  // (fallocate, or ftruncate where the filesystem has no fallocate), so any
  // later append, from this handle, another or another process, lands after
  // it, and the tasks of this one can then write into it in parallel (through
  // write_fd() and direct_fd()).
  int64_t reserve_append(size_t n);
  // Gives back the range reserve_append(n) returned `start` for, once the
  // write into it failed or was cancelled: the file is cut back to `start`,
  // as it was before the append, if it still ends where the range does.
  // A range that a later one of this File's appends still holds in flight
  // is cut with it if that one is given back too (appends that fail in
  // turn leave the file as it was, in whatever order they end). Where a
  // later append has landed after it, the range stays (as zeros where it
  // was not written): cutting it would take that append too. Best effort,
  // never throws.
  void release_append(int64_t start, size_t n) const noexcept;
  // The range reserve_append returned `start` for stays: written whole.
  void keep_append(int64_t start) const noexcept;
  // An append that went straight to the end through fd() (O_APPEND, no range
  // reserved) under `lock` and failed after its first `n` bytes landed at
  // `start`: they are given back as release_append gives back a range, so
  // the file is as it was unless another append has landed after them.
  void release_written(const AppendLock& lock, int64_t start, size_t n) const noexcept;

  void require_readable() const;
  void require_writable() const;

  // For a deferred open: the truncation "w" asks for, once nothing else can fail.
  void commit();
  // For a deferred open that failed after all: removes the file where this
  // open created it (and the path still names it), so a failed open leaves
  // the filesystem as it was.
  void discard() noexcept;

 private:
  // A FIFO or socket has no offsets: refused (ESPIPE) as it is opened.
  [[noreturn]] void refuse_unseekable(const struct stat& st) const;
  // The O_DIRECT twin of fd_ (`st` its fstat), opened as `name`: kept only
  // if it is of the same file, else (or where refused) -1.
  void open_direct(const std::string& name, const struct stat& st);
  // Under the AppendLock: [start, start + n) is given back; the file is cut
  // while it ends where a range given back does. Throws where fstat fails.
  void give_back(int64_t start, size_t n) const;
  // Under append_mutex_: forgets the ranges given back that no range still
  // held can cut with it.
  void forget_uncuttable() const noexcept;

  std::string path_;
  OpenMode mode_;
  int fd_ = -1;
  int direct_fd_ = -1;
  int write_fd_ = -1;  // fd_, or its O_APPEND-free twin in append mode
  bool created_ = false;          // a deferred open made the file
  bool truncate_pending_ = false;  // a deferred "w" open: commit() truncates
  mutable std::mutex append_mutex_;
  // Under append_mutex_: the starts of the ranges reserved and not yet kept
  // or given back, and the ranges given back that one of those, ending in
  // turn, may still cut with it (end -> start).
  mutable std::set<int64_t> held_;
  mutable std::map<int64_t, int64_t> given_back_;
};

}  // namespace gdscp::detail
