// Many files at once: a job of items (read a file into memory, write memory
// to a file, copy a file to a file) run over the process's worker pool. Each
// worker takes whole small files, so their per-file costs (open, fstat,
// transfer, fsync, rename, close) overlap; a large file is cut into chunks that
// idle workers join. Copies and reads without a destination buffer move
// through staging memory (host, or a region of device memory the caller
// gives) of a bounded size, whatever the number of files.
//
// A destination name only ever shows a complete file: written to a locked
// temporary file beside it (detail/temp_file.hpp), made durable, then renamed
// into place, the directory fsynced after. docs/durability.md is the promise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gdscp/settings.hpp"

namespace gdscp {

enum class BulkKind { read = 0, write = 1, copy = 2 };

struct BulkItem {
  BulkKind kind = BulkKind::read;
  std::string src;       // read, copy: the file read
  std::string dst;       // write, copy: the file written
  uintptr_t buf = 0;     // read, write: the memory; a read with 0 lands in staging and is dropped
  bool device = false;   // `buf` is device memory
  int64_t size = -1;     // read: bytes wanted (-1: to the end of the file); write: bytes of `buf`
  int64_t offset = 0;    // read: where in the file to start
  bool exact = false;    // read: fewer than `size` bytes is a failure, not end of file
  // write, copy: a new file's permission bits; -1: a copy takes its source's
  // (less the umask), a write 0666 less the umask.
  int mode = -1;
  bool keep_mode = true;   // write, copy: an existing destination keeps its own mode
  bool set_times = false;  // write, copy: give the file these access and modification times
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  // read into device memory: more buffers of `size` bytes, each on another
  // GPU, that get the same bytes. The file is read once; each chunk lands on
  // one of the GPUs (in turn) and is copied from there to the others, GPU to
  // GPU where they have peer access, else from the same pinned host chunk.
  std::vector<uintptr_t> replicas;
  // write, copy: `size` bytes at `offset` of `dst`, an existing regular file
  // written in place (a temporary file another process made and will rename):
  // no temporary of its own, no truncation, no rename, its mode and times left
  // alone; the range made durable with the file's own fsync. A copy reads the
  // same range of `src`, which must hold all of it.
  bool part = false;
  // read, copy: `src` must still be the file a caller found there (a tree's
  // walk): opened without following a symbolic link, it must be a regular
  // file of device `src_dev` and inode `src_ino`, else the item fails, the
  // source "replaced while being copied" (as cp says), with nothing written;
  // a whole-file copy under no_clobber whose destination exists is skipped.
  bool has_src_id = false;
  uint64_t src_dev = 0;
  uint64_t src_ino = 0;
};

// When data is made durable. file: each file fsynced on its worker. group: one
// syncfs per filesystem for a batch of files (their own fsyncs for a batch of
// a few) before their renames. automatic: group for jobs of many files, file
// otherwise. none: no fsync (the rename still comes last).
enum class BulkSync { none = 0, file = 1, group = 2, automatic = 3 };

struct BulkOptions {
  bool atomic = true;       // write, copy: temporary file, renamed into place when complete
  BulkSync sync = BulkSync::automatic;
  bool no_clobber = false;  // put files in place with link(): an existing destination is skipped
  bool fail_fast = false;   // the first failure cancels the rest
  // copy: compare each temporary file (read from storage) with its source
  // before it replaces the destination; read: compare the bytes that landed
  // with a plain read of the file.
  bool verify = false;
  bool clean = true;        // remove dead runs' temporary files from destination directories
  bool preserve = false;    // copy: the source's exact mode and times, over keep_mode and mode
  // Staging for copies and reads without a buffer: device memory at `staging`
  // (`staging_size` bytes) when given, else host memory the engine allocates.
  uintptr_t staging = 0;
  size_t staging_size = 64u << 20;
  // Several GPUs: the workers are split into one group per GPU in `devices`
  // (ordinals), each with its own staging (`stagings[g]`, `staging_size`
  // bytes of device memory on devices[g], when given) and its own streams.
  // Each file is given to one group, balanced by bytes (a file with a buffer
  // goes to its buffer's GPU); the chunks of a file large enough to be cut are
  // shared out among all the groups by bytes. Empty: one group, as above.
  std::vector<int> devices;
  std::vector<uintptr_t> stagings;
  // Where libcufile is, if the system has none (as for Handle).
  std::string cufile_library;
};

enum class BulkStatus { pending = 0, running = 1, done = 2, failed = 3, skipped = 4, cancelled = 5 };

struct BulkResult {
  BulkStatus status = BulkStatus::pending;
  uint64_t bytes = 0;
  double seconds = 0;        // the file's own transfer time, from its start to its data written
  std::string error;         // what failed, where and why
  int error_kind = 0;        // gdscp::ErrorKind of the failure
  int error_code = 0;        // its errno, CUresult or cuFile code
  std::string read_backend;  // what the file was read and written through: "posix" or "cufile"
  std::string write_backend;
  std::string backend_reason;  // why device memory took that backend (the source's, for a copy)
  std::string note;          // why a file was skipped
};

struct BulkProgress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;  // each file's size as given until it opens, then as found (0 if it never moves)
  size_t files_done = 0;     // done or skipped
  size_t files_failed = 0;
  size_t files_total = 0;
  bool finished = false;
};

namespace detail {
struct BulkState;
}

class BulkJob {
 public:
  // Starts the job on the process's pool and returns at once. Throws for an
  // item the engine cannot take at all (a device pointer CUDA does not know).
  BulkJob(std::vector<BulkItem> items, const BulkOptions& options, const Settings& s);
  // Waits for the workers: they may still use the items' memory.
  ~BulkJob();
  BulkJob(const BulkJob&) = delete;
  BulkJob& operator=(const BulkJob&) = delete;

  // Waits up to `seconds` (negative: forever); true once every item has ended.
  bool wait_for(double seconds) const;
  bool done() const;
  // Files not started are cancelled; files in flight stop at their next chunk
  // and their temporary files are removed.
  void cancel();
  BulkProgress progress() const;
  std::vector<BulkResult> results() const;
  // (index, result) of the items that failed so far.
  std::vector<std::pair<size_t, BulkResult>> failures() const;
  // Bytes moved by each group's workers (one entry per BulkOptions::devices,
  // or one for a job without devices).
  std::vector<uint64_t> group_bytes() const;

 private:
  std::shared_ptr<detail::BulkState> state_;
};

// Cancels every job of this process that has not finished and waits until
// each has (its files in flight stopped, their temporary files removed):
// for a program that leaves on an exception no job's own wait saw, even one
// that struck between a job's start and its caller holding it.
void stop_running_jobs();

// Temporary files of dead writers in `dir` (named as temp_file.hpp says, and
// unlocked): removed, but for the files that the paths in `keep` name (the
// sources of a copy); returns how many.
size_t clean_temporaries(const std::string& dir, const std::vector<std::string>& keep = {});

// A new locked temporary file beside `dst`, for callers that write it
// themselves: (descriptor, path). The lock lives as long as the descriptor.
// Refused (EACCES) where `dst` exists and may not be written, as cp refuses it.
// With `dir_fd`: there, a descriptor (O_PATH, the caller's to close) of the
// directory the file was made in, to remove and rename it through
// (unlinkat, renameat) wherever that directory is moved meanwhile.
std::pair<int, std::string> create_temporary(const std::string& dst, int* dir_fd = nullptr);

// (earlier, later) for each of `paths`, the destinations of one job, that
// lands where an earlier one does: the same name in the same directory,
// however spelled; an existing symbolic link (where `follow[i]`; all where
// `follow` is empty) also as what a write through it replaces; a FIFO or
// device, and with `in_place` any existing file, also as the file itself.
std::vector<std::pair<size_t, size_t>> same_destinations(const std::vector<std::string>& paths,
                                                         const std::vector<bool>& follow, bool in_place);

// The suffix every temporary file's name ends with.
extern const char* const kTemporarySuffix;

// Whether a file name (no directory) is a temporary file's, as the cleaner
// sees it: ".NAME.XXXXXXXX" and the suffix.
bool is_temporary_name(const std::string& name);

// A new temporary name beside `dst`, not made: for callers that make
// something other than a file under it (a symbolic link).
std::string temporary_name(const std::string& dst);

}  // namespace gdscp
