// What `gdscp info` reports about CUDA and cuFile on this machine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gdscp {

struct GpuInfo {
  int index;
  std::string name;
  std::string pci_bus_id;
  uint64_t total_memory;
};

struct CudaInfo {
  bool available = false;
  std::string error;      // why not, when not
  std::string library;    // where libcuda.so.1 was loaded from
  int driver_version = 0; // e.g. 13000
  std::vector<GpuInfo> gpus;
};

struct CuFileInfo {
  bool available = false;  // loaded and cuFileDriverOpen succeeded
  std::string error;
  std::string library;
  int version = 0;
  bool nvidia_fs = false;
  std::string nvidia_fs_version;
};

CudaInfo cuda_info();
// Loads libcufile (and opens its driver) if that has not happened yet.
CuFileInfo cufile_info(const std::string& library_hint);

// GPUDirect Storage proper needs the nvidia-fs kernel module; without it
// libcufile can only run in its own compatibility mode.
bool nvidia_fs_present();
std::string nvidia_fs_version();  // "" when absent
// For tests: the file whose presence means nvidia-fs is loaded ("" restores
// /proc/driver/nvidia-fs/version).
void set_nvidia_fs_version_path(const std::string& path);

}  // namespace gdscp
