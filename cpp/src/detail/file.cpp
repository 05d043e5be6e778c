#include "gdscp/detail/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "gdscp/error.hpp"

namespace gdscp::detail {

OpenMode parse_open_mode(std::string_view mode) {
  OpenMode m;
  int primary = 0;
  bool plus = false;
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
      case 'b':
        break;
      default:
        throw_invalid("invalid file flags '" + std::string(mode) +
                      "': use one of r, w, a, x, optionally with '+' (as Python's open())");
    }
  }
  if (primary != 1)
    throw_invalid("invalid file flags '" + std::string(mode) +
                  "': need exactly one of r, w, a, x, optionally with '+' (as Python's open())");
  switch (kind) {
    case 'r': m.readable = true; break;
    case 'w': m.writable = true; m.flags = O_CREAT | O_TRUNC; break;
    case 'x': m.writable = true; m.flags = O_CREAT | O_EXCL; break;
    case 'a': m.writable = true; m.append = true; m.flags = O_CREAT; break;
  }
  if (plus) m.readable = m.writable = true;
  m.flags |= (m.readable && m.writable) ? O_RDWR : (m.writable ? O_WRONLY : O_RDONLY);
  m.flags |= O_CLOEXEC;
  return m;
}

File::File(std::string path, std::string_view mode) : path_(std::move(path)), mode_(parse_open_mode(mode)) {
  do {
    fd_ = ::open(path_.c_str(), mode_.flags, 0666);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) throw_os_error(errno, "cannot open", path_);

  struct stat st{};
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    throw_os_error(err, "cannot stat", path_);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd_);
    throw_os_error(EISDIR, "cannot open", path_);
  }
  // The second descriptor must not create or truncate again.
  const int direct_flags = (mode_.flags & ~(O_CREAT | O_TRUNC | O_EXCL)) | O_DIRECT;
  direct_fd_ = ::open(path_.c_str(), direct_flags);
  if (direct_fd_ < 0) direct_fd_ = -1;  // tmpfs and friends: buffered I/O only
  if (mode_.append) append_end_ = st.st_size;
}

File::~File() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

int File::open_flags() const { return ::fcntl(fd_, F_GETFL); }

int64_t File::size() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) throw_os_error(errno, "cannot stat", path_);
  return st.st_size;
}

int64_t File::reserve_append(size_t n) {
  std::lock_guard<std::mutex> lock(append_mutex_);
  // Another process may have appended since: never write below the real end.
  const int64_t start = std::max(append_end_, size());
  append_end_ = start + static_cast<int64_t>(n);
  return start;
}

void File::require_readable() const {
  if (!mode_.readable) throw_os_error(EBADF, "file not open for reading:", path_);
}

void File::require_writable() const {
  if (!mode_.writable) throw_os_error(EBADF, "file not open for writing:", path_);
}

}  // namespace gdscp::detail
