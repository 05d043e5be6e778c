// Hot reads into host memory straight out of the page cache: map the range
// read-only, copy it with streaming stores (stream_copy.hpp), unmap. pread
// copies through the CPU cache and must first read every destination line it
// writes; the streaming copy does not. Hot 4 GiB file into host memory with 16
// threads on the host of an H200 with PCIe Gen5: 1.19-1.27 times pread's rate
// (docs/performance.md, mapped_reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gdscp::detail {

// Copies [off, off + size) of the regular file `fd` into `dst` if every page of
// the range is in the page cache. Returns true with `copied` set (short only at
// end of file) when it did; false, having changed nothing the caller relies on,
// when the file is not a regular file, cannot be mapped, is not wholly cached,
// or shrank during the copy (the SIGBUS is caught): the caller then reads with
// pread, which reports such cases properly. x86-64 only; elsewhere always false.
bool mapped_read(int fd, char* dst, size_t size, int64_t off, const std::string& path, size_t& copied);

// Copies `n` bytes out of a file mapping at `src` with streaming stores. On
// x86-64 a SIGBUS (a page past the end of a file that shrank) is caught: false,
// with `dst` holding part of the range. Elsewhere a plain memcpy, which such a
// page kills as it would any reader of a mapping.
bool copy_from_mapping(char* dst, const char* src, size_t n);

// memcpy under the same SIGBUS guard, for the copies between a caller's
// buffer and a staging buffer: the caller's pages may map a file cut short
// since, where pread and pwrite fail with EFAULT instead of faulting. False
// when a page faulted (`dst` then holds part of the range). Elsewhere than on
// x86-64, or where the guard cannot be set, a plain memcpy.
bool copy_guarded(char* dst, const char* src, size_t n);

// Bytes copied by mapped_read since the process started.
uint64_t mapped_read_bytes() noexcept;

// The mapping and the guarded copy that mapped_read is built from, for an
// explicit range: [off, off + n) of `fd`, mapped read-only for one copy. The
// range may reach past the end of the file; only copy_to() touches its pages.
class MappedRange {
 public:
  MappedRange(int fd, int64_t off, size_t n);
  ~MappedRange();
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;

  bool mapped() const noexcept { return map_ != nullptr; }
  // Whether every page of the range is in the page cache (mincore).
  bool cached() const;
  // Copies the range into `dst` with streaming stores under the SIGBUS guard.
  // False when a page of it is past the end of the file (the guard caught the
  // fault; `dst` then holds part of the range) or the guard could not be set.
  bool copy_to(char* dst) const;

 private:
  void* map_ = nullptr;
  size_t len_ = 0;   // mapped bytes: from the page holding `off` to its end
  size_t lead_ = 0;  // bytes of the first page before `off`
  size_t n_ = 0;
};

}  // namespace gdscp::detail
