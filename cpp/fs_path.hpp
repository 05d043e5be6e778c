// File names between Python and the engine. Linux names are bytes, and Python
// carries the ones that are not UTF-8 as str with lone surrogates (PEP 383);
// nanobind's std::string conversion takes only valid UTF-8, so such a name
// could neither be opened nor appear in an error. FsPath converts with
// Python's file-system encoding, as os.fsencode does; fs_text turns engine
// text back into str as os.fsdecode does.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

namespace gdscp::bindings {

struct FsPath {
  std::string value;
};

// Engine text that may quote a file name (an error message, a note), as str.
inline nanobind::str fs_text(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeFSDefaultAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
  if (decoded == nullptr) throw nanobind::python_error();
  return nanobind::steal<nanobind::str>(decoded);
}

}  // namespace gdscp::bindings

NAMESPACE_BEGIN(NB_NAMESPACE)
NAMESPACE_BEGIN(detail)

template <>
struct type_caster<gdscp::bindings::FsPath> {
  NB_TYPE_CASTER(gdscp::bindings::FsPath, const_name("str | bytes | os.PathLike"))

  // str, bytes or os.PathLike; a name with a NUL byte does not convert.
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    PyObject* encoded = nullptr;
    if (!PyUnicode_FSConverter(src.ptr(), &encoded)) {
      PyErr_Clear();
      return false;
    }
    char* data = nullptr;
    Py_ssize_t size = 0;
    const bool ok = PyBytes_AsStringAndSize(encoded, &data, &size) == 0;
    if (ok) value.value.assign(data, static_cast<size_t>(size));
    Py_DECREF(encoded);
    if (!ok) PyErr_Clear();
    return ok;
  }
};

NAMESPACE_END(detail)
NAMESPACE_END(NB_NAMESPACE)
