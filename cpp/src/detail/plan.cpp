#include "gdscp/detail/plan.hpp"

#include <algorithm>

namespace gdscp::detail {

std::vector<Chunk> split(int64_t file_offset, size_t size, size_t chunk_size) {
  std::vector<Chunk> out;
  if (size == 0) return out;
  chunk_size = std::max<size_t>(chunk_size, 1);
  out.reserve((size + chunk_size - 1) / chunk_size);
  for (size_t done = 0; done < size; done += chunk_size) {
    out.push_back({done, file_offset + static_cast<int64_t>(done), std::min(chunk_size, size - done)});
  }
  return out;
}

std::vector<Chunk> split_tapered(int64_t file_offset, size_t size, size_t chunk_size, size_t workers,
                                 size_t tail_min) {
  chunk_size = std::max<size_t>(chunk_size, 1);
  tail_min = std::clamp<size_t>(tail_min, 1, chunk_size);
  const size_t spread = 2 * std::max<size_t>(workers, 1);
  std::vector<Chunk> out;
  size_t done = 0;
  while (done < size) {
    const size_t left = size - done;
    const size_t n = std::min(left, std::clamp(round_up(left / spread, 4096), tail_min, chunk_size));
    out.push_back({done, file_offset + static_cast<int64_t>(done), n});
    done += n;
  }
  return out;
}

size_t effective_task_size(size_t size, size_t task_size, unsigned workers, size_t min_task) {
  task_size = std::max<size_t>(task_size, 1);
  if (workers <= 1 || size <= min_task) return std::min(task_size, std::max<size_t>(size, 1));
  const size_t share = round_up((size + workers - 1) / workers, 4096);
  return std::min(task_size, std::max(share, min_task));
}

AlignedSplit align_split(int64_t file_offset, size_t size, size_t alignment) {
  const size_t start = static_cast<size_t>(file_offset);
  const size_t end = start + size;
  const size_t a0 = round_up(start, alignment);
  const size_t a1 = round_down(end, alignment);
  if (a0 >= a1) return {size, 0, 0};
  return {a0 - start, a1 - a0, end - a1};
}

}  // namespace gdscp::detail
