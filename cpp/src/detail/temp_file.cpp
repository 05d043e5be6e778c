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
#include <mutex>
#include <random>
#include <unordered_map>

#include "gdscp/error.hpp"

namespace gdscp::detail {

struct HeldDirectory {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  HeldDirectory() = default;
  HeldDirectory(const HeldDirectory&) = delete;
  HeldDirectory& operator=(const HeldDirectory&) = delete;
  ~HeldDirectory() {
    if (fd >= 0) ::close(fd);
  }
};

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

// Links `fd` at `path`, relative to directory `dirfd` (or AT_FDCWD).
int link_fd(int fd, int dirfd, const char* path, int way) {
  if (way == kEmptyPath) return ::linkat(fd, "", dirfd, path, AT_EMPTY_PATH);
  char proc[40];
  std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  return ::linkat(AT_FDCWD, proc, dirfd, path, AT_SYMLINK_FOLLOW);
}

// The way, found by linking `fd` onto `dir`, which exists: the kernel checks
// the right to link a descriptor before it looks at the new name, so EEXIST
// says the way works, and nothing is ever made.
int link_way(int fd, const std::string& dir) {
  int way = g_link_way.load(std::memory_order_relaxed);
  if (way != kUnknown) return way;
  way = kNoWay;
  for (int w : {kEmptyPath, kProcLink}) {
    if (link_fd(fd, AT_FDCWD, dir.c_str(), w) != 0 && errno == EEXIST) {
      way = w;
      break;
    }
  }
  g_link_way.store(way, std::memory_order_relaxed);
  return way;
}

[[noreturn]] void cannot_create(int err, const std::string& dst) {
  if (err == EACCES || err == EPERM)  // a writable file in a directory that is not: cp writes it in place
    throw_os_error(err,
                   "the new copy is written beside its destination and renamed over it, so the directory "
                   "must be writable: cannot create a temporary file for", dst);
  throw_os_error(err, "cannot create a temporary file for", dst);
}

// A descriptor of directory `dir`, where a temporary file for `dst` is to be
// made. The files made in one directory at once share one (a job waiting
// for a batch of a thousand files in one directory keeps one descriptor of
// it, not a thousand), as long as the path still leads to it.
std::shared_ptr<const HeldDirectory> hold_directory(const std::string& dir, const std::string& dst) {
  struct Held {
    std::mutex mutex;
    std::unordered_map<std::string, std::weak_ptr<const HeldDirectory>> by_path;
    size_t sweep_at = 64;  // the map's size at which the directories no file holds any more are dropped
  };
  static Held* const held = new Held;  // never destroyed: files may be made as the process exits
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) cannot_create(errno, dst);
  {
    std::lock_guard<std::mutex> lock(held->mutex);
    const auto it = held->by_path.find(dir);
    if (it != held->by_path.end())
      if (auto d = it->second.lock(); d && d->dev == st.st_dev && d->ino == st.st_ino) return d;
  }
  auto d = std::make_shared<HeldDirectory>();
  do {
    d->fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  } while (d->fd < 0 && errno == EINTR);
  if (d->fd < 0) cannot_create(errno, dst);
  // What the descriptor holds, which may no longer be what the path led to
  // a moment ago.
  if (::fstat(d->fd, &st) != 0) cannot_create(errno, dst);
  d->dev = st.st_dev;
  d->ino = st.st_ino;
  std::lock_guard<std::mutex> lock(held->mutex);
  held->by_path[dir] = d;
  if (held->by_path.size() >= held->sweep_at) {
    for (auto it = held->by_path.begin(); it != held->by_path.end();)
      it = it->second.expired() ? held->by_path.erase(it) : std::next(it);
    held->sweep_at = std::max<size_t>(64, 2 * held->by_path.size());
  }
  return d;
}

}  // namespace

void throw_directory_moved(const std::string& dst, std::string_view during) {
  throw Error(ErrorKind::os, ENOENT,
              "the destination directory '" + dir_of(dst) + "' was moved or removed during " + std::string(during),
              dst);
}

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

TempFile::TempFile(const std::string& dst, unsigned mode) { create(dst, mode); }

void TempFile::create(const std::string& dst, unsigned mode) {
  if (!dir_) dir_ = hold_directory(dir_of(dst), dst);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::string full = temporary_name(dst);
    const std::string name(base_of(full));
    int fd;
    do {
      fd = ::openat(dir_->fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, static_cast<mode_t>(mode));
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      cannot_create(errno, dst);
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
      ::unlinkat(dir_->fd, name.c_str(), 0);
      ::close(fd);
      throw_os_error(err, "cannot lock the temporary file", full);
    }
    if (st.st_nlink == 0) {
      ::close(fd);
      continue;
    }
    fd_ = fd;
    dev_ = st.st_dev;
    take_name(full);
    return;
  }
  throw_os_error(EEXIST, "no free temporary name beside", dst);
}

TempFile TempFile::unnamed(const std::string& dst, unsigned mode) {
  const std::string dir = dir_of(dst);
  TempFile t;
  t.dir_ = hold_directory(dir, dst);
  if (g_link_way.load(std::memory_order_relaxed) != kNoWay) {
    int fd;
    do {
      fd = ::openat(t.dir_->fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, static_cast<mode_t>(mode));
    } while (fd < 0 && errno == EINTR);
    // Without O_TMPFILE here (EOPNOTSUPP, or EISDIR from an old kernel) or a
    // way to link it, or on any other error, a named file: its own errors
    // are the ones to report.
    if (fd >= 0) {
      struct stat st{};
      if (link_way(fd, dir) != kNoWay && ::fstat(fd, &st) == 0) {
        t.fd_ = fd;
        t.dev_ = st.st_dev;
        t.unnamed_ = true;
        return t;
      }
      ::close(fd);
    }
  }
  t.create(dst, mode);
  return t;
}

int TempFile::link_at(const std::string& name) const noexcept {
  return link_fd(fd_, dir_->fd, name.c_str(), g_link_way.load(std::memory_order_relaxed));
}

void TempFile::take_name(const std::string& full) {
  name_ = std::string(base_of(full));
  // No room for the path within PATH_MAX, even cut to no NAME (a destination
  // of a short name, its path within 20 bytes of the limit): the name is
  // reached through the descriptor of its directory, which a system call
  // takes whole (the kernel follows /proc/self/fd/N to the directory itself).
  through_dir_ = full.size() >= PATH_MAX;
  path_ = through_dir_ ? "/proc/self/fd/" + std::to_string(dir_->fd) + "/" + name_ : full;
  named_ = true;
}

bool TempFile::directory_moved(const std::string& dst) const noexcept {
  if (!dir_) return false;
  struct stat st{};
  if (::stat(dir_of(dst).c_str(), &st) != 0) return errno == ENOENT || errno == ENOTDIR;
  return st.st_dev != dir_->dev || st.st_ino != dir_->ino;
}

void TempFile::check_directory(const std::string& dst) const {
  if (!dir_) throw_state("no temporary file to put in place at '" + dst + "'");
  struct stat st{};
  if (::stat(dir_of(dst).c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) throw_os_error(errno, "cannot look up the directory of", dst);
  } else if (st.st_dev == dir_->dev && st.st_ino == dir_->ino) {
    return;
  }
  throw_directory_moved(dst, "the transfer");
}

int TempFile::open_directory() const noexcept {
  if (!dir_) {
    errno = EBADF;
    return -1;
  }
  return ::openat(dir_->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int TempFile::dup_directory() const noexcept {
  if (!dir_) {
    errno = EBADF;
    return -1;
  }
  return ::fcntl(dir_->fd, F_DUPFD_CLOEXEC, 0);
}

TempFile& TempFile::operator=(TempFile&& o) noexcept {
  if (this != &o) {
    discard();
    fd_ = o.fd_;
    dev_ = o.dev_;
    dir_ = std::move(o.dir_);
    name_ = std::move(o.name_);
    path_ = std::move(o.path_);
    through_dir_ = o.through_dir_;
    named_ = o.named_;
    unnamed_ = o.unnamed_;
    o.fd_ = -1;
    o.named_ = false;
    o.unnamed_ = false;
  }
  return *this;
}

void TempFile::rename_to(const std::string& dst) {
  // Where the destination's directory was moved away, the file would land in
  // the moved directory (whatever is at the path now would not get it).
  check_directory(dst);
  const std::string base(base_of(dst));
  if (unnamed_) {
    if (link_at(base) == 0) {
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
      const std::string full = temporary_name(dst);
      if (link_at(std::string(base_of(full))) == 0) {
        take_name(full);
        unnamed_ = false;
      } else if (errno != EEXIST || attempt == 99) {
        throw_os_error(errno, "cannot name the copy beside", dst);
      }
    }
  }
  if (::renameat(dir_->fd, name_.c_str(), dir_->fd, base.c_str()) != 0)
    throw_os_error(errno, "cannot rename the copy into place at", dst);
  named_ = false;
}

bool TempFile::link_to(const std::string& dst) {
  check_directory(dst);
  const std::string base(base_of(dst));
  if (unnamed_) {
    if (link_at(base) == 0) {
      unnamed_ = false;
      return true;
    }
    if (errno == EEXIST) return false;
    throw_os_error(errno, "cannot link", dst);
  }
  if (::linkat(dir_->fd, name_.c_str(), dir_->fd, base.c_str(), 0) != 0) {
    const int err = errno;
    if (err == EEXIST) return false;
    if (err != EPERM && err != EOPNOTSUPP && err != EXDEV && err != EMLINK) throw_os_error(err, "cannot link", dst);
    // No hard links here: check, then rename.
    struct stat st{};
    if (::fstatat(dir_->fd, base.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return false;
    rename_to(dst);
    return true;
  }
  ::unlinkat(dir_->fd, name_.c_str(), 0);
  named_ = false;
  return true;
}

void TempFile::close() noexcept {
  // An unnamed file goes with its last descriptor.
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  unnamed_ = false;
  dir_.reset();
}

void TempFile::discard() noexcept {
  // Unlink before close: while the lock is held no cleaner can take the name.
  // Through the directory's descriptor: where the directory was moved, the
  // file went with it, and is removed there.
  if (named_ && dir_) ::unlinkat(dir_->fd, name_.c_str(), 0);
  named_ = false;
  close();
}

int TempFile::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  named_ = false;
  unnamed_ = false;
  dir_.reset();
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
