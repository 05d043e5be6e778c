// How a parallel request runs: cut into chunks for the process's pool, and
// run as one task per worker there, or on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "gdscp/detail/plan.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/settings.hpp"

namespace gdscp::detail {

struct Dispatch {
  std::vector<Chunk> chunks;  // of [offset, offset + size), buffer offsets from the request's start
  size_t chunk_size = 0;      // effective_task_size for the pool's size now
  size_t tasks = 1;           // the workers the request runs on; 1: on the calling thread
};

// Small requests run on the calling thread, where a hand-off to a worker would
// cost more than it saves, and so do requests with one worker.
Dispatch plan_dispatch(int64_t offset, size_t size, const Settings& s);

// Runs `work` as each of the request's tasks: its byte count, or the
// exception it throws, goes to `req`.
void run_tasks(const std::shared_ptr<Request>& req, const Dispatch& d, const std::function<size_t()>& work);

}  // namespace gdscp::detail
