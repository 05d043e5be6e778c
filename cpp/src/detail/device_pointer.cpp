#include "gdscp/detail/device_pointer.hpp"

#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gdscp/error.hpp"
#include "gdscp/shim/cuda_driver.hpp"

namespace gdscp::detail {

CUcontext primary_context(int ordinal) {
  const CudaDriver& drv = CudaDriver::require();
  // Retained once per GPU for the life of the process, as CUDA runtimes do.
  static std::mutex mutex;
  static std::vector<CUcontext> contexts;
  std::lock_guard<std::mutex> lock(mutex);
  if (ordinal >= 0 && static_cast<size_t>(ordinal) < contexts.size() && contexts[ordinal]) return contexts[ordinal];
  int count = 0;
  drv.check(drv.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count)
    throw_invalid("GPU " + std::to_string(ordinal) + " does not exist (CUDA sees " + std::to_string(count) +
                  (count == 1 ? " GPU)" : " GPUs)"));
  if (contexts.size() <= static_cast<size_t>(ordinal)) contexts.resize(ordinal + 1, nullptr);
  CUdevice dev{};
  drv.check(drv.cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  drv.check(drv.cuDevicePrimaryCtxRetain(&contexts[ordinal], dev), "cuDevicePrimaryCtxRetain");
  return contexts[ordinal];
}

bool enable_peer_access(const MemoryTarget& from, const MemoryTarget& to) {
  if (!from.device || !to.device || from.ordinal == to.ordinal || !from.ctx || !to.ctx) return false;
  const CudaDriver& drv = CudaDriver::require();
  static std::mutex mutex;
  static std::map<std::pair<CUcontext, CUcontext>, bool> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find({from.ctx, to.ctx});
  if (it != known.end()) return it->second;
  CUdevice a{}, b{};
  int can = 0;
  drv.check(drv.cuDeviceGet(&a, from.ordinal), "cuDeviceGet");
  drv.check(drv.cuDeviceGet(&b, to.ordinal), "cuDeviceGet");
  drv.check(drv.cuDeviceCanAccessPeer(&can, a, b), "cuDeviceCanAccessPeer");
  bool ok = false;
  if (can) {
    ScopedContext scope(drv, from.ctx);
    const CUresult r = drv.cuCtxEnablePeerAccess(to.ctx, 0);
    // Enabled already (by CuPy, or another library in the process) is enabled.
    ok = r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
  }
  known[{from.ctx, to.ctx}] = ok;
  return ok;
}

MemoryTarget resolve_device_pointer(uintptr_t ptr) {
  const CudaDriver& drv = CudaDriver::require();
  CUmemorytype type{};
  CUcontext ctx = nullptr;
  int ordinal = -1;
  unsigned int managed = 0;
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void* values[] = {&type, &ctx, &ordinal, &managed};
  drv.check(drv.cuPointerGetAttributes(4, attrs, values, static_cast<CUdeviceptr>(ptr)),
            "cuPointerGetAttributes");
  MemoryTarget t;
  if (type == 0) {
    char addr[32];
    std::snprintf(addr, sizeof addr, "0x%llx", static_cast<unsigned long long>(ptr));
    throw Error(ErrorKind::invalid, 0,
                std::string("address ") + addr +
                    " is not memory CUDA knows (claimed device memory, but no allocation covers it)");
  }
  if (type == CU_MEMORYTYPE_HOST && !managed) return t;  // pinned host memory: the CPU path
  t.device = true;
  t.ordinal = ordinal;
  t.managed = managed != 0;
  if (ctx) {
    t.ctx = ctx;
    return t;
  }
  CUcontext current = nullptr;
  if (drv.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current) {
    CUdevice dev{};
    if (drv.cuCtxGetDevice(&dev) == CUDA_SUCCESS) {
      CUdevice want{};
      if (drv.cuDeviceGet(&want, ordinal) == CUDA_SUCCESS && want == dev) {
        t.ctx = current;
        return t;
      }
    }
  }
  t.ctx = primary_context(ordinal < 0 ? 0 : ordinal);
  return t;
}

}  // namespace gdscp::detail
