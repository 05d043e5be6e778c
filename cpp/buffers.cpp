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
  // What the producer wrote is checked before it is read: a negative count
  // of dimensions, or dimensions without a shape, would be read as a vast
  // array or from address 0.
  if (t->ndim < 0)
    throw nb::value_error(("the DLPack tensor has ndim " + std::to_string(t->ndim) + " (0 or more expected)").c_str());
  if (t->ndim > 0 && !t->shape)
    throw nb::value_error(
        ("the DLPack tensor of " + std::to_string(t->ndim) + (t->ndim == 1 ? " dimension" : " dimensions") +
         " has no shape (a null shape pointer)")
            .c_str());
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
  // Real formats have a handful of readings; a format of more is refused (a few MiB at most).
  constexpr size_t kMaxStates = size_t{1} << 16;
  struct State {
    uint64_t depth;
    bool named;  // a name may follow (after a code or a "}")
    bool objects;
  };
  FormatReadings out;
  const uint64_t n = f.size();
  if (n > (uint64_t{1} << 20)) {
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

[[noreturn]] void raise_error(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

// What an error shows of a value: its repr, cut short where it is long.
std::string shown(PyObject* o) {
  PyObject* r = PyObject_Repr(o);
  if (!r) {
    PyErr_Clear();
    return std::string("<") + Py_TYPE(o)->tp_name + ">";
  }
  const nb::object hold = nb::steal(r);
  Py_ssize_t n = 0;
  const char* text = PyUnicode_AsUTF8AndSize(r, &n);
  if (!text) {
    PyErr_Clear();
    return std::string("<") + Py_TYPE(o)->tp_name + ">";
  }
  return n > 80 ? std::string(text, 77) + "..." : std::string(text, static_cast<size_t>(n));
}

std::string type_and_value(PyObject* o) { return std::string(Py_TYPE(o)->tp_name) + " " + shown(o); }

std::string field(const char* key) { return std::string("__cuda_array_interface__['") + key + "']"; }

// The dict's `key`, or an invalid object where it has none. Held, not
// borrowed: reading the other fields runs their own code (__index__,
// __bool__), which might change the dict.
nb::object get(PyObject* cai, const char* key) { return nb::borrow(PyDict_GetItemString(cai, key)); }

// The dict's `key`; ValueError where it has none (`what`: what the key holds).
nb::object required(PyObject* cai, const char* key, const char* what) {
  nb::object value = get(cai, key);
  if (!value.is_valid())
    raise_error(PyExc_ValueError, std::string("__cuda_array_interface__ has no '") + key + "' (" + what + ")");
  return value;
}

// A tuple or list as a fast sequence; TypeError for anything else.
nb::object sequence(PyObject* obj, const std::string& what, const char* of) {
  if (!(PyTuple_Check(obj) || PyList_Check(obj)))
    raise_error(PyExc_TypeError, what + " must be a tuple " + of + ", got " + type_and_value(obj));
  PyObject* seq = PySequence_Fast(obj, "");
  if (!seq) throw nb::python_error();
  return nb::steal(seq);
}

// An integer (anything with __index__) as a Python int; TypeError for another
// type.
nb::object integer(PyObject* o, const std::string& what) {
  if (!PyIndex_Check(o)) raise_error(PyExc_TypeError, what + " must be an int, got " + type_and_value(o));
  PyObject* i = PyNumber_Index(o);
  if (!i) throw nb::python_error();
  return nb::steal(i);
}

// An integer from 0 to 2**64-1; `range_error` outside.
uint64_t unsigned_integer(PyObject* o, const std::string& what, PyObject* range_error) {
  const nb::object i = integer(o, what);
  const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    raise_error(range_error, what + " is " + shown(i.ptr()) + ", out of range (0 to 2**64-1)");
  }
  return v;
}

// An integer that fits int64_t; nothing where it does not.
std::optional<int64_t> signed_integer(PyObject* o, const std::string& what) {
  const nb::object i = integer(o, what);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) return std::nullopt;
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

// The bytes of an item of `typestr`: "<f8", "|u1", "<M8[ns]" (a unit after a
// date or time's size), "<U4" (characters of 4 bytes each).
int64_t item_size(PyObject* typestr) {
  const std::string what = field("typestr");
  if (typestr == Py_None) raise_error(PyExc_ValueError, what + " is None: expected a type string such as '<f4'");
  if (!PyUnicode_Check(typestr))
    raise_error(PyExc_TypeError, what + " must be a str such as '<f4', got " + type_and_value(typestr));
  Py_ssize_t tlen = 0;
  const char* t = PyUnicode_AsUTF8AndSize(typestr, &tlen);
  if (!t) throw nb::python_error();
  if (tlen == 0) raise_error(PyExc_ValueError, what + " is empty: expected a type string such as '<f4'");
  const std::string bad = what + " " + shown(typestr) + " is not a type string (such as '<f4', '|u1' or '<M8[ns]')";
  if (tlen < 3) raise_error(PyExc_ValueError, bad);
  char* end = nullptr;
  long itemsize = std::strtol(t + 2, &end, 10);
  if (end < t + tlen && *end == '[' && t[tlen - 1] == ']' && (t[1] == 'M' || t[1] == 'm'))
    end = const_cast<char*>(t) + tlen;
  if (end != t + tlen || end == t + 2 || itemsize < 0 || itemsize > (1L << 30)) raise_error(PyExc_ValueError, bad);
  if (itemsize == 0) raise_error(PyExc_ValueError, what + " " + shown(typestr) + " describes items of 0 bytes");
  if (t[1] == 'U') itemsize *= 4;
  return itemsize;
}

// Reads `cai` into `out`, or raises the error that says which field is wrong
// and what it holds: TypeError where a field (or the interface itself) is of
// the wrong type, ValueError where its value is wrong or it is missing,
// OverflowError for an address outside 0 to 2**64-1.
void read_layout(PyObject* cai, CudaArrayLayout& out) {
  if (!PyDict_Check(cai))
    raise_error(PyExc_TypeError, "__cuda_array_interface__ must be a dict, got " + type_and_value(cai));

  const nb::object data_field = required(cai, "data", "the device pointer and the read-only flag");
  PyObject* data_obj = data_field.ptr();
  const std::string data_what = field("data");
  const nb::object data = sequence(data_obj, data_what, "(pointer, read-only)");
  if (PySequence_Fast_GET_SIZE(data.ptr()) != 2)
    raise_error(PyExc_ValueError, data_what + " must be (pointer, read-only), got " + shown(data_obj));
  const uint64_t ptr =
      unsigned_integer(PySequence_Fast_GET_ITEM(data.ptr(), 0), "the pointer of " + data_what, PyExc_OverflowError);
  const int readonly = PyObject_IsTrue(PySequence_Fast_GET_ITEM(data.ptr(), 1));
  if (readonly < 0) throw nb::python_error();

  const nb::object shape_field = required(cai, "shape", "the extent of each axis");
  PyObject* shape_obj = shape_field.ptr();
  const std::string shape_what = field("shape");
  const nb::object shape = sequence(shape_obj, shape_what, "of ints");
  const Py_ssize_t ndim = PySequence_Fast_GET_SIZE(shape.ptr());
  std::vector<int64_t> extents(static_cast<size_t>(ndim));
  bool too_large = false;
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(shape.ptr(), i);
    const std::optional<int64_t> extent = signed_integer(item, "each extent of " + shape_what);
    if (extent ? *extent < 0 : PyObject_RichCompareBool(item, nb::int_(0).ptr(), Py_LT) == 1)
      raise_error(PyExc_ValueError,
                  shape_what + " " + shown(shape_obj) + " has a negative extent (" + shown(item) + ")");
    if (!extent) too_large = true;  // 2**63 or more: counted as too large below, unless another extent is 0
    extents[static_cast<size_t>(i)] = extent.value_or(1);
  }

  const int64_t itemsize = item_size(required(cai, "typestr", "the type of the items, such as '<f4'").ptr());

  const nb::object strides_field = get(cai, "strides");
  PyObject* strides_obj = strides_field.ptr();
  std::vector<int64_t> steps;
  if (strides_obj && strides_obj != Py_None) {
    const std::string what = field("strides");
    const nb::object strides = sequence(strides_obj, what, "of ints, or None");
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(strides.ptr());
    if (count != ndim)
      raise_error(PyExc_ValueError, what + " " + shown(strides_obj) + " has " + std::to_string(count) +
                                        (count == 1 ? " stride" : " strides") + " for the " + std::to_string(ndim) +
                                        (ndim == 1 ? " axis" : " axes") + " of shape " + shown(shape_obj));
    steps.resize(static_cast<size_t>(ndim));
    for (Py_ssize_t i = 0; i < ndim; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(strides.ptr(), i);
      const std::optional<int64_t> step = signed_integer(item, "each stride of " + what);
      if (!step)
        raise_error(PyExc_ValueError,
                    what + " " + shown(strides_obj) + " has a stride out of range (" + shown(item) + ")");
      steps[static_cast<size_t>(i)] = *step;
    }
  }

  // The producer's stream (the interface's version 3): None, or a CUstream as
  // an int; 1 and 2 are the legacy and per-thread default streams. 0, which
  // the interface disallows as ambiguous, is CUDA's handle of the legacy
  // default stream, and taken as that.
  std::optional<uint64_t> stream;
  const nb::object stream_field = get(cai, "stream");
  PyObject* stream_obj = stream_field.ptr();
  if (stream_obj && stream_obj != Py_None) {
    const std::string what = field("stream");
    if (!PyIndex_Check(stream_obj))
      raise_error(PyExc_TypeError,
                  what + " must be an int (a CUDA stream) or None, got " + type_and_value(stream_obj));
    stream = unsigned_integer(stream_obj, what, PyExc_ValueError);
  }

  std::optional<int64_t> nbytes = array_bytes(extents, itemsize);
  if (too_large && nbytes != 0) nbytes = std::nullopt;
  const nb::object mask = get(cai, "mask");
  out = {static_cast<uintptr_t>(ptr), nbytes.value_or(0), readonly != 0, dense(extents, steps, itemsize),
         stream, !nbytes, mask.is_valid() && !mask.is_none()};
}

}  // namespace

bool read_cuda_array_interface(PyObject* cai, CudaArrayLayout& out) noexcept {
  try {
    read_layout(cai, out);
    return true;
  } catch (...) {
  }
  PyErr_Clear();
  return false;
}

nb::tuple cuda_array_layout(nb::handle cai) {
  CudaArrayLayout l;
  read_layout(cai.ptr(), l);
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
  return nb::make_tuple(l.ptr, l.nbytes, l.readonly, l.contiguous,
                        l.stream ? nb::object(nb::int_(*l.stream)) : nb::none());
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
