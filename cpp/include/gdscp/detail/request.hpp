// One read or write in flight: the tasks it was cut into report here, and the
// future the caller holds waits here.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

namespace gdscp::detail {

class ChunkQueue;

class Request {
 public:
  // `keep` (the open file, for one) is released as the last task finishes,
  // before any waiter wakes: once get() returns, the request holds nothing.
  explicit Request(size_t tasks, std::shared_ptr<const void> keep = nullptr)
      : remaining_(tasks), keep_(std::move(keep)) {}

  // The request's result is then what `work` moved without a gap from the
  // start of the range (work_queue.hpp says why), not the tasks' sum. Set
  // before any task runs.
  void count_contiguous(std::shared_ptr<const ChunkQueue> work) noexcept { work_ = std::move(work); }

  // Runs once, as the last task ends and before any waiter wakes, with the
  // bytes the request moved and whether a task failed; what it returns
  // becomes the request's byte count. An append gives back its reserved
  // range there (handle.cpp). Set before any task runs; must not throw.
  using Settle = std::function<size_t(size_t moved, bool failed)>;
  void settle_with(Settle settle) { settle_ = std::move(settle); }

  // Called once per task, from whichever thread ran it.
  void task_done(size_t bytes);
  void task_failed(std::exception_ptr error);

  // Tasks not yet started skip their I/O once this is set.
  void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }
  // Whether the cancel made the request's tasks skip part of its range (so
  // that get() counts only the bytes before it), rather than coming after
  // every piece had started.
  bool skipped() const;
  const std::atomic<bool>* cancel_flag() const noexcept { return &cancelled_; }

  // Progress for pollers (CLI progress bars): bytes of finished tasks plus
  // what running tasks have reported so far.
  void add_progress(size_t bytes) noexcept { progress_.fetch_add(bytes, std::memory_order_relaxed); }
  size_t progress() const noexcept { return progress_.load(std::memory_order_relaxed); }

  bool done() const;
  // Waits up to `seconds` (negative: forever); true once every task has finished.
  bool wait_for(double seconds) const;
  // Waits for every task, then returns the byte count or rethrows the first error.
  size_t get() const;

 private:
  void finish_one(size_t bytes, std::exception_ptr error);

  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  size_t remaining_;
  std::shared_ptr<const void> keep_;
  std::shared_ptr<const ChunkQueue> work_;
  Settle settle_;
  size_t bytes_ = 0;
  bool skipped_ = false;  // the queue's skipped(), kept once the last task lets the queue go
  std::exception_ptr error_;
  std::atomic<bool> cancelled_{false};
  std::atomic<size_t> progress_{0};
};

}  // namespace gdscp::detail
