#include "testing.hpp"

#include <sys/sysmacros.h>

#include "gdscp/system_info.hpp"

#include <nanobind/stl/string.h>

#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "buffers.hpp"
#include "release_gil.hpp"
#include "gdscp/detail/ask_ahead.hpp"
#include "gdscp/detail/buffer_pool.hpp"
#include "gdscp/detail/dispatch.hpp"
#include "gdscp/detail/fault.hpp"
#include "gdscp/detail/mapped_read.hpp"
#include "gdscp/detail/thread_pool.hpp"
#include "gdscp/detail/work_queue.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gdscp::bindings {
namespace {

using release = nb::call_guard<ReleaseGil>;

void arm_fault(const std::string& op, long skip, long count, int err) {
  using detail::fault::Op;
  Op which;
  if (op == "pread") which = Op::pread;
  else if (op == "pwrite") which = Op::pwrite;
  else if (op == "land") which = Op::land;  // the first byte of what a bulk job's verify checks is flipped
  else if (op == "copy_file_range") which = Op::kernel_copy;
  else throw nb::value_error("op must be 'pread', 'pwrite', 'land' or 'copy_file_range'");
  if (err == 0 && which != Op::pread && which != Op::kernel_copy)
    throw nb::value_error("only a pread or a copy_file_range can move nothing (errno 0)");
  detail::fault::arm(which, skip, count, err == 0 ? detail::fault::kEndOfFile : err);
}

// The pieces `workers` workers claim from one request (chunks of `chunk`
// bytes, staging pieces of `piece`), the workers taking turns in an order
// drawn from `seed` and each starting at its first turn, as the pool's
// workers do. Returns (worker, buf_offset, file_offset, size, ahead) in claim
// order, `ahead` being what a cold piece asks of the disk after itself.
nb::list plan_pieces(int64_t file_offset, size_t size, size_t chunk, size_t piece, size_t workers, bool stagger,
                     uint64_t seed) {
  detail::ChunkQueue work(detail::split(file_offset, size, chunk), chunk, nullptr, workers);
  std::vector<std::unique_ptr<detail::PieceStream>> streams(workers);
  std::vector<size_t> active(workers);
  for (size_t w = 0; w < workers; ++w) active[w] = w;
  std::mt19937_64 rng(seed);
  nb::list out;
  while (!active.empty()) {
    const size_t i = rng() % active.size();
    const size_t w = active[i];
    if (!streams[w]) streams[w] = std::make_unique<detail::PieceStream>(work, piece, stagger);
    detail::Chunk c;
    if (streams[w]->next(c)) {
      out.append(nb::make_tuple(w, c.buf_offset, c.file_offset, c.size, streams[w]->ahead()));
    } else {
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return out;
}

// The copy mapped reads make, on an explicit range: [file_offset, file_offset
// + len(dst)) of `fd` into `dst`, with no check that the pages are cached or
// inside the file. True if every byte was copied; False if the SIGBUS guard
// caught a fault (a page past the end of the file).
bool mapped_copy(int fd, nb::handle dst, int64_t file_offset) {
  const BufferView view(dst, /*writable=*/true);
  const detail::MappedRange range(fd, file_offset, view.size());
  if (!range.mapped()) throw nb::value_error("the range could not be mapped");
  ReleaseGil unlocked;
  return range.copy_to(view.data());
}

}  // namespace

static void hold_staging_lock(double seconds) {
  std::promise<void> held;
  std::future<void> ready = held.get_future();
  std::thread([seconds, held = std::move(held)]() mutable {
    auto lock = detail::BufferPool::aligned().hold_lock_for_testing();
    held.set_value();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }).detach();
  ready.wait();
}

void define_testing(nb::module_& core) {
  nb::module_ t = core.def_submodule("testing", "Test hooks (tests/ only): not part of gdscp's interface");
  t.def("arm_fault", &arm_fault, "op"_a, "skip"_a, "count"_a, "errno"_a,
        "After `skip` more successful calls of `op` (pread, pwrite, land, copy_file_range), fail the next "
        "`count` with `errno` (0: a pread or copy_file_range moves nothing, as at end of file).");
  t.def("disarm_fault", &detail::fault::disarm, "Disarm every fault, and release a hold.");
  t.def("arm_hold", &detail::fault::arm_hold, "skip"_a,
        "After `skip` more chunks of bulk transfers or parallel preads/pwrites, every worker reaching the next one "
        "waits there until its job or request is cancelled (or disarm_fault(), or a minute): a signal sent (or a "
        "fork made) then lands while the transfer is in flight.");
  t.def("hold_reached", &detail::fault::hold_reached, "Whether a worker has reached the hold since arm_hold.");
  t.def("held_workers", &detail::fault::held_workers,
        "How many workers wait at the hold now (each doing nothing else: a fork then finds none of them in malloc).");
  t.def("arm_progress_hold", &detail::fault::arm_progress_hold,
        "The next bulk job's progress() releases a hold (arm_hold) between reading whether its job has finished "
        "and reading its counts, and waits there for the job to finish: the job ends mid-read, every time.");
  t.def("arm_unmap_hold", &detail::fault::arm_unmap_hold,
        "The next mapped file unmapped waits just before its munmap until disarm_fault() (or a minute).");
  t.def("arm_worker_limit", &detail::fault::arm_worker_limit, "n"_a,
        "The thread pool's workers from index `n` on cannot start, refused their thread as by a system out of "
        "threads (EAGAIN); a negative `n` (or disarm_fault()) lifts the limit.");
  t.def("arm_memory_available", &detail::fault::arm_memory_available, "nbytes"_a,
        "Pinned staging finds `nbytes` of memory available instead of what /proc/meminfo says; a negative "
        "`nbytes` (or disarm_fault()) lifts it.");
  t.def("arm_source_swap", &detail::fault::arm_source_swap, "replacement"_a,
        "The next bulk source read as a file handle (1 MiB or more, or through device memory) has `replacement` "
        "renamed over its path once it is opened and measured, before that handle is made; disarm_fault() drops it.");
  t.def("arm_destination_move", &detail::fault::arm_destination_move, "moved_to"_a,
        "The next bulk destination whose temporary file is made and then opened again by its path (1 MiB or more, "
        "or through device memory) has its directory renamed to `moved_to` just before that open; disarm_fault() "
        "drops it.");
  t.def("arm_descriptor_shortage", &detail::fault::arm_descriptor_shortage, "workers"_a,
        "The next bulk job's `workers` workers (all it has) find the process out of descriptors together: each "
        "one's first file fails to open (EMFILE) once all have taken off, and they ration the job in step, every "
        "file aborted before any rations and every one rationed before any goes on (or disarm_fault(), or a "
        "minute).");
  t.def("unmap_held", &detail::fault::unmap_held, "Whether a mapped file waits at its munmap now.");
  t.def("mapped_read_bytes", &detail::mapped_read_bytes, "Bytes copied by mapped reads since the process started.");
  t.def("pinned_bytes", [] { return detail::BufferPool::pinned().bytes_allocated(); },
        "Pinned staging memory allocated, idle and leased.");
  t.def("busy_threads", [] { return detail::ThreadPool::process_default().busy(); },
        "Workers of the process's pool running a task now.");
  t.def("plan_pieces", &plan_pieces, "file_offset"_a, "size"_a, "chunk"_a, "piece"_a, "workers"_a, "stagger"_a,
        "seed"_a);
  t.def("dispatch_chunks", [](int64_t file_offset, size_t size, size_t task_size, size_t min_task_size,
                              size_t bounce_buffer_size) {
    Settings s;
    s.task_size = task_size;
    s.min_task_size = min_task_size;
    s.bounce_buffer_size = bounce_buffer_size;
    const detail::Dispatch d = detail::plan_dispatch(file_offset, size, s);
    nb::list chunks;
    for (const detail::Chunk& c : d.chunks) chunks.append(nb::make_tuple(c.buf_offset, c.file_offset, c.size));
    return nb::make_tuple(d.tasks, d.chunk_size, chunks);
  }, "file_offset"_a, "size"_a, "task_size"_a, "min_task_size"_a, "bounce_buffer_size"_a,
        "(tasks, chunk_size, [(buf_offset, file_offset, size)]) of a request planned for the process's pool.");
  t.def("readahead_step", [](unsigned major, unsigned minor) { return detail::readahead_step(makedev(major, minor)); },
        "major"_a, "minor"_a, "Bytes one WILLNEED call reads ahead on that device, as the engine steps cold reads.");
  t.def("ask_disk", &detail::ask_disk, "fd"_a, "offset"_a, "length"_a,
        "Asks the disk for the range as a cold read does, in readahead_step steps.");
  t.def("hold_staging_lock", &hold_staging_lock, "seconds"_a,
        "Holds the host staging pool's lock for `seconds` on a thread of its own; returns once it is held.");
  t.def("take_staging", [] { detail::BufferPool::aligned().acquire(4096); }, release(),
        "Leases a host staging buffer and gives it back.");
  t.def("mapped_copy", &mapped_copy, "fd"_a, "dst"_a, "file_offset"_a);
  t.def("set_nvidia_fs_version_path", &set_nvidia_fs_version_path, "path"_a,
        "Where the engine looks for nvidia-fs (\"\" restores /proc/driver/nvidia-fs/version).");
  t.def("object_check", [](const std::string& format) {
    static const char* const names[] = {"none", "objects", "unclear"};
    return names[static_cast<int>(object_check(format.c_str()))];
  }, "format"_a, "What the buffer guard makes of a struct format string: \"none\", \"objects\" or \"unclear\".");
}

}  // namespace gdscp::bindings
