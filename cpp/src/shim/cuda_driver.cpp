#include "gdscp/shim/cuda_driver.hpp"

#include <dlfcn.h>

#include <mutex>

#include "gdscp/error.hpp"

namespace gdscp {
namespace {
std::string g_load_error;

// The API level every entry point is asked for. cuGetProcAddress returns the
// symbol's ABI as of this CUDA version, which must match the prototypes that
// cuda.h declares under the names used here: asking for CUDA_VERSION (13.0)
// returns cuCtxGetDevice_v2(CUdevice*, CUcontext) for "cuCtxGetDevice", whose
// header prototype is the one-argument v1, and the call crashes.
constexpr int kApiVersion = 12000;
}  // namespace

const CudaDriver* CudaDriver::load() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    g_load_error = std::string("libcuda.so.1 could not be loaded (no NVIDIA driver?): ") + (why ? why : "");
    return nullptr;
  }
  auto get_proc = reinterpret_cast<decltype(&::cuGetProcAddress)>(::dlsym(lib, "cuGetProcAddress_v2"));
  if (!get_proc) {
    g_load_error = "libcuda.so.1 lacks cuGetProcAddress_v2: the NVIDIA driver predates CUDA 12";
    return nullptr;
  }
  auto* drv = new CudaDriver();  // lives for the process: libcuda is never unloaded
  bool ok = true;
#define GDSCP_RESOLVE(name)                                                                    \
  {                                                                                            \
    void* fn = nullptr;                                                                        \
    CUdriverProcAddressQueryResult status{};                                                   \
    if (get_proc(#name, &fn, kApiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || \
        fn == nullptr) {                                                                       \
      if (ok) g_load_error = "libcuda.so.1 lacks " #name " (a driver for CUDA 12 or later is needed)"; \
      ok = false;                                                                              \
    }                                                                                          \
    drv->name = reinterpret_cast<decltype(drv->name)>(fn);                                     \
  }
  GDSCP_CUDA_FUNCTIONS(GDSCP_RESOLVE)
#undef GDSCP_RESOLVE
  if (!ok) {
    delete drv;
    return nullptr;
  }
  const CUresult init = drv->cuInit(0);
  if (init != CUDA_SUCCESS) {
    g_load_error = "cuInit failed (no usable GPU?): " + drv->error_text(init);
    delete drv;
    return nullptr;
  }
  drv->cuDriverGetVersion(&drv->version);
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(get_proc), &info) && info.dli_fname) drv->library_path = info.dli_fname;
  return drv;
}

const CudaDriver* CudaDriver::get() noexcept {
  static const CudaDriver* drv = [] {
    try {
      return load();
    } catch (...) {
      g_load_error = "libcuda.so.1 could not be loaded";
      return static_cast<const CudaDriver*>(nullptr);
    }
  }();
  return drv;
}

const std::string& CudaDriver::load_error() noexcept {
  get();
  return g_load_error;
}

const CudaDriver& CudaDriver::require() {
  const CudaDriver* drv = get();
  if (!drv) throw Error(ErrorKind::state, 0, "CUDA is not available: " + g_load_error);
  return *drv;
}

std::string CudaDriver::error_text(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName) cuGetErrorName(result, &name);
  if (cuGetErrorString) cuGetErrorString(result, &text);
  std::string s = name ? name : ("CUDA error " + std::to_string(static_cast<int>(result)));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

void CudaDriver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  throw Error(ErrorKind::cuda, static_cast<int>(result), std::string(what) + ": " + error_text(result));
}

ScopedContext::ScopedContext(const CudaDriver& drv, CUcontext ctx) : drv_(drv) {
  drv_.check(drv_.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != ctx) {
    drv_.check(drv_.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    switched_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (switched_) drv_.cuCtxSetCurrent(previous_);
}

}  // namespace gdscp
