// nanobind glue only: argument conversion, GIL release, exception translation.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gdscp/cuda_driver.hpp"
#include "gdscp/cufile_driver.hpp"
#include "gdscp/engine.hpp"
#include "gdscp/error.hpp"
#include "gdscp/fault.hpp"
#include "gdscp/grouped_staging.hpp"
#include "gdscp/mapped_read.hpp"
#include "gdscp/pinned_pool.hpp"
#include "gdscp/plan.hpp"
#include "gdscp/system_info.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using gdscp::Settings;

namespace {

using release = nb::call_guard<nb::gil_scoped_release>;

// The DLPack ABI (dlpack.h), just what is read here.
struct DLDevice { int32_t device_type; int32_t device_id; };
struct DLDataType { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor {
  void* data; DLDevice device; int32_t ndim; DLDataType dtype;
  int64_t* shape; int64_t* strides; uint64_t byte_offset;
};
struct DLManagedTensor { DLTensor dl_tensor; void* manager_ctx; void (*deleter)(DLManagedTensor*); };
struct DLPackVersion { uint32_t major; uint32_t minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version; void* manager_ctx; void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags; DLTensor dl_tensor;
};

// (address, nbytes, device_type, device_id, c_contiguous) of a DLPack capsule,
// which stays unconsumed: the caller keeps it alive while the memory is used.
nb::tuple dlpack_info(nb::handle capsule) {
  const DLTensor* t = nullptr;
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    t = &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"))->dl_tensor;
  } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    t = &static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"))->dl_tensor;
  } else {
    throw nb::type_error("not a DLPack capsule (expected a 'dltensor' capsule from __dlpack__())");
  }
  const int64_t itemsize = (static_cast<int64_t>(t->dtype.bits) * t->dtype.lanes + 7) / 8;
  int64_t count = 1;
  bool contiguous = true;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    count *= t->shape[i];
    if (t->strides && t->shape[i] != 1 && t->strides[i] != expect) contiguous = false;
    expect *= t->shape[i];
  }
  const auto addr = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  return nb::make_tuple(addr, count * itemsize, t->device.device_type, t->device.device_id, contiguous || count == 0);
}

// (address, nbytes) of a buffer-protocol object; C-contiguous required.
nb::tuple host_buffer(nb::handle obj, bool writable) {
  Py_buffer view;
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) throw nb::python_error();
  auto result = nb::make_tuple(reinterpret_cast<uintptr_t>(view.buf), static_cast<size_t>(view.len));
  PyBuffer_Release(&view);
  return result;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const gdscp::Error& e) {
    nb::object errors = nb::module_::import_("gdscp._errors");
    nb::object exc = errors.attr("from_engine")(static_cast<int>(e.kind()), e.code(), e.what(), e.path(), e.offset());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

nb::dict to_dict(const gdscp::CudaInfo& i) {
  nb::list gpus;
  for (const auto& g : i.gpus) {
    nb::dict d;
    d["index"] = g.index;
    d["name"] = g.name;
    d["pci_bus_id"] = g.pci_bus_id;
    d["total_memory"] = g.total_memory;
    gpus.append(d);
  }
  nb::dict d;
  d["available"] = i.available;
  d["error"] = i.error;
  d["library"] = i.library;
  d["driver_version"] = i.driver_version;
  d["gpus"] = gpus;
  return d;
}

nb::dict to_dict(const gdscp::CuFileInfo& i) {
  nb::dict d;
  d["available"] = i.available;
  d["error"] = i.error;
  d["library"] = i.library;
  d["version"] = i.version;
  d["nvidia_fs"] = i.nvidia_fs;
  d["nvidia_fs_version"] = i.nvidia_fs_version;
  return d;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "gdscp's C++ engine (private: use the gdscp package)";
  nb::register_exception_translator(translate);

  nb::enum_<gdscp::DirectIO>(m, "DirectIO")
      .value("off", gdscp::DirectIO::off)
      .value("on", gdscp::DirectIO::on)
      .value("auto", gdscp::DirectIO::automatic);

  nb::class_<Settings>(m, "Settings")
      .def(nb::init<>())
      .def_rw("task_size", &Settings::task_size)
      .def_rw("gds_threshold", &Settings::gds_threshold)
      .def_rw("bounce_buffer_size", &Settings::bounce_buffer_size)
      .def_rw("min_task_size", &Settings::min_task_size)
      .def_rw("direct_io", &Settings::direct_io)
      .def_rw("pipeline_depth", &Settings::pipeline_depth)
      .def_rw("mapped_reads", &Settings::mapped_reads)
      .def_rw("grouped_copies", &Settings::grouped_copies);

  nb::class_<gdscp::Future>(m, "Future")
      .def("get", &gdscp::Future::get, release())
      .def("done", &gdscp::Future::done)
      .def("wait", &gdscp::Future::wait_for, "timeout"_a, release())
      .def("cancel", &gdscp::Future::cancel)
      .def("progress", &gdscp::Future::progress);

  nb::class_<gdscp::StreamFuture>(m, "StreamFuture")
      .def("check_bytes_done", &gdscp::StreamFuture::check_bytes_done, release());

  nb::class_<gdscp::Handle>(m, "Handle")
      .def(
          "__init__",
          [](gdscp::Handle* self, const std::string& path, const std::string& flags, int compat,
             const std::string& lib) {
            nb::gil_scoped_release unlocked;
            new (self) gdscp::Handle(path, flags, static_cast<gdscp::CompatMode>(compat), lib);
          },
          "path"_a, "flags"_a, "compat_mode"_a, "cufile_library"_a)
      .def("close", &gdscp::Handle::close, release())
      .def("closed", &gdscp::Handle::closed)
      .def("fileno", &gdscp::Handle::fileno)
      .def("open_flags", &gdscp::Handle::open_flags)
      .def("path", &gdscp::Handle::path)
      .def("backend", &gdscp::Handle::backend)
      .def("backend_reason", &gdscp::Handle::backend_reason)
      .def("pread", &gdscp::Handle::pread, "buf"_a, "device"_a, "size"_a, "file_offset"_a, "task_size"_a,
           "settings"_a, release())
      .def("pwrite", &gdscp::Handle::pwrite, "buf"_a, "device"_a, "size"_a, "file_offset"_a, "task_size"_a,
           "settings"_a, release())
      .def("raw_read", &gdscp::Handle::raw_read, "base"_a, "size"_a, "file_offset"_a, "dev_offset"_a,
           "settings"_a, release())
      .def("raw_write", &gdscp::Handle::raw_write, "base"_a, "size"_a, "file_offset"_a, "dev_offset"_a,
           "settings"_a, release())
      .def("raw_read_async", &gdscp::Handle::raw_read_async, "base"_a, "size"_a, "file_offset"_a,
           "dev_offset"_a, "stream"_a, "settings"_a, release())
      .def("raw_write_async", &gdscp::Handle::raw_write_async, "base"_a, "size"_a, "file_offset"_a,
           "dev_offset"_a, "stream"_a, "settings"_a, release());

  m.def("set_num_threads", &gdscp::set_num_threads, "n"_a, release());
  m.def("num_threads", &gdscp::num_threads);
  m.def("busy_threads", &gdscp::busy_threads);
  m.def("host_buffer", &host_buffer, "obj"_a, "writable"_a);
  m.def("dlpack_info", &dlpack_info, "capsule"_a);
  m.def("cuda_info", [] { return to_dict(gdscp::cuda_info()); });
  m.def("cufile_info", [](const std::string& hint) {
    gdscp::CuFileInfo info;
    {
      nb::gil_scoped_release unlocked;
      info = gdscp::cufile_info(hint);
    }
    return to_dict(info);
  }, "library_hint"_a);
  m.def("pinned_bytes", [] { return gdscp::BufferPool::pinned().bytes_allocated(); });
  m.def("trim_pools", [] {
    gdscp::BufferPool::pinned().trim();
    gdscp::BufferPool::aligned().trim();
  }, release());
  m.def("stream_synchronize", [](uintptr_t stream) {
    const auto& drv = gdscp::CudaDriver::require();
    drv.check(drv.cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "cuStreamSynchronize");
  }, "stream"_a, release());
  m.def("_arm_fault", [](const std::string& op, long skip, long count, int err) {
    using gdscp::fault::Op;
    Op which;
    if (op == "pread") which = Op::pread;
    else if (op == "pwrite") which = Op::pwrite;
    else if (op == "map_past_eof") which = Op::map_past_eof;
    else throw nb::value_error("op must be 'pread', 'pwrite' or 'map_past_eof'");
    gdscp::fault::arm(which, skip, count, err);
  }, "op"_a, "skip"_a, "count"_a, "errno"_a);
  m.def("_disarm_fault", &gdscp::fault::disarm);
  // Test hook: where the engine looks for nvidia-fs ("" restores /proc/driver/nvidia-fs/version).
  m.def("_set_nvidia_fs_version_path", &gdscp::set_nvidia_fs_version_path, "path"_a);
  m.def("mapped_read_bytes", &gdscp::mapped_read_bytes);
  m.def("grouped_stats", [] {
    const auto st = gdscp::grouped_stats();
    nb::dict d;
    d["requests"] = st.requests;
    d["readers"] = st.readers;
    d["bytes"] = st.bytes;
    return d;
  });
  m.def("grouped_reader_limit", &gdscp::grouped_readers, "workers"_a);
  // For tests: the pieces `workers` workers claim from one request (chunks of
  // `chunk` bytes, staging pieces of `piece`), the workers taking turns in an
  // order drawn from `seed` and each starting at its first turn, as the pool's
  // workers do. Returns (worker, buf_offset, file_offset, size) in claim order.
  m.def("_plan_pieces", [](int64_t file_offset, size_t size, size_t chunk, size_t piece, size_t workers,
                           bool stagger, uint64_t seed) {
    gdscp::ChunkQueue work(gdscp::split(file_offset, size, chunk), nullptr, workers);
    std::vector<std::unique_ptr<gdscp::PieceStream>> streams(workers);
    std::vector<size_t> active(workers);
    for (size_t w = 0; w < workers; ++w) active[w] = w;
    std::mt19937_64 rng(seed);
    nb::list out;
    while (!active.empty()) {
      const size_t i = rng() % active.size();
      const size_t w = active[i];
      if (!streams[w]) streams[w] = std::make_unique<gdscp::PieceStream>(work, piece, chunk, stagger);
      gdscp::Chunk c;
      if (streams[w]->next(c)) {
        out.append(nb::make_tuple(w, c.buf_offset, c.file_offset, c.size));
      } else {
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    return out;
  }, "file_offset"_a, "size"_a, "chunk"_a, "piece"_a, "workers"_a, "stagger"_a, "seed"_a);
  // Benchmark ceiling: raw addresses from numpy (arr.ctypes.data); no checks.
  m.def("_stream_copy", [](uintptr_t dst, uintptr_t src, size_t n) {
    gdscp::stream_copy(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), n);
  }, "dst"_a, "src"_a, "nbytes"_a, release());
}
