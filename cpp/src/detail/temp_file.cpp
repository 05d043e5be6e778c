#include "gdscp/detail/temp_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <ctime>
#include <random>

#include "gdscp/error.hpp"

namespace gdscp::detail {
namespace {

constexpr size_t kRandomChars = 8;
// A temporary symbolic link (the command line makes them for links inside
// trees) cannot be locked; its writer renames it within milliseconds, so one
// whose inode changed longer ago than this belongs to a dead writer.
constexpr time_t kLinkGraceSeconds = 60;

std::string random_chars() {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  // splitmix64 (a small state: a module loaded with dlopen has little static
  // TLS), seeded per thread from the random device.
  thread_local uint64_t state = std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32);
  std::string out(kRandomChars, 'x');
  for (char& c : out) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    c = alphabet[(z ^ (z >> 31)) % (sizeof alphabet - 1)];
  }
  return out;
}

// How this process links an unnamed file (O_TMPFILE) to a name: through
// AT_EMPTY_PATH (Linux 6.10 on, or with CAP_DAC_READ_SEARCH), else through
// its /proc/self/fd link; found with the first unnamed file.
enum LinkWay : int { kUnknown, kEmptyPath, kProcLink, kNoWay };
std::atomic<int> g_link_way{kUnknown};

int link_fd(int fd, const char* path, int way) {
  if (way == kEmptyPath) return ::linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH);
  char proc[40];
  std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  return ::linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW);
}

// The way, found by linking `fd` onto `dir`, which exists: the kernel checks
// the right to link a descriptor before it looks at the new name, so EEXIST
// says the way works, and nothing is ever made.
int link_way(int fd, const std::string& dir) {
  int way = g_link_way.load(std::memory_order_relaxed);
  if (way != kUnknown) return way;
  way = kNoWay;
  for (int w : {kEmptyPath, kProcLink}) {
    if (link_fd(fd, dir.c_str(), w) != 0 && errno == EEXIST) {
      way = w;
      break;
    }
  }
  g_link_way.store(way, std::memory_order_relaxed);
  return way;
}

}  // namespace

std::string_view base_of(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool is_temporary_name(std::string_view name) {
  // "." + NAME + "." + 8 characters + suffix, NAME possibly empty.
  const size_t min = 1 + 1 + kRandomChars + kTempSuffix.size();
  if (name.size() < min || name[0] != '.') return false;
  if (name.substr(name.size() - kTempSuffix.size()) != kTempSuffix) return false;
  return name[name.size() - kTempSuffix.size() - kRandomChars - 1] == '.';
}

std::string temporary_name(const std::string& dst) {
  // NAME is cut so that the temporary name fits where its destination does:
  // a name of NAME_MAX bytes, and a path of up to PATH_MAX - 1 bytes (where
  // even no NAME is too long, TempFile reaches it through its directory).
  const size_t fixed = 2 + kRandomChars + kTempSuffix.size();
  const std::string dir = dir_of(dst);
  const size_t used = dir.size() + (dir.back() == '/' ? 0 : 1) + fixed;
  const size_t room = std::min<size_t>(NAME_MAX - fixed, used < PATH_MAX ? PATH_MAX - 1 - used : 0);
  return (dir.back() == '/' ? dir : dir + "/") + "." + std::string(base_of(dst).substr(0, room)) + "." +
         random_chars() + std::string(kTempSuffix);
}

void check_replaceable(const std::string& dst) {
  if (::faccessat(AT_FDCWD, dst.c_str(), W_OK, AT_EACCESS) != 0 && errno == EACCES)
    throw_os_error(EACCES, "cannot overwrite", dst);
}

TempFile::TempFile(const std::string& dst, unsigned mode) {
  try {
    create(dst, mode);
  } catch (...) {
    close_dir();  // no destructor runs for an object whose constructor throws
    throw;
  }
}

void TempFile::create(const std::string& dst, unsigned mode) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string path = name_beside(dst);
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      if (errno == EACCES || errno == EPERM)  // a writable file in a directory that is not: cp writes it in place
        throw_os_error(errno,
                       "the new copy is written beside its destination and renamed over it, so the directory "
                       "must be writable: cannot create a temporary file for", dst);
      throw_os_error(errno, "cannot create a temporary file for", dst);
    }
    // Between the open and the lock a cleaner may find the file unlocked and
    // remove it; the lock then holds an unnamed file, so try another name.
    int r;
    do {
      r = ::flock(fd, LOCK_EX);
    } while (r != 0 && errno == EINTR);
    struct stat st{};
    if (r != 0 || ::fstat(fd, &st) != 0) {
      const int err = errno;
      ::unlink(path.c_str());
      ::close(fd);
      throw_os_error(err, "cannot lock the temporary file", path);
    }
    if (st.st_nlink == 0) {
      ::close(fd);
      continue;
    }
    fd_ = fd;
    dev_ = st.st_dev;
    path_ = std::move(path);
    named_ = true;
    return;
  }
  throw_os_error(EEXIST, "no free temporary name beside", dst);
}

TempFile TempFile::unnamed(const std::string& dst, unsigned mode) {
  if (g_link_way.load(std::memory_order_relaxed) != kNoWay) {
    const std::string dir = dir_of(dst);
    int fd;
    do {
      fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, static_cast<mode_t>(mode));
    } while (fd < 0 && errno == EINTR);
    // Without O_TMPFILE here (EOPNOTSUPP, or EISDIR from an old kernel) or a
    // way to link it, or on any other error, a named file: its own errors
    // are the ones to report.
    if (fd >= 0) {
      struct stat st{};
      if (link_way(fd, dir) != kNoWay && ::fstat(fd, &st) == 0) {
        TempFile t;
        t.fd_ = fd;
        t.dev_ = st.st_dev;
        t.unnamed_ = true;
        return t;
      }
      ::close(fd);
    }
  }
  return TempFile(dst, mode);
}

int TempFile::link_at(const std::string& path) const noexcept {
  return link_fd(fd_, path.c_str(), g_link_way.load(std::memory_order_relaxed));
}

TempFile& TempFile::operator=(TempFile&& o) noexcept {
  if (this != &o) {
    discard();
    fd_ = o.fd_;
    dev_ = o.dev_;
    path_ = std::move(o.path_);
    dir_fd_ = o.dir_fd_;
    o.dir_fd_ = -1;
    named_ = o.named_;
    unnamed_ = o.unnamed_;
    o.fd_ = -1;
    o.named_ = false;
    o.unnamed_ = false;
  }
  return *this;
}

void TempFile::rename_to(const std::string& dst) {
  if (unnamed_) {
    if (link_at(dst) == 0) {
      unnamed_ = false;
      return;
    }
    if (errno != EEXIST) throw_os_error(errno, "cannot link the copy into place at", dst);
    // Something is there to replace: a name beside it, locked first so that
    // no cleaner takes it, then the rename over it.
    int r;
    do {
      r = ::flock(fd_, LOCK_EX);
    } while (r != 0 && errno == EINTR);
    if (r != 0) throw_os_error(errno, "cannot lock the copy of", dst);
    for (int attempt = 0; unnamed_; ++attempt) {
      std::string path = name_beside(dst);
      if (link_at(path) == 0) {
        path_ = std::move(path);
        named_ = true;
        unnamed_ = false;
      } else if (errno != EEXIST || attempt == 99) {
        throw_os_error(errno, "cannot name the copy beside", dst);
      }
    }
  }
  if (::rename(path_.c_str(), dst.c_str()) != 0) throw_os_error(errno, "cannot rename the copy into place at", dst);
  named_ = false;
}

bool TempFile::link_to(const std::string& dst) {
  if (unnamed_) {
    if (link_at(dst) == 0) {
      unnamed_ = false;
      return true;
    }
    if (errno == EEXIST) return false;
    throw_os_error(errno, "cannot link", dst);
  }
  if (::link(path_.c_str(), dst.c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST) return false;
    if (err != EPERM && err != EOPNOTSUPP && err != EXDEV && err != EMLINK) throw_os_error(err, "cannot link", dst);
    // No hard links here: check, then rename.
    struct stat st{};
    if (::lstat(dst.c_str(), &st) == 0) return false;
    rename_to(dst);
    return true;
  }
  ::unlink(path_.c_str());
  named_ = false;
  return true;
}

void TempFile::close() noexcept {
  // An unnamed file goes with its last descriptor.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  unnamed_ = false;
  close_dir();
}

void TempFile::close_dir() noexcept {
  if (dir_fd_ >= 0) ::close(dir_fd_);
  dir_fd_ = -1;
}

std::string TempFile::name_beside(const std::string& dst) {
  std::string path = temporary_name(dst);
  if (path.size() < PATH_MAX) return path;
  // No room for it within PATH_MAX, even cut to no NAME (a destination of a
  // short name, its path within 20 bytes of the limit): the name is reached
  // through a descriptor of its directory, which a system call takes whole
  // (the kernel follows /proc/self/fd/N to the directory itself).
  if (dir_fd_ < 0) {
    dir_fd_ = ::open(dir_of(dst).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd_ < 0) throw_os_error(errno, "cannot open the directory of", dst);
  }
  return "/proc/self/fd/" + std::to_string(dir_fd_) + "/" + std::string(base_of(path));
}

void TempFile::discard() noexcept {
  // Unlink before close: while the lock is held no cleaner can take the name.
  if (named_) ::unlink(path_.c_str());
  named_ = false;
  close();
}

int TempFile::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  named_ = false;
  unnamed_ = false;
  close_dir();
  return fd;
}

bool file_id(const std::string& path, FileId& id) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

size_t clean_temporaries(const std::string& dir, const std::vector<FileId>& keep) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return 0;
  DIR* d = ::fdopendir(dfd);
  if (!d) {
    ::close(dfd);
    return 0;
  }
  size_t removed = 0;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    if (!is_temporary_name(e->d_name)) continue;
    struct stat st{};
    if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const auto kept = [&](const FileId& k) { return k.dev == st.st_dev && k.ino == st.st_ino; };
    if (std::any_of(keep.begin(), keep.end(), kept)) continue;
    if (S_ISLNK(st.st_mode)) {
      if (now - st.st_ctime > kLinkGraceSeconds && ::unlinkat(dfd, e->d_name, 0) == 0) ++removed;
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    // For writing where allowed: NFS emulates flock with byte-range locks, and
    // an exclusive one needs a descriptor open for writing.
    int fd = ::openat(dfd, e->d_name, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fd = ::openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    // The lock taken: no writer holds the file. Unlink while holding it, so a
    // writer that opened the name meanwhile sees it gone (TempFile retries).
    struct stat locked{};
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(fd, &locked) == 0 && locked.st_ino == st.st_ino &&
        locked.st_nlink > 0 && ::unlinkat(dfd, e->d_name, 0) == 0)
      ++removed;
    ::close(fd);
  }
  ::closedir(d);
  return removed;
}

}  // namespace gdscp::detail
