// Typed errors: every failure carries what failed, where (path, offset) and why.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gdscp {

enum class ErrorKind {
  os,       // an OS call failed; code() is the errno
  cuda,     // a CUDA driver call failed; code() is the CUresult
  cufile,   // a cuFile call failed; code() is the CUfileOpError
  invalid,  // the caller passed something unusable (maps to ValueError)
  state,    // the object is not in a state for this call (a missing library)
  range,    // a position outside what the object covers (maps to IndexError)
  closed,   // I/O on a closed file (maps to an error that is ValueError and RuntimeError)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, int code, const std::string& message, std::string path = {},
        int64_t offset = -1)
      : std::runtime_error(message), kind_(kind), code_(code), path_(std::move(path)),
        offset_(offset) {}

  ErrorKind kind() const noexcept { return kind_; }
  int code() const noexcept { return code_; }
  const std::string& path() const noexcept { return path_; }
  int64_t offset() const noexcept { return offset_; }

 private:
  ErrorKind kind_;
  int code_;
  std::string path_;
  int64_t offset_;
};

// "<what> '<path>' at offset <offset>: <strerror> (errno N)"
[[noreturn]] void throw_os_error(int err, std::string_view what, const std::string& path,
                                 int64_t offset = -1);
[[noreturn]] void throw_invalid(const std::string& message);
[[noreturn]] void throw_state(const std::string& message);
[[noreturn]] void throw_range(const std::string& message);

}  // namespace gdscp
