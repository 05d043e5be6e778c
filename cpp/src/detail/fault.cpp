#include "gdscp/detail/fault.hpp"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <initializer_list>
#include <mutex>
#include <thread>

namespace gdscp::detail::fault {
namespace {
struct Slot {
  std::atomic<bool> armed{false};
  std::atomic<long> skip{0};
  std::atomic<long> count{0};
  std::atomic<int> err{0};
};
Slot slots[4];

std::atomic<bool> hold_armed{false};
std::atomic<long> hold_skip{0};
std::atomic<bool> reached{false};
std::atomic<int> holding{0};
std::atomic<bool> progress_armed{false};
std::atomic<bool> unmap_armed{false};
std::atomic<bool> unmap_holding{false};
std::atomic<long> worker_limit{-1};
std::atomic<long long> available{-1};
std::atomic<bool> swap_armed{false};
std::mutex swap_mutex;
std::string swap_from;  // under swap_mutex
std::atomic<bool> move_armed{false};
std::string move_to;  // under swap_mutex
std::atomic<bool> shortage_armed{false};
std::atomic<long> shortage_workers{0};
std::atomic<long> shortage_arrived{0};  // steps taken since armed, by all workers

// A worker's step of a descriptor shortage: its open (0), before its ration
// (1), after it (2). The workers take each step together: a worker waits
// until all have come to it (or the shortage is disarmed, or a minute has
// passed). -1 once every step is taken, and while disarmed.
long shortage_step_taken() noexcept {
  if (!shortage_armed.load(std::memory_order_relaxed)) return -1;
  const long workers = shortage_workers.load();
  const long i = shortage_arrived.fetch_add(1);
  if (i >= 3 * workers) return -1;
  const long all_there = (i / workers + 1) * workers;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (shortage_armed.load() && shortage_arrived.load() < all_there && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return i / workers;
}
}  // namespace

void arm(Op op, long skip, long count, int err) noexcept {
  Slot& s = slots[static_cast<int>(op)];
  s.skip = skip;
  s.count = count;
  s.err = err;
  s.armed = true;
}

void disarm() noexcept {
  for (auto& s : slots) s.armed = false;
  hold_armed = false;
  progress_armed = false;
  unmap_armed = false;
  unmap_holding = false;
  worker_limit = -1;
  available = -1;
  swap_armed = false;
  move_armed = false;
  shortage_armed = false;
}

void arm_hold(long skip) noexcept {
  hold_skip = skip;
  reached = false;
  hold_armed = true;
}

bool hold_reached() noexcept { return reached.load(); }

int held_workers() noexcept { return holding.load(); }

void hold(const std::atomic<bool>& cancelled) noexcept {
  if (!hold_armed.load(std::memory_order_relaxed)) return;
  if (hold_skip.fetch_sub(1) > 0) return;
  ++holding;
  reached = true;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!cancelled.load() && hold_armed.load() && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  --holding;
}

void arm_progress_hold() noexcept { progress_armed = true; }

bool progress_hold() noexcept {
  if (!progress_armed.load(std::memory_order_relaxed) || !progress_armed.exchange(false)) return false;
  hold_armed = false;  // the job's held workers go on, so that it can end
  return true;
}

void arm_unmap_hold() noexcept { unmap_armed = true; }

bool unmap_held() noexcept { return unmap_holding.load(); }

void unmapping() noexcept {
  if (!unmap_armed.load(std::memory_order_relaxed) || !unmap_armed.exchange(false)) return;
  unmap_holding = true;
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (unmap_holding.load() && std::chrono::steady_clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  unmap_holding = false;
}

void arm_worker_limit(long n) noexcept { worker_limit = n < 0 ? -1 : n; }

bool worker_refused(unsigned index) noexcept {
  const long limit = worker_limit.load(std::memory_order_relaxed);
  return limit >= 0 && static_cast<long>(index) >= limit;
}

void arm_memory_available(long long bytes) noexcept { available = bytes < 0 ? -1 : bytes; }

long long memory_available() noexcept { return available.load(std::memory_order_relaxed); }

void arm_source_swap(const std::string& replacement) {
  std::lock_guard<std::mutex> lock(swap_mutex);
  swap_from = replacement;
  swap_armed = true;
}

void source_measured(const std::string& path) noexcept {
  if (!swap_armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(swap_mutex);
  if (!swap_armed.exchange(false)) return;
  std::rename(swap_from.c_str(), path.c_str());
}

void arm_destination_move(const std::string& moved_to) {
  std::lock_guard<std::mutex> lock(swap_mutex);
  move_to = moved_to;
  move_armed = true;
}

void destination_made(const std::string& dir) noexcept {
  if (!move_armed.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(swap_mutex);
  if (!move_armed.exchange(false)) return;
  std::rename(dir.c_str(), move_to.c_str());
}

void arm_descriptor_shortage(long workers) noexcept {
  shortage_workers = workers < 1 ? 1 : workers;
  shortage_arrived = 0;
  shortage_armed = true;
}

int short_of_descriptors() noexcept { return shortage_step_taken() == 0 ? EMFILE : 0; }

void shortage_step() noexcept { (void)shortage_step_taken(); }

bool io_armed() noexcept {
  for (Op op : {Op::pread, Op::pwrite, Op::land})
    if (slots[static_cast<int>(op)].armed.load(std::memory_order_relaxed)) return true;
  return false;
}

int check(Op op) noexcept {
  Slot& s = slots[static_cast<int>(op)];
  if (!s.armed.load(std::memory_order_relaxed)) return 0;
  if (s.skip.fetch_sub(1) > 0) return 0;
  if (s.count.fetch_sub(1) > 0) return s.err.load();
  s.armed = false;
  return 0;
}

}  // namespace gdscp::detail::fault
