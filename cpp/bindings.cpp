// nanobind glue only: argument conversion, GIL release, exception translation.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <type_traits>

#include "buffers.hpp"
#include "fs_path.hpp"
#include "release_gil.hpp"
#include "bulk_bindings.hpp"
#include "gdscp/error.hpp"
#include "gdscp/future.hpp"
#include "gdscp/handle.hpp"
#include "gdscp/mapped_file.hpp"
#include "gdscp/page_cache.hpp"
#include "gdscp/read_rate.hpp"
#include "gdscp/runtime.hpp"
#include "gdscp/settings.hpp"
#include "gdscp/stream_copy.hpp"
#include "gdscp/system_info.hpp"
#include "testing.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using gdscp::Settings;
using gdscp::bindings::FsPath;
using gdscp::bindings::fs_text;

namespace {

using gdscp::bindings::ReleaseGil;
using release = nb::call_guard<ReleaseGil>;

// The Python exception (gdscp._errors) that an engine error becomes.
nb::object engine_exception(const gdscp::Error& e) {
  nb::object errors = nb::module_::import_("gdscp._errors");
  return errors.attr("from_engine")(static_cast<int>(e.kind()), e.code(), fs_text(e.what()), fs_text(e.path()),
                                    e.offset());
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const gdscp::Error& e) {
    gdscp::bindings::exit_safe([&] {
      nb::object exc = engine_exception(e);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    });
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

// Host buffers of the same size that do not overlap (the copy's loads and
// stores run ahead of one another, so an overlap copies bytes already
// overwritten); the copy runs with the GIL released while both views pin the
// memory.
void stream_copy(nb::handle dst, nb::handle src) {
  const gdscp::bindings::BufferView to(dst, /*writable=*/true);
  const gdscp::bindings::BufferView from(src, /*writable=*/false);
  if (to.size() != from.size())
    throw nb::value_error(("stream_copy needs buffers of one size; dst has " + std::to_string(to.size()) +
                           " bytes, src " + std::to_string(from.size()))
                              .c_str());
  const auto d = reinterpret_cast<uintptr_t>(to.data());
  const auto s = reinterpret_cast<uintptr_t>(from.data());
  const size_t n = from.size();
  if (n > 0 && d < s + n && s < d + n)
    throw nb::value_error(("stream_copy needs buffers that do not overlap; dst and src share " +
                           std::to_string(n - (d > s ? d - s : s - d)) + " of their " + std::to_string(n) + " bytes")
                              .c_str());
  ReleaseGil unlocked;
  gdscp::stream_copy(to.data(), from.data(), from.size());
}

// CuFile.read/write of plain host memory (PlainHostView) in a request that
// runs inline (Handle::runs_inline): the bytes moved, without gdscp._buffers,
// a Future or the pool. -1 where the general path must take the call: another
// buffer type, a size or offset that is not a plain non-negative int in range,
// a larger request. Its checks and errors are then the general path's.
// `deferred` (pread/pwrite, whose future reports the failure at get(), as
// KvikIO's does): an engine error, of the file (closed, not open for the
// transfer) or of the transfer itself, is returned as the exception object
// instead of raised.
nb::object transfer_inline(gdscp::Handle& h, bool write, nb::handle buf, nb::handle size, nb::handle offset,
                           const Settings& s, bool deferred) {
  const nb::object fallback = nb::int_(-1);
  if (!PyLong_CheckExact(offset.ptr())) return fallback;
  const long long off = PyLong_AsLongLong(offset.ptr());
  if (off < 0) {
    PyErr_Clear();  // -1 with OverflowError set, or a negative offset
    return fallback;
  }
  const gdscp::bindings::PlainHostView view(buf, /*writable=*/!write);
  if (!view.ok()) return fallback;
  size_t n = view.size();
  if (!size.is_none()) {
    if (!PyLong_CheckExact(size.ptr())) return fallback;
    const unsigned long long want = PyLong_AsUnsignedLongLong(size.ptr());
    if (want == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      return fallback;
    }
    if (want > n) return fallback;
    n = static_cast<size_t>(want);
  }
  if (n > static_cast<size_t>(LLONG_MAX - off)) return fallback;  // past the largest offset: the general path says so
  if (!gdscp::Handle::runs_inline(n, s)) return fallback;
  const auto ptr = reinterpret_cast<uintptr_t>(view.data());
  size_t moved = 0;
  try {
    const ReleaseGil unlocked;
    moved = write ? h.write_now(ptr, false, n, off, s) : h.read_now(ptr, false, n, off, s);
  } catch (const gdscp::Error& e) {
    if (!deferred) throw;
    return engine_exception(e);
  }
  return nb::int_(moved);
}

using HeldFuture = gdscp::bindings::Held<gdscp::Future>;
using HeldStreamFuture = gdscp::bindings::Held<gdscp::StreamFuture>;
static_assert(HeldFuture::can_tell<gdscp::Future>::value, "a Future says when it is done");

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "gdscp's C++ engine (private: use the gdscp package)";
  nb::register_exception_translator(translate);
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] { gdscp::bindings::note_interpreter_exit(); }));

  nb::enum_<gdscp::CompatMode>(m, "CompatMode")
      .value("off", gdscp::CompatMode::off)
      .value("on", gdscp::CompatMode::on)
      .value("auto", gdscp::CompatMode::automatic);

  nb::enum_<gdscp::DirectIO>(m, "DirectIO")
      .value("off", gdscp::DirectIO::off)
      .value("on", gdscp::DirectIO::on)
      .value("auto", gdscp::DirectIO::automatic);

  nb::class_<Settings>(m, "Settings")
      .def(nb::init<>())
      .def(nb::init<const Settings&>(), "other"_a)
      .def_rw("compat_mode", &Settings::compat_mode)
      .def_rw("task_size", &Settings::task_size)
      .def_rw("gds_threshold", &Settings::gds_threshold)
      .def_rw("bounce_buffer_size", &Settings::bounce_buffer_size)
      .def_rw("min_task_size", &Settings::min_task_size)
      .def_rw("direct_io", &Settings::direct_io)
      .def_rw("pipeline_depth", &Settings::pipeline_depth)
      .def_rw("mapped_reads", &Settings::mapped_reads);

  nb::class_<HeldFuture>(m, "Future")
      .def("get", [](HeldFuture& h) { return h.f->get(); }, release())
      .def("done", [](const HeldFuture& h) { return h.f->done(); })
      .def("wait", [](const HeldFuture& h, double timeout) { return h.f->wait_for(timeout); }, "timeout"_a, release())
      .def("cancel", [](HeldFuture& h) { h.f->cancel(); })
      .def("cancelled", [](const HeldFuture& h) { return h.f->cancelled(); })
      .def("progress", [](const HeldFuture& h) { return h.f->progress(); });

  nb::class_<HeldStreamFuture>(m, "StreamFuture")
      .def("check_bytes_done", [](HeldStreamFuture& h) { return h.f->check_bytes_done(); }, release());

  nb::class_<gdscp::Handle>(m, "Handle")
      .def(
          "__init__",
          [](gdscp::Handle* self, FsPath path, const std::string& flags, const Settings& s,
             const std::string& library) {
            const ReleaseGil unlocked;
            new (self) gdscp::Handle(std::move(path.value), flags, s, library);
          },
          "path"_a, "flags"_a, "settings"_a, "cufile_library"_a)
      .def("close", &gdscp::Handle::close, release())
      .def("closed", &gdscp::Handle::closed)
      .def("fileno", &gdscp::Handle::fileno)
      .def("open_flags", &gdscp::Handle::open_flags)
      .def("path", [](const gdscp::Handle& h) { return fs_text(h.path()); })
      .def("direct_io_supported", &gdscp::Handle::direct_io_supported)
      .def("backend", &gdscp::Handle::backend)
      .def("backend_reason", &gdscp::Handle::backend_reason)
      .def(
          "pread",
          [](gdscp::Handle& h, uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s) {
            return HeldFuture(h.pread(buf, device, size, file_offset, s));
          },
          "buf"_a, "device"_a, "size"_a, "file_offset"_a, "settings"_a, release())
      .def(
          "pwrite",
          [](gdscp::Handle& h, uintptr_t buf, bool device, size_t size, int64_t file_offset, const Settings& s) {
            return HeldFuture(h.pwrite(buf, device, size, file_offset, s));
          },
          "buf"_a, "device"_a, "size"_a, "file_offset"_a, "settings"_a, release())
      .def("read_inline", [](gdscp::Handle& h, nb::handle buf, nb::handle size, nb::handle offset,
                             const Settings& s, bool deferred) {
             return transfer_inline(h, false, buf, size, offset, s, deferred);
           }, "buf"_a.none(), "size"_a.none(), "file_offset"_a.none(), "settings"_a, "deferred"_a = false)
      .def("write_inline", [](gdscp::Handle& h, nb::handle buf, nb::handle size, nb::handle offset,
                              const Settings& s, bool deferred) {
             return transfer_inline(h, true, buf, size, offset, s, deferred);
           }, "buf"_a.none(), "size"_a.none(), "file_offset"_a.none(), "settings"_a, "deferred"_a = false)
      .def("read_now", &gdscp::Handle::read_now, "buf"_a, "device"_a, "size"_a, "file_offset"_a, "settings"_a,
           release())
      .def("write_now", &gdscp::Handle::write_now, "buf"_a, "device"_a, "size"_a, "file_offset"_a, "settings"_a,
           release())
      .def_static("runs_inline", &gdscp::Handle::runs_inline, "size"_a, "settings"_a)
      .def("raw_read", &gdscp::Handle::raw_read, "base"_a, "size"_a, "file_offset"_a, "dev_offset"_a,
           "settings"_a, release())
      .def("raw_write", &gdscp::Handle::raw_write, "base"_a, "size"_a, "file_offset"_a, "dev_offset"_a,
           "settings"_a, release())
      .def(
          "raw_read_async",
          [](gdscp::Handle& h, uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, uintptr_t stream,
             const Settings& s) {
            return HeldStreamFuture(h.raw_read_async(base, size, file_offset, dev_offset, stream, s));
          },
          "base"_a, "size"_a, "file_offset"_a, "dev_offset"_a, "stream"_a, "settings"_a, release())
      .def(
          "raw_write_async",
          [](gdscp::Handle& h, uintptr_t base, size_t size, int64_t file_offset, int64_t dev_offset, uintptr_t stream,
             const Settings& s) {
            return HeldStreamFuture(h.raw_write_async(base, size, file_offset, dev_offset, stream, s));
          },
          "base"_a, "size"_a, "file_offset"_a, "dev_offset"_a, "stream"_a, "settings"_a, release());

  nb::class_<gdscp::MappedFile>(m, "MappedFile")
      .def(
          "__init__",
          [](gdscp::MappedFile* self, FsPath path, const std::string& flags, std::optional<size_t> map_size,
             int64_t map_offset, int map_flags) {
            const ReleaseGil unlocked;
            new (self) gdscp::MappedFile(std::move(path.value), flags, map_size, map_offset, map_flags);
          },
          "path"_a, "flags"_a, "map_size"_a.none(), "map_offset"_a, "map_flags"_a)
      .def("close", &gdscp::MappedFile::close, release())
      .def("closed", &gdscp::MappedFile::closed)
      .def("path", [](const gdscp::MappedFile& f) { return fs_text(f.path()); })
      .def("file_size", &gdscp::MappedFile::file_size)
      .def("map_size", &gdscp::MappedFile::map_size)
      .def("map_offset", &gdscp::MappedFile::map_offset)
      .def("check", &gdscp::MappedFile::check, "size"_a, "offset"_a)
      .def("read", &gdscp::MappedFile::read, "buf"_a, "device"_a, "size"_a, "offset"_a, "settings"_a, release())
      .def(
          "pread",
          [](gdscp::MappedFile& f, uintptr_t buf, bool device, size_t size, int64_t offset, const Settings& s) {
            return HeldFuture(f.pread(buf, device, size, offset, s));
          },
          "buf"_a, "device"_a, "size"_a, "offset"_a, "settings"_a, release());

  // The benchmark's host-side ceiling: (seconds, bytes, errno) of one run of
  // threads preading hot files into their own buffers, one thread a buffer.
  m.def(
      "timed_preads",
      [](const std::vector<int>& fds, const std::vector<std::tuple<size_t, int64_t, size_t>>& pieces,
         const std::vector<uintptr_t>& buffers) {
        std::vector<gdscp::ReadPiece> list;
        list.reserve(pieces.size());
        for (const auto& [file, offset, length] : pieces) {
          if (file >= fds.size()) throw nb::index_error("a piece names a file that is not in fds");
          list.push_back({file, offset, length});
        }
        std::vector<char*> bufs;
        for (uintptr_t b : buffers) bufs.push_back(reinterpret_cast<char*>(b));
        gdscp::ReadRun run;
        {
          const ReleaseGil unlocked;
          run = gdscp::timed_preads(fds, list, bufs);
        }
        return std::make_tuple(run.seconds, run.bytes, run.error);
      },
      "fds"_a, "pieces"_a, "buffers"_a);

  m.def("page_cache_info", [](int fd, int64_t offset, size_t length, const FsPath& path) {
    const gdscp::PageCacheInfo info = gdscp::page_cache_info(fd, offset, length, path.value);
    return std::make_pair(info.cached_pages, info.total_pages);
  }, "fd"_a, "offset"_a, "length"_a, "path"_a, release());
  m.def("default_num_threads", &gdscp::default_num_threads);
  m.attr("MAX_NUM_THREADS") = gdscp::kMaxNumThreads;
  m.def("set_num_threads", &gdscp::set_num_threads, "n"_a, release());
  m.def("num_threads", &gdscp::num_threads);
  m.def("prepare_device", &gdscp::prepare_device, "ordinal"_a, "settings"_a, "workers"_a, release());
  m.def("trim_pools", &gdscp::trim_pools, release());
  m.def("gpu_numa_node", &gdscp::gpu_numa_node, "ordinal"_a, release());
  m.def("stream_synchronize", &gdscp::stream_synchronize, "stream"_a, "ptr"_a = 0, release());
  m.def("stream_copy", &stream_copy, "dst"_a, "src"_a);
  m.def("host_buffer", &gdscp::bindings::host_buffer, "obj"_a, "writable"_a);
  m.def("dlpack_info", &gdscp::bindings::dlpack_info, "capsule"_a);
  m.def("cuda_array_layout", &gdscp::bindings::cuda_array_layout, "cai"_a);
  m.def("nvidia_fs_present", &gdscp::nvidia_fs_present);
  // Both may load a driver library (cuInit, cuFileDriverOpen): the GIL is
  // released for that, and held again to build the dict.
  m.def("cuda_info", [] {
    gdscp::CudaInfo info;
    {
      ReleaseGil unlocked;
      info = gdscp::cuda_info();
    }
    return to_dict(info);
  });
  m.def("cufile_info", [](const std::string& hint) {
    gdscp::CuFileInfo info;
    {
      ReleaseGil unlocked;
      info = gdscp::cufile_info(hint);
    }
    return to_dict(info);
  }, "library_hint"_a);

  gdscp::bindings::define_device_buffer(m);
  gdscp::bindings::define_bulk(m);
  gdscp::bindings::define_testing(m);
}
