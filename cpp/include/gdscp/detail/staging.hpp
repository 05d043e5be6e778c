// Device memory through gdscp's POSIX path: pinned staging buffers between the
// file and the GPU. Each worker keeps a ring of `pipeline_depth` buffers, so
// its next piece is read (or written) while the copies of the pieces before it
// run on its own CUDA stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

// Fills `dst` with the `n` bytes of the source at `file_offset`; returns how
// many it got (fewer only at the source's end). `ahead`: with the first piece
// of a chunk, how many bytes of that chunk follow the piece (the same worker
// fills them next), else 0; a file's fill asks the disk for them with the
// piece where the data is cold (read_range).
using StageFill = std::function<size_t(char* dst, size_t n, int64_t file_offset, size_t ahead)>;

// Moves the chunks this worker claims from `work` into device memory at
// `base + chunk.buf_offset`: each piece `fill`ed into a staging buffer, then
// copied to the GPU while the next piece fills. Returns the bytes moved;
// `req`, when given, hears of them as they land.
size_t staged_upload(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req,
                     const StageFill& fill);

// The fill of a staged read from the file: each piece read with read_range.
StageFill file_fill(const File& f, const Settings& s);

// staged_upload from the file: each piece read with read_range.
size_t staged_read(const File& f, const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                   Request* req);

// Writes the chunks this worker claims from device memory: each piece copied
// into a staging buffer, then written to the file. All bytes or a throw.
size_t staged_write(const File& f, const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                    Request* req);

// A bulk worker's staging kept across the chunks and files it reads into
// device memory, so that it reads the next chunk (or file) while the copies
// of the ones before it run, where staged_upload drains its stream at the end
// of every call. Pieces go round a ring of `pipeline_depth` pinned buffers on
// the worker's stream; a buffer is waited for only when its turn comes again.
// Each chunk's `landed` runs exactly once, on the worker's thread, when the
// chunk's last copy has completed (or at once where it queued none), with the
// bytes read and the first error: the fill's, or the copy's. One thread uses a
// ring; drain() (and the destructor) waits for every copy and runs what is left.
class UploadRing {
 public:
  using Landed = std::function<void(size_t got, std::exception_ptr error)>;

  explicit UploadRing(const Settings& s);
  ~UploadRing();
  UploadRing(const UploadRing&) = delete;
  UploadRing& operator=(const UploadRing&) = delete;

  // Fills and queues the `n` bytes of the source at `file_offset` for device
  // memory `mem` at `dst`, stopping at a short fill (end of file). Never throws.
  void upload(const MemoryTarget& mem, char* dst, size_t n, int64_t file_offset, const StageFill& fill,
              Landed landed);
  // Waits for every queued copy and runs the callbacks still waiting. Never throws.
  void drain() noexcept;

 private:
  // The chunk whose last copy a slot holds (none: `landed` empty). A slot
  // takes a new chunk only once it has been waited for, so one is enough.
  struct Waiting {
    Landed landed;
    size_t got = 0;
    std::exception_ptr error;
  };
  void wait_slot(size_t k) noexcept;

  size_t depth_;
  size_t piece_;
  CUcontext ctx_ = nullptr;  // where the queued copies run (events are per context)
  int ordinal_ = -1;
  size_t next_ = 0;
  std::vector<BufferPool::Lease> bufs_;
  std::vector<char> busy_;
  std::vector<Waiting> waiting_;
  // The first copy error met since a chunk last landed. Slots are waited for
  // in the order their copies were queued, and a chunk's pieces are queued
  // one after another, so it belongs to the chunk whose last slot is waited
  // for next: a failed copy of any piece fails its chunk, not only the last.
  std::exception_ptr copy_error_;
};

// Makes, before any transfer needs them, what the workers' staged transfers
// to or from GPU `ordinal` would otherwise make inside the first one: each
// worker's stream and events under the GPU's primary context, and a
// pipeline's worth of pinned staging buffers (pipeline_depth of
// bounce_buffer_size, NUMA-placed near the GPU) for `workers` workers (0, or
// more than the pool has: the whole pool). The buffers are made on the
// workers, in parallel; this returns once they are all idle in the pool, or
// throws the first error. GPUs whose staging shares one pool (one NUMA node)
// add up: a second GPU's prepare stocks its share beside the first's.
void prepare_staging(int ordinal, const Settings& s, size_t workers);

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
