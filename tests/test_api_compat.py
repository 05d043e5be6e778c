"""gdscp.CuFile against KvikIO's CuFile API (the seed's cufile_api_reference.txt),
signature by signature, and KvikIO programs run unchanged."""

from __future__ import annotations

import inspect
import os
import pathlib
from typing import Optional, Union

import numpy as np
import pytest

import gdscp
from conftest import as_bytes, from_bytes, random_bytes

EMPTY = inspect.Parameter.empty

# (name, default) in order, after ``self``; and the return annotation, both as
# KvikIO's Python layer declares them (EMPTY where it declares none).
_IO = [("buf", EMPTY), ("size", None), ("file_offset", 0), ("task_size", None)]
_RAW = [("buf", EMPTY), ("size", None), ("file_offset", 0), ("dev_offset", 0)]
_RAW_ASYNC = [("buf", EMPTY), ("stream", EMPTY), ("size", None), ("file_offset", 0), ("dev_offset", 0)]

CUFILE_METHODS = {
    "__init__": ([("file", EMPTY), ("flags", "r")], EMPTY),
    "close": ([], None),
    "fileno": ([], EMPTY),
    "open_flags": ([], EMPTY),
    "__enter__": ([], "CuFile"),
    "__exit__": ([("exc_type", EMPTY), ("exc_val", EMPTY), ("exc_tb", EMPTY)], None),
    "pread": (_IO, "IOFuture"),
    "pwrite": (_IO, "IOFuture"),
    "read": (_IO, int),
    "write": (_IO, int),
    "raw_read_async": (_RAW_ASYNC, "IOFutureStream"),
    "raw_write_async": (_RAW_ASYNC, "IOFutureStream"),
    "raw_read": (_RAW, int),
    "raw_write": (_RAW, int),
}

# Parameter annotations the seed gives.
ANNOTATIONS = {
    "file": Union[pathlib.Path, str],
    "flags": str,
    "size": Optional[int],
    "file_offset": int,
    "task_size": Optional[int],
    "dev_offset": int,
}

FUTURE_METHODS = {
    (gdscp.IOFuture, "get"): int,
    (gdscp.IOFuture, "done"): bool,
    (gdscp.IOFutureStream, "check_bytes_done"): int,
}

_CLASSES = {"CuFile": gdscp.CuFile, "IOFuture": gdscp.IOFuture, "IOFutureStream": gdscp.IOFutureStream}


def _resolved(annotation):
    if annotation is None:
        return None
    return _CLASSES.get(annotation, annotation)


def _signature(func) -> inspect.Signature:
    return inspect.signature(func, eval_str=True)


@pytest.mark.parametrize("name", sorted(CUFILE_METHODS))
def test_cufile_method_signature(name):
    expected_params, expected_return = CUFILE_METHODS[name]
    sig = _signature(getattr(gdscp.CuFile, name))
    params = list(sig.parameters.values())
    assert params[0].name == "self"
    got = [(p.name, p.default) for p in params[1:]]
    assert got == expected_params, f"CuFile.{name}{sig}"
    for p in params[1:]:
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"CuFile.{name}: {p.name} is {p.kind}"
        if p.name in ANNOTATIONS:
            assert p.annotation == ANNOTATIONS[p.name], f"CuFile.{name}: {p.name}: {p.annotation}"
    if expected_return is not EMPTY:
        # A quoted forward reference ("CuFile", as the seed writes it) stays a string.
        got_return = _resolved(sig.return_annotation)
        assert got_return == _resolved(expected_return), f"CuFile.{name} -> {sig.return_annotation}"


@pytest.mark.parametrize("cls, name", sorted(FUTURE_METHODS, key=lambda k: (k[0].__name__, k[1])))
def test_future_method_signature(cls, name):
    sig = _signature(getattr(cls, name))
    assert [p.name for p in sig.parameters.values()] == ["self"]
    assert sig.return_annotation == FUTURE_METHODS[(cls, name)]


def test_closed_is_a_bool_property():
    prop = inspect.getattr_static(gdscp.CuFile, "closed")
    assert isinstance(prop, property)
    assert prop.fset is None
    assert _signature(prop.fget).return_annotation is bool


def test_public_names():
    for name in ["CuFile", "IOFuture", "IOFutureStream", "defaults", "CompatMode"]:
        assert hasattr(gdscp, name), name
        assert name in gdscp.__all__
    for name in ["get", "set", "compat_mode", "num_threads", "task_size", "gds_threshold",
                 "bounce_buffer_size", "compat_mode_reset", "num_threads_reset", "task_size_reset",
                 "gds_threshold_reset", "bounce_buffer_size_reset", "is_compat_mode_preferred"]:
        assert callable(getattr(gdscp.defaults, name)), name
    assert {m.name for m in gdscp.CompatMode} >= {"ON", "OFF", "AUTO"}


def test_cufile_methods_accept_keywords(tmp_file):
    path, data = tmp_file(10_000)
    buf = np.zeros(5000, np.uint8)
    with gdscp.CuFile(file=path, flags="r+") as f:
        assert f.read(buf=buf, size=100, file_offset=5, task_size=64) == 100
        assert buf[:100].tobytes() == data[5:105]
        assert f.pread(buf=buf, size=200, file_offset=0, task_size=None).get() == 200
        assert f.write(buf=buf, size=50, file_offset=20_000, task_size=4096) == 50
        assert f.pwrite(buf=buf, size=60, file_offset=30_000, task_size=None).get() == 60


# --------------------------------------------------------------------------
# KvikIO programs, unchanged apart from the import
# --------------------------------------------------------------------------
def test_kvikio_style_program(xp, tmp_path):
    import gdscp as kvikio

    path = str(tmp_path / "test-file")
    a = xp.arange(100_000, dtype=xp.int64)

    kvikio.defaults.set({"num_threads": 4, "task_size": 64 * 1024})
    try:
        f = kvikio.CuFile(path, "w")
        f.write(a)
        f.close()
        assert f.closed

        b = xp.empty_like(a)
        with kvikio.CuFile(path, "r") as f:
            assert f.read(b) == a.nbytes
        assert bool((a == b).all())

        # Partial reads with the non-blocking API.
        c = xp.empty_like(a)
        with kvikio.CuFile(path, "r") as f:
            future1 = f.pread(c[:50_000])
            future2 = f.pread(c[50_000:], file_offset=c[:50_000].nbytes)
            assert future1.get() + future2.get() == c.nbytes
        assert bool((a == c).all())

        with kvikio.defaults.set("task_size", 4096):
            with pytest.warns(FutureWarning):  # KvikIO's older accessors warn, as KvikIO's do
                assert kvikio.defaults.task_size() == 4096
            d = xp.empty_like(a)
            with kvikio.CuFile(path, "r") as f:
                fut = f.pread(d, task_size=kvikio.defaults.get("task_size"))
                assert fut.get() == d.nbytes
                assert fut.done()
            assert bool((a == d).all())

        with pytest.warns(FutureWarning):
            assert kvikio.defaults.num_threads() == 4
        with pytest.warns(FutureWarning):
            kvikio.defaults.num_threads_reset(2)
        assert kvikio.defaults.get("num_threads") == 2

        # Code written for KvikIO catches RuntimeError.
        try:
            kvikio.CuFile(str(tmp_path / "missing"), "r")
        except RuntimeError as exc:
            assert "missing" in str(exc)
        else:
            raise AssertionError("opening a missing file did not raise")
    finally:
        kvikio.defaults.set({"num_threads": 4})


def test_kvikio_compat_mode_program(xp, tmp_path):
    import gdscp as kvikio

    data = random_bytes(1 << 20, 5)
    path = tmp_path / "compat.bin"  # a pathlib.Path, as KvikIO allows
    with kvikio.defaults.set("compat_mode", kvikio.CompatMode.ON):
        assert kvikio.defaults.get("compat_mode") == kvikio.CompatMode.ON
        assert kvikio.defaults.is_compat_mode_preferred()
        with kvikio.CuFile(path, "w") as f:
            assert f.write(from_bytes(xp, data)) == len(data)
        out = xp.zeros(len(data), dtype=xp.uint8)
        with kvikio.CuFile(path, "r") as f:
            assert f.backend == "posix"
            assert f.read(out) == len(data)
    assert as_bytes(out) == data
    assert os.path.getsize(path) == len(data)
