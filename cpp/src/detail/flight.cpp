#include "gdscp/detail/flight.hpp"

#include <algorithm>

namespace gdscp::detail {

// Why no wake-up is lost: the rationed bit and the counts share one atomic
// word, so every change of it is ordered against the ration() that set the
// bit. A landing (or abort) ordered before it is seen by every later read of
// the word, among them each waiter's check; one ordered after it sees the
// bit, and notifies under the lock, which a waiter holds from its check
// until it sleeps. Waiters only wait once rationed.

bool Flight::take_off(Mark& mark, const std::atomic<bool>& cancelled) {
  if (cancelled.load()) return false;
  // Read first: an abort between this and the count below only makes a
  // failed open of this file try once more than it needs to.
  mark.aborted = aborted_.load();
  uint64_t w = word_.load(std::memory_order_relaxed);
  while (!(w & kRationed)) {
    if (word_.compare_exchange_weak(w, w + 1)) {
      mark.landed = landed(w);
      return true;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancelled.load() || in_flight(word_.load()) >= most_) return false;
  mark.landed = landed(word_.fetch_add(1));
  return true;
}

bool Flight::take_off_waiting(Mark& mark, const std::atomic<bool>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return in_flight(word_.load()) < most_ || cancelled.load(); });
  if (cancelled.load()) return false;
  mark.aborted = aborted_.load();
  mark.landed = landed(word_.fetch_add(1));
  return true;
}

void Flight::abort() noexcept {
  aborted_.fetch_add(1);
  changed(word_.fetch_sub(1));
}

void Flight::land() noexcept { changed(word_.fetch_add(kLanding)); }

void Flight::changed(uint64_t before) noexcept {
  if (!(before & kRationed)) return;
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

Flight::Ration Flight::ration(const Mark& mark) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t w = word_.fetch_or(kRationed);
  Ration r;
  if (in_flight(w) == 0) {
    // Its own abort is one. Others' can only come from files that took off
    // before the job went one at a time, so the retries end.
    const bool others_aborted = aborted_.load() - mark.aborted > 1;
    if (others_aborted) most_ = 1;
    r.none_in_flight = true;
    r.retry = landed(w) != mark.landed || others_aborted;
  } else {
    most_ = std::min(most_, in_flight(w));
  }
  r.most = most_;
  return r;
}

bool Flight::wait_for_landing(const Mark& mark, const std::atomic<bool>& cancelled) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return landed(word_.load()) != mark.landed || cancelled.load(); });
  return !cancelled.load();
}

void Flight::wake() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

}  // namespace gdscp::detail
