/* What both stand-ins share: a log of every call, injected failures, gates
 * (a call that waits until the test releases it) and a record of misuse (a
 * call the real library would refuse). Each stand-in includes this once,
 * after defining STANDIN_API(name) to give its exports their own prefix, and
 * gets its own state. The tests read all of it through ctypes
 * (tests/standin/__init__.py mirrors standin_call).
 */
#ifndef GDSCP_STANDIN_H
#define GDSCP_STANDIN_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef STANDIN_API
#error "define STANDIN_API(name) before including standin.h"
#endif

#define STANDIN_EXPORT __attribute__((visibility("default")))

/* standin_call.flags */
#define STANDIN_DIRECT 0x1    /* cuFile: moved through the O_DIRECT descriptor */
#define STANDIN_PINNED 0x2    /* copies: the host side is pinned (cuMemHostAlloc) memory */
#define STANDIN_FD_OPEN 0x4   /* cuFileHandleDeregister: the descriptor was still open */
#define STANDIN_INJECTED 0x8  /* the result is an injected failure */
#define STANDIN_DEFERRED 0x10 /* run later on a stream (copies, cuFile stream I/O) */

typedef struct standin_call {
  char entry[48];      /* the entry point, e.g. "cuFileRead" */
  char arg[64];        /* a name argument (cuGetProcAddress's symbol), else "" */
  uint64_t handle;     /* the cuFile handle, stream, event or context the call names */
  uint64_t ptr;        /* device pointer or buffer base */
  uint64_t host;       /* host pointer of a copy; the descriptor of a handle */
  uint64_t size;
  int64_t file_offset;
  int64_t buf_offset;
  int64_t result;      /* what the call returned: CUresult, CUfileOpError or ssize_t */
  int64_t tid;         /* the calling thread (gettid) */
  uint64_t ctx;        /* the context current on the calling thread */
  int64_t version;     /* cuGetProcAddress: the API version asked for */
  uint32_t flags;      /* STANDIN_* */
  int32_t err;         /* errno with a -1 result */
} standin_call;

static pthread_mutex_t standin_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t standin_cond = PTHREAD_COND_INITIALIZER;

static int64_t standin_tid(void) { return (int64_t)syscall(SYS_gettid); }

/* -- the call log -------------------------------------------------------- */
static standin_call* standin_log;
static size_t standin_log_len, standin_log_cap;

static void standin_record(const standin_call* c) {
  pthread_mutex_lock(&standin_mutex);
  if (standin_log_len == standin_log_cap) {
    size_t cap = standin_log_cap ? 2 * standin_log_cap : 1024;
    standin_call* grown = realloc(standin_log, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&standin_mutex);
      return;
    }
    standin_log = grown;
    standin_log_cap = cap;
  }
  standin_log[standin_log_len++] = *c;
  pthread_mutex_unlock(&standin_mutex);
}

static standin_call standin_begin(const char* entry) {
  standin_call c;
  memset(&c, 0, sizeof c);
  snprintf(c.entry, sizeof c.entry, "%s", entry);
  c.tid = standin_tid();
  return c;
}

STANDIN_EXPORT size_t STANDIN_API(log_count)(void) {
  pthread_mutex_lock(&standin_mutex);
  size_t n = standin_log_len;
  pthread_mutex_unlock(&standin_mutex);
  return n;
}

/* Copies up to `n` records from `first` on; returns how many. */
STANDIN_EXPORT size_t STANDIN_API(log_read)(size_t first, standin_call* out, size_t n) {
  pthread_mutex_lock(&standin_mutex);
  size_t k = 0;
  for (; first + k < standin_log_len && k < n; ++k) out[k] = standin_log[first + k];
  pthread_mutex_unlock(&standin_mutex);
  return k;
}

STANDIN_EXPORT size_t STANDIN_API(record_size)(void) { return sizeof(standin_call); }

/* -- misuse: calls the real library would refuse ----------------------------- */
static long standin_misuse_count;
static char standin_misuse_text[1024];

__attribute__((format(printf, 1, 2))) static void standin_misuse(const char* fmt, ...) {
  char text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&standin_mutex);
  if (standin_misuse_count++ == 0) snprintf(standin_misuse_text, sizeof standin_misuse_text, "%s", text);
  pthread_mutex_unlock(&standin_mutex);
}

/* How many misuses so far; the first one's description in `text`. */
STANDIN_EXPORT long STANDIN_API(misuse)(char* text, size_t n) {
  pthread_mutex_lock(&standin_mutex);
  long count = standin_misuse_count;
  if (text && n) snprintf(text, n, "%s", standin_misuse_text);
  pthread_mutex_unlock(&standin_mutex);
  return count;
}

/* -- injected failures ------------------------------------------------------- */
typedef struct {
  char entry[64];
  int64_t code;  /* what the call returns */
  int64_t aux;   /* errno for a -1 result; the CUresult of CU_FILE_CUDA_DRIVER_ERROR */
  long skip;     /* calls that still succeed first */
  long times;    /* failures left; negative: every call from then on */
} standin_fault;

#define STANDIN_MAX_FAULTS 64
static standin_fault standin_faults[STANDIN_MAX_FAULTS];

/* After `skip` more calls of `entry`, the next `times` calls (every one if
 * negative) return `code` (with `aux` as errno or CUresult). */
STANDIN_EXPORT int STANDIN_API(fail)(const char* entry, int64_t code, int64_t aux, long skip, long times) {
  pthread_mutex_lock(&standin_mutex);
  int slot = -1;
  for (int i = 0; i < STANDIN_MAX_FAULTS; ++i) {
    if (standin_faults[i].entry[0] == 0 || strcmp(standin_faults[i].entry, entry) == 0) {
      slot = i;
      break;
    }
  }
  if (slot >= 0) {
    standin_fault* f = &standin_faults[slot];
    snprintf(f->entry, sizeof f->entry, "%s", entry);
    f->code = code;
    f->aux = aux;
    f->skip = skip;
    f->times = times;
  }
  pthread_mutex_unlock(&standin_mutex);
  return slot >= 0 ? 0 : -1;
}

/* 1 if an injected failure fires for this call of `entry`. */
static int standin_fault_fires(const char* entry, int64_t* code, int64_t* aux) {
  int fires = 0;
  pthread_mutex_lock(&standin_mutex);
  for (int i = 0; i < STANDIN_MAX_FAULTS && standin_faults[i].entry[0]; ++i) {
    standin_fault* f = &standin_faults[i];
    if (strcmp(f->entry, entry) != 0 || f->times == 0) continue;
    if (f->skip > 0) {
      --f->skip;
      break;
    }
    if (f->times > 0) --f->times;
    *code = f->code;
    *aux = f->aux;
    fires = 1;
    break;
  }
  pthread_mutex_unlock(&standin_mutex);
  return fires;
}

/* -- gates: a call that waits for the test ----------------------------------- */
static char standin_gate_entry[64];
static long standin_gate_skip;
static int standin_gate_armed, standin_gate_waiting, standin_gate_open;

/* The call of `entry` after `skip` more waits in the stand-in until release(). */
STANDIN_EXPORT void STANDIN_API(gate)(const char* entry, long skip) {
  pthread_mutex_lock(&standin_mutex);
  snprintf(standin_gate_entry, sizeof standin_gate_entry, "%s", entry);
  standin_gate_skip = skip;
  standin_gate_armed = 1;
  standin_gate_open = 0;
  pthread_mutex_unlock(&standin_mutex);
}

/* Waits up to `ms` milliseconds for a call to be held at the gate; 1 if one is. */
STANDIN_EXPORT int STANDIN_API(gate_wait)(long ms) {
  pthread_mutex_lock(&standin_mutex);
  for (long waited = 0; standin_gate_waiting == 0 && waited < ms; waited += 5) {
    pthread_mutex_unlock(&standin_mutex);
    usleep(5000);
    pthread_mutex_lock(&standin_mutex);
  }
  int held = standin_gate_waiting > 0;
  pthread_mutex_unlock(&standin_mutex);
  return held;
}

STANDIN_EXPORT void STANDIN_API(gate_release)(void) {
  pthread_mutex_lock(&standin_mutex);
  standin_gate_open = 1;
  standin_gate_armed = 0;
  pthread_cond_broadcast(&standin_cond);
  pthread_mutex_unlock(&standin_mutex);
}

static void* standin_release_later(void* ms) {
  usleep((useconds_t)((long)(intptr_t)ms * 1000));
  STANDIN_API(gate_release)();
  return NULL;
}

/* Releases the gate `ms` milliseconds from now, from a thread of its own that
   runs no Python: the release still comes while the interpreter exits. */
STANDIN_EXPORT int STANDIN_API(gate_release_after)(long ms) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, standin_release_later, (void*)(intptr_t)ms) != 0) return -1;
  return pthread_detach(thread);
}

static void standin_pass_gate(const char* entry) {
  pthread_mutex_lock(&standin_mutex);
  if (standin_gate_armed && strcmp(standin_gate_entry, entry) == 0) {
    if (standin_gate_skip > 0) {
      --standin_gate_skip;
    } else {
      standin_gate_armed = 0;
      ++standin_gate_waiting;
      while (!standin_gate_open) pthread_cond_wait(&standin_cond, &standin_mutex);
      --standin_gate_waiting;
    }
  }
  pthread_mutex_unlock(&standin_mutex);
}

/* Forgets the log, the failures, the gate and the misuse (not the state of the
 * library itself: open handles, allocations and streams stay). */
static void standin_reset_common(void) {
  pthread_mutex_lock(&standin_mutex);
  standin_log_len = 0;
  memset(standin_faults, 0, sizeof standin_faults);
  standin_gate_armed = 0;
  standin_gate_open = 1;
  pthread_cond_broadcast(&standin_cond);
  standin_misuse_count = 0;
  standin_misuse_text[0] = 0;
  pthread_mutex_unlock(&standin_mutex);
}

#endif /* GDSCP_STANDIN_H */
