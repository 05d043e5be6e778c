#include "gdscp/detail/mapped_read.hpp"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "gdscp/detail/fault.hpp"
#include "gdscp/error.hpp"
#include "gdscp/stream_copy.hpp"

namespace gdscp::detail {
namespace {

std::atomic<uint64_t> g_mapped_bytes{0};

// Set as the library loads, before any worker runs: a lazily initialised
// static, first reached on a worker, would leave a process forked meanwhile
// waiting for ever on an initialisation that no thread of it will finish.
const size_t g_page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));

#if defined(__x86_64__)

// ---- SIGBUS guard ---------------------------------------------------------
// A mapped page past the end of a file that shrank under us raises SIGBUS
// (pread would just return short). The thread doing a guarded copy points
// t_guard at its jump buffer; the handler jumps back there. Any other SIGBUS
// goes to whatever handler was installed before ours, every time (a library
// that recovers from its own faults with siglongjmp keeps doing so), or kills
// the process as it would have without us.
//
// A handler that reports the fault and raises it again for the handler it
// restores (Python's faulthandler, where that is ours) would send it round
// between the two for ever; such a SIGBUS takes the default action instead.
// The previous handler runs with SIGBUS blocked (ours is installed without
// SA_NODEFER), so its raise() is pending when it returns: seen there. One that
// unblocks SIGBUS first gets the signal back inside itself: seen by
// t_handing_on, which marks where on this thread's stack the hand-on runs.
// A handler that jumps out instead leaves the mark behind; the next fault
// (si_code > 0), or a signal sent from outside the hand-on's frames, is a new
// one and goes to it again.

// initial-exec: the handler may run on a thread that never touched t_guard,
// and a lazily allocated TLS block would call malloc inside the handler.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* volatile t_guard = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local const volatile char* volatile t_handing_on = nullptr;
struct sigaction g_previous;
std::mutex g_install_mutex;

// Held across fork(), so that a child never inherits it held by a worker
// that was installing the handler.
struct InstallForkHandlers {
  InstallForkHandlers() {
    ::pthread_atfork([] { g_install_mutex.lock(); }, [] { g_install_mutex.unlock(); },
                     [] { g_install_mutex.unlock(); });
  }
};
const InstallForkHandlers g_install_fork_handlers;

void on_sigbus(int sig, siginfo_t* info, void* uctx);

bool is_ours(const struct sigaction& sa) { return (sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == on_sigbus; }

// Whether this SIGBUS is one the previous handler raised while it ran on this
// thread: sent by this process, and interrupting code below the frame that
// handed the fault on (the stack grows down).
bool raised_inside_hand_on(const siginfo_t* info, const void* uctx) {
  const volatile char* frame = t_handing_on;
  if (frame == nullptr || info == nullptr || uctx == nullptr) return false;
  if (info->si_code > 0 || info->si_pid != ::getpid()) return false;
  const auto sp = static_cast<uintptr_t>(static_cast<const ucontext_t*>(uctx)->uc_mcontext.gregs[REG_RSP]);
  return sp < reinterpret_cast<uintptr_t>(frame);
}

// Hands the signal to the handler installed before ours; false where that is
// the default action or SIG_IGN.
bool hand_on(int sig, siginfo_t* info, void* uctx) {
  const bool siginfo = g_previous.sa_flags & SA_SIGINFO;
  if (!siginfo && (g_previous.sa_handler == SIG_DFL || g_previous.sa_handler == SIG_IGN)) return false;
  volatile char frame = 0;
  t_handing_on = &frame;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (siginfo) {
    g_previous.sa_sigaction(sig, info, uctx);
  } else {
    g_previous.sa_handler(sig);
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_handing_on = nullptr;
  // It returned. Where it raised the signal again and ours is the handler in
  // place, it would come straight back here: the default action takes it.
  sigset_t pending;
  struct sigaction current;
  if (sigpending(&pending) == 0 && sigismember(&pending, sig) == 1 && sigaction(sig, nullptr, &current) == 0 &&
      is_ours(current))
    signal(sig, SIG_DFL);
  return true;
}

void on_sigbus(int sig, siginfo_t* info, void* uctx) {
  if (sigjmp_buf* guard = t_guard) {
    t_guard = nullptr;
    siglongjmp(*guard, 1);
  }
  if (!raised_inside_hand_on(info, uctx) && hand_on(sig, info, uctx)) return;
  // Default action: restore it; a fault re-executes and dies, a sent signal is re-raised.
  signal(sig, SIG_DFL);
  if (info == nullptr || info->si_code <= 0) raise(sig);
}

// Installs the handler, or re-installs it where someone replaced it since
// (Python's faulthandler restores the handler it found when it is disabled).
bool guard_installed() {
  struct sigaction current;
  if (sigaction(SIGBUS, nullptr, &current) != 0) return false;
  if (is_ours(current)) return true;
  std::lock_guard<std::mutex> lock(g_install_mutex);
  struct sigaction ours {};
  ours.sa_sigaction = on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  struct sigaction previous;
  if (sigaction(SIGBUS, &ours, &previous) != 0) return false;
  if (!is_ours(previous)) g_previous = previous;
  return true;
}

// No C++ objects live between the sigsetjmp and the copy, so jumping out of
// the copy skips no destructor. Streaming: with stream_copy's streaming
// stores, else memcpy's.
template <bool Streaming>
__attribute__((noinline)) bool guarded_copy(char* dst, const char* src, size_t n) {
  sigjmp_buf env;
  if (sigsetjmp(env, 1) != 0) return false;  // SIGBUS: the handler cleared t_guard
  t_guard = &env;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if constexpr (Streaming) {
    stream_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_guard = nullptr;
  return true;
}

#endif  // __x86_64__

}  // namespace

uint64_t mapped_read_bytes() noexcept { return g_mapped_bytes.load(std::memory_order_relaxed); }

MappedRange::MappedRange(int fd, int64_t off, size_t n) : n_(n) {
  const int64_t map_off = off - off % static_cast<int64_t>(g_page_size);
  lead_ = static_cast<size_t>(off - map_off);
  len_ = lead_ + n;
  void* map = mmap(nullptr, len_, PROT_READ, MAP_SHARED, fd, map_off);
  if (map != MAP_FAILED) map_ = map;
}

MappedRange::~MappedRange() {
  if (map_) munmap(map_, len_);
}

bool MappedRange::cached() const {
  if (!map_) return false;
  // A window at a time, on the stack: nothing allocated on a worker's path.
  constexpr size_t kWindow = 1024;  // pages
  unsigned char pages[kWindow];
  const char* base = static_cast<const char*>(map_);
  for (size_t at = 0; at < len_; at += kWindow * g_page_size) {
    const size_t len = std::min(len_ - at, kWindow * g_page_size);
    if (mincore(const_cast<char*>(base + at), len, pages) != 0) return false;
    for (size_t i = 0, n = (len + g_page_size - 1) / g_page_size; i < n; ++i)
      if (!(pages[i] & 1)) return false;
  }
  return true;
}

#if defined(__x86_64__)

bool copy_from_mapping(char* dst, const char* src, size_t n) {
  if (!guard_installed()) return false;
  return guarded_copy<true>(dst, src, n);
}

bool copy_guarded(char* dst, const char* src, size_t n) {
  if (!guard_installed()) {
    std::memcpy(dst, src, n);
    return true;
  }
  return guarded_copy<false>(dst, src, n);
}

bool MappedRange::copy_to(char* dst) const {
  if (!map_ || !guard_installed()) return false;
  return guarded_copy<true>(dst, static_cast<const char*>(map_) + lead_, n_);
}

bool mapped_read(int fd, char* dst, size_t size, int64_t off, const std::string& path, size_t& copied) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  const int64_t file_size = st.st_size;
  // Nothing to map there: pread says what is (the end of the file, or the
  // contents of a procfs or sysfs file, whose size reads as 0).
  if (off >= file_size) return false;
  const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(size), file_size - off));
  const MappedRange range(fd, off, n);
  // Only cached data: cold pages would fault in one readahead window at a
  // time, slower than pread's readahead. (For files this process neither owns
  // nor may write, mincore reports no page as cached: those use pread.)
  if (!range.cached()) return false;
  // The fault hook treats this copy as the read call it replaces (which
  // would retry EINTR).
  int err;
  while ((err = fault::check(fault::Op::pread)) == EINTR) {
  }
  if (err == fault::kEndOfFile) {
    copied = 0;
    return true;
  }
  if (err) throw_os_error(err, "read (mapped)", path, off);
  if (!range.copy_to(dst)) return false;
  // A file cut short during the copy does not always raise SIGBUS: with large
  // page-cache folios the pages past the new end may still be mapped (and
  // read as zeros). pread then reports the short count and the right bytes.
  if (fstat(fd, &st) != 0 || st.st_size < off + static_cast<int64_t>(n)) return false;
  g_mapped_bytes.fetch_add(n, std::memory_order_relaxed);
  copied = n;
  return true;
}

#else

bool copy_from_mapping(char* dst, const char* src, size_t n) {
  std::memcpy(dst, src, n);
  return true;
}

bool copy_guarded(char* dst, const char* src, size_t n) {
  std::memcpy(dst, src, n);
  return true;
}

bool MappedRange::copy_to(char*) const { return false; }

bool mapped_read(int, char*, size_t, int64_t, const std::string&, size_t&) { return false; }

#endif

}  // namespace gdscp::detail
