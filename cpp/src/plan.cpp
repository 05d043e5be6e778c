#include "gdscp/plan.hpp"

#include <algorithm>

namespace gdscp {

std::vector<Chunk> split(int64_t file_offset, size_t size, size_t piece) {
  std::vector<Chunk> out;
  if (size == 0) return out;
  piece = std::max<size_t>(piece, 1);
  out.reserve((size + piece - 1) / piece);
  for (size_t done = 0; done < size; done += piece) {
    out.push_back({done, file_offset + static_cast<int64_t>(done), std::min(piece, size - done)});
  }
  return out;
}

// Pieces are claimed one at a time, so every worker's pipeline runs to the end
// of the request and they all finish together. (Claiming whole chunks left the
// request's last chunks to one worker each: up to a chunk read serially while
// the copy engine waited.) No piece is larger than the request's chunk size,
// so a medium request is still spread over the workers.
//
// For a large read, each worker's first piece is smaller, the k-th worker to
// start taking (k + 1) / workers of a piece (in 64 KiB steps): the first copies
// reach the copy engine after a fraction of a piece's read instead of a whole
// one, and the workers' later pieces arrive spread out rather than all at once.
// Hot 4 GiB file -> GPU on the H200 machine: docs/benchmarks.md (fourth session).
PieceStream::PieceStream(ChunkQueue& work, size_t piece, size_t chunk, bool stagger)
    : work_(work), piece_(std::max<size_t>(1, std::min(piece, chunk))), first_(piece_) {
  constexpr size_t kStaggerStep = 64u << 10;
  const size_t workers = work.workers();
  if (stagger && workers > 1 && work.bytes() >= 2 * workers * piece_) {
    const size_t k = work.join() % workers;
    first_ = std::min(piece_, round_up(piece_ * (k + 1) / workers, kStaggerStep));
  }
}

size_t effective_task_size(size_t size, size_t task_size, unsigned workers, size_t min_task) {
  task_size = std::max<size_t>(task_size, 1);
  if (workers <= 1 || size <= min_task) return std::min(task_size, std::max<size_t>(size, 1));
  const size_t share = round_up((size + workers - 1) / workers, 4096);
  return std::min(task_size, std::max(share, min_task));
}

AlignedSplit align_split(int64_t file_offset, size_t size, size_t alignment) {
  const size_t start = static_cast<size_t>(file_offset);
  const size_t end = start + size;
  const size_t a0 = round_up(start, alignment);
  const size_t a1 = round_down(end, alignment);
  if (a0 >= a1) return {size, 0, 0};
  return {a0 - start, a1 - a0, end - a1};
}

}  // namespace gdscp
