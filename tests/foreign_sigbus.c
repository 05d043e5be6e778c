// SIGBUS handlers of another library in the same process as gdscp, for
// tests/test_reliability.py, which builds this file into a shared library and
// loads it with ctypes.
//
// recovering: reads a byte through a mapping of a file and, where the page is
// past the end of the file, catches the fault with sigsetjmp/siglongjmp and
// reports -1, as gdscp's own guard does. Any other SIGBUS takes the default
// action.
//
// reporting: writes a line to stderr, puts back the handler it replaced, and
// raises the signal again with SIGBUS unblocked, so that the handler it put
// back runs inside it.
#define _GNU_SOURCE
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static __thread sigjmp_buf* volatile guard;
static __thread const char* volatile guard_from;  // the mapping a guarded read touches
static __thread const char* volatile guard_to;
static volatile sig_atomic_t recovered;
static struct sigaction replaced;

static void recover(int sig, siginfo_t* info, void* uctx) {
  (void)uctx;
  sigjmp_buf* g = guard;
  const char* at = (const char*)info->si_addr;
  if (g && info->si_code > 0 && at >= guard_from && at < guard_to) {
    guard = NULL;
    ++recovered;
    siglongjmp(*g, 1);
  }
  signal(sig, SIG_DFL);
  if (info->si_code <= 0) raise(sig);
}

static void report_and_raise(int sig, siginfo_t* info, void* uctx) {
  (void)info;
  (void)uctx;
  static const char line[] = "foreign handler: SIGBUS\n";
  ssize_t ignored = write(2, line, sizeof line - 1);
  (void)ignored;
  sigaction(sig, &replaced, NULL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  raise(sig);
}

static int install(void (*handler)(int, siginfo_t*, void*)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGBUS, &sa, &replaced);
}

int install_recovering(void) { return install(recover); }

int install_reporting(void) { return install(report_and_raise); }

// Byte `offset` of `path` read through a mapping of `length` bytes; -1 where
// the page is past the end of the file (the fault caught), -2 where the file
// cannot be opened or mapped.
int read_mapped(const char* path, long length, long offset) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -2;
  const char* p = mmap(NULL, (size_t)length, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return -2;
  sigjmp_buf env;
  volatile int r;
  if (sigsetjmp(env, 1)) {
    r = -1;
  } else {
    guard_from = p;
    guard_to = p + length;
    guard = &env;
    r = ((const volatile unsigned char*)p)[offset];
    guard = NULL;
  }
  munmap((void*)p, (size_t)length);
  return r;
}

int recovered_faults(void) { return recovered; }
