// Device memory through gdscp's POSIX path: pinned staging buffers between the
// file and the GPU. Each worker keeps a ring of `pipeline_depth` buffers, so
// its next piece is read (or written) while the copies of the pieces before it
// run on its own CUDA stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

// Fills `dst` with the `n` bytes of the source at `file_offset`; returns how
// many it got (fewer only at the source's end).
using StageFill = std::function<size_t(char* dst, size_t n, int64_t file_offset)>;

// Moves the chunks this worker claims from `work` into device memory at
// `base + chunk.buf_offset`: each piece `fill`ed into a staging buffer, then
// copied to the GPU while the next piece fills. Returns the bytes moved;
// `req`, when given, hears of them as they land.
size_t staged_upload(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req,
                     const StageFill& fill);

// staged_upload from the file: each piece read with read_range.
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

// A blocking copy of `n` bytes from one GPU's memory to another's
// (cuMemcpyPeerAsync on the source's stream): over NVLink or PCIe peer to peer
// where peer access is enabled, else staged through host memory by the driver.
void copy_peer(const MemoryTarget& dst_mem, char* dst, const MemoryTarget& src_mem, const char* src, size_t n);

}  // namespace gdscp::detail
