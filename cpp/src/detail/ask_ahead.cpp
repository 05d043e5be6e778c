#include "gdscp/detail/ask_ahead.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gdscp/detail/sysfs.hpp"

namespace gdscp::detail {
namespace {

constexpr size_t kDefaultStep = size_t{128} << 10;  // VM_READAHEAD_PAGES of a 4 KiB page

// A sysfs size in KiB as bytes; 0 if the file is missing or says no number.
size_t kib_at(const std::string& path) {
  const std::string text = first_word(path);
  char* end = nullptr;
  const unsigned long long kib = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || kib > (size_t{1} << 40)) return 0;
  return static_cast<size_t>(kib) << 10;
}

size_t read_step(dev_t dev) {
  const std::string id = std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  const std::string block = sysfs_root() + "/dev/block/" + id;
  // A whole disk has queue/ of its own; a partition's is its disk's, one up.
  size_t step = 0;
  for (const char* queue : {"/queue/", "/../queue/"}) {
    step = std::max(kib_at(block + queue + "max_sectors_kb"), kib_at(block + queue + "read_ahead_kb"));
    if (step) break;
  }
  // Not a block device (NFS and other network filesystems): the readahead
  // window of the filesystem's own backing device.
  if (!step) step = kib_at(sysfs_root() + "/class/bdi/" + id + "/read_ahead_kb");
  return step >= 4096 ? step : kDefaultStep;
}

}  // namespace

size_t readahead_step(dev_t dev) {
  static std::mutex mutex;
  static std::vector<std::pair<dev_t, size_t>> known;  // a few devices in a process's life
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [d, step] : known)
    if (d == dev) return step;
  const size_t step = read_step(dev);
  known.emplace_back(dev, step);
  return step;
}

void ask_disk(int fd, int64_t off, size_t len) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  if (off >= st.st_size) return;  // nothing there to read ahead
  len = std::min(len, static_cast<size_t>(st.st_size - off));
  const size_t step = readahead_step(st.st_dev);
  for (size_t at = 0; at < len; at += step)
    ::posix_fadvise(fd, off + static_cast<int64_t>(at), static_cast<off_t>(std::min(step, len - at)),
                    POSIX_FADV_WILLNEED);
}

}  // namespace gdscp::detail
