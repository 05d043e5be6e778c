// Pure planning: how a request is cut into tasks and where O_DIRECT may apply.
// No CUDA, no I/O.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace gdscp {

struct Chunk {
  size_t buf_offset;    // from the start of the request's buffer
  int64_t file_offset;  // absolute
  size_t size;
};

// Cuts [file_offset, file_offset + size) into pieces of at most `piece` bytes.
std::vector<Chunk> split(int64_t file_offset, size_t size, size_t piece);

// The chunks of one request, claimed one at a time by the workers sharing the
// request: whoever is free takes the next chunk, so the work balances itself,
// and each worker can keep its staging pipeline full across chunks.
class ChunkQueue {
 public:
  // `chunks` must be one contiguous range, in order (as split() cuts it);
  // `workers`: how many workers the request runs on.
  explicit ChunkQueue(std::vector<Chunk> chunks, const std::atomic<bool>* cancelled = nullptr, size_t workers = 1)
      : chunks_(std::move(chunks)), cancelled_(cancelled), workers_(workers) {
    for (const Chunk& c : chunks_) bytes_ += c.size;
  }
  // The next unclaimed chunk; false once none is left or the request was cancelled.
  bool next(Chunk& out) noexcept {
    if (cancelled()) return false;
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= chunks_.size()) return false;
    out = chunks_[i];
    return true;
  }
  // A worker starting on the request: 0 for the first, 1 for the next...
  size_t join() noexcept { return joined_.fetch_add(1, std::memory_order_relaxed); }
  size_t workers() const noexcept { return workers_; }
  size_t bytes() const noexcept { return bytes_; }
  size_t size() const noexcept { return chunks_.size(); }
  const std::vector<Chunk>& chunks() const noexcept { return chunks_; }
  // Whether the request was cancelled.
  bool cancelled() const noexcept { return cancelled_ && cancelled_->load(std::memory_order_relaxed); }


 private:
  std::vector<Chunk> chunks_;
  std::atomic<size_t> next_{0};
  std::atomic<size_t> joined_{0};
  const std::atomic<bool>* cancelled_;
  size_t workers_;
  size_t bytes_ = 0;
};

// One worker's share of a request in staging-buffer-sized pieces: it claims
// whole chunks from the request's queue and cuts each into pieces, read in
// file order (plan.cpp says why).
class PieceStream {
 public:
  // `piece`: the staging buffer size; `chunk`: the request's chunk size (no
  // piece is larger); `stagger`: graded first pieces (reads).
  PieceStream(ChunkQueue& work, size_t piece, size_t chunk, bool stagger);
  // The next piece; false once the request has none left or was cancelled.
  bool next(Chunk& out);

 private:
  ChunkQueue& work_;
  size_t piece_;
  size_t first_;  // the size of the next piece: piece_ after the first
  Chunk chunk_{0, 0, 0};  // the chunk being cut
  size_t pos_ = 0;        // bytes of chunk_ handed out
};

// The task size actually used: never above `task_size`; for a request that
// would otherwise run as few tasks, smaller pieces (not below `min_task`) so
// that every worker gets a share.
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

}  // namespace gdscp
