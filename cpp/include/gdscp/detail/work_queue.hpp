// The concurrent side of a plan: the chunks of one request, claimed by the
// workers that share it, and each worker's cut of its chunks into staging
// pieces.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <utility>
#include <vector>

#include "gdscp/detail/fault.hpp"
#include "gdscp/detail/plan.hpp"

namespace gdscp::detail {

// The chunks of one request, claimed one at a time by the workers sharing the
// request: whoever is free takes the next chunk, so the work balances itself,
// and each worker can keep its staging pipeline full across chunks.
//
// It also keeps the request's count honest. A read that comes up short in one
// chunk (end of file, or a file cut short meanwhile) may have left later
// chunks, read by other workers before the cut, complete: the bytes between
// are not in the buffer. So the request moved only the part of its range
// before the first gap (moved()): each short read lowers that end, and no
// chunk starting past it is handed out any more.
class ChunkQueue {
 public:
  // `chunks` must be one contiguous range, in order (as split() cuts it).
  // `chunk_size`: the request's chunk size (effective_task_size), which bounds
  // what a worker stages at once; `workers`: how many workers the request runs on.
  ChunkQueue(std::vector<Chunk> chunks, size_t chunk_size, const std::atomic<bool>* cancelled = nullptr,
             size_t workers = 1)
      : chunks_(std::move(chunks)), chunk_size_(chunk_size), cancelled_(cancelled), workers_(workers) {
    for (const Chunk& c : chunks_) bytes_ += c.size;
    begin_ = chunks_.empty() ? 0 : chunks_.front().buf_offset;
    end_.store(begin_ + bytes_, std::memory_order_relaxed);
  }
  ChunkQueue(const ChunkQueue&) = delete;
  ChunkQueue& operator=(const ChunkQueue&) = delete;

  // The next unclaimed chunk; false once none is left, the request was
  // cancelled (the chunk then counts as not moved), or the next chunk starts
  // past a short read.
  bool next(Chunk& out) noexcept {
    if (cancelled_) fault::hold(*cancelled_);  // tests only: disarmed, one relaxed load
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= chunks_.size()) return false;
    const Chunk& c = chunks_[i];
    const bool stop = cancelled();
    if (stop || c.buf_offset >= end()) {
      if (stop) skipped_.store(true, std::memory_order_relaxed);
      came_short(c, 0);
      return false;
    }
    out = c;
    return true;
  }
  // A cancel stopped `c` after its first `moved` bytes (a worker between pieces).
  void cancelled_at(const Chunk& c, size_t moved) noexcept {
    skipped_.store(true, std::memory_order_relaxed);
    came_short(c, moved);
  }
  // `c` (a chunk, or a piece of one) moved only its first `moved` bytes.
  void came_short(const Chunk& c, size_t moved) noexcept {
    const size_t at = c.buf_offset + moved;
    size_t end = end_.load(std::memory_order_relaxed);
    while (at < end && !end_.compare_exchange_weak(end, at, std::memory_order_relaxed)) {
    }
  }
  // Where the part of the range moved without a gap ends (a buffer offset).
  size_t end() const noexcept { return end_.load(std::memory_order_relaxed); }
  // Once every worker is done with the queue: the bytes moved without a gap
  // from the start of the range, which is what the request moved.
  size_t moved() const noexcept { return end() - begin_; }

  // A worker starting on the request: 0 for the first, 1 for the next...
  size_t join() noexcept { return joined_.fetch_add(1, std::memory_order_relaxed); }
  size_t chunk_size() const noexcept { return chunk_size_; }
  // The bytes of the request's range in the chunk after `c` (asked of the
  // disk with `c` where `c` is cold: that chunk's worker, whoever it is,
  // finds it on its way).
  size_t after(const Chunk& c) const noexcept {
    if (chunks_.empty()) return 0;
    const int64_t last = chunks_.back().file_offset + static_cast<int64_t>(chunks_.back().size);
    const int64_t end = c.file_offset + static_cast<int64_t>(c.size);
    return end < last ? std::min(chunk_size_, static_cast<size_t>(last - end)) : 0;
  }
  size_t workers() const noexcept { return workers_; }
  size_t bytes() const noexcept { return bytes_; }
  bool cancelled() const noexcept { return cancelled_ && cancelled_->load(std::memory_order_relaxed); }
  // Whether the cancel flag made a worker skip part of the range (a chunk,
  // or the rest of one), rather than arriving after every piece had started.
  bool skipped() const noexcept { return skipped_.load(std::memory_order_relaxed); }

 private:
  std::vector<Chunk> chunks_;
  size_t chunk_size_;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> joined_{0};
  const std::atomic<bool>* cancelled_;
  size_t workers_;
  size_t bytes_ = 0;
  size_t begin_ = 0;
  std::atomic<size_t> end_{0};
  std::atomic<bool> skipped_{false};
};

// One worker's share of a request in staging-buffer-sized pieces: it claims
// whole chunks from the request's queue and cuts each into pieces, read in
// file order (work_queue.cpp says why).
class PieceStream {
 public:
  // `piece`: the staging buffer size (no piece is larger, nor larger than the
  // queue's chunk size); `stagger`: graded first pieces (reads).
  PieceStream(ChunkQueue& work, size_t piece, bool stagger);
  // The next piece; false once the request has none left, was cancelled
  // (what is left of the chunk then counts as not moved) or came up short
  // before this point.
  bool next(Chunk& out);
  // With the first piece of a chunk: the bytes after it to ask of the disk
  // where it is cold, the rest of the chunk (this worker's next pieces) and
  // the chunk after (ChunkQueue::after); 0 after any other piece.
  size_t ahead() const noexcept { return started_ ? chunk_.size - pos_ + work_.after(chunk_) : 0; }

 private:
  ChunkQueue& work_;
  size_t piece_;
  size_t first_;          // the size of the next piece: piece_ after the first
  Chunk chunk_{0, 0, 0};  // the chunk being cut
  size_t pos_ = 0;        // bytes of chunk_ handed out
  bool started_ = false;  // the last piece handed out began chunk_
};

}  // namespace gdscp::detail
