#include "gdscp/system_info.hpp"

#include <unistd.h>

#include <fstream>
#include <mutex>

#include "gdscp/shim/cuda_driver.hpp"
#include "gdscp/shim/cufile_driver.hpp"

namespace gdscp {

CudaInfo cuda_info() {
  CudaInfo info;
  const CudaDriver* drv = CudaDriver::get();
  if (!drv) {
    info.error = CudaDriver::load_error();
    return info;
  }
  info.available = true;
  info.library = drv->library_path;
  info.driver_version = drv->version;
  int count = 0;
  if (drv->cuDeviceGetCount(&count) != CUDA_SUCCESS) count = 0;
  for (int i = 0; i < count; ++i) {
    CUdevice dev{};
    if (drv->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    char name[256] = {};
    char bus[64] = {};
    size_t mem = 0;
    drv->cuDeviceGetName(name, sizeof name, dev);
    drv->cuDeviceGetPCIBusId(bus, sizeof bus, dev);
    drv->cuDeviceTotalMem(&mem, dev);
    info.gpus.push_back({i, name, bus, mem});
  }
  return info;
}

CuFileInfo cufile_info(const std::string& library_hint) {
  CuFileInfo info;
  info.nvidia_fs = nvidia_fs_present();
  info.nvidia_fs_version = nvidia_fs_version();
  const CuFileDriver* drv = CuFileDriver::get(library_hint);
  if (!drv) {
    info.error = CuFileDriver::error();
    return info;
  }
  info.available = true;
  info.library = drv->library_path;
  info.version = drv->version;
  return info;
}

namespace {
constexpr const char* kNvidiaFsVersion = "/proc/driver/nvidia-fs/version";
std::mutex g_nvidia_fs_mutex;
std::string g_nvidia_fs_path = kNvidiaFsVersion;

std::string nvidia_fs_version_path() {
  std::lock_guard<std::mutex> lock(g_nvidia_fs_mutex);
  return g_nvidia_fs_path;
}
}  // namespace

void set_nvidia_fs_version_path(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_nvidia_fs_mutex);
  g_nvidia_fs_path = path.empty() ? kNvidiaFsVersion : path;
}

bool nvidia_fs_present() { return ::access(nvidia_fs_version_path().c_str(), R_OK) == 0; }

std::string nvidia_fs_version() {
  std::ifstream in(nvidia_fs_version_path());
  std::string line, all;
  while (std::getline(in, line)) all += (all.empty() ? "" : "; ") + line;
  return all;
}

}  // namespace gdscp
