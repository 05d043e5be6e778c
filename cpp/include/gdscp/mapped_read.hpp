// Hot reads into host memory straight out of the page cache: map the range
// read-only, copy it with streaming (non-temporal) stores, unmap. pread copies
// through the cache and must first read every destination line it writes; the
// streaming copy does not, which is a third less memory traffic. Hot 4 GiB
// file into host memory on the H200 machine, 16 threads: 55-58 GB/s against
// 43-46 with pread (docs/benchmarks.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gdscp {

// Copies [off, off + size) of the regular file `fd` into `dst` if every page of
// the range is in the page cache. Returns true with `copied` set (short only at
// end of file) when it did; false, having changed nothing the caller relies on,
// when the file is not a regular file, cannot be mapped, is not wholly cached,
// or shrank during the copy (the SIGBUS is caught): the caller then reads with
// pread, which reports such cases properly. x86-64 only; elsewhere always false.
bool mapped_read(int fd, char* dst, size_t size, int64_t off, const std::string& path, size_t& copied);

// Bytes copied by mapped_read since the process started (for tests and `gdscp info`).
uint64_t mapped_read_bytes() noexcept;

// The copy mapped_read uses: streaming stores on x86-64, memcpy elsewhere.
// Also the benchmark's host-memory ceiling (the best copy this machine does).
void stream_copy(char* dst, const char* src, size_t n) noexcept;

}  // namespace gdscp
