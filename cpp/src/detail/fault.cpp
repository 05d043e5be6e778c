#include "gdscp/detail/fault.hpp"

#include <atomic>
#include <initializer_list>

namespace gdscp::detail::fault {
namespace {
struct Slot {
  std::atomic<bool> armed{false};
  std::atomic<long> skip{0};
  std::atomic<long> count{0};
  std::atomic<int> err{0};
};
Slot slots[4];
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
}

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
