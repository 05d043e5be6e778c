#include "gdscp/detail/file.hpp"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "gdscp/error.hpp"

namespace gdscp::detail {

OpenMode parse_open_mode(std::string_view mode) {
  OpenMode m;
  int primary = 0;
  bool plus = false;
  bool binary = false;
  bool text = false;
  char kind = 0;
  for (char c : mode) {
    switch (c) {
      case 'r': case 'w': case 'a': case 'x':
        ++primary;
        kind = c;
        break;
      case '+':
        if (plus) primary = 99;  // "++" is as invalid as in open()
        plus = true;
        break;
      case 'b':  // the bytes move as they are either way: "b" and "t" (open()'s default) change nothing
        if (binary) primary = 99;  // "bb" is as invalid as in open()
        binary = true;
        break;
      case 't':
        if (text) primary = 99;
        text = true;
        break;
      default:
        throw_invalid("invalid file flags '" + std::string(mode) +
                      "': use one of r, w, a, x, optionally with '+' (as Python's open())");
    }
  }
  if (binary && text)
    throw_invalid("invalid file flags '" + std::string(mode) + "': 'b' and 't' together (as Python's open())");
  if (primary != 1)
    throw_invalid("invalid file flags '" + std::string(mode) +
                  "': need exactly one of r, w, a, x, optionally with '+' (as Python's open())");
  switch (kind) {
    case 'r': m.readable = true; break;
    case 'w': m.writable = true; m.flags = O_CREAT | O_TRUNC; break;
    case 'x': m.writable = true; m.flags = O_CREAT | O_EXCL; break;
    case 'a': m.writable = true; m.append = true; m.flags = O_CREAT | O_APPEND; break;
  }
  if (plus) m.readable = m.writable = true;
  m.flags |= (m.readable && m.writable) ? O_RDWR : (m.writable ? O_WRONLY : O_RDONLY);
  m.flags |= O_CLOEXEC;
  return m;
}

namespace {

// The flags of a descriptor opened again beside the first: it must not
// create or truncate again, and it writes at the offsets it is given.
int again_flags(const OpenMode& mode) { return mode.flags & ~(O_CREAT | O_TRUNC | O_EXCL | O_APPEND); }

// Whether `fd` is of the file whose fstat is `st`. A descriptor opened by
// the path again must be: one renamed over the path (or a link redirected)
// between the opens would get some of the bytes.
bool same_file(int fd, const struct stat& st) {
  struct stat other{};
  return ::fstat(fd, &other) == 0 && other.st_dev == st.st_dev && other.st_ino == st.st_ino;
}

}  // namespace

File::File(std::string path, std::string_view mode, bool deferred)
    : path_(std::move(path)), mode_(parse_open_mode(mode)) {
  // Without blocking: a FIFO would wait here for its other end, in a call no
  // Ctrl-C can end. (O_NONBLOCK also refuses a file under a lease another
  // process holds: that open is made again, blocking, as open() would.)
  auto open_as = [this](int flags) {
    auto open_once = [this](int f) {
      int fd;
      do {
        // A new file gets 0644 less the umask, as with KvikIO's FileHandle (not
        // open()'s 0666: a umask of 0 or 002 would leave it writable by others).
        fd = ::open(path_.c_str(), f, 0644);
      } while (fd < 0 && errno == EINTR);
      return fd;
    };
    int fd = open_once(flags | O_NONBLOCK);
    if (fd < 0 && errno == EWOULDBLOCK) fd = open_once(flags);
    return fd;
  };
  if (!deferred) {
    fd_ = open_as(mode_.flags);
  } else {
    truncate_pending_ = (mode_.flags & O_TRUNC) != 0;
    const int flags = mode_.flags & ~O_TRUNC;
    if (!(flags & O_CREAT)) {
      fd_ = open_as(flags);
    } else if (flags & O_EXCL) {
      fd_ = open_as(flags);
      created_ = fd_ >= 0;
    } else {
      // Made here, or there already: known for discard().
      fd_ = open_as(flags | O_EXCL);
      created_ = fd_ >= 0;
      if (fd_ < 0 && errno == EEXIST) fd_ = open_as(flags & ~O_CREAT);
      // Gone meanwhile, or a dangling symbolic link (O_EXCL does not follow
      // it): opened as asked, and left in place should the open fail.
      if (fd_ < 0 && errno == ENOENT) fd_ = open_as(flags);
    }
    if (created_) truncate_pending_ = false;
  }
  struct stat st{};
  if (fd_ < 0) {
    const int err = errno;
    // A FIFO opened to write, with no reader, fails with ENXIO at once.
    if (err == ENXIO && ::stat(path_.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)) refuse_unseekable(st);
    throw_os_error(err, "cannot open", path_);
  }
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    throw_os_error(err, "cannot stat", path_);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    throw_os_error(EISDIR, "cannot open", path_);
  }
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    ::close(fd_);
    refuse_unseekable(st);
  }
  // Blocking from here on (a character device's reads wait for data), with
  // the status flags it was asked for (F_SETFL takes those of mode_.flags,
  // O_APPEND among them, and ignores the rest).
  ::fcntl(fd_, F_SETFL, mode_.flags);
  open_direct(path_, st);
  write_fd_ = fd_;
  if (mode_.append) {
    write_fd_ = ::open(path_.c_str(), again_flags(mode_));
    const int err = errno;
    const bool replaced = write_fd_ >= 0 && !same_file(write_fd_, st);
    if (write_fd_ < 0 || replaced) {
      if (write_fd_ >= 0) ::close(write_fd_);
      write_fd_ = -1;
      discard();
      if (direct_fd_ >= 0) ::close(direct_fd_);
      ::close(fd_);
      fd_ = -1;
      if (replaced) throw_state("'" + path_ + "' was replaced while it was being opened");
      throw_os_error(err, "cannot open", path_);
    }
  }
}

File::File(std::string path, int fd) : path_(std::move(path)), mode_(parse_open_mode("r")), fd_(fd) {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw_os_error(err, "cannot stat", path_);
  }
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw_os_error(EINVAL, "not a regular file or block device:", path_);
  }
  ::fcntl(fd_, F_SETFL, mode_.flags);
  // /proc/self/fd/N opens the file the descriptor is, renamed or not; only
  // where /proc is not mounted is the path tried (and kept if the same file).
  open_direct("/proc/self/fd/" + std::to_string(fd_), st);
  if (direct_fd_ < 0 && errno == ENOENT) open_direct(path_, st);
  write_fd_ = fd_;
}

void File::open_direct(const std::string& name, const struct stat& st) {
  direct_fd_ = ::open(name.c_str(), again_flags(mode_) | O_DIRECT);
  if (direct_fd_ >= 0 && !same_file(direct_fd_, st)) {
    ::close(direct_fd_);
    direct_fd_ = -1;
    errno = ESTALE;  // another file: not ENOENT, which would have the path tried
  }
  if (direct_fd_ < 0) direct_fd_ = -1;  // tmpfs and friends (or a file replaced meanwhile): buffered I/O only
}

void File::refuse_unseekable(const struct stat& st) const {
  throw_os_error(ESPIPE,
                 S_ISFIFO(st.st_mode) ? "cannot open a FIFO (a CuFile reads and writes at offsets, which it has not)"
                                      : "cannot open a socket (a CuFile reads and writes at offsets, which it has not)",
                 path_);
}

void File::commit() {
  created_ = false;  // the file is the handle's now, whoever made it
  if (!truncate_pending_) return;
  truncate_pending_ = false;
  // As O_TRUNC: regular files only (a device or a FIFO is left alone).
  struct stat st{};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) return;
  int r;
  do {
    r = ::ftruncate(fd_, 0);
  } while (r != 0 && errno == EINTR);
  if (r != 0) throw_os_error(errno, "cannot truncate", path_);
}

void File::discard() noexcept {
  if (!created_) return;
  created_ = false;
  struct stat mine{}, named{};
  if (::fstat(fd_, &mine) == 0 && ::lstat(path_.c_str(), &named) == 0 && mine.st_dev == named.st_dev &&
      mine.st_ino == named.st_ino)
    ::unlink(path_.c_str());
}

File::~File() {
  if (write_fd_ >= 0 && write_fd_ != fd_) ::close(write_fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

int64_t content_size(int fd, const struct stat& st, const std::string& path) {
  if (!S_ISBLK(st.st_mode)) return st.st_size;
  uint64_t bytes = 0;
  if (::ioctl(fd, BLKGETSIZE64, &bytes) != 0) throw_os_error(errno, "cannot find the size of", path);
  return static_cast<int64_t>(bytes);
}

int File::open_flags() const { return ::fcntl(fd_, F_GETFL); }

int64_t File::size() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) throw_os_error(errno, "cannot stat", path_);
  return st.st_size;
}

File::AppendLock::AppendLock(const File& f) : mutex_(f.append_mutex_) {
  int r;
  do {
    r = ::flock(f.fd_, LOCK_EX);
  } while (r != 0 && errno == EINTR);
  if (r == 0) {
    locked_fd_ = f.fd_;
    return;
  }
  // A filesystem without locks: appends through this handle still take turns
  // (the mutex); others are as safe as O_APPEND is there.
  if (errno != ENOLCK && errno != EOPNOTSUPP && errno != EINVAL) throw_os_error(errno, "cannot lock", f.path_);
}

File::AppendLock::~AppendLock() {
  if (locked_fd_ >= 0) ::flock(locked_fd_, LOCK_UN);
}

int64_t File::reserve_append(size_t n) {
  const AppendLock lock(*this);
  const int64_t start = size();
  const int64_t end = start + static_cast<int64_t>(n);
  // fallocate never shrinks the file, even if a writer that ignores the lock
  // appended since size(), and it fails cleanly when the disk is full.
  int r;
  do {
    r = ::fallocate(write_fd_, 0, start, static_cast<off_t>(n));
  } while (r != 0 && errno == EINTR);
  if (r != 0 && (errno == ENODEV || errno == ESPIPE)) return start;  // not a regular file: no end to reserve
  if (r != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
    do {
      r = ::ftruncate(write_fd_, end);
    } while (r != 0 && errno == EINTR);
  }
  if (r != 0) throw_os_error(errno, "cannot reserve " + std::to_string(n) + " bytes to append to", path_, start);
  held_.insert(start);
  return start;
}

void File::keep_append(int64_t start) const noexcept {
  const std::lock_guard<std::mutex> lock(append_mutex_);
  held_.erase(start);
  // What was given back before a range that stays can no longer be cut.
  given_back_.erase(given_back_.begin(), given_back_.upper_bound(start));
}

void File::release_append(int64_t start, size_t n) const noexcept {
  try {
    const AppendLock lock(*this);
    give_back(start, n);
  } catch (...) {
    // The lock or fstat refused: the range stays, as it would after a crash.
  }
  const std::lock_guard<std::mutex> lock(append_mutex_);
  held_.erase(start);
  forget_uncuttable();
}

void File::release_written(const AppendLock&, int64_t start, size_t n) const noexcept {
  // The AppendLock holds append_mutex_ too. Nothing was reserved, so nothing
  // is held: what is given back is at the end, after every range held.
  try {
    give_back(start, n);
  } catch (...) {
    // fstat refused: the bytes stay, as they would after a crash.
  }
  forget_uncuttable();
}

void File::give_back(int64_t start, size_t n) const {
  given_back_.emplace(start + static_cast<int64_t>(n), start);
  // Cut the file back while its end is that of a range given back: this
  // one, then any given back earlier while this one was still held.
  for (auto it = given_back_.find(size()); it != given_back_.end(); it = given_back_.find(size())) {
    int r;
    do {
      r = ::ftruncate(write_fd_, it->second);
    } while (r != 0 && errno == EINTR);
    if (r != 0) break;
    given_back_.erase(it);
  }
}

void File::forget_uncuttable() const noexcept {
  // Only a range still held can cut those given back before it.
  const int64_t last_held = held_.empty() ? -1 : *held_.rbegin();
  given_back_.erase(given_back_.upper_bound(last_held), given_back_.end());
}

void File::require_readable() const {
  if (!mode_.readable) throw_os_error(EBADF, "file not open for reading:", path_);
}

void File::require_writable() const {
  if (!mode_.writable) throw_os_error(EBADF, "file not open for writing:", path_);
}

}  // namespace gdscp::detail
