// A file read through a memory mapping (gdscp.Mmap, after KvikIO's Mmap): a
// region mapped read-only once, at open, and copied out of by each read: into
// host memory directly, into device memory through pinned staging buffers. A
// read of pages the file no longer has (it shrank since) is an error, not a
// crash, where the engine can catch the SIGBUS (x86-64).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "gdscp/future.hpp"
#include "gdscp/settings.hpp"

namespace gdscp {

namespace detail {
struct Mapping;
}

class MappedFile {
 public:
  // Opens `path` with Python open() `flags` ("r" or "r+": reading only, the
  // file must exist) and maps [map_offset, map_offset + map_size) of it
  // (map_size none: to the end of the file) with mmap(2) `map_flags`. A region
  // outside the file is a range error, an empty one (map_size 0) invalid.
  MappedFile(std::string path, std::string_view flags, std::optional<size_t> map_size, int64_t map_offset,
             int map_flags);

  void close();
  bool closed() const;
  const std::string& path() const noexcept { return path_; }
  size_t file_size() const;  // the file's size now; 0 once closed
  size_t map_size() const;   // 0 once closed
  int64_t map_offset() const;

  // Throws what read() would for [offset, offset + size): closed, past the end
  // of the file, outside the mapped region.
  void check(size_t size, int64_t offset) const { checked(size, offset); }

  // Copies [offset, offset + size) of the file, which must lie in the mapped
  // region, to `buf` (device or host memory): on the calling thread, or in
  // parallel on the process's pool.
  size_t read(uintptr_t buf, bool device, size_t size, int64_t offset, const Settings& s);
  std::unique_ptr<Future> pread(uintptr_t buf, bool device, size_t size, int64_t offset, const Settings& s);

 private:
  std::shared_ptr<const detail::Mapping> state() const;  // throws once closed
  std::shared_ptr<const detail::Mapping> checked(size_t size, int64_t offset) const;

  mutable std::mutex mutex_;
  std::shared_ptr<const detail::Mapping> map_;
  std::string path_;
};

}  // namespace gdscp
