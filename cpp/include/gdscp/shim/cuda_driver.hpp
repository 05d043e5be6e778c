// libcuda.so.1 loaded at run time: only the calls gdscp uses, resolved by name
// and version through cuGetProcAddress. Nothing links against libcuda.
#pragma once

#include <cuda.h>

#include <string>

namespace gdscp {

#define GDSCP_CUDA_FUNCTIONS(X) \
  X(cuInit)                     \
  X(cuDriverGetVersion)         \
  X(cuGetErrorName)             \
  X(cuGetErrorString)           \
  X(cuDeviceGetCount)           \
  X(cuDeviceGet)                \
  X(cuDeviceGetName)            \
  X(cuDeviceTotalMem)           \
  X(cuDeviceGetPCIBusId)        \
  X(cuDevicePrimaryCtxRetain)   \
  X(cuCtxGetCurrent)            \
  X(cuCtxSetCurrent)            \
  X(cuCtxGetDevice)             \
  X(cuCtxSynchronize)           \
  X(cuPointerGetAttributes)     \
  X(cuMemGetInfo)               \
  X(cuMemAlloc)                 \
  X(cuMemFree)                  \
  X(cuMemsetD8)                 \
  X(cuMemcpyHtoD)               \
  X(cuMemcpyDtoH)               \
  X(cuMemcpyHtoDAsync)          \
  X(cuMemcpyDtoHAsync)          \
  X(cuStreamCreate)             \
  X(cuStreamSynchronize)        \
  X(cuEventCreate)              \
  X(cuEventRecord)              \
  X(cuEventSynchronize)         \
  X(cuEventDestroy)             \
  X(cuDeviceCanAccessPeer)      \
  X(cuCtxEnablePeerAccess)      \
  X(cuMemcpyPeerAsync)          \
  X(cuMemHostRegister)          \
  X(cuMemHostUnregister)

class CudaDriver {
 public:
  // nullptr where libcuda.so.1 is missing or cuInit fails; load_error() says why.
  static const CudaDriver* get() noexcept;
  static const std::string& load_error() noexcept;
  // Like get(), but throws a clear error instead of returning nullptr.
  static const CudaDriver& require();

  // Throws Error(ErrorKind::cuda) naming `what` and the driver's error text.
  void check(CUresult result, const char* what) const;
  std::string error_text(CUresult result) const;

  std::string library_path;
  int version = 0;  // cuDriverGetVersion, e.g. 13000

#define GDSCP_DECLARE(name) decltype(&::name) name = nullptr;
  GDSCP_CUDA_FUNCTIONS(GDSCP_DECLARE)
#undef GDSCP_DECLARE

 private:
  CudaDriver() = default;
  static const CudaDriver* load();
};

// Makes a context current on this thread for a scope, restoring the previous one.
class ScopedContext {
 public:
  ScopedContext(const CudaDriver& drv, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const CudaDriver& drv_;
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace gdscp
