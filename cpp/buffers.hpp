// Python memory as the bindings read it: DLPack capsules and the buffer
// protocol. gdscp._buffers decides what a Python object is; this reads the
// addresses and sizes out of the C structures. And gdscp's own device memory
// as Python sees it (define_device_buffer).
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace gdscp::bindings {

// Whether an array of `shape` with `strides` (empty: none given, C order)
// covers one block of memory, in C or in Fortran order; strides in multiples
// of `unit`.
bool dense(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t unit) noexcept;

// (address, nbytes, device_type, device_id, contiguous, read_only) of a DLPack
// capsule, which stays unconsumed: the caller keeps it alive while the memory
// is used. read_only: a versioned capsule's flag (an unversioned one has none).
nanobind::tuple dlpack_info(nanobind::handle capsule);

// Whether `obj` is host memory by its type alone: an exact numpy.ndarray,
// bytearray or memoryview, or bytes when not `writable` (none of which can
// describe device memory).
bool plain_host_type(PyObject* obj, bool writable);

// What a __cuda_array_interface__ dict describes: the address, the bytes of
// its shape, whether it is read-only and contiguous (C or Fortran order), and the producer's
// stream (nothing where it names none).
struct CudaArrayLayout {
  uintptr_t ptr = 0;
  int64_t nbytes = 0;
  bool readonly = false;
  bool contiguous = true;
  std::optional<uint64_t> stream;
  bool too_large = false;  // its bytes overflow int64_t (nbytes is then 0)
  bool masked = false;     // it has a mask (a masked array), which gdscp does not take
};

// Reads `cai`; false, with no Python error set, where cuda_array_layout raises
// for it (a field missing or wrong).
bool read_cuda_array_interface(PyObject* cai, CudaArrayLayout& out) noexcept;

// (address, nbytes, readonly, contiguous, stream or None) of a
// __cuda_array_interface__ dict, for gdscp._buffers. Errors name the field
// that is wrong and what it holds: TypeError where the interface is not a
// dict or a field is of the wrong type, ValueError where a field is missing
// or its value is wrong (as KvikIO for a typestr of None or "" and strides
// that do not match the shape), OverflowError for an address outside 0 to
// 2**64-1 (as KvikIO) and for an array of more than 2**63-1 bytes,
// NotImplementedError where it has a mask (as KvikIO).
nanobind::tuple cuda_array_layout(nanobind::handle cai);

// (address, nbytes) of a buffer-protocol object; contiguous required (C or
// Fortran order: the bytes move in memory order).
nanobind::tuple host_buffer(nanobind::handle obj, bool writable);

// Whether a buffer of struct format `format` holds Python object pointers
// (code 'O', alone or as a field): its bytes are references, and writing into
// them corrupts the interpreter. A null format means bytes. `unclear`: the
// format has an 'O' that only some readings take for a code, or it does not
// read at all; a field name may hold ':' (ctypes writes any name as it is), so
// which letters are names is then not certain.
enum class ObjectCheck { none, objects, unclear };
ObjectCheck object_check(const char* format) noexcept;

// True where object_check is not `none`: what is refused.
bool holds_objects(const char* format) noexcept;

// A contiguous (C or Fortran order) buffer-protocol view of an object, held while this lives: the
// exporter may not move or resize the memory meanwhile, so it may be used with
// the GIL released. Create and destroy it with the GIL held.
class BufferView {
 public:
  BufferView(nanobind::handle obj, bool writable);  // raises the exporter's error, or TypeError for objects
  ~BufferView();
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  char* data() const noexcept { return static_cast<char*>(view_.buf); }
  size_t size() const noexcept { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_;
};

// The memory of an object that is host memory by its type alone: an exact
// numpy.ndarray, bytearray or memoryview (and bytes when not `writable`),
// none of which can describe device memory. For the small calls that skip
// gdscp._buffers. ok() is false, with no Python error set, for any other
// object, for a buffer its exporter refuses (read-only, not contiguous) and
// for one of Python objects:
// the caller then takes the general path, which names the problem. Create and
// destroy it with the GIL held.
class PlainHostView {
 public:
  PlainHostView(nanobind::handle obj, bool writable) noexcept;
  ~PlainHostView();
  PlainHostView(const PlainHostView&) = delete;
  PlainHostView& operator=(const PlainHostView&) = delete;
  bool ok() const noexcept { return ok_; }
  char* data() const noexcept { return static_cast<char*>(view_.buf); }
  size_t size() const noexcept { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_;
  bool ok_ = false;
};

// _core.DeviceBuffer (gdscp/device_buffer.hpp): a 1-D array of bytes with
// __cuda_array_interface__ and DLPack, views by slicing, synchronous fills and
// copies from and to host buffers; and device_memory_info, device_synchronize.
void define_device_buffer(nanobind::module_& m);

}  // namespace gdscp::bindings
