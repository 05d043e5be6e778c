// Shared staging for one request's device reads: the workers of a request read
// bounce-sized pieces into a ring of chunk-sized pinned slots, and whoever
// finishes a chunk's last piece copies the whole chunk to the GPU at once.
// Large copies run the copy engine closer to its peak (16 MiB copies 54.6
// against 52.9 GB/s for 4 MiB ones on the H200 machine) while the staging
// memory in use stays as small as with per-worker buffers, so it can stay in
// the CPU cache. Used for requests whose data is in the page cache, by at
// most half the CPUs' worth of readers (posix_backend.cpp). Off by default
// (Settings::grouped_copies): on one H200 machine instance it read a hot 4 GiB
// file at 53-54 GB/s against 52-53 per-worker, on another at 30-38 against
// 45-50 (docs/benchmarks.md, third session).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "gdscp/cuda_driver.hpp"
#include "gdscp/pinned_pool.hpp"
#include "gdscp/plan.hpp"

namespace gdscp {

// Readers of one grouped read when the pool has `workers`: half the CPUs,
// 4 to 16, never more than `workers`.
size_t grouped_readers(size_t workers);
// Chunk-sized slots for `readers` reading `piece`-sized pieces of `chunk`-sized
// chunks, with `depth` chunks queued on the copy engine.
size_t grouped_slots(size_t readers, size_t piece, size_t chunk, size_t depth);

// Process-wide counts, for tests: grouped requests, the readers that joined
// them, and the bytes they read.
struct GroupedStats {
  uint64_t requests, readers, bytes;
};
GroupedStats grouped_stats() noexcept;

class GroupedStaging {
 public:
  struct Piece {
    size_t index;         // in pieces()
    size_t group;         // the chunk it belongs to
    size_t buf_offset;    // from the start of the request's buffer
    int64_t file_offset;
    size_t size;
    size_t got = 0;       // bytes read (set by the worker that read it)
  };

  // `work`: the request's queue (which owns this ring, through its shared
  // state); each of its chunks is cut into `piece`-sized pieces and staged in
  // one of `slots` pinned buffers of the largest chunk's size, by at most
  // `readers` workers. Needs the request's context current (allocates pinned
  // memory, events).
  GroupedStaging(const CudaDriver& drv, CUcontext ctx, const ChunkQueue& work, size_t piece, size_t slots,
                 size_t readers);
  ~GroupedStaging();
  GroupedStaging(const GroupedStaging&) = delete;
  GroupedStaging& operator=(const GroupedStaging&) = delete;

  // A worker joins the request as a reader; false once it has `readers` (the
  // worker then leaves the pieces to them).
  bool join();
  // The next piece in file order; false when none is left.
  bool claim(Piece*& out);
  // Where `p` goes once its slot is free (the copy of the slot's previous
  // chunk has finished); nullptr if the request failed or was cancelled
  // meanwhile (the worker should stop).
  char* wait_for_slot(const Piece& p);
  // Records `p` as read (its `got` set); true if it was its chunk's last piece: the caller
  // then copies the chunk (full_chunk() says whether one copy covers it) and
  // calls issued() after recording slot_event() behind the copy.
  bool piece_done(const Piece& p);
  bool full_chunk(size_t group) const;  // every piece of it came back whole
  const Chunk& chunk(size_t group) const { return work_.chunks()[group]; }
  char* slot_memory(size_t group) const;
  CUevent slot_event(size_t group) const { return slots_[group % slots_.size()].event; }
  void issued(size_t group);
  // Pieces of `group`, for the rare chunk with a short read: copied one by one.
  std::pair<size_t, size_t> piece_range(size_t group) const { return {first_piece_[group], first_piece_[group + 1]}; }
  const Piece& piece(size_t i) const { return pieces_[i]; }
  // A worker failed: every waiting worker gives up.
  void fail();

 private:
  const CudaDriver& drv_;
  CUcontext ctx_;
  const ChunkQueue& work_;
  std::vector<Piece> pieces_;
  std::vector<size_t> first_piece_;                 // per group, plus one past the end
  std::unique_ptr<std::atomic<size_t>[]> left_;     // pieces of each group still unread
  std::atomic<size_t> next_{0};
  std::atomic<size_t> readers_{0};
  size_t max_readers_;

  struct Slot {
    BufferPool::Lease buffer;
    CUevent event = nullptr;
    size_t generations_issued = 0;  // chunks g with g % slots == this slot whose copy was queued
  };
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool failed_ = false;
};

}  // namespace gdscp
