#include "gdscp/page_cache.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "gdscp/detail/file.hpp"
#include "gdscp/error.hpp"

namespace gdscp {
namespace {

// The range is mapped a window at a time, so that a huge file needs neither a
// huge mapping nor a huge residency vector.
constexpr size_t kWindow = size_t{1} << 30;

}  // namespace

PageCacheInfo page_cache_info(int fd, int64_t offset, size_t length, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw_os_error(errno, "cannot stat", path);
  const auto file_size = static_cast<uint64_t>(detail::content_size(fd, st, path));
  const auto start = static_cast<uint64_t>(offset);
  if (start >= file_size) return {};
  const uint64_t end = length == 0 || length > file_size - start ? file_size : start + length;  // no wrap-around
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = start / page * page;
  PageCacheInfo info;
  info.total_pages = static_cast<size_t>((end - first + page - 1) / page);
  std::vector<unsigned char> resident;
  for (uint64_t at = first; at < end; at += kWindow) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kWindow, end - at));
    void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(at));
    if (map == MAP_FAILED) throw_os_error(errno, "cannot map", path, static_cast<int64_t>(at));
    resident.resize((len + page - 1) / page);
    const int rc = ::mincore(map, len, resident.data());
    const int err = errno;
    ::munmap(map, len);
    if (rc != 0) throw_os_error(err, "mincore on", path, static_cast<int64_t>(at));
    info.cached_pages += static_cast<size_t>(std::count_if(resident.begin(), resident.end(),
                                                           [](unsigned char r) { return (r & 1) != 0; }));
  }
  return info;
}

}  // namespace gdscp
