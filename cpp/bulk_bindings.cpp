#include "bulk_bindings.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "fs_path.hpp"
#include "gdscp/bulk.hpp"
#include "release_gil.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gdscp::bindings {
namespace {

using release = nb::call_guard<ReleaseGil>;

// One item as Python passes it: (kind, src, dst, buf, device, size, offset,
// exact, mode, keep_mode, set_times, atime_ns, mtime_ns, part).
using ItemTuple = std::tuple<int, FsPath, FsPath, uintptr_t, bool, int64_t, int64_t, bool, int, bool, bool,
                             int64_t, int64_t, bool>;

std::vector<BulkItem> to_items(const std::vector<ItemTuple>& in) {
  std::vector<BulkItem> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    BulkItem& it = out[i];
    int kind;
    FsPath src, dst;
    std::tie(kind, src, dst, it.buf, it.device, it.size, it.offset, it.exact, it.mode, it.keep_mode,
             it.set_times, it.atime_ns, it.mtime_ns, it.part) = in[i];
    it.src = std::move(src.value);
    it.dst = std::move(dst.value);
    if (kind < 0 || kind > 2) throw nb::value_error("bulk item kind must be 0 (read), 1 (write) or 2 (copy)");
    it.kind = static_cast<BulkKind>(kind);
  }
  return out;
}

nb::tuple result_tuple(const BulkResult& r) {
  return nb::make_tuple(static_cast<int>(r.status), r.bytes, r.seconds, fs_text(r.error), r.error_kind,
                        r.error_code, r.read_backend, r.write_backend, fs_text(r.backend_reason), fs_text(r.note));
}

}  // namespace

void define_bulk(nb::module_& m) {
  nb::enum_<BulkSync>(m, "BulkSync")
      .value("none", BulkSync::none)
      .value("file", BulkSync::file)
      .value("group", BulkSync::group)
      .value("auto", BulkSync::automatic);

  nb::class_<BulkOptions>(m, "BulkOptions")
      .def(nb::init<>())
      .def_rw("atomic", &BulkOptions::atomic)
      .def_rw("sync", &BulkOptions::sync)
      .def_rw("no_clobber", &BulkOptions::no_clobber)
      .def_rw("fail_fast", &BulkOptions::fail_fast)
      .def_rw("verify", &BulkOptions::verify)
      .def_rw("clean", &BulkOptions::clean)
      .def_rw("preserve", &BulkOptions::preserve)
      .def_rw("staging", &BulkOptions::staging)
      .def_rw("staging_size", &BulkOptions::staging_size)
      .def_rw("devices", &BulkOptions::devices)
      .def_rw("stagings", &BulkOptions::stagings)
      .def_rw("cufile_library", &BulkOptions::cufile_library);

  nb::class_<BulkJob>(m, "BulkJob")
      .def(
          "__init__",
          [](BulkJob* self, const std::vector<ItemTuple>& items, const BulkOptions& options, const Settings& s,
             const std::vector<std::pair<size_t, std::vector<uintptr_t>>>& replicas) {
            std::vector<BulkItem> converted = to_items(items);
            for (const auto& [i, ptrs] : replicas) {
              if (i >= converted.size()) throw nb::index_error("replicas name an item that does not exist");
              converted[i].replicas = ptrs;
            }
            const ReleaseGil unlocked;
            new (self) BulkJob(std::move(converted), options, s);
          },
          "items"_a, "options"_a, "settings"_a, "replicas"_a = std::vector<std::pair<size_t, std::vector<uintptr_t>>>{})
      .def("wait", &BulkJob::wait_for, "timeout"_a, release())
      .def("done", &BulkJob::done)
      .def("cancel", &BulkJob::cancel)
      .def("progress",
           [](const BulkJob& job) {
             const BulkProgress p = job.progress();
             return nb::make_tuple(p.bytes_done, p.bytes_total, p.files_done, p.files_failed, p.files_total,
                                   p.finished);
           })
      .def("results",
           [](const BulkJob& job) {
             nb::list out;
             for (const BulkResult& r : job.results()) out.append(result_tuple(r));
             return out;
           })
      .def("group_bytes", &BulkJob::group_bytes)
      .def("failures", [](const BulkJob& job) {
        nb::list out;
        for (const auto& [i, r] : job.failures()) out.append(nb::make_tuple(i, result_tuple(r)));
        return out;
      });

  m.def("clean_temporaries", [](const FsPath& dir) { return clean_temporaries(dir.value); }, "dir"_a, release());
  m.def("create_temporary", [](const FsPath& dst) {
    std::pair<int, std::string> made;
    {
      const ReleaseGil unlocked;
      made = create_temporary(dst.value);
    }
    return nb::make_tuple(made.first, fs_text(made.second));
  }, "dst"_a);
  m.attr("TEMPORARY_SUFFIX") = kTemporarySuffix;
}

}  // namespace gdscp::bindings
