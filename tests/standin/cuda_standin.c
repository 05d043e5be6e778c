/* A stand-in for libcuda.so.1, for tests on machines without a GPU.
 *
 * It serves, through cuGetProcAddress_v2, the driver calls gdscp's engine
 * resolves (cpp/include/gdscp/shim/cuda_driver.hpp), with the prototypes
 * cuda.h declares for them. "Device memory" is host memory that the tests
 * allocate through gdscp_cuda_alloc, or the engine through cuMemAlloc:
 * cuPointerGetAttributes reports it as CU_MEMORYTYPE_DEVICE of a device and
 * its primary context, so the engine treats it as GPU memory and the tests can
 * still read it with numpy.
 *
 * What the real driver checks, it checks too: cuInit first, a current
 * context for calls that need one, streams of the current context, copies
 * that stay inside an allocation. Stream work is deferred as on a GPU: a
 * copy runs when the stream is synchronised (or an event recorded after it
 * is), in stream order, blocking streams waiting for the legacy stream. An
 * engine that reuses a staging buffer before its copy ran, or returns before
 * its copies did, gets wrong bytes here just as on a GPU.
 *
 * Every call is logged; any entry point can be made to fail (gdscp_cuda_fail);
 * a lookup can be made to miss ("lookup:<name>"). Built by the test suite
 * (tests/standin/__init__.py) with the soname libcuda.so.1.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdbool.h>

#define STANDIN_API(name) gdscp_cuda_##name
#include "standin.h"

#define MAX_DEVICES 8
#define STANDIN_ALIGN 4096

/* -- devices and contexts ------------------------------------------------------ */
struct CUctx_st {
  uint32_t magic;
  int device;
};
static struct CUctx_st g_ctx[MAX_DEVICES];
static int g_device_count = 1;
static int g_initialized;
static long g_retains[MAX_DEVICES];
static __thread CUcontext t_current;

static int valid_ctx(CUcontext c) {
  for (int i = 0; i < g_device_count; ++i)
    if (c == &g_ctx[i]) return 1;
  return 0;
}

/* -- allocations: "device" memory and pinned host memory ------------------------ */
enum { KIND_NONE = 0, KIND_DEVICE = 1, KIND_PINNED = 2 };
/* gdscp_cuda_alloc flags */
#define ALLOC_NO_CONTEXT 0x1 /* CU_POINTER_ATTRIBUTE_CONTEXT is NULL, as for VMM and pool memory */
#define ALLOC_BY_TEST 0x100  /* made by gdscp_cuda_alloc, not cuMemAlloc: cuMemFree must not free it */
#define ALLOC_REGISTERED 0x200 /* the caller's memory, pinned by cuMemHostRegister: never freed here */

typedef struct {
  uintptr_t base;
  size_t size;
  int kind;
  int device;
  int flags;
} allocation;

static pthread_mutex_t g_alloc_mutex = PTHREAD_MUTEX_INITIALIZER;
static allocation* g_allocs;
static size_t g_alloc_len, g_alloc_cap;

static void* add_allocation(size_t size, int kind, int device, int flags) {
  void* p = NULL;
  const size_t bytes = size ? size : 1;
  if (posix_memalign(&p, STANDIN_ALIGN, bytes) != 0) return NULL;
  pthread_mutex_lock(&g_alloc_mutex);
  if (g_alloc_len == g_alloc_cap) {
    size_t cap = g_alloc_cap ? 2 * g_alloc_cap : 64;
    allocation* grown = realloc(g_allocs, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&g_alloc_mutex);
      free(p);
      return NULL;
    }
    g_allocs = grown;
    g_alloc_cap = cap;
  }
  g_allocs[g_alloc_len++] = (allocation){(uintptr_t)p, bytes, kind, device, flags};
  pthread_mutex_unlock(&g_alloc_mutex);
  return p;
}

/* The allocation holding `ptr` (copied to *out); KIND_NONE if none. */
static int find_allocation(uintptr_t ptr, allocation* out) {
  int kind = KIND_NONE;
  pthread_mutex_lock(&g_alloc_mutex);
  for (size_t i = 0; i < g_alloc_len; ++i) {
    if (ptr >= g_allocs[i].base && ptr < g_allocs[i].base + g_allocs[i].size) {
      if (out) *out = g_allocs[i];
      kind = g_allocs[i].kind;
      break;
    }
  }
  pthread_mutex_unlock(&g_alloc_mutex);
  return kind;
}

/* The kind of memory [ptr, ptr + n) lies in: KIND_NONE if it is not inside
 * one allocation (-1 if it starts in one and runs past its end). */
static int range_kind(uintptr_t ptr, size_t n, allocation* out) {
  allocation a;
  const int kind = find_allocation(ptr, &a);
  if (kind == KIND_NONE) return KIND_NONE;
  if (n > a.base + a.size - ptr) return -1;
  if (out) *out = a;
  return kind;
}

static int remove_allocation(uintptr_t base, int kind) {
  int found = 0, registered = 0;
  pthread_mutex_lock(&g_alloc_mutex);
  for (size_t i = 0; i < g_alloc_len; ++i) {
    if (g_allocs[i].base == base && g_allocs[i].kind == kind) {
      registered = (g_allocs[i].flags & ALLOC_REGISTERED) != 0;
      g_allocs[i] = g_allocs[--g_alloc_len];
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&g_alloc_mutex);
  if (found && !registered) free((void*)base);
  return found;
}

/* The caller's memory [p, p + size) recorded as pinned (cuMemHostRegister). */
static int add_registered(void* p, size_t size, int device) {
  pthread_mutex_lock(&g_alloc_mutex);
  if (g_alloc_len == g_alloc_cap) {
    size_t cap = g_alloc_cap ? 2 * g_alloc_cap : 64;
    allocation* grown = realloc(g_allocs, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&g_alloc_mutex);
      return 0;
    }
    g_allocs = grown;
    g_alloc_cap = cap;
  }
  g_allocs[g_alloc_len++] = (allocation){(uintptr_t)p, size, KIND_PINNED, device, ALLOC_REGISTERED};
  pthread_mutex_unlock(&g_alloc_mutex);
  return 1;
}

/* -- streams, events and the work queued on them ------------------------------- */
typedef struct op {
  void (*run)(void*);
  void* arg;
  uintptr_t host; /* host memory the op reads or writes (for cuMemFreeHost's check) */
  size_t host_size;
  struct op* next;
} op;

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u

struct CUstream_st {
  uint32_t magic;
  int device;
  unsigned flags; /* CU_STREAM_NON_BLOCKING or 0 */
  int legacy;     /* the device's legacy default stream */
  op* head;
  op* tail;
  uint64_t queued, done;
  struct CUstream_st* next_all;
};

struct CUevent_st {
  uint32_t magic;
  int device;
  struct CUstream_st* stream; /* where it was last recorded */
  uint64_t seq;               /* complete once the stream has run this many ops */
  struct CUevent_st* next_all;
};

/* Held while stream work is queued or run: one copy engine for all devices. */
static pthread_mutex_t g_exec = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st g_legacy[MAX_DEVICES];
static struct CUstream_st* g_streams;
static struct CUevent_st* g_events;

static struct CUstream_st* legacy_stream(int device) {
  struct CUstream_st* s = &g_legacy[device];
  if (s->magic != STREAM_MAGIC) {
    s->magic = STREAM_MAGIC;
    s->device = device;
    s->legacy = 1;
  }
  return s;
}

/* The calling thread's per-thread default stream of `device`: a blocking
 * stream of its own (it waits for the legacy stream, and the legacy stream for
 * it), not the legacy stream. Made at first use; never freed. Under g_exec. */
static __thread struct CUstream_st* t_per_thread[MAX_DEVICES];
static struct CUstream_st* per_thread_stream(int device) {
  struct CUstream_st* s = t_per_thread[device];
  if (!s) {
    s = calloc(1, sizeof *s);
    s->magic = STREAM_MAGIC;
    s->device = device;
    s->next_all = g_streams;
    g_streams = s;
    t_per_thread[device] = s;
  }
  return s;
}

/* The stream a handle names (NULL and CU_STREAM_LEGACY: the current
 * context's legacy stream; CU_STREAM_PER_THREAD: the calling thread's own
 * default stream of that context); NULL if it names none. Under g_exec. */
static struct CUstream_st* resolve_stream(CUstream h) {
  if (h == NULL || h == CU_STREAM_LEGACY) return t_current ? legacy_stream(t_current->device) : NULL;
  if (h == CU_STREAM_PER_THREAD) return t_current ? per_thread_stream(t_current->device) : NULL;
  for (struct CUstream_st* s = g_streams; s; s = s->next_all)
    if (s == (struct CUstream_st*)h) return s;
  return NULL;
}

static struct CUevent_st* resolve_event(CUevent h) {
  for (struct CUevent_st* e = g_events; e; e = e->next_all)
    if (e == (struct CUevent_st*)h) return e;
  return NULL;
}

/* Runs `s`'s queued work until it has run `upto` ops. Under g_exec. */
static void run_stream(struct CUstream_st* s, uint64_t upto) {
  while (s->done < upto && s->head) {
    op* o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = NULL;
    const int saved = errno; /* stream work runs "on the GPU": it leaves errno alone */
    o->run(o->arg);
    errno = saved;
    free(o);
    ++s->done;
  }
}

static void drain(struct CUstream_st* s) { run_stream(s, s->queued); }

/* Queues work on `s`, after what it must wait for. Under g_exec. */
static void enqueue(struct CUstream_st* s, void (*run)(void*), void* arg, uintptr_t host, size_t host_size) {
  if (s->legacy) {
    for (struct CUstream_st* o = g_streams; o; o = o->next_all)
      if (o->device == s->device && !(o->flags & CU_STREAM_NON_BLOCKING)) drain(o);
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
    drain(legacy_stream(s->device));
  }
  op* o = calloc(1, sizeof *o);
  o->run = run;
  o->arg = arg;
  o->host = host;
  o->host_size = host_size;
  if (s->tail) s->tail->next = o; else s->head = o;
  s->tail = o;
  ++s->queued;
}

/* -- the calls ------------------------------------------------------------------ */
#define ERROR_CODES(X)                       \
  X(CUDA_SUCCESS, "no error")                \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument") \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory") \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error") \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down") \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected") \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal") \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context") \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle") \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found") \
  X(CUDA_ERROR_NOT_READY, "device not ready") \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered") \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure") \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported") \
  X(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered") \
  X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
  X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled") \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped") \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

/* Every call starts here: logged, and failing if a failure was injected. */
#define BEGIN(name)                                      \
  standin_call call = standin_begin(#name);              \
  call.ctx = (uint64_t)(uintptr_t)t_current;             \
  standin_pass_gate(#name);                              \
  {                                                      \
    int64_t code_, aux_;                                 \
    if (standin_fault_fires(#name, &code_, &aux_)) {     \
      call.flags |= STANDIN_INJECTED;                    \
      return finish(&call, (CUresult)code_);             \
    }                                                    \
  }
#define NEED_INIT() \
  if (!g_initialized) return finish(&call, CUDA_ERROR_NOT_INITIALIZED)
#define NEED_CONTEXT()                                                  \
  NEED_INIT();                                                          \
  if (!t_current) return finish(&call, CUDA_ERROR_INVALID_CONTEXT)

static CUresult finish(standin_call* c, CUresult r) {
  c->result = r;
  standin_record(c);
  return r;
}

#define DECLARE(name) static __typeof__(name) sc_##name;
#define GDSCP_STANDIN_CUDA_FUNCTIONS(X) \
  X(cuInit)                             \
  X(cuDriverGetVersion)                 \
  X(cuGetErrorName)                     \
  X(cuGetErrorString)                   \
  X(cuDeviceGetCount)                   \
  X(cuDeviceGet)                        \
  X(cuDeviceGetName)                    \
  X(cuDeviceTotalMem)                   \
  X(cuDeviceGetPCIBusId)                \
  X(cuDevicePrimaryCtxRetain)           \
  X(cuCtxGetCurrent)                    \
  X(cuCtxSetCurrent)                    \
  X(cuCtxGetDevice)                     \
  X(cuCtxSynchronize)                   \
  X(cuPointerGetAttributes)             \
  X(cuMemGetInfo)                       \
  X(cuMemAlloc)                         \
  X(cuMemFree)                          \
  X(cuMemsetD8)                         \
  X(cuMemcpyHtoD)                       \
  X(cuMemcpyDtoH)                       \
  X(cuMemHostAlloc)                     \
  X(cuMemFreeHost)                      \
  X(cuMemcpyHtoDAsync)                  \
  X(cuMemcpyDtoHAsync)                  \
  X(cuStreamCreate)                     \
  X(cuStreamSynchronize)                \
  X(cuEventCreate)                      \
  X(cuEventRecord)                      \
  X(cuDeviceCanAccessPeer)              \
  X(cuCtxEnablePeerAccess)              \
  X(cuMemcpyPeerAsync)                  \
  X(cuMemHostRegister)                  \
  X(cuMemHostUnregister)                \
  X(cuEventSynchronize)                 \
  X(cuEventDestroy)
/* Each stand-in has exactly the type cuda.h declares for the name (a
 * mismatch does not compile): the ABI the engine calls it with. */
GDSCP_STANDIN_CUDA_FUNCTIONS(DECLARE)

static CUresult sc_cuInit(unsigned int flags) {
  BEGIN(cuInit);
  if (flags != 0) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  if (!g_initialized) {
    for (int i = 0; i < MAX_DEVICES; ++i) g_ctx[i] = (struct CUctx_st){0x43545831u, i};
    g_initialized = 1;
  }
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuDriverGetVersion(int* version) {
  BEGIN(cuDriverGetVersion);
  if (!version) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  *version = 13000;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuGetErrorName(CUresult error, const char** str) {
  BEGIN(cuGetErrorName);
  switch (error) {
#define NAME(code, text) \
  case code:             \
    *str = #code;        \
    return finish(&call, CUDA_SUCCESS);
    ERROR_CODES(NAME)
#undef NAME
    default:
      *str = NULL;
      return finish(&call, CUDA_ERROR_INVALID_VALUE);
  }
}

static CUresult sc_cuGetErrorString(CUresult error, const char** str) {
  BEGIN(cuGetErrorString);
  switch (error) {
#define TEXT(code, text) \
  case code:             \
    *str = text;         \
    return finish(&call, CUDA_SUCCESS);
    ERROR_CODES(TEXT)
#undef TEXT
    default:
      *str = NULL;
      return finish(&call, CUDA_ERROR_INVALID_VALUE);
  }
}

static CUresult sc_cuDeviceGetCount(int* count) {
  BEGIN(cuDeviceGetCount);
  NEED_INIT();
  *count = g_device_count;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuDeviceGet(CUdevice* dev, int ordinal) {
  BEGIN(cuDeviceGet);
  NEED_INIT();
  if (ordinal < 0 || ordinal >= g_device_count) return finish(&call, CUDA_ERROR_INVALID_DEVICE);
  *dev = ordinal;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuDeviceGetName(char* name, int len, CUdevice dev) {
  BEGIN(cuDeviceGetName);
  NEED_INIT();
  if (dev < 0 || dev >= g_device_count) return finish(&call, CUDA_ERROR_INVALID_DEVICE);
  snprintf(name, (size_t)len, "gdscp stand-in GPU");
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  BEGIN(cuDeviceTotalMem);
  NEED_INIT();
  if (dev < 0 || dev >= g_device_count) return finish(&call, CUDA_ERROR_INVALID_DEVICE);
  *bytes = (size_t)16 << 30;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  BEGIN(cuDeviceGetPCIBusId);
  NEED_INIT();
  if (dev < 0 || dev >= g_device_count) return finish(&call, CUDA_ERROR_INVALID_DEVICE);
  snprintf(bus, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  BEGIN(cuDevicePrimaryCtxRetain);
  NEED_INIT();
  if (dev < 0 || dev >= g_device_count) return finish(&call, CUDA_ERROR_INVALID_DEVICE);
  *ctx = &g_ctx[dev];
  __atomic_add_fetch(&g_retains[dev], 1, __ATOMIC_RELAXED);
  call.handle = (uint64_t)(uintptr_t)*ctx;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuCtxGetCurrent(CUcontext* ctx) {
  BEGIN(cuCtxGetCurrent);
  NEED_INIT();
  *ctx = t_current;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuCtxSetCurrent(CUcontext ctx) {
  BEGIN(cuCtxSetCurrent);
  NEED_INIT();
  call.handle = (uint64_t)(uintptr_t)ctx;
  if (ctx && !valid_ctx(ctx)) return finish(&call, CUDA_ERROR_INVALID_CONTEXT);
  t_current = ctx;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuCtxGetDevice(CUdevice* dev) {
  BEGIN(cuCtxGetDevice);
  NEED_CONTEXT();
  *dev = t_current->device;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  BEGIN(cuPointerGetAttributes);
  NEED_INIT();
  call.ptr = ptr;
  allocation a;
  const int kind = find_allocation((uintptr_t)ptr, &a);
  /* Unknown memory is no error: every attribute reads as zero. */
  for (unsigned int i = 0; i < n; ++i) {
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int*)data[i] = kind == KIND_DEVICE   ? CU_MEMORYTYPE_DEVICE
                                  : kind == KIND_PINNED ? CU_MEMORYTYPE_HOST
                                                        : 0;
        break;
      case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext*)data[i] = kind == KIND_NONE || (a.flags & ALLOC_NO_CONTEXT) ? NULL : &g_ctx[a.device];
        break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int*)data[i] = kind == KIND_NONE ? -2 : a.device;
        break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int*)data[i] = 0;
        break;
      default:
        standin_misuse("cuPointerGetAttributes: attribute %d is not served by the stand-in", (int)attrs[i]);
        return finish(&call, CUDA_ERROR_NOT_SUPPORTED);
    }
  }
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuMemHostAlloc(void** p, size_t size, unsigned int flags) {
  BEGIN(cuMemHostAlloc);
  NEED_CONTEXT();
  call.size = size;
  (void)flags;
  *p = add_allocation(size, KIND_PINNED, t_current->device, 0);
  call.host = (uint64_t)(uintptr_t)*p;
  return finish(&call, *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

/* Whether queued work still uses [p, p + n). Under g_exec. */
static int host_memory_in_use(uintptr_t p, size_t n) {
  for (int d = 0; d < MAX_DEVICES; ++d)
    for (op* o = g_legacy[d].head; o; o = o->next)
      if (o->host < p + n && p < o->host + o->host_size) return 1;
  for (struct CUstream_st* s = g_streams; s; s = s->next_all)
    for (op* o = s->head; o; o = o->next)
      if (o->host < p + n && p < o->host + o->host_size) return 1;
  return 0;
}

static CUresult sc_cuMemFreeHost(void* p) {
  BEGIN(cuMemFreeHost);
  NEED_CONTEXT();
  call.host = (uint64_t)(uintptr_t)p;
  allocation a;
  pthread_mutex_lock(&g_exec);
  if (find_allocation((uintptr_t)p, &a) != KIND_PINNED || a.base != (uintptr_t)p) {
    pthread_mutex_unlock(&g_exec);
    standin_misuse("cuMemFreeHost(%p): not pinned memory from cuMemHostAlloc", p);
    return finish(&call, CUDA_ERROR_INVALID_VALUE);
  }
  if (host_memory_in_use(a.base, a.size))
    standin_misuse("cuMemFreeHost(%p) while a copy queued on a stream still uses it", p);
  remove_allocation(a.base, KIND_PINNED);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

static int device_broken(int device);

typedef struct {
  char* dst;
  const char* src;
  size_t n;
  uintptr_t device_ptr;
  int fill; /* >= 0: a fill of this byte instead of a copy */
} copy_args;

static void run_copy(void* arg) {
  copy_args* c = arg;
  if (range_kind(c->device_ptr, c->n, NULL) != KIND_DEVICE) {
    standin_misuse("a queued copy ran after its device memory (0x%llx, %zu bytes) was freed",
                   (unsigned long long)c->device_ptr, c->n);
  } else if (c->fill >= 0) {
    memset(c->dst, c->fill, c->n);
  } else {
    memcpy(c->dst, c->src, c->n);
  }
  free(c);
}

/* The checks of both copy directions; queues the copy. */
static CUresult queue_copy(standin_call* call, CUdeviceptr dev, void* host, size_t n, CUstream stream, int to_device) {
  call->ptr = dev;
  call->host = (uint64_t)(uintptr_t)host;
  call->size = n;
  call->handle = (uint64_t)(uintptr_t)stream;
  call->flags |= STANDIN_DEFERRED;
  allocation a;
  const int kind = range_kind((uintptr_t)dev, n, &a);
  if (kind != KIND_DEVICE) {
    standin_misuse("%s: [0x%llx, +%zu) is %s", call->entry, (unsigned long long)dev, n,
                   kind < 0 ? "past the end of its device allocation" : "not device memory");
    return finish(call, CUDA_ERROR_INVALID_VALUE);
  }
  if (range_kind((uintptr_t)host, n, NULL) == KIND_PINNED) call->flags |= STANDIN_PINNED;
  if (device_broken(a.device)) return finish(call, CUDA_ERROR_ECC_UNCORRECTABLE);
  pthread_mutex_lock(&g_exec);
  struct CUstream_st* s = resolve_stream(stream);
  if (!s || s->device != t_current->device) {
    pthread_mutex_unlock(&g_exec);
    standin_misuse("%s: stream %p is not a stream of the current context", call->entry, (void*)stream);
    return finish(call, CUDA_ERROR_INVALID_HANDLE);
  }
  copy_args* c = malloc(sizeof *c);
  *c = (copy_args){to_device ? (char*)(uintptr_t)dev : host, to_device ? host : (const char*)(uintptr_t)dev, n,
                   (uintptr_t)dev, -1};
  enqueue(s, run_copy, c, (uintptr_t)host, n);
  pthread_mutex_unlock(&g_exec);
  return finish(call, CUDA_SUCCESS);
}

static CUresult sc_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  BEGIN(cuMemcpyHtoDAsync);
  NEED_CONTEXT();
  return queue_copy(&call, dst, (void*)src, n, stream, 1);
}

static CUresult sc_cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  BEGIN(cuMemcpyDtoHAsync);
  NEED_CONTEXT();
  return queue_copy(&call, src, dst, n, stream, 0);
}

static CUresult sc_cuStreamCreate(CUstream* out, unsigned int flags) {
  BEGIN(cuStreamCreate);
  NEED_CONTEXT();
  struct CUstream_st* s = calloc(1, sizeof *s);
  s->magic = STREAM_MAGIC;
  s->device = t_current->device;
  s->flags = flags;
  pthread_mutex_lock(&g_exec);
  s->next_all = g_streams;
  g_streams = s;
  pthread_mutex_unlock(&g_exec);
  *out = s;
  call.handle = (uint64_t)(uintptr_t)s;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuStreamSynchronize(CUstream stream) {
  BEGIN(cuStreamSynchronize);
  NEED_INIT();
  call.handle = (uint64_t)(uintptr_t)stream;
  pthread_mutex_lock(&g_exec);
  struct CUstream_st* s = resolve_stream(stream);
  if (!s) {
    pthread_mutex_unlock(&g_exec);
    return finish(&call, t_current ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_CONTEXT);
  }
  drain(s);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuEventCreate(CUevent* out, unsigned int flags) {
  BEGIN(cuEventCreate);
  NEED_CONTEXT();
  (void)flags;
  struct CUevent_st* e = calloc(1, sizeof *e);
  e->magic = EVENT_MAGIC;
  e->device = t_current->device;
  pthread_mutex_lock(&g_exec);
  e->next_all = g_events;
  g_events = e;
  pthread_mutex_unlock(&g_exec);
  *out = e;
  call.handle = (uint64_t)(uintptr_t)e;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuEventRecord(CUevent event, CUstream stream) {
  BEGIN(cuEventRecord);
  NEED_CONTEXT();
  call.handle = (uint64_t)(uintptr_t)event;
  pthread_mutex_lock(&g_exec);
  struct CUevent_st* e = resolve_event(event);
  struct CUstream_st* s = resolve_stream(stream);
  if (!e || !s || e->device != s->device) {
    pthread_mutex_unlock(&g_exec);
    standin_misuse("cuEventRecord: event %p or stream %p is unknown or of another context", (void*)event,
                   (void*)stream);
    return finish(&call, CUDA_ERROR_INVALID_HANDLE);
  }
  e->stream = s;
  e->seq = s->queued;
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuEventSynchronize(CUevent event) {
  BEGIN(cuEventSynchronize);
  NEED_INIT();
  call.handle = (uint64_t)(uintptr_t)event;
  pthread_mutex_lock(&g_exec);
  struct CUevent_st* e = resolve_event(event);
  if (!e) {
    pthread_mutex_unlock(&g_exec);
    return finish(&call, CUDA_ERROR_INVALID_HANDLE);
  }
  if (e->stream) run_stream(e->stream, e->seq);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuEventDestroy(CUevent event) {
  BEGIN(cuEventDestroy);
  NEED_INIT();
  call.handle = (uint64_t)(uintptr_t)event;
  pthread_mutex_lock(&g_exec);
  for (struct CUevent_st** p = &g_events; *p; p = &(*p)->next_all) {
    if (*p != (struct CUevent_st*)event) continue;
    struct CUevent_st* e = *p;
    *p = e->next_all;
    pthread_mutex_unlock(&g_exec);
    e->magic = 0;
    free(e);
    return finish(&call, CUDA_SUCCESS);
  }
  pthread_mutex_unlock(&g_exec);
  standin_misuse("cuEventDestroy: event %p is unknown (destroyed twice?)", (void*)event);
  return finish(&call, CUDA_ERROR_INVALID_HANDLE);
}

/* -- device memory the engine allocates itself ----------------------------------- */
#define STANDIN_DEVICE_MEMORY ((size_t)16 << 30) /* what cuDeviceTotalMem reports */

/* Runs everything queued on `device`'s legacy stream and on its blocking
 * streams: what a synchronous copy on the legacy stream waits for. Under g_exec. */
static void drain_for_legacy(int device) {
  for (struct CUstream_st* o = g_streams; o; o = o->next_all)
    if (o->device == device && !(o->flags & CU_STREAM_NON_BLOCKING)) drain(o);
  drain(legacy_stream(device));
}

static CUresult sc_cuCtxSynchronize(void) {
  BEGIN(cuCtxSynchronize);
  NEED_CONTEXT();
  pthread_mutex_lock(&g_exec);
  for (struct CUstream_st* o = g_streams; o; o = o->next_all)
    if (o->device == t_current->device) drain(o);
  drain(legacy_stream(t_current->device));
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuMemGetInfo(size_t* free_bytes, size_t* total) {
  BEGIN(cuMemGetInfo);
  NEED_CONTEXT();
  if (!free_bytes || !total) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  size_t used = 0;
  pthread_mutex_lock(&g_alloc_mutex);
  for (size_t i = 0; i < g_alloc_len; ++i)
    if (g_allocs[i].kind == KIND_DEVICE && g_allocs[i].device == t_current->device) used += g_allocs[i].size;
  pthread_mutex_unlock(&g_alloc_mutex);
  *total = STANDIN_DEVICE_MEMORY;
  *free_bytes = used < STANDIN_DEVICE_MEMORY ? STANDIN_DEVICE_MEMORY - used : 0;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuMemAlloc(CUdeviceptr* out, size_t size) {
  BEGIN(cuMemAlloc);
  NEED_CONTEXT();
  call.size = size;
  if (!out || size == 0) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  void* p = add_allocation(size, KIND_DEVICE, t_current->device, 0);
  if (!p) return finish(&call, CUDA_ERROR_OUT_OF_MEMORY);
  *out = (CUdeviceptr)(uintptr_t)p;
  call.ptr = *out;
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuMemFree(CUdeviceptr ptr) {
  BEGIN(cuMemFree);
  NEED_CONTEXT();
  call.ptr = ptr;
  allocation a;
  pthread_mutex_lock(&g_exec);
  if (find_allocation((uintptr_t)ptr, &a) != KIND_DEVICE || a.base != (uintptr_t)ptr || (a.flags & ALLOC_BY_TEST)) {
    pthread_mutex_unlock(&g_exec);
    standin_misuse("cuMemFree(0x%llx): not device memory from cuMemAlloc", (unsigned long long)ptr);
    return finish(&call, CUDA_ERROR_INVALID_VALUE);
  }
  /* The driver finishes the device's work before it frees. */
  for (struct CUstream_st* o = g_streams; o; o = o->next_all)
    if (o->device == a.device) drain(o);
  drain(legacy_stream(a.device));
  remove_allocation(a.base, KIND_DEVICE);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

/* The device range [ptr, ptr + n) for a call: logged, and a misuse unless it
 * is device memory of the current context's device. */
static CUresult device_range(standin_call* call, CUdeviceptr ptr, size_t n) {
  call->ptr = ptr;
  call->size = n;
  allocation a;
  const int kind = range_kind((uintptr_t)ptr, n, &a);
  if (kind != KIND_DEVICE) {
    standin_misuse("%s: [0x%llx, +%zu) is %s", call->entry, (unsigned long long)ptr, n,
                   kind < 0 ? "past the end of its device allocation" : "not device memory");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (a.device != t_current->device) {
    standin_misuse("%s: device memory of device %d under a context of device %d", call->entry, a.device,
                   t_current->device);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* Asynchronous for device memory, as the real one: queued on the legacy stream. */
static CUresult sc_cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t n) {
  BEGIN(cuMemsetD8);
  NEED_CONTEXT();
  call.flags |= STANDIN_DEFERRED;
  const CUresult r = device_range(&call, dst, n);
  if (r != CUDA_SUCCESS) return finish(&call, r);
  pthread_mutex_lock(&g_exec);
  copy_args* c = malloc(sizeof *c);
  *c = (copy_args){(char*)(uintptr_t)dst, NULL, n, (uintptr_t)dst, value};
  enqueue(legacy_stream(t_current->device), run_copy, c, 0, 0);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

/* Synchronous copies on the legacy stream: after the work queued before them. */
static CUresult sync_copy(standin_call* call, CUdeviceptr dev, void* host, size_t n, int to_device) {
  call->host = (uint64_t)(uintptr_t)host;
  const CUresult r = device_range(call, dev, n);
  if (r != CUDA_SUCCESS) return finish(call, r);
  pthread_mutex_lock(&g_exec);
  drain_for_legacy(t_current->device);
  if (to_device) memcpy((void*)(uintptr_t)dev, host, n);
  else memcpy(host, (const void*)(uintptr_t)dev, n);
  pthread_mutex_unlock(&g_exec);
  return finish(call, CUDA_SUCCESS);
}

static CUresult sc_cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  BEGIN(cuMemcpyHtoD);
  NEED_CONTEXT();
  return sync_copy(&call, dst, (void*)src, n, 1);
}

static CUresult sc_cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  BEGIN(cuMemcpyDtoH);
  NEED_CONTEXT();
  return sync_copy(&call, src, dst, n, 0);
}

/* -- several devices: peer access, peer copies, registered host memory ---------- */
static int g_peer_allowed = 1;                        /* cuDeviceCanAccessPeer's answer for two devices */
static int g_peer_enabled[MAX_DEVICES][MAX_DEVICES];  /* [from][to]: cuCtxEnablePeerAccess done */
static long g_broken_after[MAX_DEVICES] = {-1, -1, -1, -1, -1, -1, -1, -1};

/* A device made to fail (gdscp_cuda_break_device): true once its copies fail. */
static int device_broken(int device) {
  long left = __atomic_load_n(&g_broken_after[device], __ATOMIC_RELAXED);
  if (left < 0) return 0;
  if (left == 0) return 1;
  __atomic_sub_fetch(&g_broken_after[device], 1, __ATOMIC_RELAXED);
  return 0;
}

static CUresult sc_cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  BEGIN(cuDeviceCanAccessPeer);
  NEED_INIT();
  if (dev < 0 || dev >= g_device_count || peer < 0 || peer >= g_device_count)
    return finish(&call, CUDA_ERROR_INVALID_DEVICE);
  *can = dev != peer && __atomic_load_n(&g_peer_allowed, __ATOMIC_RELAXED);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  BEGIN(cuCtxEnablePeerAccess);
  NEED_CONTEXT();
  call.handle = (uint64_t)(uintptr_t)peer;
  if (flags != 0 || !valid_ctx(peer) || peer == t_current) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  if (!__atomic_load_n(&g_peer_allowed, __ATOMIC_RELAXED)) return finish(&call, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
  int* on = &g_peer_enabled[t_current->device][peer->device];
  if (__atomic_exchange_n(on, 1, __ATOMIC_RELAXED)) return finish(&call, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  return finish(&call, CUDA_SUCCESS);
}

/* Logged with STANDIN_PINNED when the copy could go directly (peer access
 * enabled from the source's context to the destination's): the tests tell the
 * direct path from the driver's staged one by it. */
static CUresult sc_cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                                     CUstream stream) {
  BEGIN(cuMemcpyPeerAsync);
  NEED_CONTEXT();
  call.ptr = dst;
  call.host = src; /* the source, a device pointer here */
  call.size = n;
  call.handle = (uint64_t)(uintptr_t)stream;
  call.flags |= STANDIN_DEFERRED;
  if (!valid_ctx(dst_ctx) || !valid_ctx(src_ctx)) return finish(&call, CUDA_ERROR_INVALID_CONTEXT);
  allocation d, s;
  const int dk = range_kind((uintptr_t)dst, n, &d), sk = range_kind((uintptr_t)src, n, &s);
  if (dk != KIND_DEVICE || sk != KIND_DEVICE || d.device != dst_ctx->device || s.device != src_ctx->device) {
    standin_misuse("cuMemcpyPeerAsync: [0x%llx, +%zu) on device %d from [0x%llx, +%zu) on device %d do not match "
                   "their contexts", (unsigned long long)dst, n, dst_ctx->device, (unsigned long long)src, n,
                   src_ctx->device);
    return finish(&call, CUDA_ERROR_INVALID_VALUE);
  }
  if (device_broken(src_ctx->device) || device_broken(dst_ctx->device))
    return finish(&call, CUDA_ERROR_ECC_UNCORRECTABLE);
  if (__atomic_load_n(&g_peer_enabled[src_ctx->device][dst_ctx->device], __ATOMIC_RELAXED)) call.flags |= STANDIN_PINNED;
  pthread_mutex_lock(&g_exec);
  struct CUstream_st* st = resolve_stream(stream);
  if (!st || st->device != t_current->device) {
    pthread_mutex_unlock(&g_exec);
    standin_misuse("cuMemcpyPeerAsync: stream %p is not a stream of the current context", (void*)stream);
    return finish(&call, CUDA_ERROR_INVALID_HANDLE);
  }
  copy_args* c = malloc(sizeof *c);
  *c = (copy_args){(char*)(uintptr_t)dst, (const char*)(uintptr_t)src, n, (uintptr_t)dst, -1};
  enqueue(st, run_copy, c, 0, 0);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

static CUresult sc_cuMemHostRegister(void* p, size_t size, unsigned int flags) {
  BEGIN(cuMemHostRegister);
  NEED_CONTEXT();
  call.host = (uint64_t)(uintptr_t)p;
  call.size = size;
  (void)flags;
  if (!p || size == 0) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  if (find_allocation((uintptr_t)p, NULL) != KIND_NONE || find_allocation((uintptr_t)p + size - 1, NULL) != KIND_NONE)
    return finish(&call, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  return finish(&call, add_registered(p, size, t_current->device) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

static CUresult sc_cuMemHostUnregister(void* p) {
  BEGIN(cuMemHostUnregister);
  NEED_CONTEXT();
  call.host = (uint64_t)(uintptr_t)p;
  allocation a;
  pthread_mutex_lock(&g_exec);
  if (find_allocation((uintptr_t)p, &a) != KIND_PINNED || a.base != (uintptr_t)p || !(a.flags & ALLOC_REGISTERED)) {
    pthread_mutex_unlock(&g_exec);
    return finish(&call, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  }
  if (host_memory_in_use(a.base, a.size))
    standin_misuse("cuMemHostUnregister(%p) while a copy queued on a stream still uses it", p);
  remove_allocation(a.base, KIND_PINNED);
  pthread_mutex_unlock(&g_exec);
  return finish(&call, CUDA_SUCCESS);
}

/* -- the one exported driver entry point ---------------------------------------- */
typedef struct {
  const char* name;
  void* fn;
} proc_entry;

#define ENTRY(name) {#name, (void*)&sc_##name},
static const proc_entry g_procs[] = {GDSCP_STANDIN_CUDA_FUNCTIONS(ENTRY)};
#undef ENTRY

/* The stand-ins implement cuda.h's prototypes, which for these names are the
 * ABI the driver hands out for API levels 12.x: asked for another level, the
 * stand-in says the version does not fit rather than risk another ABI. */
STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* status) {
  standin_call call = standin_begin("cuGetProcAddress_v2");
  call.ctx = (uint64_t)(uintptr_t)t_current;
  call.version = version;
  if (symbol) snprintf(call.arg, sizeof call.arg, "%s", symbol);
  if (!symbol || !pfn) return finish(&call, CUDA_ERROR_INVALID_VALUE);
  *pfn = NULL;
  (void)flags;
  char lookup[96];
  snprintf(lookup, sizeof lookup, "lookup:%s", symbol);
  int64_t code, aux;
  const int hidden = standin_fault_fires(lookup, &code, &aux);
  for (size_t i = 0; !hidden && i < sizeof g_procs / sizeof g_procs[0]; ++i) {
    if (strcmp(g_procs[i].name, symbol) != 0) continue;
    if (version < 12000 || version >= 13000) {
      if (status) *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
      return finish(&call, CUDA_ERROR_NOT_FOUND);
    }
    *pfn = g_procs[i].fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return finish(&call, CUDA_SUCCESS);
  }
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return finish(&call, CUDA_ERROR_NOT_FOUND);
}

/* -- for the tests and the libcufile stand-in ------------------------------------ */

/* How many devices there are (1 to 8); before cuInit only. */
STANDIN_EXPORT int gdscp_cuda_set_device_count(int n) {
  if (g_initialized || n < 1 || n > MAX_DEVICES) return -1;
  g_device_count = n;
  return 0;
}

/* Whether two devices can reach each other's memory (default: yes). */
STANDIN_EXPORT void gdscp_cuda_set_peer(int allowed) { __atomic_store_n(&g_peer_allowed, allowed != 0, __ATOMIC_RELAXED); }

/* After `after` more copies touching `device` succeed, every further one fails
 * (CUDA_ERROR_ECC_UNCORRECTABLE); -1 heals it. */
STANDIN_EXPORT void gdscp_cuda_break_device(int device, long after) {
  if (device >= 0 && device < MAX_DEVICES) __atomic_store_n(&g_broken_after[device], after, __ATOMIC_RELAXED);
}

/* "Device memory" of `device`: 4 KiB-aligned host memory that the driver
 * calls treat as device memory. `flags`: ALLOC_NO_CONTEXT. */
STANDIN_EXPORT void* gdscp_cuda_alloc(size_t size, int device, int flags) {
  if (device < 0 || device >= g_device_count) return NULL;
  return add_allocation(size, KIND_DEVICE, device, flags | ALLOC_BY_TEST);
}

STANDIN_EXPORT int gdscp_cuda_free(void* p) {
  pthread_mutex_lock(&g_exec);
  allocation a;
  if (find_allocation((uintptr_t)p, &a) == KIND_DEVICE && host_memory_in_use(a.base, a.size))
    standin_misuse("device memory %p freed while queued work still uses it", p);
  const int found = remove_allocation((uintptr_t)p, KIND_DEVICE);
  pthread_mutex_unlock(&g_exec);
  return found ? 0 : -1;
}

/* Pinned host memory, as from cuMemHostAlloc, without needing a context. */
STANDIN_EXPORT void* gdscp_cuda_host_alloc(size_t size) { return add_allocation(size, KIND_PINNED, 0, 0); }

STANDIN_EXPORT int gdscp_cuda_host_free(void* p) { return remove_allocation((uintptr_t)p, KIND_PINNED) ? 0 : -1; }

/* Live allocations of a kind (1: device, 2: pinned) and their bytes. */
STANDIN_EXPORT long gdscp_cuda_live(int kind, size_t* bytes) {
  long n = 0;
  size_t total = 0;
  pthread_mutex_lock(&g_alloc_mutex);
  for (size_t i = 0; i < g_alloc_len; ++i)
    if (g_allocs[i].kind == kind) {
      ++n;
      total += g_allocs[i].size;
    }
  pthread_mutex_unlock(&g_alloc_mutex);
  if (bytes) *bytes = total;
  return n;
}

/* Device memory from cuMemAlloc not yet freed with cuMemFree, and its bytes. */
STANDIN_EXPORT long gdscp_cuda_driver_allocations(size_t* bytes) {
  long n = 0;
  size_t total = 0;
  pthread_mutex_lock(&g_alloc_mutex);
  for (size_t i = 0; i < g_alloc_len; ++i)
    if (g_allocs[i].kind == KIND_DEVICE && !(g_allocs[i].flags & ALLOC_BY_TEST)) {
      ++n;
      total += g_allocs[i].size;
    }
  pthread_mutex_unlock(&g_alloc_mutex);
  if (bytes) *bytes = total;
  return n;
}

/* A stream of `device`, made without a current context (or cuInit). */
STANDIN_EXPORT CUstream gdscp_cuda_stream(int device, unsigned flags) {
  if (device < 0 || device >= g_device_count) return NULL;
  struct CUstream_st* s = calloc(1, sizeof *s);
  s->magic = STREAM_MAGIC;
  s->device = device;
  s->flags = flags;
  pthread_mutex_lock(&g_exec);
  s->next_all = g_streams;
  g_streams = s;
  pthread_mutex_unlock(&g_exec);
  return s;
}

/* Queues a fill of device memory on a stream, as a kernel would. */
STANDIN_EXPORT int gdscp_cuda_fill_async(CUstream stream, void* dst, int byte, size_t n) {
  if (range_kind((uintptr_t)dst, n, NULL) != KIND_DEVICE) return -1;
  pthread_mutex_lock(&g_exec);
  struct CUstream_st* s = resolve_stream(stream);
  if (!s) {
    pthread_mutex_unlock(&g_exec);
    return -1;
  }
  copy_args* c = malloc(sizeof *c);
  *c = (copy_args){dst, NULL, n, (uintptr_t)dst, byte & 0xff};
  enqueue(s, run_copy, c, 0, 0);
  pthread_mutex_unlock(&g_exec);
  return 0;
}

/* Work queued on all streams and not run yet. */
STANDIN_EXPORT long gdscp_cuda_pending(void) {
  long n = 0;
  pthread_mutex_lock(&g_exec);
  for (int d = 0; d < MAX_DEVICES; ++d) n += (long)(g_legacy[d].queued - g_legacy[d].done);
  for (struct CUstream_st* s = g_streams; s; s = s->next_all) n += (long)(s->queued - s->done);
  pthread_mutex_unlock(&g_exec);
  return n;
}

/* Queues `run(arg)` on a stream (for the libcufile stand-in's stream I/O);
 * a CUresult. Needs a current context for the legacy stream, as copies do. */
STANDIN_EXPORT CUresult gdscp_cuda_enqueue(CUstream stream, void (*run)(void*), void* arg) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  pthread_mutex_lock(&g_exec);
  struct CUstream_st* s = resolve_stream(stream);
  if (!s) {
    pthread_mutex_unlock(&g_exec);
    return t_current ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_CONTEXT;
  }
  enqueue(s, run, arg, 0, 0);
  pthread_mutex_unlock(&g_exec);
  return CUDA_SUCCESS;
}

/* What [ptr, ptr + n) is: 1 device memory (its device in *device), 2 pinned
 * host memory, 0 neither, -1 past the end of an allocation. */
STANDIN_EXPORT int gdscp_cuda_memory_kind(uintptr_t ptr, size_t n, int* device) {
  allocation a;
  const int kind = range_kind(ptr, n, &a);
  if (kind > 0 && device) *device = a.device;
  return kind;
}

/* Makes `device`'s primary context current on the calling thread (-1: none),
 * as CuPy or PyTorch leave it on a thread that used the GPU; 0, or -1 for a
 * device that does not exist. */
STANDIN_EXPORT int gdscp_cuda_make_current(int device) {
  if (device < -1 || device >= g_device_count) return -1;
  t_current = device < 0 ? NULL : &g_ctx[device];
  return 0;
}

/* The device of the calling thread's current context; -1 without one. */
STANDIN_EXPORT int gdscp_cuda_current_device(void) { return t_current ? t_current->device : -1; }

STANDIN_EXPORT int gdscp_cuda_initialized(void) { return g_initialized; }

STANDIN_EXPORT CUcontext gdscp_cuda_primary_context(int device) {
  return device >= 0 && device < g_device_count ? &g_ctx[device] : NULL;
}

STANDIN_EXPORT long gdscp_cuda_retains(int device) {
  return device >= 0 && device < MAX_DEVICES ? __atomic_load_n(&g_retains[device], __ATOMIC_RELAXED) : -1;
}

STANDIN_EXPORT void gdscp_cuda_reset(void) { standin_reset_common(); }
