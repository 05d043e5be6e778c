// File ranges moved with pread/pwrite: the system call loops, and O_DIRECT for
// the aligned middle of a range where it is asked for. Errors are decoded here,
// once, and name the file and the offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gdscp/detail/file.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

// Loop over EINTR and short transfers. Reads stop early only at end of file;
// writes move every byte or throw.
size_t pread_full(int fd, void* buf, size_t size, int64_t offset, const std::string& path);
size_t pwrite_full(int fd, const void* buf, size_t size, int64_t offset, const std::string& path);

// Reads [off, off + size) of `f` into `dst`; fewer bytes only at end of file.
// With `direct` on, the aligned middle of a range of 1 MiB and more goes
// through the O_DIRECT descriptor (into `dst` if it is aligned, else through an
// aligned bounce of at most `bounce_size` bytes), the rest buffered.
//
// A buffered read of 1 MiB and more first takes what the page cache holds
// without waiting for the disk (RWF_NOWAIT). Where that comes short, the data
// is cold, and the rest of the range plus the `ahead` bytes after it (what
// the caller reads next, such as the rest of its chunk and the chunk after
// it) are asked of the disk at once (ask_disk) before the read waits for
// them: the kernel's own readahead of a large read fetches one window at a
// time, each after the one before has come in, and with it the workers kept
// fewer reads queued on the disk than it could take (docs/performance.md,
// cold reads).
size_t read_range(const File& f, char* dst, size_t size, int64_t off, DirectIO direct, size_t bounce_size,
                  size_t ahead = 0);

// Writes [off, off + size) of `f` from `src`, every byte or a throw. O_DIRECT
// for the aligned middle with `direct` on (1 MiB and more) or automatic (4 MiB
// and more), the rest buffered; `bounce_size` as for read_range.
size_t write_range(const File& f, const char* src, size_t size, int64_t off, DirectIO direct, size_t bounce_size);

// Appends from host memory below this size go as one O_APPEND write
// (append_write): atomic even against writers that do not take gdscp's lock.
constexpr size_t kAtomicAppendMax = 1u << 20;

// Appends `size` bytes of `src` to `f` (opened in append mode) with write()
// on its O_APPEND descriptor, under its AppendLock: every byte, or a throw
// with what the kernel took before the failure given back (File::release_written).
size_t append_write(const File& f, const char* src, size_t size);

// The piece a write moves through one bounce or staging buffer: whole chunks
// up to 64 MiB rather than bounce-buffer-sized pieces, since the disk, not host
// memory, limits writes, and it prefers large requests.
size_t write_piece_size(size_t bounce_buffer_size, size_t chunk_size);

}  // namespace gdscp::detail
