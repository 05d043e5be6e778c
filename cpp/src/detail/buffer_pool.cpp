#include "gdscp/detail/buffer_pool.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/fault.hpp"
#include "gdscp/detail/numa.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {

// Idle buffers kept per size; beyond this many of one size, returns are freed.
constexpr size_t kMaxIdlePerSize = 256;

namespace {

// A std::bad_alloc (a MemoryError in Python) that says which staging buffer
// could not be had and why, where a bare one says only "std::bad_alloc": a
// pinned one's size is the bounce_buffer_size setting, which may be far more
// than the machine has.
class NoStagingMemory : public std::bad_alloc {
 public:
  NoStagingMemory(size_t size, int err, bool pinned = true, const std::string& more = "")
      : what_(pinned ? "cannot allocate a pinned staging buffer of " + std::to_string(size) +
                           " bytes (bounce_buffer_size sets its size): " + std::strerror(err) + more
                     : "cannot allocate a staging buffer of " + std::to_string(size) + " bytes: " +
                           std::strerror(err) + more) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// MemAvailable of /proc/meminfo in bytes: what can be had without swapping
// (free memory, and the page cache the kernel would give back). SIZE_MAX
// where it cannot be read: nothing is refused on a guess. Plain read(2), as
// sysfs.cpp reads (no iostreams).
size_t memory_available() {
  if (const long long armed = fault::memory_available(); armed >= 0) return static_cast<size_t>(armed);
  const int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SIZE_MAX;
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t at = text.find("\nMemAvailable:");
  if (at == std::string::npos) return SIZE_MAX;
  char* end = nullptr;
  const unsigned long long kib = std::strtoull(text.c_str() + at + 14, &end, 10);
  if (end == text.c_str() + at + 14 || kib > SIZE_MAX / 1024) return SIZE_MAX;
  return static_cast<size_t>(kib) * 1024;
}

// The pinned buffers being mapped and populated now, by every pool: a claim
// on the memory available, so that workers making buffers side by side
// (gdscp.prepare) do not each count the same memory as free.
std::atomic<size_t> populating{0};

class PinnedClaim {
 public:
  // Pinned pages are neither swapped nor reclaimed, and the kernel may map
  // more than there is (overcommit, vm.overcommit_memory=1): populated, a
  // buffer past the memory available ends only in the OOM killer, which ends
  // the process (or another). Refused instead, with the other buffers being
  // made now counted against what is available.
  // A buffer larger than all of it is refused whatever else is being made
  // (the same message every time); one that fits only without the others,
  // with them named.
  explicit PinnedClaim(size_t size) : size_(size) {
    const size_t others = populating.fetch_add(size);
    const size_t available = memory_available();
    if (available == SIZE_MAX || (size <= available && others <= available - size)) return;
    populating.fetch_sub(size);
    std::string why = " (" + std::to_string(available) + " bytes of memory are available";
    if (size <= available)
      why += ", and other staging buffers of " + std::to_string(others) + " bytes are being pinned now";
    throw NoStagingMemory(size, ENOMEM, true, why + ")");
  }
  ~PinnedClaim() { populating.fetch_sub(size_); }
  PinnedClaim(const PinnedClaim&) = delete;
  PinnedClaim& operator=(const PinnedClaim&) = delete;

 private:
  size_t size_;
};

}  // namespace

BufferPool::Lease& BufferPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    ptr_ = o.ptr_;
    size_ = o.size_;
    capacity_ = o.capacity_;
    o.pool_ = nullptr;
    o.ptr_ = nullptr;
    o.size_ = 0;
    o.capacity_ = 0;
  }
  return *this;
}

void BufferPool::Lease::release() noexcept {
  if (pool_ && ptr_) pool_->give_back(ptr_, capacity_);
  pool_ = nullptr;
  ptr_ = nullptr;
}

BufferPool::~BufferPool() { trim(); }

void* BufferPool::allocate(size_t size) {
  if (kind_ == Kind::pinned) {
    // Mapped and populated here, then registered: cuMemHostAlloc zeroes and
    // pins under a lock the driver holds across threads, so that the first
    // buffers of every worker of a new process were made one at a time.
    const CudaDriver& drv = CudaDriver::require();
    const PinnedClaim claim(size);
    void* p = map_on_node(size, node_);
    if (!p) throw NoStagingMemory(size, errno);
    const CUresult r = drv.cuMemHostRegister(p, size, CU_MEMHOSTREGISTER_PORTABLE);
    if (r != CUDA_SUCCESS) unmap_on_node(p, size);
    drv.check(r, "cuMemHostRegister (pinned staging buffer)");
    return p;
  }
  void* p = nullptr;
  if (const int err = ::posix_memalign(&p, 4096, size); err != 0) throw NoStagingMemory(size, err, false);
  return p;
}

void BufferPool::deallocate(void* ptr, size_t size) noexcept {
  if (kind_ == Kind::pinned) {
    const CudaDriver* drv = CudaDriver::get();
    if (!drv) return;
    auto release = [&] {
      drv->cuMemHostUnregister(ptr);
      unmap_on_node(ptr, size);
    };
    CUcontext current = nullptr;
    if (drv->cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == nullptr) {
      // Portable pinned memory may be freed under any context, but some context
      // must be current: borrow GPU 0's primary one.
      try {
        ScopedContext scope(*drv, primary_context(0));
        release();
      } catch (...) {
      }
      return;
    }
    release();
  } else {
    std::free(ptr);
  }
}

size_t BufferPool::bucket(size_t size) noexcept {
  constexpr size_t kPage = 4096, kSmall = 64 << 10;
  if (size <= kSmall) return std::max<size_t>(1, (size + kPage - 1) / kPage) * kPage;
  size_t two = kSmall;  // the power of two at or below size
  while (two <= size / 2) two *= 2;
  if (size == two) return two;
  return size <= two + two / 2 ? two + two / 2 : 2 * two;
}

BufferPool::Lease BufferPool::acquire(size_t size) {
  const size_t capacity = bucket(size);
  // No bucket holds more than half the address space: no such buffer can exist.
  if (capacity < size) {
    throw NoStagingMemory(size, ENOMEM, kind_ == Kind::pinned);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = idle_.find(capacity);
    if (it != idle_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return Lease(this, p, size, capacity);
    }
  }
  void* p = allocate(capacity);
  std::lock_guard<std::mutex> lock(mutex_);
  allocated_ += capacity;
  return Lease(this, p, size, capacity);
}

void BufferPool::want(size_t size, int owner, size_t count) {
  size = bucket(size);
  std::lock_guard<std::mutex> lock(mutex_);
  size_t& mine = wanted_[{size, owner}];
  mine = std::max(mine, count);
}

bool BufferPool::stock(size_t size) {
  size = bucket(size);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t target = 0;
    for (auto it = wanted_.lower_bound({size, INT_MIN}); it != wanted_.end() && it->first.first == size; ++it)
      target += it->second;
    if (idle_[size].size() + stocking_[size] >= std::min(target, kMaxIdlePerSize)) return false;
    ++stocking_[size];
  }
  void* p = nullptr;
  try {
    p = allocate(size);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    --stocking_[size];
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  --stocking_[size];
  idle_[size].push_back(p);
  allocated_ += size;
  return true;
}

void BufferPool::give_back(void* ptr, size_t size) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& list = idle_[size];
    if (list.size() < kMaxIdlePerSize) {
      list.push_back(ptr);
      return;
    }
    allocated_ -= size;
  }
  deallocate(ptr, size);
}

size_t BufferPool::trim() {
  std::unordered_map<size_t, std::vector<void*>> idle;
  size_t freed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wanted_.clear();
    idle.swap(idle_);
    for (auto& [size, list] : idle) freed += size * list.size();
    allocated_ -= freed;
  }
  for (auto& [size, list] : idle)
    for (void* p : list) deallocate(p, size);
  return freed;
}

size_t BufferPool::bytes_allocated() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

namespace {
// The process-wide pools once made (leaked on purpose: freeing pinned memory
// during static destruction races the driver's own teardown), and the pools
// of pinned memory on one NUMA node, by node.
std::atomic<BufferPool*> g_pinned{nullptr};
std::atomic<BufferPool*> g_aligned{nullptr};
std::mutex g_node_mutex;
std::unordered_map<int, BufferPool*> g_node_pools;
}  // namespace

struct PoolForkHandlers {
  PoolForkHandlers() { ::pthread_atfork(&BufferPool::before_fork, &BufferPool::after_fork, &BufferPool::after_fork); }
};
namespace {
const PoolForkHandlers g_fork_handlers;
}  // namespace

void BufferPool::before_fork() noexcept {
  g_node_mutex.lock();
  for (BufferPool* pool : {g_pinned.load(), g_aligned.load()})
    if (pool) pool->mutex_.lock();
  for (auto& [node, pool] : g_node_pools) pool->mutex_.lock();
}

void BufferPool::after_fork() noexcept {
  // In the parent and in the child alike: the forking thread (the child's
  // only one) unlocks what it locked.
  for (auto& [node, pool] : g_node_pools) pool->mutex_.unlock();
  for (BufferPool* pool : {g_pinned.load(), g_aligned.load()})
    if (pool) pool->mutex_.unlock();
  g_node_mutex.unlock();
}

BufferPool& BufferPool::pinned() {
  static BufferPool* pool = g_pinned = new BufferPool(Kind::pinned);
  return *pool;
}

BufferPool& BufferPool::pinned_near(int ordinal) {
  const int node = gpu_numa_node(ordinal);
  if (node < 0) return pinned();
  std::lock_guard<std::mutex> lock(g_node_mutex);
  BufferPool*& pool = g_node_pools[node];
  if (!pool) pool = new BufferPool(Kind::pinned, node);
  return *pool;
}

size_t BufferPool::trim_pinned() {
  size_t freed = pinned().trim();
  std::vector<BufferPool*> pools;
  {
    std::lock_guard<std::mutex> lock(g_node_mutex);
    for (auto& [node, pool] : g_node_pools) pools.push_back(pool);
  }
  for (BufferPool* pool : pools) freed += pool->trim();
  return freed;
}

BufferPool& BufferPool::aligned() {
  static BufferPool* pool = g_aligned = new BufferPool(Kind::aligned);
  return *pool;
}

}  // namespace gdscp::detail
