#include "gdscp/detail/cufile_backend.hpp"
#include "gdscp/detail/posix_backend.hpp"
#include "gdscp/error.hpp"
#include "gdscp/shim/cufile_driver.hpp"
#include "gdscp/system_info.hpp"

namespace gdscp::detail {

Backends choose_backends(const std::shared_ptr<File>& file, CompatMode compat, const std::string& lib) {
  auto posix = std::make_shared<PosixBackend>(file);
  auto use_posix = [&](std::string why) {
    return Backends{posix, posix, why + ": gdscp's POSIX path (pread/pwrite through pinned staging buffers)"};
  };
  if (compat == CompatMode::on) return use_posix("compat_mode is ON");
  if (compat == CompatMode::automatic) {
    if (!nvidia_fs_present())
      return use_posix("nvidia-fs kernel module not loaded, so GPUDirect Storage cannot work here");
    if (file->direct_fd() < 0) return use_posix("the filesystem refuses O_DIRECT");
    const CuFileDriver* drv = CuFileDriver::get(lib);
    if (!drv) return use_posix(CuFileDriver::error());
    try {
      return {posix, std::make_shared<CuFileBackend>(file, *drv),
              "GPUDirect Storage: nvidia-fs is loaded and cuFile registered the file"};
    } catch (const Error& e) {
      return use_posix(std::string("cuFile refused the file (") + e.what() + ")");
    }
  }
  const CuFileDriver* drv = CuFileDriver::get(lib);
  if (!drv) throw Error(ErrorKind::state, 0, "compat_mode is OFF, which requires cuFile, but " + CuFileDriver::error());
  try {
    return {posix, std::make_shared<CuFileBackend>(file, *drv),
            nvidia_fs_present()
                ? "compat_mode is OFF: cuFile with GPUDirect Storage"
                : "compat_mode is OFF: cuFile (no nvidia-fs, so libcufile runs in its own compatibility mode)"};
  } catch (const Error& e) {
    throw Error(e.kind(), e.code(), std::string("compat_mode is OFF, which requires cuFile, but ") + e.what(),
                e.path());
  }
}

}  // namespace gdscp::detail
