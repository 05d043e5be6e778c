// Staging buffers, leased and returned: page-locked ones for GPU copies, and
// page-aligned ones for O_DIRECT into unaligned host buffers.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gdscp::detail {

class BufferPool {
 public:
  enum class Kind { pinned, aligned };

  class Lease {
   public:
    Lease() = default;
    Lease(BufferPool* pool, void* ptr, size_t size, size_t capacity)
        : pool_(pool), ptr_(ptr), size_(size), capacity_(capacity) {}
    Lease(Lease&& o) noexcept { *this = std::move(o); }
    Lease& operator=(Lease&& o) noexcept;
    ~Lease() { release(); }
    void* get() const noexcept { return ptr_; }
    size_t size() const noexcept { return size_; }  // what was asked for (the buffer may be larger)
    void release() noexcept;

   private:
    BufferPool* pool_ = nullptr;
    void* ptr_ = nullptr;
    size_t size_ = 0;
    size_t capacity_ = 0;  // the buffer's own size, its size class
  };

  // `node` >= 0: pinned buffers whose pages are on that NUMA node
  // (preferred with mbind before they are populated).
  explicit BufferPool(Kind kind, int node = -1) : kind_(kind), node_(node) {}
  ~BufferPool();  // frees what is idle; a lease outliving the pool is a bug

  // A buffer of at least `size` bytes, reused when one is idle. Buffers come
  // in size classes (bucket()), so that the pool keeps a few sizes, however
  // many different sizes are asked for. Pinned buffers
  // are mapped by the calling thread and registered with
  // CU_MEMHOSTREGISTER_PORTABLE (any context may use them); they need a
  // current CUDA context on the calling thread.
  Lease acquire(size_t size);
  // Asks the pool to hold `count` idle buffers of `size` for `owner` (a GPU
  // ordinal; the larger of this and the owner's earlier ask). Owners add up:
  // GPUs on one NUMA node share its pool, and each gets its share.
  void want(size_t size, int owner, size_t count);
  // Allocates one buffer of `size` bytes and keeps it idle, unless the
  // owners' wants of that size are already idle (or being made); whether it
  // made one. Many threads may call it at once: each makes its own buffer in
  // parallel.
  bool stock(size_t size);
  size_t trim();  // frees every idle buffer and forgets the wants; the bytes freed

  size_t bytes_allocated() const;  // idle + leased
  // Tests only: the pool's lock, as acquire() and give_back() hold it a moment.
  std::unique_lock<std::mutex> hold_lock_for_testing() { return std::unique_lock<std::mutex>(mutex_); }

  // The size class of `size`: whole pages up to 64 KiB, then the next of 2^k
  // and 1.5 * 2^k bytes (a third more than asked for at most, none for a
  // power of two).
  static size_t bucket(size_t size) noexcept;

  static BufferPool& pinned();
  static BufferPool& aligned();
  // The pinned pool for staging to or from GPU `ordinal`: its NUMA node's on
  // a machine of several nodes, else pinned().
  static BufferPool& pinned_near(int ordinal);
  // trim() of every pinned pool.
  static size_t trim_pinned();

 private:
  // pthread_atfork handlers: every pool's lock held across fork(), so that a
  // child never inherits one held by a thread it does not have.
  static void before_fork() noexcept;
  static void after_fork() noexcept;
  friend struct PoolForkHandlers;

  void give_back(void* ptr, size_t size) noexcept;
  void* allocate(size_t size);
  void deallocate(void* ptr, size_t size) noexcept;

  Kind kind_;
  int node_ = -1;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> idle_;
  size_t allocated_ = 0;
  std::unordered_map<size_t, size_t> stocking_;  // by size: buffers stock() is making now
  std::map<std::pair<size_t, int>, size_t> wanted_;  // by (size, owner): want()'s counts
};

}  // namespace gdscp::detail
