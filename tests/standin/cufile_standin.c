/* A stand-in for libcufile.so.0, for tests on machines without GPUDirect
 * Storage (or a GPU: it works over the libcuda stand-in, cuda_standin.c,
 * whose "device memory" is host memory).
 *
 * It implements the cuFile calls gdscp's engine loads
 * (cpp/include/gdscp/cufile_driver.hpp) over POSIX I/O with the prototypes
 * of cufile.h: driver open/close, handle register/deregister, buffer
 * register/deregister, cuFileRead/cuFileWrite, cuFileReadAsync/WriteAsync
 * (run on the libcuda stand-in's streams when they are synchronised) and
 * cuFileGetVersion. The batch API is left out: the engine does not use it.
 *
 * It refuses what libcufile refuses, and counts it as misuse: a descriptor
 * without O_DIRECT, a handle used after deregistration, memory that is not
 * device memory or a range past its allocation, I/O without the buffer's
 * context current, a handle whose descriptor was closed before it was
 * deregistered. Transfers whose file offset, size and device address are
 * all 4 KiB-aligned go through the registered O_DIRECT descriptor, as
 * GPUDirect Storage would; the rest through a buffered descriptor of the same
 * file, as libcufile's own bounce buffers would.
 *
 * Every call is logged; every call can fail on demand (gdscp_cufile_fail:
 * a CUfileOpError, a negative errno or -1 with errno; "cuFileReadAsync:io"
 * for the stream I/O itself), be held at a gate, or move at most so many
 * bytes per call (gdscp_cufile_limit). Built by the test suite with the soname
 * libcufile.so.0; -DGDSCP_STANDIN_NO_ASYNC leaves out the stream calls and
 * -DGDSCP_STANDIN_NO_WRITE leaves out cuFileWrite.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cufile.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>

#define STANDIN_API(name) gdscp_cufile_##name
#include "standin.h"

#define DIRECT_ALIGN 4096

/* The libcuda stand-in's hooks, found when the driver opens. */
static int (*cuda_memory_kind)(uintptr_t ptr, size_t n, int* device);
static int (*cuda_current_device)(void);
static CUresult (*cuda_enqueue)(CUstream stream, void (*run)(void*), void* arg);

static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static int g_open;
static size_t g_limit_read, g_limit_write; /* most bytes one call moves; 0: no limit */

#define HANDLE_MAGIC 0x47445348u
typedef struct handle {
  uint32_t magic;
  int live;
  int fd;        /* the registered (O_DIRECT) descriptor */
  int buffered;  /* the same file without O_DIRECT */
  dev_t dev;
  ino_t ino;
  struct handle* next;
} handle;
static handle* g_handles;

typedef struct registered_buffer {
  uintptr_t base;
  size_t size;
  struct registered_buffer* next;
} registered_buffer;
static registered_buffer* g_buffers;

static CUfileError_t status(CUfileOpError err, CUresult cu) {
  CUfileError_t s = {err, cu};
  return s;
}

static CUfileError_t finish_status(standin_call* c, CUfileOpError err, CUresult cu) {
  c->result = err;
  standin_record(c);
  return status(err, cu);
}

static ssize_t finish_ssize(standin_call* c, ssize_t r) {
  c->result = r;
  if (r == -1) c->err = errno;
  const int saved = errno;
  standin_record(c);
  errno = saved;
  return r;
}

static standin_call begin(const char* entry) {
  standin_call c = standin_begin(entry);
  if (cuda_current_device) c.ctx = (uint64_t)(int64_t)cuda_current_device();
  return c;
}

/* An injected failure of a CUfileError_t call. */
#define STATUS_FAULT(entry)                                        \
  {                                                                \
    int64_t code_, aux_;                                           \
    if (standin_fault_fires(entry, &code_, &aux_)) {               \
      call.flags |= STANDIN_INJECTED;                              \
      return finish_status(&call, (CUfileOpError)code_, (CUresult)aux_); \
    }                                                              \
  }

/* The live handle `fh` names; NULL (with the misuse counted) otherwise. */
static handle* live_handle(CUfileHandle_t fh, const char* entry) {
  pthread_mutex_lock(&g_mutex);
  handle* found = NULL;
  for (handle* h = g_handles; h; h = h->next)
    if (h == (handle*)fh) found = h;
  const int live = found && found->live;
  pthread_mutex_unlock(&g_mutex);
  if (!live) {
    standin_misuse("%s on %s handle %p", entry, found ? "a deregistered" : "an unknown", fh);
    return NULL;
  }
  return found;
}

/* -- the driver ------------------------------------------------------------------ */
STANDIN_EXPORT CUfileError_t cuFileDriverOpen(void) {
  standin_call call = begin("cuFileDriverOpen");
  STATUS_FAULT("cuFileDriverOpen");
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (cuda) {
    cuda_memory_kind = (int (*)(uintptr_t, size_t, int*))dlsym(cuda, "gdscp_cuda_memory_kind");
    cuda_current_device = (int (*)(void))dlsym(cuda, "gdscp_cuda_current_device");
    cuda_enqueue = (CUresult(*)(CUstream, void (*)(void*), void*))dlsym(cuda, "gdscp_cuda_enqueue");
  }
  if (!cuda_memory_kind || !cuda_current_device || !cuda_enqueue) {
    standin_misuse("the libcufile stand-in runs over the libcuda stand-in only, which is not loaded");
    return finish_status(&call, CU_FILE_CUDA_DRIVER_ERROR, CUDA_ERROR_NOT_INITIALIZED);
  }
  pthread_mutex_lock(&g_mutex);
  ++g_open;
  pthread_mutex_unlock(&g_mutex);
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}

static CUfileError_t driver_close(const char* entry) {
  standin_call call = begin(entry);
  STATUS_FAULT(entry);
  pthread_mutex_lock(&g_mutex);
  const int was_open = g_open > 0;
  if (was_open) --g_open;
  pthread_mutex_unlock(&g_mutex);
  return finish_status(&call, was_open ? CU_FILE_SUCCESS : CU_FILE_DRIVER_NOT_INITIALIZED, CUDA_SUCCESS);
}

/* cufile.h renames cuFileDriverClose to cuFileDriverClose_v2; both exist. */
STANDIN_EXPORT CUfileError_t cuFileDriverClose(void) { return driver_close("cuFileDriverClose_v2"); }
#undef cuFileDriverClose
STANDIN_EXPORT CUfileError_t cuFileDriverClose(void) { return driver_close("cuFileDriverClose"); }

STANDIN_EXPORT CUfileError_t cuFileGetVersion(int* version) {
  standin_call call = begin("cuFileGetVersion");
  STATUS_FAULT("cuFileGetVersion");
  if (!version) return finish_status(&call, CU_FILE_INVALID_VALUE, CUDA_SUCCESS);
  *version = 1150;
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}

/* -- file handles ---------------------------------------------------------------- */
STANDIN_EXPORT CUfileError_t cuFileHandleRegister(CUfileHandle_t* fh, CUfileDescr_t* descr) {
  standin_call call = begin("cuFileHandleRegister");
  if (descr) call.host = (uint64_t)(int64_t)descr->handle.fd;
  STATUS_FAULT("cuFileHandleRegister");
  if (g_open <= 0) {
    standin_misuse("cuFileHandleRegister before cuFileDriverOpen");
    return finish_status(&call, CU_FILE_DRIVER_NOT_INITIALIZED, CUDA_SUCCESS);
  }
  if (!fh || !descr || descr->type != CU_FILE_HANDLE_TYPE_OPAQUE_FD) {
    standin_misuse("cuFileHandleRegister: no handle, no descriptor, or not CU_FILE_HANDLE_TYPE_OPAQUE_FD");
    return finish_status(&call, CU_FILE_INVALID_VALUE, CUDA_SUCCESS);
  }
  const int fd = descr->handle.fd;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    standin_misuse("cuFileHandleRegister: %d is no open descriptor", fd);
    return finish_status(&call, CU_FILE_INVALID_VALUE, CUDA_SUCCESS);
  }
  if (!S_ISREG(st.st_mode)) return finish_status(&call, CU_FILE_INVALID_FILE_TYPE, CUDA_SUCCESS);
  const int fl = fcntl(fd, F_GETFL);
  if (!(fl & O_DIRECT)) {
    standin_misuse("cuFileHandleRegister: descriptor %d was opened without O_DIRECT", fd);
    return finish_status(&call, CU_FILE_INVALID_FILE_OPEN_FLAG, CUDA_SUCCESS);
  }
  pthread_mutex_lock(&g_mutex);
  for (handle* h = g_handles; h; h = h->next) {
    if (h->live && h->fd == fd) {
      pthread_mutex_unlock(&g_mutex);
      standin_misuse("cuFileHandleRegister: descriptor %d is registered already (or was closed while registered)",
                     fd);
      return finish_status(&call, CU_FILE_HANDLE_ALREADY_REGISTERED, CUDA_SUCCESS);
    }
  }
  pthread_mutex_unlock(&g_mutex);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const int buffered = open(path, (fl & O_ACCMODE) | O_CLOEXEC);
  if (buffered < 0) {
    standin_misuse("cuFileHandleRegister: cannot reopen %s without O_DIRECT: %s", path, strerror(errno));
    return finish_status(&call, CU_FILE_INTERNAL_ERROR, CUDA_SUCCESS);
  }
  handle* h = calloc(1, sizeof *h);
  *h = (handle){HANDLE_MAGIC, 1, fd, buffered, st.st_dev, st.st_ino, NULL};
  pthread_mutex_lock(&g_mutex);
  h->next = g_handles;
  g_handles = h;
  pthread_mutex_unlock(&g_mutex);
  *fh = h;
  call.handle = (uint64_t)(uintptr_t)h;
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}

STANDIN_EXPORT void cuFileHandleDeregister(CUfileHandle_t fh) {
  standin_call call = begin("cuFileHandleDeregister");
  call.handle = (uint64_t)(uintptr_t)fh;
  standin_pass_gate("cuFileHandleDeregister");
  handle* h = live_handle(fh, "cuFileHandleDeregister");
  if (h) {
    call.host = (uint64_t)(int64_t)h->fd;
    struct stat st;
    if (fstat(h->fd, &st) == 0 && st.st_dev == h->dev && st.st_ino == h->ino)
      call.flags |= STANDIN_FD_OPEN;
    else
      standin_misuse("cuFileHandleDeregister: descriptor %d was closed before its handle was deregistered", h->fd);
    pthread_mutex_lock(&g_mutex);
    h->live = 0;
    pthread_mutex_unlock(&g_mutex);
    close(h->buffered);
  }
  standin_record(&call);
}

/* -- buffers ---------------------------------------------------------------------- */
STANDIN_EXPORT CUfileError_t cuFileBufRegister(const void* base, size_t length, int flags) {
  standin_call call = begin("cuFileBufRegister");
  call.ptr = (uint64_t)(uintptr_t)base;
  call.size = length;
  (void)flags;
  STATUS_FAULT("cuFileBufRegister");
  int device = -1;
  if (g_open <= 0 || !cuda_memory_kind) return finish_status(&call, CU_FILE_DRIVER_NOT_INITIALIZED, CUDA_SUCCESS);
  if (cuda_memory_kind((uintptr_t)base, length, &device) != 1)
    return finish_status(&call, CU_FILE_INVALID_VALUE, CUDA_SUCCESS);
  pthread_mutex_lock(&g_mutex);
  for (registered_buffer* b = g_buffers; b; b = b->next) {
    if (b->base == (uintptr_t)base) {
      pthread_mutex_unlock(&g_mutex);
      return finish_status(&call, CU_FILE_MEMORY_ALREADY_REGISTERED, CUDA_SUCCESS);
    }
  }
  registered_buffer* b = calloc(1, sizeof *b);
  *b = (registered_buffer){(uintptr_t)base, length, g_buffers};
  g_buffers = b;
  pthread_mutex_unlock(&g_mutex);
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}

STANDIN_EXPORT CUfileError_t cuFileBufDeregister(const void* base) {
  standin_call call = begin("cuFileBufDeregister");
  call.ptr = (uint64_t)(uintptr_t)base;
  STATUS_FAULT("cuFileBufDeregister");
  pthread_mutex_lock(&g_mutex);
  for (registered_buffer** p = &g_buffers; *p; p = &(*p)->next) {
    if ((*p)->base == (uintptr_t)base) {
      registered_buffer* b = *p;
      *p = b->next;
      free(b);
      pthread_mutex_unlock(&g_mutex);
      return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
    }
  }
  pthread_mutex_unlock(&g_mutex);
  return finish_status(&call, CU_FILE_INVALID_VALUE, CUDA_SUCCESS);
}

/* -- reads and writes ------------------------------------------------------------- */

/* Moves up to `n` bytes; a short count only at end of file (reads); -1 with
 * errno on failure. */
static ssize_t move(int write, int fd, char* p, size_t n, off_t at) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = write ? pwrite(fd, p + done, n - done, at + (off_t)done)
                            : pread(fd, p + done, n - done, at + (off_t)done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) break;
    done += (size_t)r;
  }
  return (ssize_t)done;
}

/* cuFileRead/cuFileWrite and the stream I/O; `call` is the caller's record. */
static ssize_t transfer(int write, standin_call* call, CUfileHandle_t fh, const void* base, size_t size,
                        off_t file_offset, off_t buf_offset, int on_stream) {
  call->handle = (uint64_t)(uintptr_t)fh;
  call->ptr = (uint64_t)(uintptr_t)base;
  call->size = size;
  call->file_offset = file_offset;
  call->buf_offset = buf_offset;
  if (on_stream) call->flags |= STANDIN_DEFERRED;
  {
    int64_t code, aux;
    if (standin_fault_fires(call->entry, &code, &aux)) {
      call->flags |= STANDIN_INJECTED;
      if (code == -1) errno = (int)aux;
      return finish_ssize(call, (ssize_t)code);
    }
  }
  handle* h = live_handle(fh, call->entry);
  if (!h) return finish_ssize(call, -CU_FILE_HANDLE_NOT_REGISTERED);
  if (file_offset < 0 || buf_offset < 0) {
    standin_misuse("%s: negative offset (file %lld, buffer %lld)", call->entry, (long long)file_offset,
                   (long long)buf_offset);
    return finish_ssize(call, -CU_FILE_INVALID_VALUE);
  }
  int base_device = -1, device = -1;
  const uintptr_t at = (uintptr_t)base + (uintptr_t)buf_offset;
  const int base_kind = cuda_memory_kind((uintptr_t)base, 1, &base_device);
  const int kind = cuda_memory_kind(at, size ? size : 1, &device);
  if (base_kind != 1 || kind == 0 || kind == 2) {
    standin_misuse("%s: %p + %lld is not device memory", call->entry, base, (long long)buf_offset);
    return finish_ssize(call, -CU_FILE_CUDA_MEMORY_TYPE_INVALID);
  }
  if (kind < 0 || device != base_device) {
    standin_misuse("%s: [%p + %lld, +%zu) runs past its device allocation", call->entry, base,
                   (long long)buf_offset, size);
    return finish_ssize(call, -CU_FILE_CUDA_POINTER_RANGE_ERROR);
  }
  if (!on_stream && cuda_current_device() != device) {
    standin_misuse("%s: the current context (device %d) is not the buffer's (device %d)", call->entry,
                   cuda_current_device(), device);
    return finish_ssize(call, -CU_FILE_CUDA_CONTEXT_MISMATCH);
  }
  if (!on_stream) standin_pass_gate(call->entry);
  const size_t limit = write ? g_limit_write : g_limit_read;
  const size_t n = limit && size > limit ? limit : size;
  char* p = (char*)at;
  ssize_t r = -1;
  if (at % DIRECT_ALIGN == 0 && file_offset % DIRECT_ALIGN == 0 && n % DIRECT_ALIGN == 0 && n > 0) {
    r = move(write, h->fd, p, n, file_offset);
    if (r >= 0) call->flags |= STANDIN_DIRECT;
    else if (errno != EINVAL) return finish_ssize(call, -1);
  }
  if (r < 0) r = move(write, h->buffered, p, n, file_offset);
  return finish_ssize(call, r);
}

STANDIN_EXPORT ssize_t cuFileRead(CUfileHandle_t fh, void* base, size_t size, off_t file_offset, off_t buf_offset) {
  standin_call call = begin("cuFileRead");
  return transfer(0, &call, fh, base, size, file_offset, buf_offset, 0);
}

#ifndef GDSCP_STANDIN_NO_WRITE
STANDIN_EXPORT ssize_t cuFileWrite(CUfileHandle_t fh, const void* base, size_t size, off_t file_offset,
                                   off_t buf_offset) {
  standin_call call = begin("cuFileWrite");
  return transfer(1, &call, fh, base, size, file_offset, buf_offset, 0);
}
#endif

/* -- stream I/O -------------------------------------------------------------------- */
#ifndef GDSCP_STANDIN_NO_ASYNC
typedef struct {
  int write;
  CUfileHandle_t fh;
  void* base;
  size_t* size_p;
  off_t* file_offset_p;
  off_t* buf_offset_p;
  ssize_t* bytes_p;
} stream_io;

/* Runs when the stream gets to it: reads the arguments only now, as
 * libcufile does, and stores the result in *bytes_p. */
static void run_stream_io(void* arg) {
  stream_io* io = arg;
  standin_call call = begin(io->write ? "cuFileWriteAsync:io" : "cuFileReadAsync:io");
  *io->bytes_p = transfer(io->write, &call, io->fh, io->base, *io->size_p, *io->file_offset_p, *io->buf_offset_p, 1);
  free(io);
}

static CUfileError_t submit(int write, CUfileHandle_t fh, void* base, size_t* size_p, off_t* file_offset_p,
                            off_t* buf_offset_p, ssize_t* bytes_p, CUstream stream) {
  standin_call call = begin(write ? "cuFileWriteAsync" : "cuFileReadAsync");
  call.handle = (uint64_t)(uintptr_t)fh;
  call.ptr = (uint64_t)(uintptr_t)base;
  call.host = (uint64_t)(uintptr_t)stream;
  if (size_p) call.size = *size_p;
  if (file_offset_p) call.file_offset = *file_offset_p;
  if (buf_offset_p) call.buf_offset = *buf_offset_p;
  STATUS_FAULT(call.entry);
  if (!live_handle(fh, call.entry)) return finish_status(&call, CU_FILE_HANDLE_NOT_REGISTERED, CUDA_SUCCESS);
  if (!size_p || !file_offset_p || !buf_offset_p || !bytes_p) {
    standin_misuse("%s: a NULL argument pointer", call.entry);
    return finish_status(&call, CU_FILE_INVALID_VALUE, CUDA_SUCCESS);
  }
  if (cuda_current_device() < 0) {
    standin_misuse("%s without a current context", call.entry);
    return finish_status(&call, CU_FILE_CUDA_CONTEXT_MISMATCH, CUDA_SUCCESS);
  }
  stream_io* io = malloc(sizeof *io);
  *io = (stream_io){write, fh, base, size_p, file_offset_p, buf_offset_p, bytes_p};
  const CUresult r = cuda_enqueue(stream, run_stream_io, io);
  if (r != CUDA_SUCCESS) {
    free(io);
    standin_misuse("%s: stream %p is not a stream of the current context", call.entry, (void*)stream);
    return finish_status(&call, CU_FILE_CUDA_DRIVER_ERROR, r);
  }
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}

STANDIN_EXPORT CUfileError_t cuFileReadAsync(CUfileHandle_t fh, void* base, size_t* size_p, off_t* file_offset_p,
                                             off_t* buf_offset_p, ssize_t* bytes_read_p, CUstream stream) {
  return submit(0, fh, base, size_p, file_offset_p, buf_offset_p, bytes_read_p, stream);
}

STANDIN_EXPORT CUfileError_t cuFileWriteAsync(CUfileHandle_t fh, void* base, size_t* size_p, off_t* file_offset_p,
                                              off_t* buf_offset_p, ssize_t* bytes_written_p, CUstream stream) {
  return submit(1, fh, base, size_p, file_offset_p, buf_offset_p, bytes_written_p, stream);
}

STANDIN_EXPORT CUfileError_t cuFileStreamRegister(CUstream stream, unsigned flags) {
  standin_call call = begin("cuFileStreamRegister");
  call.host = (uint64_t)(uintptr_t)stream;
  call.size = flags;
  STATUS_FAULT("cuFileStreamRegister");
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}

STANDIN_EXPORT CUfileError_t cuFileStreamDeregister(CUstream stream) {
  standin_call call = begin("cuFileStreamDeregister");
  call.host = (uint64_t)(uintptr_t)stream;
  STATUS_FAULT("cuFileStreamDeregister");
  return finish_status(&call, CU_FILE_SUCCESS, CUDA_SUCCESS);
}
#endif

/* -- for the tests ---------------------------------------------------------------- */

/* Each call of `entry` ("cuFileRead" or "cuFileWrite", stream I/O included)
 * moves at most `max_bytes` (0: no limit), as a short transfer would. */
STANDIN_EXPORT int gdscp_cufile_limit(const char* entry, size_t max_bytes) {
  if (strcmp(entry, "cuFileRead") == 0) g_limit_read = max_bytes;
  else if (strcmp(entry, "cuFileWrite") == 0) g_limit_write = max_bytes;
  else return -1;
  return 0;
}

/* Registered handles not yet deregistered. */
STANDIN_EXPORT long gdscp_cufile_live_handles(void) {
  long n = 0;
  pthread_mutex_lock(&g_mutex);
  for (handle* h = g_handles; h; h = h->next) n += h->live;
  pthread_mutex_unlock(&g_mutex);
  return n;
}

STANDIN_EXPORT int gdscp_cufile_driver_opens(void) { return g_open; }

/* Every CUfileOpError of cufile.h: its value, name and cufileop_status_error
 * text; returns how many there are (fills at most `cap`). */
STANDIN_EXPORT int gdscp_cufile_error_codes(int* codes, const char** names, const char** texts, int cap) {
  static const int all_codes[] = {
#define CUFILE_OP(code, name, string) name,
      CUFILEOP_STATUS_ENTRIES
#undef CUFILE_OP
  };
  static const char* all_names[] = {
#define CUFILE_OP(code, name, string) #name,
      CUFILEOP_STATUS_ENTRIES
#undef CUFILE_OP
  };
  const int n = (int)(sizeof all_codes / sizeof all_codes[0]);
  for (int i = 0; i < n && i < cap; ++i) {
    codes[i] = all_codes[i];
    names[i] = all_names[i];
    texts[i] = cufileop_status_error((CUfileOpError)all_codes[i]);
  }
  return n;
}

STANDIN_EXPORT void gdscp_cufile_reset(void) {
  standin_reset_common();
  g_limit_read = g_limit_write = 0;
}
