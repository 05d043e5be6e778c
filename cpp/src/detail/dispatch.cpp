#include "gdscp/detail/dispatch.hpp"

#include <algorithm>

#include "gdscp/detail/thread_pool.hpp"

namespace gdscp::detail {
namespace {

constexpr size_t kTaperMin = 1u << 20;

}  // namespace

Dispatch plan_dispatch(int64_t offset, size_t size, const Settings& s) {
  const unsigned pool_size = ThreadPool::process_default().size();
  Dispatch d;
  d.chunk_size = effective_task_size(size, s.task_size, pool_size, s.min_task_size);
  const size_t whole_chunks = d.chunk_size == 0 ? 0 : (size + d.chunk_size - 1) / d.chunk_size;
  const size_t workers = std::min<size_t>(pool_size, whole_chunks);
  d.tasks = size < s.gds_threshold ? 1 : std::max<size_t>(workers, 1);
  // Chunks taper toward the end so that the workers finish together (a
  // request's fixed cost otherwise: the last chunks read by a few workers
  // while the rest wait), down to a staging buffer's size, which is also what
  // a mapped read of host memory needs at least (1 MiB).
  d.chunks = d.tasks > 1 ? split_tapered(offset, size, d.chunk_size, d.tasks,
                                         std::max<size_t>(s.bounce_buffer_size, kTaperMin))
                         : split(offset, size, d.chunk_size);
  return d;
}

void run_tasks(const std::shared_ptr<Request>& req, const Dispatch& d, const std::function<size_t()>& work) {
  auto task = [req, work] {
    try {
      req->task_done(work());
    } catch (...) {
      req->task_failed(std::current_exception());
    }
  };
  if (d.tasks == 1) {
    task();
    return;
  }
  std::vector<std::function<void()>> tasks(d.tasks, task);
  ThreadPool::process_default().submit_many(std::move(tasks));
}

}  // namespace gdscp::detail
