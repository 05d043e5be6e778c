// Test hook: make the Nth pread or pwrite of the process fail with a chosen
// errno, so tests can prove that mid-transfer failures surface cleanly; or
// hold a bulk job's workers until the job is cancelled, so that a signal can
// be sent while a transfer is certainly in flight; or hold a mapped file's
// munmap, so that calls can be made while a close() is certainly unmapping;
// or refuse the thread pool its workers past a count, as a system out of
// threads (a pids limit, RLIMIT_NPROC, RLIMIT_AS) does; or rename another
// file over a bulk job's source once it is measured; or have a bulk job's
// first files all fail to open for want of descriptors at once; or have
// pinned staging find less memory available than the machine has.
// Disarmed, a check is one relaxed atomic load.
#pragma once

#include <atomic>
#include <string>

namespace gdscp::detail::fault {

// land: bytes a bulk job checks with verify, in host memory (flipped instead of failing).
// kernel_copy: a copy_file_range of a bulk copy (the kernel declines with the errno).
enum class Op { pread = 0, pwrite = 1, land = 2, kernel_copy = 3 };

// The "errno" that makes a pread read nothing, as at end of file.
constexpr int kEndOfFile = -1;

// After `skip` more successful calls of `op`, the next `count` calls fail with `err`.
void arm(Op op, long skip, long count, int err) noexcept;
void disarm() noexcept;
// Whether a pread, pwrite or land fault is armed: a copy inside the kernel,
// which bypasses them, steps aside then, so that the fault lands where aimed.
bool io_armed() noexcept;
// Called before each read or write system call (posix_io.cpp) and before a
// mapped copy, which stands in for a read (mapped_read.cpp); returns the errno
// to fail with (kEndOfFile: to read nothing), or 0.
int check(Op op) noexcept;

// After `skip` more chunks of bulk transfers or of parallel requests (a
// CuFile's or Mmap's pread), every worker that reaches the next one waits
// there until its job or request is cancelled (or the hold is disarmed, or a
// minute has passed): the job can neither finish nor rename a file first, and
// a request is certainly in flight. disarm() releases it too.
void arm_hold(long skip) noexcept;
// Whether a worker has reached the hold since it was armed.
bool hold_reached() noexcept;
// How many workers wait at the hold now.
int held_workers() noexcept;
// Called before each chunk of a bulk transfer is moved (bulk.cpp, bulk_transfer.cpp)
// and before a parallel request's worker claims a chunk (work_queue.hpp).
void hold(const std::atomic<bool>& cancelled) noexcept;

// The next bulk job's progress() lets go of a hold (arm_hold) between the
// two halves of its reading and waits there for its job to finish: a job
// that ends while its progress is being read, every time.
void arm_progress_hold() noexcept;
// Called by a bulk job's progress() between its reads (bulk.cpp): whether to
// wait there for the job to finish (once per arm_progress_hold, the hold let go).
bool progress_hold() noexcept;

// The next mapped file unmapped waits just before its munmap until disarm()
// (or a minute has passed).
void arm_unmap_hold() noexcept;
// Whether a mapped file is waiting there now.
bool unmap_held() noexcept;
// Called before a mapped file's munmap (mapped_file.cpp).
void unmapping() noexcept;

// The thread pool's workers from index `n` on cannot start: their thread is
// refused as the system refuses one it has no room for (EAGAIN). A negative
// `n` lifts the limit; disarm() lifts it too.
void arm_worker_limit(long n) noexcept;
// Called before a worker's thread starts (thread_pool.cpp): whether the
// worker of index `index` is refused its thread.
bool worker_refused(unsigned index) noexcept;

// Pinned staging (buffer_pool.cpp) finds `bytes` of memory available
// instead of what /proc/meminfo says: a machine with less memory than a
// staging buffer asks for. A negative `bytes` lifts it; disarm() too.
void arm_memory_available(long long bytes) noexcept;
// The bytes armed, or -1.
long long memory_available() noexcept;

// The next bulk source read as a File (1 MiB or more, or through device
// memory) has `replacement` renamed over its path once it is opened and
// measured, just before its File is made: a source replaced in the middle of
// the transfer, every time. disarm() drops it.
void arm_source_swap(const std::string& replacement);
// Called once a bulk source is measured, before its File is made (bulk_transfer.cpp).
void source_measured(const std::string& path) noexcept;

// The next bulk destination whose temporary file is made, to be opened again
// by its path (1 MiB or more, or through device memory), has its directory
// renamed to `moved_to` just before: a destination directory moved while its
// file is being opened, every time. disarm() drops it.
void arm_destination_move(const std::string& moved_to);
// Called once a bulk destination's temporary file is made, before it is
// opened again by its path (bulk_transfer.cpp).
void destination_made(const std::string& dir) noexcept;

// A bulk job's `workers` workers (all it has) find the process out of
// descriptors together, as files opening side by side under a low ulimit -n
// now and then do, each holding a descriptor another lacks: each worker's
// first file fails to open with EMFILE once all of them have taken off, and
// the workers then ration the job (Flight::ration) in step: every file
// aborted before any rations, every one rationed before any goes on. At
// each step a worker waits for the others, a minute at most; disarm()
// releases them.
void arm_descriptor_shortage(long workers) noexcept;
// Called before a bulk job's source is opened (bulk_transfer.cpp): the
// errno to fail the open with (EMFILE), or 0.
int short_of_descriptors() noexcept;
// Called by a bulk file that could not open for want of descriptors just
// before it rations its job, and just after (bulk.cpp).
void shortage_step() noexcept;

}  // namespace gdscp::detail::fault
