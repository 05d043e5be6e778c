"""Host buffers of every kind the buffer protocol offers, read into and written from."""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import re

import numpy as np
import pytest

import gdscp
from conftest import DLPackOnly, random_bytes

MiB = 1 << 20


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.int64, np.complex128, np.bool_])
@pytest.mark.parametrize("shape", [(0,), (1,), (1000,), (7, 11, 13), (3, 1, 4096)])
def test_numpy_dtypes_and_shapes(tmp_file, tmp_path, dtype, shape):
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    path, data = tmp_file(nbytes + 100)
    arr = np.zeros(shape, dtype=dtype)
    with gdscp.CuFile(path) as f:
        assert f.read(arr) == nbytes
    assert arr.tobytes() == data[:nbytes]

    out = str(tmp_path / "out.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(arr) == nbytes
    assert file_bytes(out) == data[:nbytes]


def test_numpy_zero_dimensional(tmp_file):
    path, data = tmp_file(8)
    arr = np.zeros((), dtype=np.float64)
    with gdscp.CuFile(path) as f:
        assert f.read(arr) == 8
    assert arr.tobytes() == data


def test_numpy_contiguous_row_slice(tmp_file):
    # Rows of a C array are contiguous even though the array is a view.
    path, data = tmp_file(6 * 1000)
    grid = np.zeros((10, 1000), np.uint8)
    with gdscp.CuFile(path) as f:
        assert f.read(grid[2:8]) == 6000
    assert grid[2:8].tobytes() == data
    assert not grid[:2].any() and not grid[8:].any()


def test_bytearray(tmp_file, tmp_path):
    path, data = tmp_file(4097)
    buf = bytearray(4097)
    with gdscp.CuFile(path) as f:
        assert f.read(buf) == 4097
    assert bytes(buf) == data
    out = str(tmp_path / "o.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(buf) == 4097
    assert file_bytes(out) == data


def test_bytes_can_be_written(tmp_path):
    data = random_bytes(10_000, 3)
    out = str(tmp_path / "o.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(data) == 10_000
    assert file_bytes(out) == data


def test_memoryview_and_slices(tmp_file):
    path, data = tmp_file(3 * MiB + 1)
    backing = bytearray(b"\xee" * (3 * MiB + 100))
    view = memoryview(backing)[17 : 17 + 3 * MiB + 1]
    with gdscp.CuFile(path) as f:
        assert f.read(view) == 3 * MiB + 1
    assert bytes(backing[17 : 17 + 3 * MiB + 1]) == data
    assert backing[:17] == b"\xee" * 17
    assert backing[17 + 3 * MiB + 1 :] == b"\xee" * 82


def test_memoryview_cast(tmp_file):
    path, data = tmp_file(800)
    view = memoryview(bytearray(800)).cast("d")
    with gdscp.CuFile(path) as f:
        assert f.read(view) == 800
    assert view.tobytes() == data


def test_strided_memoryview_is_rejected(tmp_file):
    path, _ = tmp_file(100)
    view = memoryview(bytearray(100))[::2]
    with gdscp.CuFile(path) as f:
        with pytest.raises(ValueError):
            f.read(view)


def _refused_as_objects(buf, path, out) -> None:
    """Every CuFile call and both bulk jobs refuse ``buf`` as a buffer of Python objects."""
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.write, lambda b: f.pread(b).get(), lambda b: f.pwrite(b).get()):
            with pytest.raises(TypeError, match="Python objects"):
                call(buf)
    with pytest.raises(TypeError, match="Python objects"):
        gdscp.read_files([path], [buf])
    with pytest.raises(TypeError, match="Python objects"):
        gdscp.write_files([buf], [out])


@pytest.mark.parametrize("size", [16, 5 * MiB])  # run on the calling thread / by the workers
def test_buffers_of_python_objects_are_refused(tmp_file, tmp_path, size):
    """A buffer of object references (numpy dtype object, alone or as a field)
    is not data: reading into it would overwrite references and crash the
    interpreter, writing from it would store addresses. Every call refuses it
    with TypeError and leaves it and the file as they were."""
    path, data = tmp_file(size)
    count = size // 8
    plain = np.empty(count, dtype=object)
    plain[:] = [str(i) for i in range(count)]
    record = np.zeros(count // 2, dtype=[("n", "i8"), ("obj", "O")])
    record["obj"] = "x"
    for arr in (plain, record):
        before = arr.copy()
        _refused_as_objects(arr, path, path)
        assert list(arr.tolist()) == list(before.tolist())
    assert file_bytes(path) == data
    # A field whose name has an O in it is not an object field.
    named = np.zeros(size // 8, dtype=[("Obj", "u8")])
    with gdscp.CuFile(path) as f:
        assert f.read(named) == size
    assert named.tobytes() == data


class _ColonNamed(ctypes.Structure):
    """A ctypes field name may hold ':', which ends a name in the struct
    format string: 'T{<i:a::<O:p:}' also reads as a field "a:" and an object
    field, or as a field "a::<O" followed by a Pascal string."""

    _fields_ = [("a:", ctypes.c_int), ("p", ctypes.py_object)]


class _LettersNamed(ctypes.Structure):
    """Fields whose names hold an O: 'T{<I:Offset:<I:Obj:}' reads one way
    only, with no object in it."""

    _fields_ = [("Offset", ctypes.c_uint32), ("Obj", ctypes.c_uint32)]


def test_a_field_name_with_a_colon_cannot_hide_an_object_field(tmp_file, tmp_path):
    """A struct format whose field names could hide an object field is
    refused: CuFile's calls (the small ones on the calling thread too), the
    bulk jobs and Mmap raise TypeError before anything moves, and the object
    reference is never overwritten. A format that reads one way only is not,
    whatever letters its field names hold."""
    from gdscp import _core

    # (Python 3.12's ctypes writes the padding before the pointer: "4x".)
    assert re.fullmatch(r"T\{<i:a::(\d+x)?<O:p:\}", memoryview(_ColonNamed()).format)
    path, data = tmp_file(4096)
    out = str(tmp_path / "out.bin")
    s = _ColonNamed(7, "kept")
    for buf in (s, memoryview(s)):
        _refused_as_objects(buf, path, out)
        with gdscp.Mmap(path) as m:
            for call in (m.read, lambda b: m.pread(b).get()):
                with pytest.raises(TypeError, match="Python objects"):
                    call(buf)
    assert (getattr(s, "a:"), s.p) == (7, "kept")
    assert file_bytes(path) == data and not os.path.exists(out)

    assert memoryview(_LettersNamed()).format == "T{<I:Offset:<I:Obj:}"
    r = _LettersNamed()
    with gdscp.CuFile(path) as f:
        assert f.read(r) == 8
    assert bytes(r) == data[:8]
    (result,) = gdscp.read_files([path], [r := _LettersNamed()]).results()
    assert result.bytes == 8 and bytes(r) == data[:8]
    with gdscp.Mmap(path) as m:
        assert m.read(r := _LettersNamed(), 8) == 8 and bytes(r) == data[:8]
    (result,) = gdscp.write_files([r], [out]).results()
    assert result.status == "done" and file_bytes(out) == data[:8]

    # The format strings themselves: an 'O' that some reading takes for a
    # code is refused, as is a format with an 'O' that does not read at all.
    check = _core.testing.object_check
    for fmt in ("O", "<O", "5O", "O:x:", "T{<q:n:O:obj:}", "T{T{O:y:}:x:}", "T{(2,3)<O:o:}"):
        assert check(fmt) == "objects", fmt
    for fmt in ("T{<i:a::<O:p:}", "T{<i:a:b:O:p:b:q:r:}", "T{<i:a:<i:<O:p::}", "T{<i:Offset", "T{<i:Offset:", "%O"):
        assert check(fmt) == "unclear", fmt
    for fmt in ("B", "<d", "T{<I:Offset:<I:Obj:}", "T{L:Obj:}", "T{<q:Offset:<d:Obj:}", "T{(2,3)<i:Obj:}",
                "T{<i:a:X{}:f:&<i:pOint:}", "T{<i:O}:}", "T{" * 500 + "<i:Oa:" + "}" * 500):
        assert check(fmt) == "none", fmt


def test_none_is_not_a_buffer(tmp_file):
    """The message names the problem, whichever path the call would take."""
    path, _ = tmp_file(100)
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.write, f.pread, f.pwrite):
            with pytest.raises(TypeError, match="expected a buffer .*got NoneType"):
                call(None)


def test_readonly_memoryview_for_writes(tmp_path):
    data = random_bytes(5000, 8)
    view = memoryview(data).toreadonly()
    out = str(tmp_path / "ro.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(view[1000:]) == 4000
    assert file_bytes(out) == data[1000:]


def test_readonly_numpy_for_writes(tmp_path):
    arr = np.frombuffer(random_bytes(4096, 9), np.uint8)
    assert not arr.flags.writeable
    out = str(tmp_path / "ro.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(arr) == 4096
    assert file_bytes(out) == arr.tobytes()


def test_mmap_read_into_and_write_from(tmp_file, tmp_path):
    size = 2 * MiB + 5
    path, data = tmp_file(size)
    target = str(tmp_path / "mapped.bin")
    with open(target, "wb") as t:
        t.truncate(size)
    with open(target, "r+b") as t, mmap.mmap(t.fileno(), size) as mapped:
        with gdscp.CuFile(path) as f:
            assert f.read(mapped) == size
        mapped.flush()
        assert mapped[:] == data
    assert file_bytes(target) == data

    copy = str(tmp_path / "copy.bin")
    with open(target, "r+b") as t, mmap.mmap(t.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with gdscp.CuFile(copy, "w") as f:
            assert f.write(mapped) == size
    assert file_bytes(copy) == data


def test_read_only_mmap_cannot_be_read_into(tmp_file):
    path, _ = tmp_file(4096)
    with open(path, "rb") as t, mmap.mmap(t.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        with gdscp.CuFile(path) as f:
            with pytest.raises(ValueError):
                f.read(mapped)


def test_anonymous_mmap(tmp_file):
    path, data = tmp_file(10_000)
    with mmap.mmap(-1, 10_000) as mapped:
        with gdscp.CuFile(path) as f:
            assert f.read(mapped) == 10_000
        assert mapped[:] == data


@pytest.mark.parametrize("typecode", ["b", "H", "i", "q", "f", "d"])
def test_array_array(tmp_file, tmp_path, typecode):
    itemsize = array.array(typecode).itemsize
    path, data = tmp_file(itemsize * 999)
    arr = array.array(typecode, bytes(itemsize * 999))
    with gdscp.CuFile(path) as f:
        assert f.read(arr) == itemsize * 999
    assert arr.tobytes() == data
    out = str(tmp_path / "a.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(arr) == itemsize * 999
    assert file_bytes(out) == data


def test_ctypes_array(tmp_file):
    path, data = tmp_file(512)
    buf = (ctypes.c_uint8 * 512)()
    with gdscp.CuFile(path) as f:
        assert f.read(buf) == 512
    assert bytes(buf) == data


def test_bytearray_cannot_resize_while_transfer_holds_it(tmp_file):
    """The future keeps the buffer export alive, so the memory cannot move under
    the engine; once the future is gone the bytearray is free again."""
    path, data = tmp_file(4 * MiB)
    buf = bytearray(4 * MiB)
    with gdscp.CuFile(path) as f:
        future = f.pread(buf, task_size=256 * 1024)
        with pytest.raises(BufferError):
            buf.extend(b"x")
        with pytest.raises(BufferError):
            del buf[-1]
        assert future.get() == 4 * MiB
        del future
    assert bytes(buf) == data
    buf.extend(b"x")
    assert len(buf) == 4 * MiB + 1


def test_buffer_survives_dropping_the_last_python_reference(tmp_file):
    """A pread keeps its buffer alive: the caller may drop its own reference."""
    path, data = tmp_file(4 * MiB)
    arr = np.zeros(4 * MiB, np.uint8)
    view = arr[:]
    with gdscp.CuFile(path) as f:
        future = f.pread(view, task_size=128 * 1024)
        del view
        assert future.get() == 4 * MiB
    assert arr.tobytes() == data


def test_file_object_stays_alive_through_future(tmp_file):
    path, data = tmp_file(4 * MiB)
    arr = np.zeros(4 * MiB, np.uint8)
    future = gdscp.CuFile(path).pread(arr, task_size=128 * 1024)
    assert future.get() == 4 * MiB
    assert arr.tobytes() == data


def test_host_dlpack_object(tmp_file, tmp_path):
    path, data = tmp_file(3000)
    arr = np.zeros(750, np.float32)
    with gdscp.CuFile(path) as f:
        assert f.read(DLPackOnly(arr)) == 3000
    assert arr.tobytes() == data
    out = str(tmp_path / "d.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(DLPackOnly(arr[250:])) == 2000
    assert file_bytes(out) == data[1000:]


def test_fortran_order_moves_in_memory_order(tmp_file, tmp_path):
    """A Fortran-ordered array is one block of memory, as KvikIO takes it: the
    file's bytes fill it in memory order, by the buffer protocol, DLPack and
    the bulk jobs alike, and a write stores its memory as it lies."""
    path, data = tmp_file(4 * 6 * 8 + 5)
    nbytes = 4 * 6 * 8
    want = np.frombuffer(data[:nbytes], np.float64).reshape((6, 4)).T  # (4, 6), Fortran order
    for make in (lambda a: a, DLPackOnly):
        arr = np.zeros((4, 6), np.float64, order="F")
        with gdscp.CuFile(path) as f:
            assert f.read(make(arr)) == nbytes
            assert f.pread(make(arr)).get() == nbytes
        assert np.array_equal(arr, want)
    arr = np.zeros((4, 6), np.float64, order="F")
    (result,) = gdscp.read_files([path], [arr]).results()
    assert result.status == "done" and np.array_equal(arr, want)
    out = str(tmp_path / "f.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(arr) == nbytes
    assert file_bytes(out) == data[:nbytes]


class _PreVersionDLPack(DLPackOnly):
    """A producer from before DLPack 1.0: its __dlpack__ takes no max_version."""

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__(stream=stream)


def test_read_only_dlpack_tensors(tmp_file, tmp_path):
    """A read-only tensor's memory is written from as any other and never read
    into: its producer says it is read-only in a versioned capsule (DLPack
    1.0), which gdscp asks for. Through the old unversioned capsule numpy
    refuses to share a read-only array at all, and the write failed."""
    path, data = tmp_file(3000)
    source = np.frombuffer(data, np.uint8)  # read-only: bytes behind it
    out = str(tmp_path / "out.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(DLPackOnly(source[1000:])) == 2000
        assert f.pwrite(DLPackOnly(source[:1000]), file_offset=2000).get() == 1000
    assert file_bytes(out) == data[1000:] + data[:1000]
    target = np.zeros(3000, np.uint8)
    target.setflags(write=False)
    with gdscp.CuFile(path) as f:
        for call in (f.read, lambda buf: f.pread(buf).get()):
            with pytest.raises(ValueError, match="read-only DLPack tensor"):
                call(DLPackOnly(target))
    assert not target.any()
    # A producer that takes no max_version still works, through the old capsule.
    target = np.zeros(3000, np.uint8)
    with gdscp.CuFile(path) as f:
        assert f.read(_PreVersionDLPack(target)) == 3000
    assert target.tobytes() == data


def test_host_dlpack_strided_is_rejected(tmp_file):
    path, _ = tmp_file(3000)
    with gdscp.CuFile(path) as f:
        with pytest.raises(ValueError):
            f.read(DLPackOnly(np.zeros(100, np.float32)[::2]))


def test_cuda_array_interface_read_once_for_both_paths():
    """gdscp._buffers and the bulk jobs' C++ pass read __cuda_array_interface__
    with one reader (_core.cuda_array_layout): address, bytes, read-only,
    contiguity (C or Fortran order) and the stream, from tuples or lists;
    anything else is an error (the next test says which)."""
    from gdscp import _core

    layout = _core.cuda_array_layout
    assert layout({"data": (1234, False), "shape": (10,), "typestr": "|u1", "version": 3}) == (1234, 10, False, True, None)
    assert layout({"data": [8, True], "shape": [2, 3], "typestr": "<f4", "strides": (12, 4), "stream": 7}) == (
        8, 24, True, True, 7)
    assert layout({"data": (8, False), "shape": (2, 3), "typestr": "<f4", "strides": (4, 8)})[3] is True  # Fortran
    assert layout({"data": (8, False), "shape": (2, 3), "typestr": "<f4", "strides": (4, 16)})[3] is False
    assert layout({"data": (8, False), "shape": (2, 3), "typestr": "<f4", "strides": (16, 4)})[3] is False
    assert layout({"data": (8, False), "shape": (2, 1, 3), "typestr": "<f4", "strides": (4, 99, 8)})[3] is True
    assert layout({"data": (8, False), "shape": (0, 3), "typestr": "<f4", "strides": (4, 8)}) == (8, 0, False, True, None)
    for bad in ({}, {"data": (1,), "shape": (1,), "typestr": "|u1"}, {"data": (1, False), "shape": (1,), "typestr": "u"},
                {"data": (1, False), "shape": (1,), "typestr": "<M8[ns"}, {"data": (1, False), "shape": (1,), "typestr": "<f[8]"}):
        with pytest.raises(ValueError, match="__cuda_array_interface__"):
            layout(bad)
    with pytest.raises(TypeError, match="__cuda_array_interface__ must be a dict, got int 5"):
        layout(5)


class _DeviceArray:
    """An object that offers `cai` as its __cuda_array_interface__."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


_CAI = {"data": (4096, False), "shape": (2, 3), "typestr": "<f4", "version": 3}


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"typestr": None}, ValueError, r"\['typestr'\] is None"),
    ({"typestr": ""}, ValueError, r"\['typestr'\] is empty"),
    ({"typestr": "|V0"}, ValueError, r"\['typestr'\] '\|V0' describes items of 0 bytes"),
    ({"typestr": "<f[8]"}, ValueError, r"\['typestr'\] '<f\[8\]' is not a type string"),
    ({"typestr": 4}, TypeError, r"\['typestr'\] must be a str .*, got int 4"),
    ({"strides": (4,)}, ValueError, r"\['strides'\] \(4,\) has 1 stride for the 2 axes of shape \(2, 3\)"),
    ({"strides": "12,4"}, TypeError, r"\['strides'\] must be a tuple of ints, or None, got str '12,4'"),
    ({"shape": (2, -3)}, ValueError, r"\['shape'\] \(2, -3\) has a negative extent \(-3\)"),
    ({"shape": (2, 3.0)}, TypeError, r"each extent of __cuda_array_interface__\['shape'\] must be an int, got float 3.0"),
    ({"data": (-1, False)}, OverflowError, r"pointer of __cuda_array_interface__\['data'\] is -1, out of range"),
    ({"data": (2**64, False)}, OverflowError, r"\['data'\] is 18446744073709551616, out of range"),
    ({"data": ("0x1000", False)}, TypeError, r"pointer of __cuda_array_interface__\['data'\] must be an int, got str"),
    ({"data": (4096,)}, ValueError, r"\['data'\] must be \(pointer, read-only\), got \(4096,\)"),
    ({"data": None}, TypeError, r"\['data'\] must be a tuple \(pointer, read-only\), got NoneType None"),
    ({"data": ...}, ValueError, r"__cuda_array_interface__ has no 'data'"),
    ({"shape": ...}, ValueError, r"__cuda_array_interface__ has no 'shape'"),
    ({"typestr": ...}, ValueError, r"__cuda_array_interface__ has no 'typestr'"),
])
def test_a_malformed_cuda_array_interface_says_which_field_is_wrong(tmp_file, tmp_path, change, error, message):
    """Each field of __cuda_array_interface__ that is missing or wrong gets its
    own message, naming the field and what it holds, with KvikIO's exception
    types: ValueError for a wrong or missing value (KvikIO's for a typestr of
    None or "" and strides that do not match the shape), TypeError for a field
    of the wrong type, OverflowError for an address outside 0 to 2**64-1 (as
    KvikIO). CuFile's calls and the bulk jobs raise it before anything moves."""
    from gdscp import _core

    cai = {k: v for k, v in {**_CAI, **change}.items() if v is not ...}
    with pytest.raises(error, match=message):
        _core.cuda_array_layout(cai)
    path, data = tmp_file(4096)
    out = str(tmp_path / "out.bin")
    array = _DeviceArray(cai)
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.write, lambda a: f.pread(a).get(), lambda a: f.pwrite(a).get(), f.raw_read):
            with pytest.raises(error, match=message):
                call(array)
    with pytest.raises(error, match=message):
        gdscp.read_files([path], [array])
    with pytest.raises(error, match=message):
        gdscp.write_files([array], [out])
    assert file_bytes(path) == data and not os.path.exists(out)


@pytest.mark.parametrize(("stream", "error", "message"), [
    (-1, ValueError, r"__cuda_array_interface__\['stream'\] is -1, out of range \(0 to 2\*\*64-1\)"),
    (2**64, ValueError, r"__cuda_array_interface__\['stream'\] is 18446744073709551616, out of range"),
    ("1", TypeError, r"__cuda_array_interface__\['stream'\] must be an int \(a CUDA stream\) or None, got str '1'"),
    (2.5, TypeError, r"__cuda_array_interface__\['stream'\] must be an int \(a CUDA stream\) or None, got float 2.5"),
])
def test_a_bad_stream_in_cuda_array_interface_is_named(tmp_file, tmp_path, stream, error, message):
    """A stream that is no CUDA stream handle (one outside 0 to 2**64-1, or
    not an int) is refused with an error naming __cuda_array_interface__ and
    the value, before any stream is synchronised or any byte moves."""
    path, data = tmp_file(4096)
    out = str(tmp_path / "out.bin")
    array = _DeviceArray({**_CAI, "stream": stream})
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.write, lambda a: f.pread(a).get(), lambda a: f.pwrite(a).get()):
            with pytest.raises(error, match=message):
                call(array)
    with pytest.raises(error, match=message):
        gdscp.read_files([path], [array])
    with pytest.raises(error, match=message):
        gdscp.write_files([array], [out])
    assert file_bytes(path) == data and not os.path.exists(out)


def test_a_read_only_device_array_is_not_read_into(tmp_file):
    """A device array whose __cuda_array_interface__ says its memory is
    read-only (the second item of 'data') is refused by every call that
    would write into it, before anything moves (KvikIO writes into it)."""
    path, data = tmp_file(4096)
    array = _DeviceArray({**_CAI, "data": (4096, True)})
    message = "^cannot read into a read-only device array$"
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, lambda a: f.pread(a).get(), f.raw_read, lambda a: f.raw_read_async(a, 0)):
            with pytest.raises(ValueError, match=message):
                call(array)
    with pytest.raises(ValueError, match=r"^buffers\[0\] \(for '.*'\): cannot read into a read-only device array$"):
        gdscp.read_files([path], [array])
    assert file_bytes(path) == data


def test_cuda_array_interface_with_a_mask_is_not_implemented():
    """A mask (a masked array) is a NotImplementedError, as KvikIO raises; a
    mask of None is no mask."""
    from gdscp import _core

    cai = {"data": (8, False), "shape": (4,), "typestr": "<f8", "version": 3}
    assert _core.cuda_array_layout({**cai, "mask": None}) == (8, 32, False, True, None)
    for mask in ({**cai, "typestr": "|b1"}, np.ones(4, np.bool_), 0):
        with pytest.raises(NotImplementedError, match="__cuda_array_interface__ has a mask"):
            _core.cuda_array_layout({**cai, "mask": mask})


@pytest.mark.parametrize(("typestr", "itemsize"), [("<M8[ns]", 8), ("<m8[s]", 8), ("<M8", 8), ("<U4", 16), ("|V12", 12),
                                                   ("<c16", 16), ("|b1", 1)])
def test_cuda_array_interface_item_sizes_are_numpys(typestr, itemsize):
    """The bytes of a __cuda_array_interface__ array are its elements times
    numpy's itemsize for the typestr: a date or time's unit after its size
    (cuDF's datetime columns), four bytes to a character of a unicode string."""
    from gdscp import _core

    assert np.dtype(typestr).itemsize == itemsize
    assert _core.cuda_array_layout({"data": (8, False), "shape": (4,), "typestr": typestr})[1] == 4 * itemsize


@pytest.mark.parametrize("shape", [(2**61,), (2**61 + 1,), (2**32, 2**32), (2**62, 3)])
def test_cuda_array_interface_too_large_to_count_is_an_overflow_error(shape):
    """An array whose bytes do not fit in 63 bits is refused, where the count
    wrapped round (to 0 bytes, or a few) and the transfer moved that."""
    from gdscp import _core

    with pytest.raises(OverflowError, match="2\\*\\*63-1"):
        _core.cuda_array_layout({"data": (8, False), "shape": shape, "typestr": "<f8"})
    # An empty array is empty whatever its other extents.
    assert _core.cuda_array_layout({"data": (8, False), "shape": (0,) + shape, "typestr": "<f8"})[1] == 0


class _NullDeviceArray:
    """An array interface whose data pointer is 0 though it has bytes."""

    __cuda_array_interface__ = {"data": (0, False), "shape": (100,), "typestr": "|u1", "version": 3}


def test_a_device_array_without_memory_is_refused(tmp_file):
    """Address 0 with bytes to hold is no memory at all: refused, never a read
    that reports bytes which went nowhere (to a bulk job, 0 means no buffer)."""
    path, _ = tmp_file(1000)
    with pytest.raises(ValueError, match="data pointer is 0"):
        gdscp.read_files([path], [_NullDeviceArray()])
    with gdscp.CuFile(path, "r") as f, pytest.raises(ValueError, match="data pointer is 0"):
        f.read(_NullDeviceArray())


class _PackedDLPack:
    """A host tensor of `count` elements of `bits` bits each (lanes 1), shared
    through a hand-made DLPack capsule: elements below 8 bits lie packed, two
    4-bit floats (DLPack's kDLFloat4_e2m1fn) to a byte; other widths as
    unsigned integers."""

    class _Device(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]

    class _DType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]

    class _Tensor(ctypes.Structure):
        pass

    _Tensor._fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                        ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                        ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

    def __init__(self, memory: np.ndarray, count: int, bits: int):
        self.memory = memory
        self._shape = (ctypes.c_int64 * 1)(count)
        self._tensor = self._Tensor(memory.ctypes.data, self._Device(1, 0), 1, self._DType(17 if bits == 4 else 1, bits, 1),
                                    self._shape, None, 0, None, None)

    def __dlpack__(self, *args, **kwargs):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self._tensor), b"dltensor", None)

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize(("count", "bits", "nbytes"), [(1000, 4, 500), (1001, 4, 501), (8, 1, 1), (100, 6, 75)])
def test_dlpack_elements_below_a_byte_count_packed(tmp_file, count, bits, nbytes):
    """A DLPack tensor of elements narrower than a byte holds them packed: its
    bytes are its bits rounded up to a byte, and a read fills exactly those,
    where one byte was counted per element and the read ran on past the
    tensor's end."""
    from gdscp import _buffers

    path, data = tmp_file(4096)
    memory = np.full(count + 64, 0xA5, np.uint8)  # room past the tensor, to see a read run over
    tensor = _PackedDLPack(memory, count, bits)
    assert _buffers.resolve(tensor, writable=True).nbytes == nbytes
    with gdscp.CuFile(path) as f:
        assert f.read(tensor) == nbytes
    assert memory[:nbytes].tobytes() == data[:nbytes]
    assert memory[nbytes:].tobytes() == b"\xa5" * (len(memory) - nbytes)


class _StreamMethod:
    def __init__(self, handle):
        self.handle_value = handle

    def __cuda_stream__(self):
        return (0, self.handle_value)


class _StreamProperty:
    def __init__(self, handle):
        self.handle_value = handle

    @property
    def __cuda_stream__(self):
        return (0, self.handle_value)


class _Attribute:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


@pytest.mark.parametrize("stream, handle", [
    (None, 0), (0, 0), (7, 7), (np.uint64(9), 9), (2**64 - 1, 2**64 - 1),
    (_StreamMethod(11), 11), (_StreamProperty(12), 12),
    (_Attribute(ptr=13), 13), (_Attribute(cuda_stream=14), 14), (_Attribute(handle=ctypes.c_void_p(15)), 15),
    (_Attribute(handle=ctypes.c_void_p(None)), 0),
])
def test_stream_objects_of_every_kind_give_their_handle(stream, handle):
    from gdscp._streams import stream_handle

    assert stream_handle(stream) == handle


@pytest.mark.parametrize("stream, error, text", [
    ("5", TypeError, "str"), (2.5, TypeError, "float"), (-1, OverflowError, "stream"),
    (2**64, OverflowError, "stream"), (_StreamMethod("x"), TypeError, "stream"),
    (_Attribute(__cuda_stream__=(1, 2, 3)), TypeError, "not a (version, handle) pair"),
    (_Attribute(__cuda_stream__=lambda: None), TypeError, "not a (version, handle) pair"),
])
def test_what_is_not_a_stream_is_refused_saying_so(stream, error, text):
    from gdscp._streams import stream_handle

    with pytest.raises(error, match=re.escape(text)):
        stream_handle(stream)


class _DLPackWithoutDevice:
    """An object with __dlpack__ but no __dlpack_device__."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)


class _DLPackDeviceFails(DLPackOnly):
    """A producer whose __dlpack_device__ raises."""

    def __dlpack_device__(self):
        raise RuntimeError("the device is gone")


def test_a_dlpack_producer_that_cannot_say_where_its_tensor_lies_is_named(tmp_file, tmp_path):
    """An object with __dlpack__ but no __dlpack_device__, or whose
    __dlpack_device__ raises, is refused with a TypeError that says so (the
    producer's own exception chained), not the message for an object that is
    no buffer at all; nothing moves."""
    path, data = tmp_file(4096)
    out = str(tmp_path / "out.bin")
    target = np.zeros(4096, np.uint8)
    for obj, message in ((_DLPackWithoutDevice(target), "_DLPackWithoutDevice has __dlpack__ but no __dlpack_device__"),
                         (_DLPackDeviceFails(target), r"its __dlpack_device__\(\) failed \(RuntimeError: the device is gone\)")):
        with gdscp.CuFile(path, "r+") as f:
            for call in (f.read, f.write, lambda b: f.pread(b).get(), lambda b: f.pwrite(b).get()):
                with pytest.raises(TypeError, match=message) as info:
                    call(obj)
                if isinstance(obj, _DLPackDeviceFails):
                    assert isinstance(info.value.__cause__, RuntimeError)
        with pytest.raises(TypeError, match=message):
            gdscp.read_files([path], [obj])
        with pytest.raises(TypeError, match=message):
            gdscp.write_files([obj], [out])
    assert not target.any()
    assert file_bytes(path) == data and not os.path.exists(out)


def test_a_dlpack_tensor_with_a_bad_ndim_or_no_shape_is_a_value_error(tmp_file):
    """A DLPack tensor of ndim below 0, or of dimensions without a shape
    pointer, is a ValueError that says so, read before anything else of the
    tensor; nothing moves."""
    path, data = tmp_file(4096)
    memory = np.full(64, 0xA5, np.uint8)
    negative = _PackedDLPack(memory, 64, 8)
    negative._tensor.ndim = -1
    shapeless = _PackedDLPack(memory, 64, 8)
    shapeless._tensor.shape = None
    for tensor, message in ((negative, r"the DLPack tensor has ndim -1 \(0 or more expected\)"),
                            (shapeless, r"the DLPack tensor of 1 dimension has no shape")):
        with gdscp.CuFile(path) as f:
            for call in (f.read, lambda b: f.pread(b).get()):
                with pytest.raises(ValueError, match=message):
                    call(tensor)
        with pytest.raises(ValueError, match=message):
            gdscp.read_files([path], [tensor])
    assert memory.tobytes() == b"\xa5" * 64
    # With its ndim and shape right, the same tensor is read into.
    negative._tensor.ndim = 1
    with gdscp.CuFile(path) as f:
        assert f.read(negative) == 64
    assert memory.tobytes() == data[:64]
