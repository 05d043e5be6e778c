// One item of a bulk job on its way (bulk.hpp): its open source and
// destination, and, for a file cut into chunks, the chunks that workers claim.
// bulk_transfer.cpp opens the endpoints and moves chunks; bulk.cpp schedules.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <sys/stat.h>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gdscp/bulk.hpp"
#include "gdscp/detail/backend.hpp"
#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/flight.hpp"
#include "gdscp/detail/plan.hpp"
#include "gdscp/detail/staging.hpp"
#include "gdscp/detail/temp_file.hpp"

namespace gdscp::detail {

using BulkClock = std::chrono::steady_clock;

// What one worker brings to the chunks it moves: its share of the staging
// memory, and a host buffer for bytes that must pass through host memory.
struct BulkWorker {
  size_t slot_size = 0;
  char* device_slot = nullptr;  // its share of the caller's device staging, if there is one
  MemoryTarget staging_mem;     // what device_slot is (device, context)
  size_t group = 0;             // its group: the GPU it stages through (BulkOptions::devices)
  std::atomic<uint64_t>* group_moved = nullptr;  // the group's bytes moved
  BufferPool::Lease host_lease;
  // Reads into device memory through pinned staging, queued across chunks
  // (upload_chunk); made on first use, drained before the worker waits or ends.
  std::unique_ptr<UploadRing> ring;
  char* staging();  // slot_size bytes of staging: the device slot, else host memory
  char* host();     // slot_size bytes of host memory
};

struct Transfer {
  ~Transfer();

  // Released last, once every descriptor of the transfer is closed: the job
  // counts its files holding descriptors by it (bulk.cpp).
  Flight::Ticket in_flight;

  size_t index = 0;
  const BulkItem* item = nullptr;
  MemoryTarget mem;  // of the item's buffer (read, write) or of the staging (copy, scratch read)
  bool scratch = false;  // a read into staging, dropped once it landed

  // Source (read, copy): a plain descriptor for small host-memory transfers
  // and front-to-back reads; a File and its backend for large or device ones.
  int src_fd = -1;
  std::shared_ptr<File> src_file;
  Backends src_backends;
  Backend* src_backend = nullptr;
  bool src_sized = true;  // false: read front to back with read(2) until end of file
  struct stat src_stat {};
  // Not the file the caller found (BulkItem::has_src_id), in a copy under
  // no_clobber: skipped if its destination exists, else failed (open_destination).
  bool src_replaced = false;

  // Destination (write, copy).
  std::string dst;   // where the file lands (a symbolic link's target)
  std::string dir;   // dst's directory
  TempFile tmp;      // atomic: the temporary file (locked while it is open)
  int dst_fd = -1;   // tmp's descriptor, an in-place destination's, or a plain file's
  uint64_t dst_opened = 0;  // the order in which the process's jobs opened their destinations
  bool own_dst_fd = false;  // dst_fd is not tmp's, and closes with the transfer
  std::shared_ptr<File> dst_file;
  Backends dst_backends;
  Backend* dst_backend = nullptr;
  bool in_place = false;      // a device or FIFO: written front to back, never replaced
  bool cut_to_size = false;   // written over in place (not atomic): cut to its new size once written
  bool part = false;          // a range of an existing file, written in place (BulkItem::part)
  bool block_device = false;
  int mode = -1;
  bool chmod = true;          // the mode still has to be set (it was not the one the file was created with)
  bool chown = false;         // replacing a file of another owner or group: give the copy theirs
  uid_t uid = 0;
  gid_t gid = 0;
  bool set_times = false;
  struct timespec atime {};
  struct timespec mtime {};
  bool synced = false;        // fsynced on its worker (not left for the batch's syncfs)
  bool placed = false;        // renamed (or linked) into place
  dev_t dev = 0;              // the destination's filesystem

  // The work: `size` bytes from `offset` (sequential: at most `size`, -1 no
  // limit), and for a file moved by several workers the chunks they claim.
  bool sequential = false;
  // A copy of a regular file through host memory goes inside the kernel
  // (copy_file_range) until the kernel declines; the bytes it copied.
  std::atomic<bool> kernel_copy{false};
  std::atomic<uint64_t> kernel_bytes{0};
  std::atomic<uint64_t> memory_bytes{0};  // the bytes of such a copy that went through host memory
  bool early_writeback = false;  // each chunk's writeback starts once the kernel copied it
  // A sparse source (fewer blocks than its size) copied through host memory:
  // only its data is copied, its holes stay holes (the destination is sized first).
  bool sparse = false;
  int64_t offset = 0;
  int64_t size = 0;
  std::vector<Chunk> chunks;
  std::atomic<size_t> next{0};  // one group: the next chunk to claim
  // Several groups: group g claims chunks [group_begin[g], group_begin[g + 1])
  // through group_next[g] (empty with one group).
  std::vector<size_t> group_begin;
  std::unique_ptr<std::atomic<size_t>[]> group_next;
  std::atomic<size_t> left{0};
  std::atomic<uint64_t> bytes{0};
  // Where a read's source was found to end: a chunk came up short (the file
  // shrank while it was read). The read reports only the bytes before it,
  // whatever chunks after it moved.
  std::atomic<int64_t> ends_at{INT64_MAX};

  // A read with replicas: the other GPUs' buffers (the item's own is
  // `mem` at item->buf), and whether every pair of them has peer access.
  struct Replica {
    char* base;
    MemoryTarget mem;
  };
  std::vector<Replica> replicas;
  bool peer = true;

  std::mutex mutex;
  std::exception_ptr error;  // the first failure of any chunk
  // Set with `error`: each chunk asks before it moves, without the lock.
  std::atomic<bool> has_error{false};
  BulkClock::time_point start;
  double seconds = 0;

  void fail(std::exception_ptr e);
  // Chunk `c` moved only `got` of its bytes: the source ends there.
  void landed_short(const Chunk& c, size_t got) noexcept;
  // What the transfer reports: its bytes, up to where the source was found to end.
  uint64_t reported_bytes() const noexcept;
  // Once its data is written: closes the source and the File objects (and
  // their backends), keeping only the destination's descriptor (dst_fd).
  void release_endpoints() noexcept;
  bool failed() const noexcept { return has_error.load(std::memory_order_acquire); }
  // The descriptor verify reads the source through.
  int source_fd() const { return src_file ? src_file->fd() : src_fd; }

  // Cuts the chunks among `groups` groups by bytes (contiguous ranges); with
  // `owner` < groups, all of them go to that group (its GPU holds the buffer).
  void share_chunks(size_t groups, size_t owner);
  // The next chunk group `g` claims; chunks.size() once its share is gone.
  size_t claim(size_t g);
  // Whether group `g` has chunks left to claim.
  bool has_chunks(size_t g) const;
};

// Everything the job knows that opening and moving need.
struct TransferContext {
  const BulkOptions& opt;
  const Settings& s;
  const std::atomic<bool>& cancelled;
  size_t chunk_cap;  // largest chunk through staging: the slot size
  unsigned workers;
  unsigned umask;    // the process's, read once for the job
  size_t items;      // how many files the job has
};

// Opens the item's endpoints and plans its chunks. Returns null with `note`
// set when the item is skipped (an existing destination under no_clobber).
// `replica_mem`: what item.replicas are; `peer`: whether they and the item's
// buffer all have peer access to one another.
std::shared_ptr<Transfer> open_transfer(const TransferContext& cx, size_t index, const BulkItem& item,
                                        const MemoryTarget& item_mem, const MemoryTarget& staging_mem,
                                        const std::vector<MemoryTarget>& replica_mem, bool peer, std::string& note);

// Moves one chunk (its bytes counted into t.bytes and `moved`); throws.
// `index`: the chunk's place in t.chunks (replicas land on the GPUs in turn).
void move_chunk(const TransferContext& cx, Transfer& t, size_t index, BulkWorker& w, std::atomic<uint64_t>& moved);

// A chunk of a read into device memory through gdscp's staging (POSIX backend,
// no replicas, no verify), queued on the worker's ring (w.ring) instead of
// moved at once: `landed` runs once its bytes are in place or it failed, and
// counts them (count_moved) unless short_read says they fall short. False,
// with nothing done, for any other chunk.
bool upload_chunk(const TransferContext& cx, Transfer& t, size_t index, BulkWorker& w, UploadRing::Landed landed);

// The error of chunk `index` of a read that brought only `got` bytes where
// its item wants them all (`exact`); null where that is fine.
std::exception_ptr short_read(const Transfer& t, size_t index, size_t got);

// `n` more bytes moved for `t`: counted for it, for the job (`moved`) and
// for the worker's group.
void count_moved(Transfer& t, const BulkWorker& w, std::atomic<uint64_t>& moved, size_t n);

// Moves a sequential transfer front to back on this worker; throws.
void move_sequential(const TransferContext& cx, Transfer& t, BulkWorker& w, std::atomic<uint64_t>& moved);

// Once every byte is written: mode, times, and the file's own fsync unless
// `group` leaves it to its batch; with verify, the comparison. Throws.
void finish_data(const TransferContext& cx, Transfer& t, bool group);

}  // namespace gdscp::detail
