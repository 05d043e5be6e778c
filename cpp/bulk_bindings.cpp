#include "bulk_bindings.hpp"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "buffers.hpp"
#include "fs_path.hpp"
#include "gdscp/bulk.hpp"
#include "gdscp/error.hpp"
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

// A buffer's (address, nbytes, device) and what keeps its memory, or false
// where gdscp._buffers must look at it: anything but an exact numpy.ndarray,
// bytearray, memoryview or bytes, or an object whose
// __cuda_array_interface__ is plainly contiguous with no stream to wait for;
// and any buffer that would be refused (read-only, strided), for whose error
// the general path has the words.
struct Plain {
  uintptr_t ptr = 0;
  int64_t nbytes = 0;
  bool device = false;
  nb::object keep;
};

bool plain_host(PyObject* o, bool writable, Plain& out) {
  if (!plain_host_type(o, writable)) return false;
  // A memoryview of it, kept with the job: it pins the export, so that a
  // bytearray cannot be resized under the engine.
  PyObject* view = PyMemoryView_FromObject(o);
  if (!view) {
    PyErr_Clear();
    return false;
  }
  nb::object keep = nb::steal(view);
  const Py_buffer* b = PyMemoryView_GET_BUFFER(view);
  if ((writable && b->readonly) || !PyBuffer_IsContiguous(b, 'A') || holds_objects(b->format)) return false;
  out = {reinterpret_cast<uintptr_t>(b->buf), static_cast<int64_t>(b->len), false, std::move(keep)};
  return true;
}

bool plain_cai(PyObject* o, bool writable, Plain& out) {
  PyObject* raw = PyObject_GetAttrString(o, "__cuda_array_interface__");
  if (!raw) {
    PyErr_Clear();
    return false;
  }
  const nb::object cai = nb::steal(raw);
  CudaArrayLayout l;
  if (!read_cuda_array_interface(raw, l) || l.too_large || l.masked || !l.contiguous || (writable && l.readonly))
    return false;
  if (l.ptr == 0 && l.nbytes > 0) return false;  // the general path refuses it, saying why
  // No stream, or the legacy default one, which the engine's blocking streams
  // already wait for (and its cuFile path synchronises). Another, the
  // per-thread default stream (2) among them, is the general path's to
  // synchronise on the caller's thread: the per-thread default stream is that
  // thread's own, and does not synchronise with the engine's streams.
  if (l.stream && *l.stream != 1) return false;
  out = {l.ptr, l.nbytes, true, nb::borrow(o)};
  return true;
}

// gdscp.bulk's items for reads into (kind 0) or writes from (kind 1) `buffers`,
// one per path, and what keeps their memory: (items, keep), or None where
// one buffer needs gdscp._buffers (see Plain), which then resolves them all.
// Per buffer this costs a fraction of the general path's Python.
nb::object plain_buffer_items(int kind, const nb::list& paths, nb::handle buffers) {
  const bool writable = kind == 0;
  PyObject* seq = PySequence_Fast(buffers.ptr(), "buffers must be a sequence");
  if (!seq) throw nb::python_error();
  const nb::object hold = nb::steal(seq);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n != static_cast<Py_ssize_t>(paths.size())) return nb::none();
  nb::list items, keep;
  const nb::str empty("");
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PySequence_Fast_GET_ITEM(seq, i);
    Plain b;
    if (!plain_host(o, writable, b) && !plain_cai(o, writable, b)) return nb::none();
    const nb::handle path = paths[i];
    items.append(nb::make_tuple(kind, writable ? path : empty, writable ? empty : path, b.ptr, b.device, b.nbytes, 0,
                                false, -1, true, false, 0, 0, false));
    keep.append(std::move(b.keep));
  }
  return nb::make_tuple(items, keep);
}

nb::object text_or_none(const std::string& text) { return text.empty() ? nb::none() : nb::object(fs_text(text)); }

// gdscp.bulk.FileResult (`cls`, a NamedTuple) of item `index`, whose tuple as
// Python passed it is `item`: its source and destination are the very str
// objects given, the rest comes from `r` (status names from `statuses`).
nb::object file_result(nb::handle cls, size_t index, nb::handle item, const BulkResult& r, nb::handle statuses) {
  const auto kind = static_cast<BulkKind>(nb::cast<int>(item[0]));
  const bool failed = !r.error.empty();
  const nb::tuple fields = nb::make_tuple(
      index, kind != BulkKind::write ? nb::object(item[1]) : nb::none(),
      kind != BulkKind::read ? nb::object(item[2]) : nb::none(), statuses[static_cast<size_t>(r.status)], r.bytes,
      r.seconds, text_or_none(r.error),
      failed && r.error_kind == static_cast<int>(ErrorKind::os) ? nb::object(nb::int_(r.error_code)) : nb::none(),
      text_or_none(r.read_backend), text_or_none(r.write_backend), text_or_none(r.backend_reason),
      text_or_none(r.note));
  // What cls._make does: tuple.__new__(cls, fields).
  const nb::tuple args = nb::make_tuple(fields);
  PyObject* made = PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(cls.ptr()), args.ptr(), nullptr);
  if (!made) throw nb::python_error();
  return nb::steal(made);
}

static_assert(Held<BulkJob>::can_tell<BulkJob>::value, "a job says when it is done");

// The engine's job and what keeps the memory its items name. The memory is
// held while the workers may use it, and let go the first time a call with
// the GIL sees the job finished (every worker done with it, whether its files
// were done, failed or cancelled): a finished job pins no buffer, so a
// bytearray given to it can be resized and an array dropped by its owner is
// freed. Never from a worker thread, which holds no GIL. A job dropped while
// it runs lets go only after its destructor has waited for the workers.
struct HeldJob {
  nb::object keep;  // before `job`: members are destroyed in reverse, so the workers are waited for first
  Held<BulkJob> job;  // dropped while it runs: waits for its workers without the GIL

  // Whether the job has finished; once it has, `keep` is let go.
  bool finished() {
    const bool ended = job.f->done();
    if (ended) let_go();
    return ended;
  }
  void let_go() {
    // Cleared before the references drop: what dropping them runs (a
    // __del__, a weakref callback) may call this job again.
    const nb::object gone = std::move(keep);
  }
};

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

  nb::class_<HeldJob>(m, "BulkJob")
      .def(
          "__init__",
          [](HeldJob* self, const std::vector<ItemTuple>& items, const BulkOptions& options, const Settings& s,
             const std::vector<std::pair<size_t, std::vector<uintptr_t>>>& replicas, nb::handle keep,
             const std::vector<std::tuple<size_t, uint64_t, uint64_t>>& source_ids) {
            std::vector<BulkItem> converted = to_items(items);
            for (const auto& [i, ptrs] : replicas) {
              if (i >= converted.size()) throw nb::index_error("replicas name an item that does not exist");
              converted[i].replicas = ptrs;
            }
            for (const auto& [i, dev, ino] : source_ids) {
              if (i >= converted.size()) throw nb::index_error("source_ids name an item that does not exist");
              converted[i].has_src_id = true;
              converted[i].src_dev = dev;
              converted[i].src_ino = ino;
            }
            std::unique_ptr<BulkJob> job;
            {
              const ReleaseGil unlocked;
              job = std::make_unique<BulkJob>(std::move(converted), options, s);
            }
            new (self) HeldJob{nb::borrow(keep), Held<BulkJob>(std::move(job))};
          },
          "items"_a, "options"_a, "settings"_a, "replicas"_a, "keep"_a.none(),
          "source_ids"_a = std::vector<std::tuple<size_t, uint64_t, uint64_t>>())
      .def(
          "wait",
          [](HeldJob& h, double timeout) {
            bool ended;
            {
              const ReleaseGil unlocked;
              ended = h.job.f->wait_for(timeout);
            }
            if (ended) h.let_go();
            return ended;
          },
          "timeout"_a)
      .def("done", [](HeldJob& h) { return h.finished(); })
      .def("cancel", [](HeldJob& h) { h.job.f->cancel(); })
      .def("progress",
           [](HeldJob& h) {
             const BulkProgress p = h.job.f->progress();
             if (p.finished) h.let_go();
             return nb::make_tuple(p.bytes_done, p.bytes_total, p.files_done, p.files_failed, p.files_total,
                                   p.finished);
           })
      .def("file_results",
           [](HeldJob& h, nb::handle cls, const nb::list& items, nb::handle statuses) {
             h.finished();
             const std::vector<BulkResult> rs = h.job.f->results();
             if (rs.size() != items.size()) throw nb::value_error("one item per result");
             nb::list out;
             for (size_t i = 0; i < rs.size(); ++i) out.append(file_result(cls, i, items[i], rs[i], statuses));
             return out;
           },
           "cls"_a, "items"_a, "statuses"_a)
      .def("file_failures",
           [](HeldJob& h, nb::handle cls, const nb::list& items, nb::handle statuses) {
             h.finished();
             nb::list out;
             for (const auto& [i, r] : h.job.f->failures()) out.append(file_result(cls, i, items[i], r, statuses));
             return out;
           },
           "cls"_a, "items"_a, "statuses"_a)
      .def("group_bytes", [](const HeldJob& h) { return h.job.f->group_bytes(); });

  m.def("stop_running_jobs", &stop_running_jobs, release());
  m.def("plain_buffer_items", &plain_buffer_items, "kind"_a, "paths"_a, "buffers"_a);
  m.def(
      "clean_temporaries",
      [](const FsPath& dir, const std::vector<FsPath>& keep) {
        std::vector<std::string> paths;
        for (const FsPath& p : keep) paths.push_back(p.value);
        return clean_temporaries(dir.value, paths);
      },
      "dir"_a, "keep"_a, release());
  m.def(
      "same_destinations",
      [](const std::vector<FsPath>& paths, const std::vector<bool>& follow, bool in_place) {
        std::vector<std::string> names;
        names.reserve(paths.size());
        for (const FsPath& p : paths) names.push_back(p.value);
        const ReleaseGil unlocked;
        return same_destinations(names, follow, in_place);
      },
      "paths"_a, "follow"_a, "in_place"_a);
  m.def("create_temporary", [](const FsPath& dst, bool directory) -> nb::tuple {
    std::pair<int, std::string> made;
    int dir_fd = -1;
    {
      const ReleaseGil unlocked;
      made = create_temporary(dst.value, directory ? &dir_fd : nullptr);
    }
    if (directory) return nb::make_tuple(made.first, fs_text(made.second), dir_fd);
    return nb::make_tuple(made.first, fs_text(made.second));
  }, "dst"_a, nb::kw_only(), "directory"_a = false);
  m.attr("TEMPORARY_SUFFIX") = kTemporarySuffix;
  m.def("is_temporary_name", [](const FsPath& name) { return is_temporary_name(name.value); }, "name"_a);
  m.def("temporary_name", [](const FsPath& dst) { return fs_text(temporary_name(dst.value)); }, "dst"_a);
}

}  // namespace gdscp::bindings
