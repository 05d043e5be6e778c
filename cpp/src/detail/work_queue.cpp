#include "gdscp/detail/work_queue.hpp"

#include <algorithm>
#include <utility>

namespace gdscp::detail {

// A worker claims a whole chunk and reads its pieces in order, so the kernel's
// readahead, started by one piece, has the next one on its way: on a cold file
// that is what keeps the disk busy. (Claiming single pieces in turn would
// spread the last chunk's pieces over every worker, but each worker's next
// piece would then be another worker's readahead: cold reads slow down.)
//
// For a large read, each worker's first piece is smaller, the k-th worker to
// start taking (k + 1) / workers of a piece (in 64 KiB steps): the first copies
// reach the copy engine after a fraction of a piece's read instead of a whole
// one, and the workers' later pieces arrive spread out rather than all at once.
PieceStream::PieceStream(ChunkQueue& work, size_t piece, bool stagger)
    : work_(work), piece_(std::max<size_t>(1, std::min(piece, work.chunk_size()))), first_(piece_) {
  constexpr size_t kStaggerStep = 64u << 10;
  const size_t workers = work.workers();
  if (stagger && workers > 1 && work.bytes() >= 2 * workers * piece_) {
    const size_t k = work.join() % workers;
    first_ = std::min(piece_, round_up(piece_ * (k + 1) / workers, kStaggerStep));
  }
}

bool PieceStream::next(Chunk& out) {
  if (pos_ < chunk_.size) {
    const bool stop = work_.cancelled();
    if (stop || chunk_.buf_offset + pos_ >= work_.end()) {
      if (stop) work_.cancelled_at(chunk_, pos_); else work_.came_short(chunk_, pos_);
      pos_ = chunk_.size;
      return false;
    }
  }
  started_ = pos_ >= chunk_.size;
  if (started_) {
    if (!work_.next(chunk_)) return false;
    pos_ = 0;
  }
  const size_t n = std::min(std::exchange(first_, piece_), chunk_.size - pos_);
  out = {chunk_.buf_offset + pos_, chunk_.file_offset + static_cast<int64_t>(pos_), n};
  pos_ += n;
  return true;
}

}  // namespace gdscp::detail
