// libcufile.so.0 loaded at run time; the cuFile driver opened once per process.
#pragma once

#include <cufile.h>

#include <string>

namespace gdscp {

#define GDSCP_CUFILE_FUNCTIONS(X) \
  X(cuFileDriverOpen)             \
  X(cuFileHandleRegister)         \
  X(cuFileHandleDeregister)       \
  X(cuFileRead)                   \
  X(cuFileWrite)

#define GDSCP_CUFILE_OPTIONAL_FUNCTIONS(X) \
  X(cuFileGetVersion)                      \
  X(cuFileReadAsync)                       \
  X(cuFileWriteAsync)

class CuFileDriver {
 public:
  // Loads the library (the system's libcufile.so.0, else `library_hint`) and
  // opens the driver, once. nullptr on failure; error() says why.
  static const CuFileDriver* get(const std::string& library_hint = {});
  static std::string error();

  // "cuFileRead ... : <text>" for a CUfileError_t / negative ssize_t result.
  static std::string status_text(CUfileError_t status);
  static std::string op_error_text(int code);

  std::string library_path;
  int version = 0;  // cuFileGetVersion, e.g. 1150 for 1.15

#define GDSCP_DECLARE(name) decltype(&::name) name = nullptr;
  GDSCP_CUFILE_FUNCTIONS(GDSCP_DECLARE)
  GDSCP_CUFILE_OPTIONAL_FUNCTIONS(GDSCP_DECLARE)
#undef GDSCP_DECLARE

 private:
  CuFileDriver() = default;
  static const CuFileDriver* load(const std::string& hint, std::string& error);
};

// GPUDirect Storage proper needs the nvidia-fs kernel module; without it
// libcufile can only run in its own compatibility mode.
bool nvidia_fs_present();
std::string nvidia_fs_version();  // "" when absent
// Test hook: the file whose presence means nvidia-fs is loaded ("" restores
// /proc/driver/nvidia-fs/version).
void set_nvidia_fs_version_path(const std::string& path);

}  // namespace gdscp
