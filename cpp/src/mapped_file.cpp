#include "gdscp/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "gdscp/detail/device_pointer.hpp"
#include "gdscp/detail/dispatch.hpp"
#include "gdscp/detail/fault.hpp"
#include "gdscp/detail/file.hpp"
#include "gdscp/detail/mapped_read.hpp"
#include "gdscp/detail/request.hpp"
#include "gdscp/detail/staging.hpp"
#include "gdscp/detail/work_queue.hpp"
#include "gdscp/error.hpp"

namespace gdscp {
namespace detail {

// The open descriptor and the mapped region. Requests keep it alive, so
// close() during a pread never unmaps pages a task is copying.
struct Mapping {
  std::string path;
  int fd = -1;
  void* base = nullptr;  // the mapping: from the page holding `offset`
  size_t length = 0;     // mapped bytes
  size_t lead = 0;       // bytes of the first page before `offset`
  int64_t offset = 0;    // the region as asked for
  size_t size = 0;

  const char* at(int64_t file_offset) const {
    return static_cast<const char*>(base) + lead + static_cast<size_t>(file_offset - offset);
  }

  ~Mapping() {
    fault::unmapping();  // tests only: disarmed, one relaxed load
    if (base) ::munmap(base, length);
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace detail

namespace {

using detail::Chunk;
using detail::ChunkQueue;
using detail::Mapping;
using detail::MemoryTarget;

int64_t size_of(int fd, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) throw_os_error(errno, "cannot stat", path);
  return detail::content_size(fd, st, path);
}

[[noreturn]] void shrank(const Mapping& m, int64_t file_size) {
  throw_state("reading '" + m.path + "' through its mapping failed: the file no longer holds those bytes (it "
              "shrank to " + std::to_string(file_size) + " bytes after it was mapped)");
}

// The copy faults on a page past the end of a file that shrank, or on a page
// of the destination that cannot be written (a mapping of another file cut
// short since): the file's size tells which, and the error names the one at
// fault. pread reports a destination's fault as EFAULT, and so does this.
void copy_piece(const Mapping& m, char* dst, const char* src, int64_t at, size_t n) {
  if (detail::copy_from_mapping(dst, src, n)) return;
  const int64_t file_size = size_of(m.fd, m.path);
  if (file_size < at + static_cast<int64_t>(n)) shrank(m, file_size);
  throw_os_error(EFAULT, "the buffer cannot take the bytes read through the mapping of", m.path, at);
}

// After a copy out of the mapping: the file still holds [0, end). A shrink
// while the bytes were copied leaves zeros, not a fault, in the last page.
void still_holds(const Mapping& m, int64_t end) {
  const int64_t file_size = size_of(m.fd, m.path);
  if (end > file_size) shrank(m, file_size);
}

// Copies the chunks this worker claims from `work`: into host memory
// directly; into device memory through the engine's pinned staging pipeline
// (staging.hpp), each piece copied out of the mapping while the pieces before
// it go to the GPU.
size_t copy_chunks(const Mapping& m, const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings& s,
                   detail::Request* req) {
  int64_t end = 0;
  if (mem.device) {
    const size_t total = detail::staged_upload(mem, base, work, s, req, [&m, &end](char* dst, size_t n, int64_t at, size_t) {
      copy_piece(m, dst, m.at(at), at, n);
      end = std::max(end, at + static_cast<int64_t>(n));
      return n;
    });
    still_holds(m, end);
    return total;
  }
  size_t total = 0;
  Chunk c;
  while (work.next(c)) {
    copy_piece(m, base + c.buf_offset, m.at(c.file_offset), c.file_offset, c.size);
    end = std::max(end, c.file_offset + static_cast<int64_t>(c.size));
    total += c.size;
    if (req) req->add_progress(c.size);
  }
  still_holds(m, end);
  return total;
}

MemoryTarget target_for(uintptr_t ptr, bool device) {
  return device ? detail::resolve_device_pointer(ptr) : MemoryTarget{};
}

}  // namespace

MappedFile::MappedFile(std::string path, std::string_view flags, std::optional<size_t> map_size, int64_t map_offset,
                       int map_flags)
    : path_(std::move(path)) {
  const detail::OpenMode mode = detail::parse_open_mode(flags);
  if (!mode.readable || (mode.flags & O_CREAT))
    throw_invalid("a mapped file is opened for reading: flags must be 'r' or 'r+', not '" + std::string(flags) + "'");
  if (map_size && *map_size == 0) throw_invalid("the mapped region of '" + path_ + "' must not be empty (size 0)");
  auto m = std::make_shared<Mapping>();
  m->path = path_;
  // Without blocking: a FIFO would wait for a writer here, where no Ctrl-C
  // reaches the call. What has no pages to map is refused.
  do {
    m->fd = ::open(path_.c_str(), mode.flags | O_NONBLOCK);
  } while (m->fd < 0 && errno == EINTR);
  if (m->fd < 0) throw_os_error(errno, "cannot open", path_);
  struct stat st{};
  if (::fstat(m->fd, &st) != 0) throw_os_error(errno, "cannot stat", path_);
  if (S_ISDIR(st.st_mode)) throw_os_error(EISDIR, "cannot map", path_);
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
    throw_os_error(ENODEV, S_ISFIFO(st.st_mode) ? "cannot map a FIFO" : "cannot map a socket", path_);
  const int64_t file_size = detail::content_size(m->fd, st, path_);
  if (map_offset > file_size || (map_offset == file_size && file_size > 0))
    throw_range("initial_map_offset " + std::to_string(map_offset) + " is not inside '" + path_ + "' (" +
                std::to_string(file_size) + " bytes)");
  const size_t size = map_size ? *map_size : static_cast<size_t>(file_size - map_offset);
  if (size > static_cast<size_t>(file_size - map_offset))
    throw_range("the region of " + std::to_string(size) + " bytes at offset " + std::to_string(map_offset) +
                " ends past the end of '" + path_ + "' (" + std::to_string(file_size) + " bytes)");
  m->offset = map_offset;
  m->size = size;
  if (size > 0) {
    const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
    const int64_t start = map_offset / page * page;
    m->lead = static_cast<size_t>(map_offset - start);
    m->length = m->lead + size;
    void* base = ::mmap(nullptr, m->length, PROT_READ, map_flags, m->fd, start);
    if (base == MAP_FAILED) throw_os_error(errno, "cannot map", path_, map_offset);
    m->base = base;
  }
  map_ = std::move(m);
}

void MappedFile::close() {
  std::shared_ptr<const Mapping> m;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    m.swap(map_);
  }
  // Unmapped and closed as `m` goes, after the lock (the munmap of a large
  // region takes a while, and the handle's other calls wait for the lock),
  // or, where reads in flight still hold the mapping, as the last one ends.
}

bool MappedFile::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !map_;
}

std::shared_ptr<const Mapping> MappedFile::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!map_) throw Error(ErrorKind::closed, 0, "read from a closed mapped file '" + path_ + "'");
  return map_;
}

size_t MappedFile::file_size() const {
  std::shared_ptr<const Mapping> m;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    m = map_;
  }
  return m ? static_cast<size_t>(size_of(m->fd, path_)) : 0;
}

size_t MappedFile::map_size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_ ? map_->size : 0;
}

int64_t MappedFile::map_offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_ ? map_->offset : 0;
}

std::shared_ptr<const Mapping> MappedFile::checked(size_t size, int64_t offset) const {
  std::shared_ptr<const Mapping> m = state();
  const int64_t file_size = size_of(m->fd, path_);
  if (offset > file_size)
    throw_range("offset " + std::to_string(offset) + " is past the end of '" + path_ + "' (" +
                std::to_string(file_size) + " bytes)");
  if (size > 0 && (offset < m->offset || static_cast<size_t>(offset - m->offset) > m->size ||
                   size > m->size - static_cast<size_t>(offset - m->offset)))
    throw_range("the read of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                " is outside the mapped region of '" + path_ + "' (" + std::to_string(m->size) +
                " bytes at offset " + std::to_string(m->offset) + ")");
  // Inside the region, but the file shrank since: its last page past the new
  // end reads as zeros rather than faulting, so zeros would pass for data.
  if (size > static_cast<size_t>(file_size - offset)) shrank(*m, file_size);
  return m;
}

size_t MappedFile::read(uintptr_t buf, bool device, size_t size, int64_t offset, const Settings& s) {
  std::shared_ptr<const Mapping> m = checked(size, offset);
  if (size == 0) return 0;
  const MemoryTarget mem = target_for(buf, device);
  ChunkQueue one({Chunk{0, offset, size}}, size);
  return copy_chunks(*m, mem, reinterpret_cast<char*>(buf), one, s, nullptr);
}

std::unique_ptr<Future> MappedFile::pread(uintptr_t buf, bool device, size_t size, int64_t offset,
                                          const Settings& s) {
  std::shared_ptr<const Mapping> m = checked(size, offset);
  // Nothing to copy, as read(): an empty GPU array has no address to resolve.
  if (size == 0) return Future::ready(0);
  const MemoryTarget mem = target_for(buf, device);
  detail::Dispatch d = detail::plan_dispatch(offset, size, s);
  auto req = std::make_shared<detail::Request>(d.tasks, m);
  auto work = std::make_shared<ChunkQueue>(std::move(d.chunks), d.chunk_size, req->cancel_flag(), d.tasks);
  // A cancel leaves pieces that other workers had started moved past the
  // ones it skipped: the result is what the queue moved without a gap, and
  // cancelled() sees the skip, as for a CuFile.
  req->count_contiguous(work);
  char* base = reinterpret_cast<char*>(buf);
  // The request keeps the mapping alive until the last task ends.
  detail::run_tasks(req, d, [m, mem, base, s, req, work] { return copy_chunks(*m, mem, base, *work, s, req.get()); });
  return std::make_unique<Future>(std::move(req));
}

}  // namespace gdscp
