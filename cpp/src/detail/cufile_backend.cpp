#include "gdscp/detail/cufile_backend.hpp"

#include <cerrno>

#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {
namespace {

// A negative cuFileRead/cuFileWrite result, decoded: -1 with errno set, a
// negated errno, or a negated CUfileOpError.
[[noreturn]] void throw_io_error(ssize_t result, const char* what, const std::string& path, int64_t offset) {
  if (result == -1) throw_os_error(errno != 0 ? errno : EIO, what, path, offset);  // -1 without errno: still an error
  const int code = static_cast<int>(-result);
  if (code <= CUFILEOP_BASE_ERR) throw_os_error(code, what, path, offset);  // a negated errno
  throw Error(ErrorKind::cufile, code,
              std::string(what) + " '" + path + "' at offset " + std::to_string(offset) + ": " +
                  CuFileDriver::op_error_text(code),
              path, offset);
}

}  // namespace

CuFileBackend::CuFileBackend(std::shared_ptr<File> file, const CuFileDriver& driver)
    : file_(std::move(file)), driver_(driver) {
  if (file_->direct_fd() < 0)
    throw Error(ErrorKind::state, 0, "cuFile needs O_DIRECT, which the filesystem of '" + file_->path() + "' refuses");
  CUfileDescr_t descr{};
  descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  descr.handle.fd = file_->direct_fd();
  const CUfileError_t st = driver_.cuFileHandleRegister(&handle_, &descr);
  if (st.err != CU_FILE_SUCCESS)
    throw Error(ErrorKind::cufile, st.err,
                "cuFileHandleRegister '" + file_->path() + "': " + CuFileDriver::status_text(st), file_->path());
}

CuFileBackend::~CuFileBackend() {
  if (handle_) driver_.cuFileHandleDeregister(handle_);
}

template <bool Write>
size_t CuFileBackend::transfer(const MemoryTarget& mem, char* base, ChunkQueue& work, Request* req) {
  const char* what = Write ? "cuFileWrite" : "cuFileRead";
  if (!mem.device) throw_invalid("the cuFile backend moves device memory only");
  const CudaDriver& cuda = CudaDriver::require();
  ScopedContext scope(cuda, mem.ctx);
  // cuFile's I/O is not ordered on any stream: work queued on the legacy
  // default stream before the call (a kernel filling the buffer) is waited
  // for here, as the POSIX path's blocking streams wait for it.
  cuda.check(cuda.cuStreamSynchronize(CU_STREAM_LEGACY), "cuStreamSynchronize (legacy default stream)");
  size_t total = 0;
  Chunk c;
  while (work.next(c)) {
    for (size_t done = 0; done < c.size;) {
      const off_t at = c.file_offset + static_cast<off_t>(done);
      const off_t buf_at = static_cast<off_t>(c.buf_offset + done);
      const ssize_t r = Write ? driver_.cuFileWrite(handle_, base, c.size - done, at, buf_at)
                              : driver_.cuFileRead(handle_, base, c.size - done, at, buf_at);
      if (r < 0) throw_io_error(r, what, file_->path(), at);
      if (r == 0) {
        if (Write) throw_os_error(EIO, "cuFileWrite wrote nothing to", file_->path(), at);
        work.came_short(c, done);  // end of file
        break;
      }
      done += static_cast<size_t>(r);
      total += static_cast<size_t>(r);
      if (req) req->add_progress(static_cast<size_t>(r));
    }
  }
  return total;
}

size_t CuFileBackend::read(const MemoryTarget& mem, char* base, ChunkQueue& work, const Settings&, Request* req) {
  return transfer<false>(mem, base, work, req);
}

size_t CuFileBackend::write(const MemoryTarget& mem, const char* base, ChunkQueue& work, const Settings&,
                            Request* req) {
  return transfer<true>(mem, const_cast<char*>(base), work, req);
}

bool CuFileBackend::submit_async(bool write, const MemoryTarget& mem, void* base, AsyncOp& op, CUstream stream) {
  if (!supports_async()) return false;
  const CudaDriver& cuda = CudaDriver::require();
  ScopedContext scope(cuda, mem.ctx);
  const CUfileError_t st =
      write ? driver_.cuFileWriteAsync(handle_, base, &op.size, &op.file_offset, &op.buf_offset, &op.bytes, stream)
            : driver_.cuFileReadAsync(handle_, base, &op.size, &op.file_offset, &op.buf_offset, &op.bytes, stream);
  if (st.err == CU_FILE_SUCCESS) return true;
  if (st.err == CU_FILE_ASYNC_NOT_SUPPORTED || st.err == CU_FILE_IO_NOT_SUPPORTED) return false;
  throw Error(ErrorKind::cufile, st.err,
              std::string(write ? "cuFileWriteAsync" : "cuFileReadAsync") + " '" + file_->path() +
                  "': " + CuFileDriver::status_text(st),
              file_->path(), op.file_offset);
}

size_t CuFileBackend::async_result(const AsyncOp& op) const {
  // The I/O ran on the stream: this thread's errno says nothing about a -1.
  if (op.bytes == -1)
    throw_os_error(EIO, "cuFile stream I/O (failed; its errno is lost on the stream) on", file_->path(),
                   op.file_offset);
  if (op.bytes < 0) throw_io_error(op.bytes, "cuFile stream I/O on", file_->path(), op.file_offset);
  return static_cast<size_t>(op.bytes);
}

}  // namespace gdscp::detail
