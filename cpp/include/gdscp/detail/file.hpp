// The descriptor pair behind a CuFile: a buffered descriptor opened as Python's
// open() would, plus an O_DIRECT descriptor where the filesystem allows one.
// No I/O policy lives here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace gdscp::detail {

struct OpenMode {
  int flags = 0;          // open(2) flags for the buffered descriptor
  bool readable = false;
  bool writable = false;
  bool append = false;    // "a": every write lands at the current end of the file
};

// Parses Python open() modes: exactly one of r/w/a/x, optionally '+', optionally 'b'.
OpenMode parse_open_mode(std::string_view mode);

class File {
 public:
  File(std::string path, std::string_view mode);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const noexcept { return path_; }
  int fd() const noexcept { return fd_; }
  int direct_fd() const noexcept { return direct_fd_; }  // -1 where O_DIRECT is refused
  const OpenMode& mode() const noexcept { return mode_; }
  int open_flags() const;  // fcntl(F_GETFL) of the buffered descriptor

  int64_t size() const;    // current size from fstat

  // For append mode: reserves [start, start + n) at the end of the file and
  // returns start, so that parallel tasks of one append never interleave with
  // another append through this handle.
  int64_t reserve_append(size_t n);

  void require_readable() const;
  void require_writable() const;

 private:
  std::string path_;
  OpenMode mode_;
  int fd_ = -1;
  int direct_fd_ = -1;
  std::mutex append_mutex_;
  int64_t append_end_ = -1;
};

}  // namespace gdscp::detail
