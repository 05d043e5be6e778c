// What of a file the page cache holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gdscp {

struct PageCacheInfo {
  size_t cached_pages = 0;
  size_t total_pages = 0;
};

// The pages of [offset, offset + length) of the file open as `fd` (length 0:
// to the end of the file; the range is clamped to the file and widened to
// whole pages), and how many of them the page cache holds. Nothing past the
// end of the file: (0, 0). `path` names the file in errors. The kernel
// reports pages as cached only for files the caller owns or may write
// (mincore(2)); for others every page reads as not cached.
PageCacheInfo page_cache_info(int fd, int64_t offset, size_t length, const std::string& path);

}  // namespace gdscp
