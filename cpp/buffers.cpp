#include "buffers.hpp"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gdscp/device_buffer.hpp"
#include "release_gil.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gdscp::bindings {
namespace {

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
constexpr int32_t kDLCUDA = 2;
constexpr uint8_t kDLUInt = 1;
constexpr uint64_t kDLReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY

// A DeviceBuffer handed out as a DLPack tensor: the tensor, its shape, and
// the view that keeps the memory until the consumer (or the capsule) deletes it.
struct DeviceExport {
  DLManagedTensor managed;
  int64_t shape[1];
  DeviceBuffer keep;
};

void delete_export(DLManagedTensor* t) { delete static_cast<DeviceExport*>(t->manager_ctx); }

// A consumer renames the capsule "used_dltensor" and deletes the tensor
// itself; an unconsumed one is deleted with the capsule.
void delete_unused_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor"))
    delete_export(static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor")));
}

nb::object to_dlpack(const DeviceBuffer& b) {
  auto* e = new DeviceExport{{}, {static_cast<int64_t>(b.size())}, b};
  e->managed.dl_tensor = DLTensor{reinterpret_cast<void*>(b.ptr()), DLDevice{kDLCUDA, b.ordinal()}, 1,
                                  DLDataType{kDLUInt, 8, 1}, e->shape, nullptr, 0};
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_export;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", delete_unused_capsule);
  if (!capsule) {
    delete e;
    throw nb::python_error();
  }
  return nb::steal(capsule);
}

nb::dict cuda_array_interface(const DeviceBuffer& b) {
  nb::dict d;
  d["shape"] = nb::make_tuple(b.size());
  d["typestr"] = "|u1";
  d["data"] = nb::make_tuple(b.ptr(), false);
  d["strides"] = nb::none();
  d["version"] = 3;
  return d;
}

DeviceBuffer slice(const DeviceBuffer& b, const nb::slice& s) {
  const auto [start, stop, step, length] = s.compute(b.size());
  (void)stop;
  if (step != 1) throw nb::value_error("a DeviceBuffer is sliced contiguously (step 1)");
  return b.slice(static_cast<size_t>(start), static_cast<size_t>(start) + length);
}

// The bytes of an array of `shape` with items of `itemsize` bytes: 0 for an
// empty one (whatever its other extents), nothing where they overflow int64_t.
std::optional<int64_t> array_bytes(const std::vector<int64_t>& shape, int64_t itemsize) noexcept {
  int64_t count = 1;
  bool overflow = false;
  for (int64_t extent : shape) {
    if (extent == 0) return 0;
    overflow = __builtin_mul_overflow(count, extent, &count) || overflow;
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(count, itemsize, &nbytes) || overflow) return std::nullopt;
  return nbytes;
}

}  // namespace

bool dense(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t unit) noexcept {
  if (strides.empty()) return true;  // no strides given: C order
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  if (count == 0) return true;
  // Each stride the size of the axes inside it (axes of extent 1 say nothing):
  // in C order the later axes, in Fortran order the earlier ones.
  auto ordered = [&](bool c_order) {
    int64_t expect = unit;
    const size_t n = shape.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = c_order ? n - 1 - k : k;
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  };
  return ordered(true) || ordered(false);
}

nb::tuple dlpack_info(nb::handle capsule) {
  const DLTensor* t = nullptr;
  bool read_only = false;
  if (PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
    t = &static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"))->dl_tensor;
  } else if (PyCapsule_IsValid(capsule.ptr(), "dltensor_versioned")) {
    const auto* v = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor_versioned"));
    t = &v->dl_tensor;
    read_only = (v->flags & kDLReadOnly) != 0;
  } else {
    throw nb::type_error("not a DLPack capsule (expected a 'dltensor' capsule from __dlpack__())");
  }
  const int64_t bits = static_cast<int64_t>(t->dtype.bits) * t->dtype.lanes;
  const std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  const std::vector<int64_t> strides = t->strides ? std::vector<int64_t>(t->strides, t->strides + t->ndim)
                                                  : std::vector<int64_t>();
  for (int64_t extent : shape)
    if (extent < 0) throw nb::value_error("a DLPack tensor with a negative extent");
  // Elements narrower than a byte (4-bit floats and integers) lie packed:
  // the tensor holds its bits rounded up to a byte, not a byte per element.
  std::optional<int64_t> nbytes = array_bytes(shape, bits % 8 == 0 ? bits / 8 : bits);
  if (nbytes && bits % 8 != 0) nbytes = *nbytes / 8 + (*nbytes % 8 != 0);
  if (!nbytes) {
    PyErr_SetString(PyExc_OverflowError, "the DLPack tensor describes more than 2**63-1 bytes");
    throw nb::python_error();
  }
  const auto addr = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  return nb::make_tuple(addr, *nbytes, t->device.device_type, t->device.device_id,
                        dense(shape, strides, 1), read_only);  // DLPack strides count elements
}

namespace {

// What the readings of a struct format string (PEP 3118) found: whether one
// reads it whole, whether one of those reads an 'O' (a Python object) as a
// code, and whether the search gave up (a format of too many readings).
struct FormatReadings {
  bool whole = false;
  bool objects = false;
  bool gave_up = false;
};

// Reads `format` every way it can be read: items of an optional byte order,
// count or "(shape)", then a code (any letter or '?'; "T{...}" and "X{...}"
// hold items), and after a code or a "}" an optional ":name:". A field name
// may hold any character, ':' included (ctypes takes any name and writes it
// as it is), so a name may end at any later ':' from which the rest reads;
// `first_colon` reads names as ending at the first one only. The format is
// read left to right, one position at a time, every reading at once: a
// reading at a position is its depth of braces, whether a name may follow,
// and whether it has read an 'O' as a code.
FormatReadings read_format(std::string_view f, bool first_colon) {
  constexpr size_t kMaxStates = size_t{1} << 22;
  struct State {
    uint64_t depth;
    bool named;  // a name may follow (after a code or a "}")
    bool objects;
  };
  FormatReadings out;
  const uint64_t n = f.size();
  if (n > (uint64_t{1} << 24)) {
    out.gave_up = true;
    return out;
  }
  // Every step reads on, past its position: the readings are taken up in
  // the order of their positions.
  std::map<uint64_t, std::vector<State>> todo;
  std::unordered_set<uint64_t> seen;
  auto add = [&](uint64_t pos, State s) {
    if (!seen.insert((pos * (n + 2) + s.depth) * 4 + s.named * 2 + s.objects).second) return;
    todo[pos].push_back(s);
    if (seen.size() > kMaxStates) out.gave_up = true;
  };
  // A name opened at an earlier position with the same depth and objects
  // reaches every ':' that one opened later would: it is read once.
  std::vector<std::pair<uint64_t, bool>> names_opened;
  add(0, {0, false, false});
  while (!todo.empty() && !out.gave_up) {
    const auto first = todo.begin();
    const uint64_t pos = first->first;
    const std::vector<State> here = std::move(first->second);
    todo.erase(first);
    for (const State& s : here) {
      if (out.gave_up) break;
      if (pos == n) {
        if (s.depth == 0) {
          out.whole = true;
          out.objects = out.objects || s.objects;
        }
        continue;
      }
      const char c = f[pos];
      const State item{s.depth, false, s.objects};
      if (c == ' ' || c == '\t' || c == '\n' || c == '@' || c == '=' || c == '<' || c == '>' || c == '!' ||
          c == '^' || c == '&' || (c >= '0' && c <= '9')) {
        add(pos + 1, item);
      } else if (c == '(') {
        uint64_t end = pos + 1;
        while (end < n && ((f[end] >= '0' && f[end] <= '9') || f[end] == ',' || f[end] == ' ')) ++end;
        if (end < n && f[end] == ')') add(end + 1, item);
      } else if (c == '}') {
        if (s.depth > 0) add(pos + 1, {s.depth - 1, true, s.objects});
      } else if (c == ':') {
        if (!s.named) continue;
        if (!first_colon) {
          const std::pair<uint64_t, bool> key{s.depth, s.objects};
          bool read = false;
          for (const auto& o : names_opened) read = read || o == key;
          if (read) continue;
          names_opened.push_back(key);
        }
        for (size_t end = f.find(':', pos + 1); end != std::string_view::npos; end = f.find(':', end + 1)) {
          add(end + 1, item);
          if (first_colon || out.gave_up) break;
        }
      } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '?') {
        add(pos + 1, {s.depth, true, s.objects || c == 'O'});
        if ((c == 'T' || c == 'X') && pos + 1 < n && f[pos + 1] == '{') add(pos + 2, {s.depth + 1, false, s.objects});
      }
    }
  }
  return out;
}

}  // namespace

ObjectCheck object_check(const char* format) noexcept {
  // Only the code 'O' is a Python object; a format without the letter holds none.
  if (!format || !std::strchr(format, 'O')) return ObjectCheck::none;
  try {
    const std::string_view f(format);
    if (read_format(f, /*first_colon=*/true).objects) return ObjectCheck::objects;
    // Names that end at their first ':' read no object; the format is taken
    // for data only if no other reading of its names reads one either, and
    // some reading reads it whole.
    const FormatReadings all = read_format(f, /*first_colon=*/false);
    return all.whole && !all.objects && !all.gave_up ? ObjectCheck::none : ObjectCheck::unclear;
  } catch (...) {
    return ObjectCheck::unclear;  // out of memory: what cannot be read is refused
  }
}

bool holds_objects(const char* format) noexcept { return object_check(format) != ObjectCheck::none; }

BufferView::BufferView(nb::handle obj, bool writable) {
  const int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw nb::python_error();
  const ObjectCheck check = object_check(view_.format);
  if (check != ObjectCheck::none) {
    const std::string format = view_.format;
    PyBuffer_Release(&view_);
    const std::string what = check == ObjectCheck::objects
                                 ? "buffer holds Python objects (format '" + format + "')"
                                 : "buffer may hold Python objects (format '" + format +
                                       "' does not read one way only: field names may hold ':')";
    throw nb::type_error(
        (what + ", not data: gdscp moves bytes, which would overwrite or expose object references").c_str());
  }
}

BufferView::~BufferView() { PyBuffer_Release(&view_); }

namespace {

// numpy.ndarray once numpy has been imported (an object cannot be an array
// before that); numpy is never unloaded, so the type stays valid.
PyTypeObject* numpy_array_type() {
  static PyTypeObject* type = nullptr;
  if (type) return type;
  PyObject* numpy = PyImport_GetModule(nb::str("numpy").ptr());
  if (!numpy) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* ndarray = PyObject_GetAttrString(numpy, "ndarray");
  Py_DECREF(numpy);
  if (!ndarray || !PyType_Check(ndarray)) {
    Py_XDECREF(ndarray);
    PyErr_Clear();
    return nullptr;
  }
  type = reinterpret_cast<PyTypeObject*>(ndarray);  // the reference is kept for good
  return type;
}

}  // namespace

bool plain_host_type(PyObject* obj, bool writable) {
  const PyTypeObject* type = Py_TYPE(obj);
  return type == &PyByteArray_Type || type == &PyMemoryView_Type || (!writable && type == &PyBytes_Type) ||
         type == numpy_array_type();
}

PlainHostView::PlainHostView(nb::handle obj, bool writable) noexcept {
  PyObject* o = obj.ptr();
  if (!plain_host_type(o, writable)) return;
  const int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(o, &view_, flags) != 0) {
    PyErr_Clear();
    return;
  }
  if (holds_objects(view_.format)) {
    PyBuffer_Release(&view_);
    return;
  }
  ok_ = true;
}

PlainHostView::~PlainHostView() {
  if (ok_) PyBuffer_Release(&view_);
}

namespace {

// A tuple or list as a fast sequence (new reference), or nullptr with no
// Python error set.
PyObject* as_sequence(PyObject* obj) {
  if (!obj || !(PyTuple_Check(obj) || PyList_Check(obj))) return nullptr;
  return PySequence_Fast(obj, "");
}

bool read_layout(PyObject* cai, CudaArrayLayout& out) {
  if (!PyDict_Check(cai)) return false;
  PyObject* typestr = PyDict_GetItemString(cai, "typestr");
  PyObject* strides_obj = PyDict_GetItemString(cai, "strides");
  const nb::object data = nb::steal(as_sequence(PyDict_GetItemString(cai, "data")));
  const nb::object shape = nb::steal(as_sequence(PyDict_GetItemString(cai, "shape")));
  const bool strided = strides_obj && strides_obj != Py_None;
  const nb::object strides = strided ? nb::steal(as_sequence(strides_obj)) : nb::object();
  if (!data.is_valid() || PySequence_Fast_GET_SIZE(data.ptr()) != 2 || !shape.is_valid() || !typestr ||
      !PyUnicode_Check(typestr) || (strided && !strides.is_valid()))
    return false;
  const Py_ssize_t ndim = PySequence_Fast_GET_SIZE(shape.ptr());
  if (strided && PySequence_Fast_GET_SIZE(strides.ptr()) != ndim) return false;
  Py_ssize_t tlen = 0;
  const char* t = PyUnicode_AsUTF8AndSize(typestr, &tlen);
  if (!t || tlen < 3) return false;
  // "<f8", "|u1", "<M8[ns]" (a unit after a date or time's size), "<U4"
  // (characters of 4 bytes each).
  char* end = nullptr;
  long itemsize = std::strtol(t + 2, &end, 10);
  if (end < t + tlen && *end == '[' && t[tlen - 1] == ']' && (t[1] == 'M' || t[1] == 'm')) end = const_cast<char*>(t) + tlen;
  if (end != t + tlen || itemsize <= 0 || end == t + 2) return false;
  if (t[1] == 'U') itemsize *= 4;
  const int readonly = PyObject_IsTrue(PySequence_Fast_GET_ITEM(data.ptr(), 1));
  const unsigned long long ptr = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(data.ptr(), 0));
  if (readonly < 0 || PyErr_Occurred()) return false;
  std::vector<int64_t> extents(static_cast<size_t>(ndim)), steps;
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    const long long extent = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(shape.ptr(), i));
    if (extent < 0 || PyErr_Occurred()) return false;
    extents[static_cast<size_t>(i)] = extent;
  }
  const std::optional<int64_t> nbytes = array_bytes(extents, itemsize);
  if (strided) {
    steps.resize(static_cast<size_t>(ndim));
    for (Py_ssize_t i = 0; i < ndim; ++i) {
      steps[static_cast<size_t>(i)] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(strides.ptr(), i));
      if (PyErr_Occurred()) return false;
    }
  }
  PyObject* mask = PyDict_GetItemString(cai, "mask");
  out = {static_cast<uintptr_t>(ptr), nbytes.value_or(0), readonly != 0, dense(extents, steps, itemsize),
         PyDict_GetItemString(cai, "stream"), !nbytes, mask && mask != Py_None};
  return true;
}

}  // namespace

bool read_cuda_array_interface(PyObject* cai, CudaArrayLayout& out) noexcept {
  bool ok = false;
  try {
    ok = read_layout(cai, out);
  } catch (...) {
  }
  if (!ok) PyErr_Clear();
  return ok;
}

nb::tuple cuda_array_layout(nb::handle cai) {
  CudaArrayLayout l;
  if (!read_cuda_array_interface(cai.ptr(), l))
    throw nb::type_error("__cuda_array_interface__ is not a dict with data (address, read-only), shape and typestr");
  if (l.too_large) {
    PyErr_SetString(PyExc_OverflowError, "__cuda_array_interface__ describes an array of more than 2**63-1 bytes");
    throw nb::python_error();
  }
  // A masked array's invalid elements are only marked in the mask: moving its
  // data bytes alone would read or write them as if they were valid.
  if (l.masked) {
    PyErr_SetString(PyExc_NotImplementedError,
                    "__cuda_array_interface__ has a mask: masked device arrays are not supported");
    throw nb::python_error();
  }
  return nb::make_tuple(l.ptr, l.nbytes, l.readonly, l.contiguous, nb::borrow(l.stream ? l.stream : Py_None));
}

nb::tuple host_buffer(nb::handle obj, bool writable) {
  const BufferView view(obj, writable);
  return nb::make_tuple(reinterpret_cast<uintptr_t>(view.data()), view.size());
}

void define_device_buffer(nb::module_& m) {
  using release = nb::call_guard<ReleaseGil>;
  nb::class_<DeviceBuffer>(m, "DeviceBuffer",
                           "Device memory gdscp allocates itself (cuMemAlloc), as a 1-D array of bytes; freed "
                           "with the last view of it. Fills and copies are synchronous.")
      .def(nb::init<size_t, int>(), "nbytes"_a, "device"_a, release())
      .def_prop_ro("ptr", &DeviceBuffer::ptr)
      .def_prop_ro("nbytes", &DeviceBuffer::size)
      .def_prop_ro("device", &DeviceBuffer::ordinal)
      .def_prop_ro("__cuda_array_interface__", &cuda_array_interface)
      .def("__len__", &DeviceBuffer::size)
      .def("__getitem__", &slice, "index"_a)
      .def("__dlpack__", [](const DeviceBuffer& b, nb::kwargs) { return to_dlpack(b); })
      .def("__dlpack_device__", [](const DeviceBuffer& b) { return nb::make_tuple(kDLCUDA, b.ordinal()); })
      .def("__repr__", [](const DeviceBuffer& b) {
        return "<gdscp DeviceBuffer of " + std::to_string(b.size()) + " bytes on GPU " +
               std::to_string(b.ordinal()) + ">";
      })
      .def("fill", &DeviceBuffer::fill, "value"_a, release())
      .def("copy_from_host", [](DeviceBuffer& b, nb::handle src, size_t offset) {
        const BufferView view(src, /*writable=*/false);
        const ReleaseGil unlocked;
        b.copy_from_host(offset, view.data(), view.size());
      }, "src"_a, "offset"_a = 0, "The bytes of host buffer `src` to the view's bytes from `offset`.")
      .def("copy_to_host", [](const DeviceBuffer& b, nb::handle dst, size_t offset) {
        const BufferView view(dst, /*writable=*/true);
        const ReleaseGil unlocked;
        b.copy_to_host(offset, view.data(), view.size());
      }, "dst"_a, "offset"_a = 0, "The view's bytes from `offset` into all of host buffer `dst`.");

  m.def("device_memory_info", [](int device) {
    DeviceMemoryInfo info;
    {
      const ReleaseGil unlocked;
      info = device_memory_info(device);
    }
    return nb::make_tuple(info.free, info.total);
  }, "device"_a, "(free, total) bytes of GPU `device`.");
  m.def("device_synchronize", &device_synchronize, "device"_a, release(),
        "Waits for all work queued on GPU `device`'s primary context.");
}

}  // namespace gdscp::bindings
