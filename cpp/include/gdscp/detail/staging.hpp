// Device memory through gdscp's POSIX path: pinned staging buffers between the
// file and the GPU. Each worker keeps a ring of `pipeline_depth` buffers, so
// its next piece is read (or written) while the copies of the pieces before it
// run on its own CUDA stream.
#pragma once

#include <cstddef>

#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

// Reads the chunks this worker claims from `work` into device memory at
// `base + chunk.buf_offset`: each piece from the file into a staging buffer,
// then copied to the GPU. Returns the bytes read; `req`, when given, hears of
// them as they land.
size_t staged_read(const File& f, const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                   Request* req);

// Writes the chunks this worker claims from device memory: each piece copied
// into a staging buffer, then written to the file. All bytes or a throw.
size_t staged_write(const File& f, const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                    Request* req);

// Blocking copies between host memory and device memory on this worker's
// stream, for the bytes that move front to back (read(2), write(2)) or are
// compared on the host (the bulk engine's verify).
void copy_to_device(const MemoryTarget& mem, char* dst, const void* src, size_t n);
void copy_to_host(const MemoryTarget& mem, void* dst, const char* src, size_t n);

}  // namespace gdscp::detail
