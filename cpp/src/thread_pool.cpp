#include "gdscp/thread_pool.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

namespace gdscp {

ThreadPool::ThreadPool(unsigned threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  spawn_locked(std::max(threads, 1u));
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
    Worker* self = w.get();
    w->thread = std::thread([this, self] { worker_loop(self); });
    workers_.push_back(std::move(w));
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void ThreadPool::worker_loop(Worker* self) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || self->retire || !queue_.empty(); });
    if (self->retire || (stopping_ && queue_.empty())) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();  // tasks catch their own errors (engine.cpp)
    task = nullptr;  // let go of what the task held before taking the lock
    lock.lock();
  }
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
  std::vector<std::unique_ptr<Worker>> leaving;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (workers_.size() < threads) {
      spawn_locked(threads);
    } else {
      // Surplus workers finish the task in hand, then leave; queued tasks stay
      // for the others. A later grow spawns new workers, never revives these.
      for (size_t i = threads; i < workers_.size(); ++i) {
        workers_[i]->retire = true;
        leaving.push_back(std::move(workers_[i]));
      }
      workers_.resize(threads);
    }
  }
  cv_.notify_all();
  for (auto& w : leaving) w->thread.join();
}

unsigned ThreadPool::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<unsigned>(workers_.size());
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
      const unsigned n = static_cast<unsigned>(pool->workers_.size());
      pool = new ThreadPool(n);
      owner = ::getpid();
    }
  }
  return *pool;
}

}  // namespace gdscp
