// Pure planning: how a request is cut into chunks and where O_DIRECT may
// apply. No threads, no atomics, no CUDA, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gdscp::detail {

struct Chunk {
  size_t buf_offset;    // from the start of the request's buffer
  int64_t file_offset;  // absolute
  size_t size;
};

// Cuts [file_offset, file_offset + size) into chunks of at most `chunk_size` bytes.
std::vector<Chunk> split(int64_t file_offset, size_t size, size_t chunk_size);

// The same range for `workers` workers that claim chunks as they go: chunks
// of `chunk_size`, except toward the end, where each is at most what is left
// over 2 * workers (whole pages), down to `tail_min`. With equal chunks to the
// end, a worker that takes the last one works on alone for up to a chunk's time
// while the others are done; with chunks that taper, the workers finish within
// about a `tail_min` chunk of each other.
std::vector<Chunk> split_tapered(int64_t file_offset, size_t size, size_t chunk_size, size_t workers,
                                 size_t tail_min);

// The chunk size a request actually uses: never above `task_size`; for a
// request that would otherwise run as few chunks, smaller ones (not below
// `min_task`) so that every worker gets a share.
size_t effective_task_size(size_t size, size_t task_size, unsigned workers, size_t min_task);

// A range split at `alignment` boundaries of the file: `head` unaligned bytes,
// then `middle` bytes that start and end on boundaries, then `tail`.
struct AlignedSplit {
  size_t head;
  size_t middle;
  size_t tail;
};
AlignedSplit align_split(int64_t file_offset, size_t size, size_t alignment);

constexpr size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
constexpr size_t round_down(size_t v, size_t a) { return v / a * a; }

}  // namespace gdscp::detail
