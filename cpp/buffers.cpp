#include "buffers.hpp"

#include <cstdint>

namespace nb = nanobind;

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

}  // namespace

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

BufferView::BufferView(nb::handle obj, bool writable) {
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw nb::python_error();
}

BufferView::~BufferView() { PyBuffer_Release(&view_); }

nb::tuple host_buffer(nb::handle obj, bool writable) {
  const BufferView view(obj, writable);
  return nb::make_tuple(reinterpret_cast<uintptr_t>(view.data()), view.size());
}

}  // namespace gdscp::bindings
