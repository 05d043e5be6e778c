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

// A worker claims a whole chunk and reads its pieces in order, so the kernel's
// readahead, started by one piece, has the next one on its way: on a cold file
// that is what keeps the disk busy. (Claiming single pieces in turn spread the
// last chunk's pieces over every worker, but each worker's next piece was then
// another worker's readahead: cold 2 GiB -> GPU fell from 1.71 to 1.50 GB/s,
// hot 4 GiB reads were the same within 0.1 GB/s; docs/benchmarks.md, fifth
// session.)
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

bool PieceStream::next(Chunk& out) {
  if (work_.cancelled()) return false;
  if (pos_ >= chunk_.size) {
    if (!work_.next(chunk_)) return false;
    pos_ = 0;
  }
  const size_t n = std::min(std::exchange(first_, piece_), chunk_.size - pos_);
  out = {chunk_.buf_offset + pos_, chunk_.file_offset + static_cast<int64_t>(pos_), n};
  pos_ += n;
  return true;
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
