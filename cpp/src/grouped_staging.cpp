#include "gdscp/grouped_staging.hpp"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "gdscp/thread_pool.hpp"

namespace gdscp {
namespace {

// Events outlive requests (like the staging streams): a request's destructor
// may run on a thread with no context, so its events go back to a free list
// instead of to cuEventDestroy.
std::mutex g_events_mutex;
std::unordered_map<CUcontext, std::vector<CUevent>> g_free_events;

CUevent take_event(const CudaDriver& drv, CUcontext ctx) {
  {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    auto& free = g_free_events[ctx];
    if (!free.empty()) {
      CUevent ev = free.back();
      free.pop_back();
      return ev;
    }
  }
  CUevent ev = nullptr;
  drv.check(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  return ev;
}

void give_event(CUcontext ctx, CUevent ev) noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    g_free_events[ctx].push_back(ev);
  } catch (...) {
  }
}

std::atomic<uint64_t> g_requests{0}, g_readers{0}, g_bytes{0};

}  // namespace

// Chunk-sized slots of a grouped read: the chunks the readers are filling (the
// pieces in flight span at most this many) plus `depth` chunks queued on the
// copy engine. Sized by the pieces in flight rather than as workers x depth x
// piece, so the ring stays small enough for the CPU cache.
size_t grouped_slots(size_t readers, size_t piece, size_t chunk, size_t depth) {
  return std::max<size_t>((readers * piece + chunk - 1) / chunk + 1 + depth, 4);
}

// Readers of one grouped read: half the CPUs, 4 to 16. More readers than that
// only contend for memory bandwidth and the CPUs' sibling threads while the copy
// engine is already busy: on one H200 machine instance (16 CPUs, ~55 GB/s link)
// 8 readers reached 53-54 GB/s where all 16 workers reached 52 and 32 workers
// 36-38 (docs/benchmarks.md, third session).
size_t grouped_readers(size_t workers) {
  return std::min(workers, std::clamp<size_t>(ThreadPool::online_cpus() / 2, 4, 16));
}

GroupedStats grouped_stats() noexcept {
  return {g_requests.load(std::memory_order_relaxed), g_readers.load(std::memory_order_relaxed),
          g_bytes.load(std::memory_order_relaxed)};
}

GroupedStaging::GroupedStaging(const CudaDriver& drv, CUcontext ctx, const ChunkQueue& work, size_t piece,
                               size_t slots, size_t readers)
    : drv_(drv), ctx_(ctx), work_(work), max_readers_(std::max<size_t>(1, readers)) {
  const std::vector<Chunk>& groups = work.chunks();
  size_t largest = 0;
  first_piece_.reserve(groups.size() + 1);
  for (size_t g = 0; g < groups.size(); ++g) {
    const Chunk& c = groups[g];
    largest = std::max(largest, c.size);
    first_piece_.push_back(pieces_.size());
    for (size_t done = 0; done < c.size; done += piece) {
      const size_t n = std::min(piece, c.size - done);
      pieces_.push_back({pieces_.size(), g, c.buf_offset + done, c.file_offset + static_cast<int64_t>(done), n});
    }
  }
  first_piece_.push_back(pieces_.size());
  left_.reset(new std::atomic<size_t>[groups.size()]);
  for (size_t g = 0; g < groups.size(); ++g) left_[g].store(first_piece_[g + 1] - first_piece_[g]);
  g_requests.fetch_add(1, std::memory_order_relaxed);
  slots_.resize(std::max<size_t>(1, std::min(slots, groups.size())));
  try {
    for (auto& s : slots_) {
      s.buffer = BufferPool::pinned().acquire(largest);
      s.event = take_event(drv_, ctx_);
    }
  } catch (...) {
    for (auto& s : slots_)
      if (s.event) give_event(ctx_, s.event);
    throw;
  }
}

GroupedStaging::~GroupedStaging() {
  // Every worker drained its stream before leaving, so no copy out of a slot
  // is still running when the request lets go of this.
  for (auto& s : slots_)
    if (s.event) give_event(ctx_, s.event);
}

bool GroupedStaging::claim(Piece*& out) {
  const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i >= pieces_.size()) return false;
  out = &pieces_[i];
  return true;
}

char* GroupedStaging::slot_memory(size_t group) const {
  return static_cast<char*>(slots_[group % slots_.size()].buffer.get());
}

char* GroupedStaging::wait_for_slot(const Piece& p) {
  const size_t n = slots_.size();
  Slot& slot = slots_[p.group % n];
  const size_t generation = p.group / n;  // chunks before it in this slot
  if (generation > 0) {
    std::unique_lock<std::mutex> lock(mutex_);
    // The previous chunk of this slot must have queued its copy. Its pieces
    // were all claimed before this one, so it does get there unless the
    // request fails or is cancelled (then some of them are never read):
    // those are checked every millisecond.
    while (slot.generations_issued < generation) {
      if (failed_ || work_.cancelled()) return nullptr;
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
    if (failed_) return nullptr;
    lock.unlock();
    // ... and the copy must have finished before the slot is overwritten.
    drv_.check(drv_.cuEventSynchronize(slot.event), "cuEventSynchronize");
  }
  return slot_memory(p.group) + (p.buf_offset - chunk(p.group).buf_offset);
}

bool GroupedStaging::join() {
  if (readers_.fetch_add(1, std::memory_order_relaxed) >= max_readers_) return false;
  g_readers.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool GroupedStaging::piece_done(const Piece& p) {
  g_bytes.fetch_add(p.got, std::memory_order_relaxed);
  // acq_rel: the finisher sees every other piece's bytes and `got`.
  return left_[p.group].fetch_sub(1, std::memory_order_acq_rel) == 1;
}

bool GroupedStaging::full_chunk(size_t group) const {
  for (size_t i = first_piece_[group]; i < first_piece_[group + 1]; ++i)
    if (pieces_[i].got < pieces_[i].size) return false;
  return true;
}

void GroupedStaging::issued(size_t group) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    slots_[group % slots_.size()].generations_issued = group / slots_.size() + 1;
  }
  cv_.notify_all();
}

void GroupedStaging::fail() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
  }
  cv_.notify_all();
}

}  // namespace gdscp
