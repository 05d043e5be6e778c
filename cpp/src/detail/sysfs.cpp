#include "gdscp/detail/sysfs.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace gdscp::detail {

std::string sysfs_root() {
  const char* root = std::getenv("GDSCP_SYSFS_ROOT");
  return root && *root ? root : "/sys";
}

// Plain read(2), not iostreams: a Python process may hold another C++ runtime
// whose locale facets the extension's stream parsing crashed on.
std::string first_word(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return {};
  std::string text(buf, static_cast<size_t>(n));
  const size_t begin = text.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return {};
  const size_t end = text.find_first_of(" \t\n", begin);
  return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace gdscp::detail
