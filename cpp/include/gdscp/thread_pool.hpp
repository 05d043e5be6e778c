// Worker threads fed from one queue. Tasks never wait on each other inside the
// pool: completion is tracked by the Request they belong to (request.hpp).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gdscp {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void submit_many(std::vector<std::function<void()>> tasks);

  // Safe while work is queued or running: queued tasks stay queued; a shrinking
  // pool lets surplus workers finish their current task, then joins them.
  void resize(unsigned threads);
  unsigned size() const;

  // The process-wide pool (the only one most callers need). It is rebuilt in a
  // forked child, where the parent's workers do not exist.
  static ThreadPool& process_default();

 private:
  struct Worker {
    std::thread thread;
    bool retire = false;  // set (under the mutex) when a shrink lets this worker go
  };
  void worker_loop(Worker* self);
  void spawn_locked(unsigned upto);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::unique_ptr<Worker>> workers_;
  bool stopping_ = false;
};

}  // namespace gdscp
