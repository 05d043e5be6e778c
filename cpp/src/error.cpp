#include "gdscp/error.hpp"

#include <cstring>

namespace gdscp {

void throw_os_error(int err, std::string_view what, const std::string& path, int64_t offset) {
  std::string msg(what);
  if (!path.empty()) msg += " '" + path + "'";
  if (offset >= 0) msg += " at offset " + std::to_string(offset);
  msg += ": ";
  msg += std::strerror(err);
  msg += " (errno " + std::to_string(err) + ")";
  throw Error(ErrorKind::os, err, msg, path, offset);
}

void throw_invalid(const std::string& message) {
  throw Error(ErrorKind::invalid, 0, message);
}

void throw_state(const std::string& message) {
  throw Error(ErrorKind::state, 0, message);
}

void throw_range(const std::string& message) {
  throw Error(ErrorKind::range, 0, message);
}

}  // namespace gdscp
