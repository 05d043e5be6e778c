#include "gdscp/grouped_staging.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <unordered_map>

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
  const char* blocking = std::getenv("GDSCP_PROBE_BLOCKING_EVENTS");  // experiment knob
  drv.check(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING | (blocking && *blocking == '1' ? CU_EVENT_BLOCKING_SYNC : 0)),
            "cuEventCreate");
  return ev;
}

void give_event(CUcontext ctx, CUevent ev) noexcept {
  try {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    g_free_events[ctx].push_back(ev);
  } catch (...) {
  }
}

}  // namespace

GroupedStaging::GroupedStaging(const CudaDriver& drv, CUcontext ctx, const std::vector<Chunk>& groups, size_t piece,
                               size_t slots)
    : drv_(drv), ctx_(ctx), groups_(groups) {
  size_t largest = 0;
  first_piece_.reserve(groups_.size() + 1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Chunk& c = groups_[g];
    largest = std::max(largest, c.size);
    first_piece_.push_back(pieces_.size());
    for (size_t done = 0; done < c.size; done += piece) {
      const size_t n = std::min(piece, c.size - done);
      pieces_.push_back({pieces_.size(), g, c.buf_offset + done, c.file_offset + static_cast<int64_t>(done), n});
    }
  }
  first_piece_.push_back(pieces_.size());
  left_.reset(new std::atomic<size_t>[groups_.size()]);
  for (size_t g = 0; g < groups_.size(); ++g) left_[g].store(first_piece_[g + 1] - first_piece_[g]);
  slots_.resize(std::max<size_t>(1, std::min(slots, groups_.size())));
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

char* GroupedStaging::wait_for_slot(const Piece& p, const std::atomic<bool>* cancelled) {
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
      if (failed_ || (cancelled && cancelled->load(std::memory_order_relaxed))) return nullptr;
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
    if (failed_) return nullptr;
    lock.unlock();
    // ... and the copy must have finished before the slot is overwritten.
    drv_.check(drv_.cuEventSynchronize(slot.event), "cuEventSynchronize");
  }
  return slot_memory(p.group) + (p.buf_offset - groups_[p.group].buf_offset);
}

bool GroupedStaging::piece_done(const Piece& p) {
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
