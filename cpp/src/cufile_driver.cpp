#include "gdscp/cufile_driver.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <fstream>
#include <mutex>

#include "gdscp/cuda_driver.hpp"

namespace gdscp {
namespace {
std::mutex g_mutex;
bool g_tried = false;
const CuFileDriver* g_driver = nullptr;
std::string g_error = "libcufile was not loaded yet";
}  // namespace

std::string CuFileDriver::op_error_text(int code) {
  return std::string(cufileop_status_error(static_cast<CUfileOpError>(code < 0 ? -code : code))) +
         " (CUfileOpError " + std::to_string(code < 0 ? -code : code) + ")";
}

std::string CuFileDriver::status_text(CUfileError_t status) {
  std::string s = op_error_text(status.err);
  if (status.err == CU_FILE_CUDA_DRIVER_ERROR) {
    if (const CudaDriver* drv = CudaDriver::get()) s += ": " + drv->error_text(status.cu_err);
  }
  return s;
}

const CuFileDriver* CuFileDriver::load(const std::string& hint, std::string& error) {
  // The system's library first (it matches the installed driver), then the
  // nvidia-cufile wheel's, which the Python side finds with cuda-pathfinder.
  void* lib = ::dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    error = "libcufile.so.0 could not be loaded: " + std::string(e ? e : "");
    if (hint.empty()) return nullptr;
    lib = ::dlopen(hint.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* h = ::dlerror();
      error += "; nor " + hint + ": " + std::string(h ? h : "");
      return nullptr;
    }
  }
  auto* drv = new CuFileDriver();
#define GDSCP_RESOLVE(name) drv->name = reinterpret_cast<decltype(drv->name)>(::dlsym(lib, #name));
  GDSCP_CUFILE_FUNCTIONS(GDSCP_RESOLVE)
  GDSCP_CUFILE_OPTIONAL_FUNCTIONS(GDSCP_RESOLVE)
#undef GDSCP_RESOLVE
#define GDSCP_REQUIRE(name)                                    \
  if (!drv->name) {                                            \
    error = "libcufile.so.0 lacks " #name;                     \
    delete drv;                                                \
    return nullptr;                                            \
  }
  GDSCP_CUFILE_FUNCTIONS(GDSCP_REQUIRE)
#undef GDSCP_REQUIRE
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(drv->cuFileRead), &info) && info.dli_fname)
    drv->library_path = info.dli_fname;
  if (drv->cuFileGetVersion) drv->cuFileGetVersion(&drv->version);
  // cuFile needs the CUDA driver initialised in this process first.
  if (!CudaDriver::get()) {
    error = "cuFile needs CUDA: " + CudaDriver::load_error();
    delete drv;
    return nullptr;
  }
  const CUfileError_t st = drv->cuFileDriverOpen();
  if (st.err != CU_FILE_SUCCESS && st.err != CU_FILE_DRIVER_ALREADY_OPEN) {
    error = "cuFileDriverOpen failed: " + status_text(st);
    delete drv;
    return nullptr;
  }
  // Never closed: libcufile closes its driver at process exit.
  return drv;
}

const CuFileDriver* CuFileDriver::get(const std::string& library_hint) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_tried) {
    g_tried = true;
    g_driver = load(library_hint, g_error);
    if (g_driver) g_error.clear();
  }
  return g_driver;
}

std::string CuFileDriver::error() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_error;
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
