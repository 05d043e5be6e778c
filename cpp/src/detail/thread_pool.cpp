#include "gdscp/detail/thread_pool.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>

#include "gdscp/detail/fault.hpp"
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
  std::vector<Worker*> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    idle = take_idle_locked();
  }
  for (Worker* w : idle) wake(w);
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
      if (fault::worker_refused(w->index)) throw std::system_error(EAGAIN, std::generic_category());
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

std::vector<ThreadPool::Worker*> ThreadPool::take_idle_locked() {
  std::vector<Worker*> idle;
  for (auto& w : workers_) {
    if (!w->idle) continue;
    w->idle = false;
    idle.push_back(w.get());
  }
  return idle;
}

void ThreadPool::wake(Worker* w, std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(w->wake_mutex);
    w->handed = std::move(task);
    w->woken = true;
  }
  w->wake_cv.notify_one();
}

void ThreadPool::worker_loop(Worker* self) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    std::function<void()> task;
    if (self->index < active_ + blocked_ && !queue_.empty()) {
      task = std::move(queue_.front());
      queue_.pop_front();
      ++busy_;
    } else if (stopping_) {
      return;
    } else {
      // Nothing for this worker (or it is parked): sleep until a wake, which
      // may bring a task, counted busy by whoever handed it over.
      self->idle = true;
      lock.unlock();
      {
        std::unique_lock<std::mutex> wake_lock(self->wake_mutex);
        self->wake_cv.wait(wake_lock, [&] { return self->woken; });
        self->woken = false;
        task = std::move(self->handed);
        self->handed = nullptr;
      }
      if (!task) {
        lock.lock();
        continue;
      }
    }
    if (lock.owns_lock()) lock.unlock();
    task();  // tasks catch their own errors (handle.cpp)
    task = nullptr;  // let go of what the task held before taking the lock
    lock.lock();
    --busy_;
  }
}

void ThreadPool::submit_many(std::vector<std::function<void()>> tasks) {
  // Each task goes with the wake of an idle active worker, lowest index first
  // (the workers busy last have their caches and staging warm); the rest
  // queue, for workers as they finish. Behind tasks already queued, new ones
  // queue too, so that tasks start in the order they came.
  std::vector<std::pair<Worker*, std::function<void()>>> handed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t next = 0;
    if (queue_.empty()) {
      const unsigned eligible = active_ + blocked_;
      for (auto& w : workers_) {
        if (next == tasks.size()) break;
        if (w->index >= eligible || !w->idle) continue;
        w->idle = false;
        ++busy_;
        handed.emplace_back(w.get(), std::move(tasks[next++]));
      }
    }
    for (; next < tasks.size(); ++next) queue_.push_back(std::move(tasks[next]));
  }
  for (auto& [w, task] : handed) wake(w, std::move(task));
}

void ThreadPool::resize(unsigned threads) {
  threads = std::max(threads, 1u);
  std::string why;
  unsigned running = 0;
  std::vector<Worker*> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (workers_.size() < threads) why = spawn_locked(threads);
    // Surplus workers finish the task in hand and park; queued tasks stay for
    // the active ones. A pool that could not grow to `threads` runs every
    // worker it has.
    active_ = why.empty() ? threads : static_cast<unsigned>(workers_.size());
    running = active_;
    // Parked workers now active take queued tasks; the rest park again.
    if (!queue_.empty()) idle = take_idle_locked();
  }
  for (Worker* w : idle) wake(w);
  if (!why.empty())
    throw_state("the I/O thread pool could not grow to " + std::to_string(threads) + " workers (" + why +
                "); it runs " + std::to_string(running) + (running == 1 ? " worker" : " workers"));
}

ThreadPool::Blocking::Blocking(ThreadPool& pool) : pool_(pool) {
  std::vector<Worker*> idle;
  {
    std::lock_guard<std::mutex> lock(pool_.mutex_);
    ++pool_.blocked_;
    // Where no thread can start, the pool goes on with those it has.
    (void)pool_.spawn_locked(pool_.active_ + pool_.blocked_);
    if (!pool_.queue_.empty()) idle = pool_.take_idle_locked();
  }
  for (Worker* w : idle) wake(w);
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
