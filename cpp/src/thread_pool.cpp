#include "gdscp/thread_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <memory>

namespace gdscp {

ThreadPool::ThreadPool(unsigned threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  target_ = std::max(threads, 1u);
  spawn_locked(target_);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void ThreadPool::spawn_locked(unsigned upto) {
  while (workers_.size() < upto) {
    const unsigned index = static_cast<unsigned>(workers_.size());
    workers_.emplace_back([this, index] { worker_loop(index); });
  }
}

void ThreadPool::worker_loop(unsigned index) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || index >= target_ || !queue_.empty(); });
    if (index >= target_ || (stopping_ && queue_.empty())) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();  // tasks catch their own errors (engine.cpp)
    lock.lock();
  }
}

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void ThreadPool::submit_many(std::vector<std::function<void()>> tasks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& t : tasks) queue_.push_back(std::move(t));
  }
  if (tasks.size() == 1) cv_.notify_one(); else cv_.notify_all();
}

void ThreadPool::resize(unsigned threads) {
  threads = std::max(threads, 1u);
  std::vector<std::thread> leaving;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    target_ = threads;
    if (workers_.size() < threads) {
      spawn_locked(threads);
    } else {
      for (size_t i = threads; i < workers_.size(); ++i) leaving.push_back(std::move(workers_[i]));
      workers_.resize(threads);
    }
  }
  cv_.notify_all();
  for (auto& t : leaving) t.join();
}

unsigned ThreadPool::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return target_;
}

namespace {
unsigned initial_threads() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<unsigned>(std::clamp<long>(n, 1, 64));
}
}  // namespace

ThreadPool& ThreadPool::process_default() {
  // Deliberately leaked: workers must not be joined during static destruction,
  // when the CUDA driver they may be using is being torn down.
  static ThreadPool* pool = new ThreadPool(initial_threads());
  static pid_t owner = ::getpid();
  static std::mutex fork_mutex;
  if (::getpid() != owner) {
    std::lock_guard<std::mutex> lock(fork_mutex);
    if (::getpid() != owner) {
      // In a forked child the parent's threads are gone; its pool object is
      // unusable (its mutex may even be held). Start afresh.
      const unsigned n = pool->target_;
      pool = new ThreadPool(n);
      owner = ::getpid();
    }
  }
  return *pool;
}

}  // namespace gdscp
