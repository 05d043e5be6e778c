#include "gdscp/detail/thread_pool.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "gdscp/settings.hpp"

namespace gdscp::detail {

ThreadPool::ThreadPool(unsigned threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = std::max(threads, 1u);
  spawn_locked(active_);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) {
    if (w->thread.joinable()) w->thread.join();
  }
}

void ThreadPool::spawn_locked(unsigned upto) {
  // Workers start with every asynchronous signal blocked (a new thread
  // inherits its creator's mask), so Ctrl-C and SIGTERM reach a Python thread:
  // CPython notices a signal that a foreign thread caught only much later, if
  // at all. Fault signals stay open: a blocked SIGBUS kills the process instead
  // of reaching a handler (the mapped read's guard needs it).
  sigset_t all, previous;
  sigfillset(&all);
  for (int sig : {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&all, sig);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  while (workers_.size() < upto) {
    auto w = std::make_unique<Worker>();
    w->index = static_cast<unsigned>(workers_.size());
    Worker* self = w.get();
    w->thread = std::thread([this, self] { worker_loop(self); });
    workers_.push_back(std::move(w));
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void ThreadPool::worker_loop(Worker* self) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (self->index < active_ && !queue_.empty()); });
    if (stopping_ && (queue_.empty() || self->index >= active_)) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    task();  // tasks catch their own errors (handle.cpp)
    task = nullptr;  // let go of what the task held before taking the lock
    lock.lock();
    --busy_;
  }
}

void ThreadPool::submit_many(std::vector<std::function<void()>> tasks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& t : tasks) queue_.push_back(std::move(t));
  }
  // Every waiter, even for one task: parked workers wait on the same condition
  // variable, and a notify_one that woke only a parked one would leave the
  // task queued with every active worker asleep.
  cv_.notify_all();
}

void ThreadPool::resize(unsigned threads) {
  threads = std::max(threads, 1u);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (workers_.size() < threads) spawn_locked(threads);
    // Surplus workers finish the task in hand and park; queued tasks stay for
    // the active ones.
    active_ = threads;
  }
  cv_.notify_all();
}

unsigned ThreadPool::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

unsigned ThreadPool::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_;
}

ThreadPool& ThreadPool::process_default() {
  // Deliberately leaked: workers must not be joined during static destruction,
  // when the CUDA driver they may be using is being torn down.
  static ThreadPool* pool = new ThreadPool(default_num_threads());
  static pid_t owner = ::getpid();
  static std::mutex fork_mutex;
  if (::getpid() != owner) {
    std::lock_guard<std::mutex> lock(fork_mutex);
    if (::getpid() != owner) {
      // In a forked child the parent's threads are gone; its pool object is
      // unusable (its mutex may even be held). Start afresh.
      pool = new ThreadPool(pool->active_);
      owner = ::getpid();
    }
  }
  return *pool;
}

}  // namespace gdscp::detail
