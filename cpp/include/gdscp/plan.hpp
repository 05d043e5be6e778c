// Pure planning: how a request is cut into tasks and where O_DIRECT may apply.
// No CUDA, no I/O.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
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
  explicit ChunkQueue(std::vector<Chunk> chunks, const std::atomic<bool>* cancelled = nullptr)
      : chunks_(std::move(chunks)), cancelled_(cancelled) {}
  // The next unclaimed chunk; false once none is left or the request was cancelled.
  bool next(Chunk& out) noexcept {
    if (cancelled_ && cancelled_->load(std::memory_order_relaxed)) return false;
    const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= chunks_.size()) return false;
    out = chunks_[i];
    return true;
  }
  size_t size() const noexcept { return chunks_.size(); }
  const std::vector<Chunk>& chunks() const noexcept { return chunks_; }
  const std::atomic<bool>* cancel_flag() const noexcept { return cancelled_; }

  // State a backend shares among the workers of this request, made by the
  // first worker that asks (if `make` throws, the next one tries again); null
  // if `make` returned null.
  template <class T, class Make>
  T* shared_state(Make&& make) {
    std::call_once(state_once_, [&] { state_ = make(); });
    return static_cast<T*>(state_.get());
  }

 private:
  std::vector<Chunk> chunks_;
  std::atomic<size_t> next_{0};
  const std::atomic<bool>* cancelled_;
  std::once_flag state_once_;
  std::shared_ptr<void> state_;
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
