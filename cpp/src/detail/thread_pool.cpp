#include "gdscp/detail/thread_pool.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>

#include "gdscp/error.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

namespace {

// Blocks the asynchronous signals on the calling thread for its lifetime and
// restores the mask on every way out, a failed thread start included.
//
// Workers start with every asynchronous signal blocked (a new thread inherits
// its creator's mask), so Ctrl-C and SIGTERM reach a Python thread: CPython
// notices a signal that a foreign thread caught only much later, if at all.
// Fault signals stay open: a blocked SIGBUS kills the process instead of
// reaching a handler (the mapped read's guard needs it).
class AsyncSignalsBlocked {
 public:
  AsyncSignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    for (int sig : {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&all, sig);
    pthread_sigmask(SIG_BLOCK, &all, &previous_);
  }
  ~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  AsyncSignalsBlocked(const AsyncSignalsBlocked&) = delete;
  AsyncSignalsBlocked& operator=(const AsyncSignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

std::string worker_name(unsigned index) { return "gdscp-io-" + std::to_string(index); }

}  // namespace

ThreadPool::ThreadPool(unsigned threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = std::max(threads, 1u);
  const std::string why = spawn_locked(active_);
  if (why.empty()) return;
  // A pool that could start some workers runs with those; one without any
  // would leave every request queued forever.
  if (workers_.empty()) throw_state("the I/O thread pool could not start any worker: " + why);
  active_ = static_cast<unsigned>(workers_.size());
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

std::string ThreadPool::spawn_locked(unsigned upto) {
  const AsyncSignalsBlocked blocked;
  workers_.reserve(upto);  // so that recording a started worker cannot fail
  while (workers_.size() < upto) {
    auto w = std::make_unique<Worker>();
    w->index = static_cast<unsigned>(workers_.size());
    Worker* self = w.get();
    try {
      w->thread = std::thread([this, self] { worker_loop(self); });
    } catch (const std::system_error& e) {
      return "cannot start thread " + worker_name(w->index) + ": " + std::strerror(e.code().value()) + " (errno " +
             std::to_string(e.code().value()) + ")";
    }
    // Named here, so that a worker carries its name once the pool has it: top
    // -H, debuggers and sanitizer reports tell the workers apart.
    pthread_setname_np(w->thread.native_handle(), worker_name(w->index).c_str());
    workers_.push_back(std::move(w));
  }
  return {};
}

void ThreadPool::worker_loop(Worker* self) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (self->index < active_ + blocked_ && !queue_.empty()); });
    if (stopping_ && (queue_.empty() || self->index >= active_ + blocked_)) return;
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
  std::string why;
  unsigned running = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (workers_.size() < threads) why = spawn_locked(threads);
    // Surplus workers finish the task in hand and park; queued tasks stay for
    // the active ones. A pool that could not grow to `threads` runs every
    // worker it has.
    active_ = why.empty() ? threads : static_cast<unsigned>(workers_.size());
    running = active_;
  }
  cv_.notify_all();
  if (!why.empty())
    throw_state("the I/O thread pool could not grow to " + std::to_string(threads) + " workers (" + why +
                "); it runs " + std::to_string(running) + " workers");
}

ThreadPool::Blocking::Blocking(ThreadPool& pool) : pool_(pool) {
  bool queued;
  {
    std::lock_guard<std::mutex> lock(pool_.mutex_);
    ++pool_.blocked_;
    // Where no thread can start, the pool goes on with those it has.
    (void)pool_.spawn_locked(pool_.active_ + pool_.blocked_);
    queued = !pool_.queue_.empty();
  }
  if (queued) pool_.cv_.notify_all();
}

ThreadPool::Blocking::~Blocking() {
  std::lock_guard<std::mutex> lock(pool_.mutex_);
  --pool_.blocked_;
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
