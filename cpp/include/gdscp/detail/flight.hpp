// The files of a bulk job in flight (bulk.cpp): taken off (being opened, or
// open) and not yet landed (their last descriptor closed), each holding a few
// descriptors. While the process has descriptors to spare, a take-off and a
// landing are one atomic operation each. Once a file could not open for want
// of one (EMFILE, ENFILE), the job is rationed: no more files in flight than
// it had then, take-offs counted under a lock, and a worker whose file could
// not open waits there for one of the job's files to land.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace gdscp::detail {

class Flight {
 public:
  // A file in flight that took off and opened: it lands when its ticket is
  // dropped. The Flight must outlive its tickets.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& o) noexcept : flight_(o.flight_) { o.flight_ = nullptr; }
    Ticket& operator=(Ticket&& o) noexcept {
      if (this != &o) {
        if (flight_) flight_->land();
        flight_ = o.flight_;
        o.flight_ = nullptr;
      }
      return *this;
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() {
      if (flight_) flight_->land();
    }

   private:
    friend class Flight;
    explicit Ticket(Flight* f) noexcept : flight_(f) {}
    Flight* flight_ = nullptr;
  };

  // How many files had landed, and how many had aborted, as one took off.
  struct Mark {
    uint64_t landed = 0;
    uint64_t aborted = 0;
  };

  // Counts a file taking off where there is room (always, until rationed);
  // `mark` is then set. False, counting nothing, if `cancelled`, or if the
  // rationed job has as many in flight as it may (take_off_waiting then).
  bool take_off(Mark& mark, const std::atomic<bool>& cancelled);
  // take_off, waiting for room; false if `cancelled` meanwhile.
  bool take_off_waiting(Mark& mark, const std::atomic<bool>& cancelled);
  // A file that took off and holds nothing (it did not open, or was skipped).
  void abort() noexcept;
  // The file that took off has opened: in flight until the ticket goes.
  Ticket ticket() noexcept { return Ticket(this); }

  // What ration() leaves the job.
  struct Ration {
    // How many files it may have in flight from now on (SIZE_MAX: no
    // number yet, where it had none in flight and the file was alone).
    size_t most = SIZE_MAX;
    // None of its files is in flight: nothing of its own to wait for.
    bool none_in_flight = false;
    // With none in flight, whether the file may try again (see ration()).
    bool retry = false;
  };

  // A file that took off with `mark` could not open for want of descriptors
  // (and was aborted): the job is rationed to as many files in flight as it
  // has now. Where none of its files is in flight, the file may try again if
  // one has landed since `mark`, or if others that took off beside it have
  // aborted since (files opening at once can each hold a descriptor the
  // others lack, and all fail), and from then on the job opens one file at
  // a time; not where it was alone: the process's other descriptors leave
  // the job none.
  Ration ration(const Mark& mark);
  // Waits until a file has landed since `mark`; false if `cancelled` first.
  bool wait_for_landing(const Mark& mark, const std::atomic<bool>& cancelled);
  // Wakes the waiters, to see that the job was cancelled (set before).
  void wake();

 private:
  void land() noexcept;
  void changed(uint64_t before) noexcept;  // wakes the waiters, if rationed `before`

  // One word, so that a take-off reads the landings as it counts itself, and
  // a landing learns in the same step whether anyone may be waiting for it.
  // Bits 0-30: files in flight (a few per worker); bit 31: rationed (set once,
  // never cleared); bits 32-63: files landed, wrapping (compared for change only).
  static constexpr uint64_t kRationed = uint64_t{1} << 31;
  static constexpr uint64_t kCount = kRationed - 1;
  static constexpr uint64_t kLanding = (uint64_t{1} << 32) - 1;  // one more landed, one fewer in flight
  static size_t in_flight(uint64_t w) noexcept { return static_cast<size_t>(w & kCount); }
  static uint64_t landed(uint64_t w) noexcept { return w >> 32; }

  std::atomic<uint64_t> word_{0};
  std::atomic<uint64_t> aborted_{0};  // aborts so far (counted before the word changes)
  // Once rationed: take-offs count themselves under the lock (a check for
  // room and the count are one step), and landings, aborts and a cancel
  // notify under it (a waiter between its check and its sleep misses none).
  std::mutex mutex_;
  std::condition_variable cv_;
  size_t most_ = SIZE_MAX;  // under mutex_
};

}  // namespace gdscp::detail
