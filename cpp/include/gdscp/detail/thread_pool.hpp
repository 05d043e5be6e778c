// Worker threads fed from one queue. Tasks never wait on each other inside the
// pool: completion is tracked by the Request they belong to (request.hpp).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gdscp::detail {

class ThreadPool {
 public:
  // Starts `threads` workers, or as many as the system allows (at least one,
  // else it throws).
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit_many(std::vector<std::function<void()>> tasks);

  // Safe while work is queued or running: queued tasks stay queued; a shrinking
  // pool lets surplus workers finish their current task, then parks them. A
  // parked worker costs only its stack's address space; growing again wakes it
  // with its per-thread state (CUDA streams, staging events) intact, where a new
  // thread would create them inside the next transfer. Where the system refuses
  // a new thread, the pool keeps every worker it could start, runs them all,
  // and throws an Error naming how many run and why no more could start.
  void resize(unsigned threads);
  unsigned size() const;   // active workers
  unsigned busy() const;   // workers running a task now

  // Held by a worker while it waits on something outside the pool: the other
  // end of a FIFO or a terminal, which a task still queued here may be the
  // one to open (a bulk job reading a FIFO that a later job writes). While
  // it is held, one more worker takes tasks, so that the wait cannot keep
  // them queued behind it; that worker parks again after the task it took.
  class Blocking {
   public:
    explicit Blocking(ThreadPool& pool);
    ~Blocking();
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;

   private:
    ThreadPool& pool_;
  };

  // The process-wide pool (the only one most callers need), starting with
  // default_num_threads() workers. It is rebuilt in a forked child, where the
  // parent's workers do not exist.
  static ThreadPool& process_default();

 private:
  // An idle worker sleeps on a wake of its own, and a task for it comes with
  // the wake: so that a request's workers start side by side. Woken together
  // from one condition variable, each had to take the pool's mutex in turn,
  // and each one that found it held went back to sleep until the one before
  // it let go: on a 16-vCPU virtual machine the last of 16 idle workers
  // started 66 µs after the submit that way, 49 µs this way
  // (docs/performance.md, start cost).
  struct Worker {
    std::thread thread;
    unsigned index = 0;  // takes tasks while index < active_
    bool idle = false;   // guarded by the pool's mutex_: waiting for a wake
    std::mutex wake_mutex;
    std::condition_variable wake_cv;
    bool woken = false;            // guarded by wake_mutex
    std::function<void()> handed;  // guarded by wake_mutex: a task that came with the wake
  };
  void worker_loop(Worker* self);
  // Starts workers until there are `upto`; "" or why the next could not start.
  std::string spawn_locked(unsigned upto);
  // Marks every idle worker woken and returns them, to wake once mutex_ is let go.
  std::vector<Worker*> take_idle_locked();
  // Wakes `w`, handing it `task` (or none: it then looks at the queue).
  static void wake(Worker* w, std::function<void()> task = nullptr);

  mutable std::mutex mutex_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::unique_ptr<Worker>> workers_;
  unsigned active_ = 0;
  unsigned blocked_ = 0;  // workers inside a Blocking: as many more take tasks
  unsigned busy_ = 0;
  bool stopping_ = false;
};

}  // namespace gdscp::detail
