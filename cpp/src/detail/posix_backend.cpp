#include "gdscp/detail/posix_backend.hpp"

#include <algorithm>

#include "gdscp/detail/host_destination.hpp"
#include "gdscp/detail/mapped_read.hpp"
#include "gdscp/detail/posix_io.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/staging.hpp"
#include "gdscp/error.hpp"

namespace gdscp::detail {
namespace {

constexpr size_t kMappedMin = 1u << 20;  // below this mapping costs more than streaming saves

size_t reported(size_t bytes, Request* req) {
  if (req) req->add_progress(bytes);
  return bytes;
}

}  // namespace

size_t PosixBackend::read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s, Request* req) {
  if (mem.device) return staged_read(*file_, mem, base, work, s, req);
  size_t total = 0;
  Chunk c;
  // A fresh destination: this task maps its stripe of it first (the k-th task
  // to start, the k-th stripe), so that the pages fault on every worker at once
  // and the copies then run without faults (host_destination.hpp).
  if (mem.populate_bytes > 0) {
    const size_t workers = std::max<size_t>(work.workers(), 1);
    const size_t stripe = (mem.populate_bytes + workers - 1) / workers;
    const size_t from = (work.join() % workers) * stripe;
    if (from < mem.populate_bytes) populate_for_write(base + from, std::min(stripe, mem.populate_bytes - from));
  }
  while (work.next(c)) {
    const size_t got = read_host(base + c.buf_offset, c.size, c.file_offset, s, work.after(c));
    if (got < c.size) work.came_short(c, got);
    total += reported(got, req);
  }
  return total;
}

size_t PosixBackend::read_one(const MemoryTarget& mem, char* dst, size_t size, int64_t file_offset,
                              const Settings& s) {
  if (mem.device) return Backend::read_one(mem, dst, size, file_offset, s);
  return read_host(dst, size, file_offset, s);
}

size_t PosixBackend::write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings& s,
                           Request* req) {
  if (mem.device) return staged_write(*file_, mem, base, work, s, req);
  const size_t bounce = write_piece_size(s.bounce_buffer_size, work.chunk_size());
  size_t total = 0;
  Chunk c;
  while (work.next(c))
    total += reported(write_range(*file_, base + c.buf_offset, c.size, c.file_offset, s.direct_io, bounce), req);
  return total;
}

bool PosixBackend::append_whole(const MemoryTarget& mem, const char* base, size_t size) {
  if (mem.device || size >= kAtomicAppendMax) return false;
  append_write(*file_, base, size);
  return true;
}

size_t PosixBackend::read_host(char* dst, size_t size, int64_t off, const Settings& s, size_t ahead) {
  // Cached data goes straight from the page cache with streaming stores.
  size_t copied = 0;
  if (s.mapped_reads && s.direct_io != DirectIO::on && size >= kMappedMin &&
      mapped_read(file_->fd(), dst, size, off, file_->path(), copied))
    return copied;
  return read_range(*file_, dst, size, off, s.direct_io, s.bounce_buffer_size, ahead);
}

bool PosixBackend::submit_async(bool, const MemoryTarget&, void*, AsyncOp&, CUstream) { return false; }

size_t PosixBackend::async_result(const AsyncOp&) const {
  throw_state("gdscp's POSIX path queues no stream-ordered I/O");
}

}  // namespace gdscp::detail
