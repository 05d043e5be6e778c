#include "gdscp/request.hpp"

namespace gdscp {

void Request::task_done(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_ += bytes;
  if (--remaining_ == 0) cv_.notify_all();
}

void Request::task_failed(std::exception_ptr error) {
  cancel();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!error_) error_ = error;
  if (--remaining_ == 0) cv_.notify_all();
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

}  // namespace gdscp
