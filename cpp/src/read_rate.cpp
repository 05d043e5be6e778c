#include "gdscp/read_rate.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace gdscp {

ReadRun timed_preads(const std::vector<int>& fds, const std::vector<ReadPiece>& pieces,
                     const std::vector<char*>& buffers) {
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> error{0};
  std::mutex mutex;
  std::condition_variable cv;
  bool go = false;
  size_t ready = 0;

  auto work = [&](char* buf) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      ++ready;
      cv.notify_all();
      cv.wait(lock, [&] { return go; });
    }
    uint64_t moved = 0;
    for (size_t k = next.fetch_add(1); k < pieces.size() && !error.load(std::memory_order_relaxed);
         k = next.fetch_add(1)) {
      const ReadPiece& p = pieces[k];
      size_t done = 0;
      while (done < p.length) {
        const ssize_t n = ::pread(fds[p.file], buf + done, p.length - done, p.offset + static_cast<int64_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          int none = 0;
          error.compare_exchange_strong(none, errno);
          break;
        }
        if (n == 0) break;  // the file is shorter than it was: the caller sees the bytes short
        done += static_cast<size_t>(n);
      }
      moved += done;
    }
    bytes.fetch_add(moved);
  };

  std::vector<std::thread> threads;
  threads.reserve(buffers.size());
  try {
    for (char* buf : buffers) threads.emplace_back(work, buf);
  } catch (...) {  // no more threads: let those made go (with nothing to read) and end
    next.store(pieces.size());
    {
      std::lock_guard<std::mutex> lock(mutex);
      go = true;
    }
    cv.notify_all();
    for (std::thread& t : threads) t.join();
    throw;
  }
  std::chrono::steady_clock::time_point start;
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return ready == threads.size(); });
    go = true;
    start = std::chrono::steady_clock::now();
  }
  cv.notify_all();
  for (std::thread& t : threads) t.join();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return {elapsed.count(), bytes.load(), error.load()};
}

}  // namespace gdscp
