#include "gdscp/detail/request.hpp"

#include <algorithm>

#include "gdscp/detail/work_queue.hpp"

namespace gdscp::detail {

void Request::finish_one(size_t bytes, std::exception_ptr error) {
  std::shared_ptr<const void> last;
  std::shared_ptr<const ChunkQueue> work;
  Settle settle;
  size_t moved;
  bool failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_ += bytes;
    if (error && !error_) error_ = error;
    if (remaining_ > 1) {
      --remaining_;
      return;
    }
    last = std::move(keep_);
    work = std::move(work_);
    // Every task is done: the queue's contiguous count is final.
    if (work) {
      bytes_ = std::min(bytes_, work->moved());
      skipped_ = work->skipped();
    }
    settle = std::move(settle_);
    moved = bytes_;
    failed = error_ != nullptr;
  }
  if (settle) {
    const size_t kept = settle(moved, failed);
    settle = nullptr;  // it may hold the file too
    std::lock_guard<std::mutex> lock(mutex_);
    bytes_ = kept;
  }
  work.reset();
  last.reset();  // may close the file's descriptors: before anyone sees the request done
  {
    std::lock_guard<std::mutex> lock(mutex_);
    remaining_ = 0;
  }
  cv_.notify_all();
}

void Request::task_done(size_t bytes) { finish_one(bytes, nullptr); }

void Request::task_failed(std::exception_ptr error) {
  cancel();
  finish_one(0, error);
}

bool Request::skipped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return work_ ? work_->skipped() : skipped_;
}

bool Request::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return remaining_ == 0;
}

bool Request::wait_for(double seconds) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (seconds < 0) {
    cv_.wait(lock, [&] { return remaining_ == 0; });
    return true;
  }
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return remaining_ == 0; });
}

size_t Request::get() const {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return remaining_ == 0; });
  if (error_) std::rethrow_exception(error_);
  return bytes_;
}

}  // namespace gdscp::detail
