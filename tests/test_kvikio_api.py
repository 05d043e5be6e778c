"""KvikIO's module-level interface in gdscp: Mmap, the page cache helpers,
buffer and stream registration, bounce_buffer_free, RemoteFile; the names the
package exports, what ``import gdscp`` loads, and what help() and type
checkers see. Device memory: tests/test_cufile_standin.py."""

from __future__ import annotations

import ast
import errno
import inspect
import io
import mmap
import os
import pathlib
import pydoc
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import gdscp
from conftest import random_bytes

PAGE = os.sysconf("SC_PAGESIZE")
MiB = 1 << 20


def cached(path) -> tuple[int, int]:
    return gdscp.get_page_cache_info(path)


# --------------------------------------------------------------------------
# the names
# --------------------------------------------------------------------------
# KvikIO 26.10's kvikio.__all__, less what gdscp leaves out on purpose
# (docs/kvikio-compatibility.md): its statistics, nsys and version helpers.
KVIKIO_NAMES = [
    "CompatMode", "CuFile", "Mmap", "RemoteFile", "bounce_buffer_free", "clear_page_cache", "defaults",
    "drop_file_page_cache", "drop_system_page_cache", "get_page_cache_info", "is_remote_file_available",
    "memory_deregister", "memory_register", "stream_deregister", "stream_register", "IOFuture", "IOFutureStream",
]


def test_kvikios_names_are_there():
    for name in KVIKIO_NAMES:
        assert name in gdscp.__all__, name
        assert getattr(gdscp, name) is not None
    public = {n for n in dir(gdscp) if not n.startswith("_")}
    assert set(gdscp.__all__) - {"__version__"} <= public


EMPTY = inspect.Parameter.empty
# (name, default) of each parameter, as KvikIO 26.10 declares them.
KVIKIO_SIGNATURES = {
    gdscp.get_page_cache_info: [("file", EMPTY), ("offset", 0), ("length", 0)],
    gdscp.drop_file_page_cache: [("file", EMPTY), ("offset", 0), ("length", 0), ("sync_first", True)],
    gdscp.drop_system_page_cache: [("reclaim_dentries_and_inodes", True), ("sync_first", True)],
    gdscp.clear_page_cache: [("reclaim_dentries_and_inodes", True), ("clear_dirty_pages", True)],
    gdscp.bounce_buffer_free: [],
    gdscp.memory_register: [("buf", EMPTY)],
    gdscp.memory_deregister: [("buf", EMPTY)],
    gdscp.stream_register: [("raw_stream", EMPTY), ("flags", EMPTY)],
    gdscp.stream_deregister: [("raw_stream", EMPTY)],
    gdscp.is_remote_file_available: [],
    gdscp.defaults.get: [("config_name", EMPTY)],
    gdscp.defaults.is_compat_mode_preferred: [],
    gdscp.Mmap.__init__: [("self", EMPTY), ("file_path", EMPTY), ("flags", "r"), ("initial_map_size", None),
                          ("initial_map_offset", 0), ("mode", 0o644), ("map_flags", None)],
    gdscp.Mmap.read: [("self", EMPTY), ("buf", EMPTY), ("size", None), ("offset", 0)],
    gdscp.Mmap.pread: [("self", EMPTY), ("buf", EMPTY), ("size", None), ("offset", 0), ("task_size", None)],
    gdscp.Mmap.initial_map_size: [("self", EMPTY)],
    gdscp.Mmap.initial_map_offset: [("self", EMPTY)],
    gdscp.Mmap.file_size: [("self", EMPTY)],
    gdscp.Mmap.close: [("self", EMPTY)],
    gdscp.Mmap.closed: [("self", EMPTY)],
    gdscp.CuFile.is_direct_io_supported: [("self", EMPTY)],
}


@pytest.mark.parametrize("func", list(KVIKIO_SIGNATURES), ids=lambda f: f.__qualname__)
def test_kvikios_signatures(func):
    params = inspect.signature(func).parameters.values()
    assert [(p.name, p.default) for p in params] == KVIKIO_SIGNATURES[func]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def test_kvikios_modules_are_attributes_after_import_gdscp():
    """``import kvikio`` makes its modules attributes of the package (its
    __init__ imports from them): ``kvikio.mmap.Mmap``, ``kvikio.cufile.IOFuture``
    work without importing the module by name. A fresh interpreter, where
    nothing imported them yet."""
    code = (
        "import gdscp as kvikio\n"
        "assert kvikio.mmap.Mmap is kvikio.Mmap and kvikio.cufile.IOFuture is kvikio.IOFuture\n"
        "assert kvikio.stream.stream_register is kvikio.stream_register\n"
        "assert kvikio.buffer.memory_register is kvikio.memory_register\n"
        "assert kvikio.remote_file.RemoteFile is kvikio.RemoteFile\n"
        "print(sorted({'buffer', 'cufile', 'mmap', 'remote_file', 'stream'} - set(dir(kvikio))))\n"
    )
    assert _fresh_interpreter(code) == "[]\n"


def _fresh_interpreter(code: str) -> str:
    """What ``code`` prints in a new interpreter, where nothing of gdscp is
    imported yet; it must exit 0."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        gdscp.no_such_thing  # noqa: B018
    assert not hasattr(gdscp, "http_timeout")


def test_import_gdscp_loads_nothing_heavy():
    """``import gdscp`` stays cheap (the command's start depends on it): no
    engine, numpy, Typer or Rich until a name is used."""
    code = (
        "import sys, gdscp\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'typer', 'rich', 'importlib_metadata')"
        " or m.startswith('gdscp.') or m == 'importlib.metadata')\n"
        "print(heavy)\n"
        "gdscp.CuFile\n"
        "print('gdscp._core' in sys.modules, 'gdscp.defaults' in sys.modules)\n"
    )
    out = _fresh_interpreter(code).split("\n")
    assert out[0] == "[]"
    assert out[1] == "True True"


# --------------------------------------------------------------------------
# help() and type checkers
# --------------------------------------------------------------------------
def test_help_shows_real_signatures():
    text = pydoc.render_doc(gdscp.CuFile, renderer=pydoc.plaintext)
    assert "pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0, " in text
    assert "-> gdscp.cufile.IOFuture" in text
    assert "__enter__(self) -> gdscp.cufile.CuFile" in text
    assert "-> 'CuFile'" not in text and "'IOFuture'" not in text and "\"'" not in text
    text = pydoc.render_doc(gdscp.Mmap, renderer=pydoc.plaintext)
    assert "read(self, buf: Any, size: Optional[int] = None, offset: int = 0) -> int" in text


def test_stubs_and_py_typed_are_installed_beside_the_engine():
    folder = pathlib.Path(gdscp.__file__).parent
    assert (folder / "py.typed").is_file()
    stub = folder / "_core.pyi"
    tree = ast.parse(stub.read_text())
    names = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    names |= {node.target.id for node in tree.body if isinstance(node, ast.AnnAssign)}  # constants
    assert {"Handle", "Settings", "MappedFile", "Future", "page_cache_info", "trim_pools"} <= names
    assert "testing" not in stub.read_text()  # the test hooks are not part of the interface
    from gdscp import _core

    engine = {name for name in dir(_core) if not name.startswith("_")} - {"testing"}
    assert engine <= names | {"CompatMode", "DirectIO"}


# --------------------------------------------------------------------------
# Mmap, on host memory
# --------------------------------------------------------------------------
@pytest.fixture
def mapped_file(tmp_path):
    data = random_bytes(5 * PAGE + 123, seed=11)
    path = tmp_path / "mapped.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("as_path", [str, pathlib.Path, os.fsencode])
def test_mmap_reads_the_whole_file(mapped_file, as_path):
    path, data = mapped_file
    m = gdscp.Mmap(as_path(path))
    assert (m.initial_map_size(), m.initial_map_offset(), m.file_size(), m.closed()) == (len(data), 0, len(data), False)
    buf = np.zeros(len(data), np.uint8)
    assert m.read(buf) == len(data)
    assert buf.tobytes() == data
    buf[:] = 0
    assert m.pread(buf, task_size=PAGE).get() == len(data)
    assert buf.tobytes() == data
    m.close()


@pytest.mark.parametrize("threads, task_size", [(1, None), (4, 1), (4, 1000), (3, PAGE + 1)])
def test_mmap_reads_any_range(mapped_file, threads, task_size):
    path, data = mapped_file
    with gdscp.defaults.set({"num_threads": threads, "gds_threshold": 0}), gdscp.Mmap(path) as m:
        for offset, size in [(0, 1), (1, PAGE), (PAGE - 1, 2), (3 * PAGE + 7, 2 * PAGE + 116), (len(data) - 1, 1)]:
            buf = np.full(size + 1, 0xA5, np.uint8)
            assert m.read(buf, size, offset) == size
            assert buf[:size].tobytes() == data[offset:offset + size] and buf[size] == 0xA5
            buf[:] = 0xA5
            assert m.pread(buf, size, offset, task_size).get() == size
            assert buf[:size].tobytes() == data[offset:offset + size] and buf[size] == 0xA5


def test_mmap_size_none_reads_to_the_end_of_the_file(mapped_file):
    path, data = mapped_file
    with gdscp.Mmap(path) as m:
        buf = np.zeros(len(data), np.uint8)
        assert m.read(buf, None, 1000) == len(data) - 1000
        assert buf[: len(data) - 1000].tobytes() == data[1000:]
        assert m.read(buf, 0, len(data)) == 0  # at the end: nothing, no error
        with pytest.raises(ValueError, match="larger than the buffer"):
            m.read(np.zeros(10, np.uint8), None, 0)


def test_mmap_region(mapped_file):
    path, data = mapped_file
    offset, size = PAGE + 1, 1000
    with gdscp.Mmap(path, "r", size, offset) as m:
        assert (m.initial_map_size(), m.initial_map_offset()) == (size, offset)
        buf = np.zeros(size, np.uint8)
        assert m.read(buf, size, offset) == size
        assert buf.tobytes() == data[offset:offset + size]
        assert m.read(buf, 10, offset + size - 10) == 10
        for bad_size, bad_offset in [(1, offset - 1), (size, offset + 1), (1, offset + size), (None, offset)]:
            with pytest.raises(IndexError) as info:
                m.read(buf, bad_size, bad_offset)
            assert str(offset) in str(info.value)
        with pytest.raises(IndexError, match="past the end"):
            m.read(buf, 0, len(data) + 1)
    with gdscp.Mmap(path, "r+", None, len(data) - 5) as m:
        assert m.initial_map_size() == 5


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"initial_map_offset": 10**6}, IndexError),
        ({"initial_map_size": 10**6}, IndexError),
        ({"initial_map_size": 100, "initial_map_offset": 5 * PAGE + 100}, IndexError),
        ({"initial_map_size": 0}, ValueError),
        ({"initial_map_size": -1}, OverflowError),
        ({"initial_map_offset": -1}, OverflowError),
        ({"flags": "w"}, ValueError),
        ({"flags": "a"}, ValueError),
        ({"flags": "x"}, ValueError),
        ({"flags": "q"}, ValueError),
        ({"flags": 1}, TypeError),
    ],
)
def test_mmap_bad_arguments(mapped_file, kwargs, error):
    path, data = mapped_file
    with pytest.raises(error):
        gdscp.Mmap(path, **kwargs)
    assert path.read_bytes() == data


def test_mmap_missing_file_and_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        gdscp.Mmap(tmp_path / "missing")
    assert isinstance(info.value, RuntimeError) and info.value.errno == errno.ENOENT
    assert not (tmp_path / "missing").exists()
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with gdscp.Mmap(empty) as m:
        assert (m.initial_map_size(), m.file_size()) == (0, 0)
        assert m.read(bytearray(4)) == 0


def test_mmap_bad_read_arguments(mapped_file):
    path, _ = mapped_file
    with gdscp.Mmap(path) as m:
        buf = np.zeros(100, np.uint8)
        for kwargs, error in [({"size": -1}, OverflowError), ({"offset": -1}, OverflowError),
                              ({"offset": 2**63}, OverflowError), ({"size": 101}, ValueError),
                              ({"offset": 1.5}, TypeError)]:
            with pytest.raises(error):
                m.read(buf, **{"size": 10, **kwargs})
        with pytest.raises(ValueError, match="task_size"):
            m.pread(buf, 10, 0, task_size=0)
        with pytest.raises(ValueError):
            m.read(bytes(100))  # read-only memory
        with pytest.raises(TypeError):
            m.read(42)


def test_mmap_after_close(mapped_file):
    path, _ = mapped_file
    m = gdscp.Mmap(path)
    m.close()
    assert m.closed()
    assert (m.file_size(), m.initial_map_size(), m.initial_map_offset()) == (0, 0, 0)
    for call in (lambda: m.read(bytearray(10), 10), lambda: m.pread(bytearray(10), 10)):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    m.close()  # again: nothing happens
    assert "closed" in repr(m)


def test_mmap_read_of_a_file_that_shrank_is_an_error(mapped_file):
    """Pages past the new end of the file raise SIGBUS when touched: the engine
    turns that into an exception instead of dying."""
    if os.uname().machine != "x86_64":
        pytest.skip("the SIGBUS guard is x86-64 only")
    path, data = mapped_file
    with gdscp.Mmap(path) as m:
        os.truncate(path, PAGE)
        buf = np.zeros(len(data), np.uint8)
        assert m.read(buf, PAGE, 0) == PAGE  # what is still in the file reads fine
        assert buf[:PAGE].tobytes() == data[:PAGE]
        with pytest.raises(RuntimeError, match="shrank"):
            m.read(buf, 3 * PAGE, 0)
        with pytest.raises(RuntimeError, match="shrank"):
            m.pread(buf, 3 * PAGE, 0).get()
        with pytest.raises(IndexError, match="past the end"):  # checked before any copy
            m.read(buf, PAGE, 2 * PAGE)


def test_mmap_read_ending_past_a_shrunk_files_end_is_an_error(mapped_file):
    """A read inside the region that ends past where the file now ends: the
    last page's bytes past the end read as zeros rather than faulting, and
    must not pass for data."""
    path, data = mapped_file
    with gdscp.Mmap(path) as m:
        os.truncate(path, 100)
        buf = np.zeros(PAGE, np.uint8)
        with pytest.raises(RuntimeError, match="shrank to 100 bytes"):
            m.read(buf, PAGE, 0)
        with pytest.raises(RuntimeError, match="shrank to 100 bytes"):
            m.pread(buf, PAGE, 0).get()
        assert m.read(buf, 100, 0) == 100 and buf[:100].tobytes() == data[:100]


def test_mmap_read_into_a_buffer_that_faults_blames_the_buffer(mapped_file, tmp_path):
    """A destination whose pages fault (a mapping of a file cut short since)
    is the buffer's fault, as pread's EFAULT says: not reported as the mapped
    file having shrunk, which it has not."""
    if os.uname().machine != "x86_64":
        pytest.skip("the SIGBUS guard is x86-64 only")
    path, data = mapped_file
    target = tmp_path / "target.bin"
    target.write_bytes(bytes(len(data)))

    def failure(call) -> tuple:
        # What the call raised, without its traceback, whose frames would keep
        # dst's buffer exported (and the mapping open) after the test.
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the type is checked below
            return getattr(exc, "errno", None), isinstance(exc, RuntimeError), str(exc)
        return None, False, "nothing raised"

    with open(target, "r+b") as f, mmap.mmap(f.fileno(), len(data)) as dst, gdscp.Mmap(path) as m:
        os.truncate(target, 0)  # every page of dst now faults when written
        for call in (lambda: m.read(dst), lambda: m.pread(dst, task_size=PAGE).get()):
            code, runtime_error, message = failure(call)
            assert code == errno.EFAULT and runtime_error  # a RuntimeError too, as KvikIO's callers expect
            assert "buffer" in message and "shrank" not in message, message
        assert m.file_size() == len(data)
        buf = bytearray(len(data))
        assert m.read(buf) == len(data) and bytes(buf) == data  # the mapping reads on


def test_mmap_size_none_reads_to_the_end_the_file_had_when_mapped(mapped_file):
    """As KvikIO: a file grown since it was mapped is read, with size None, to
    the end it had (the bytes the region holds)."""
    path, data = mapped_file
    with gdscp.Mmap(path) as m:
        with open(path, "ab") as f:
            f.write(b"more")
        buf = np.zeros(len(data) + 4, np.uint8)
        assert m.read(buf) == len(data) and buf[: len(data)].tobytes() == data


def test_mmap_refuses_what_has_no_pages_and_flags_that_map_something_else(mapped_file, tmp_path):
    """A FIFO is refused at once (it would wait for a writer where Ctrl-C does
    not reach), a directory as one; map_flags must map the file itself."""
    import mmap

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="cannot map a FIFO"):
        gdscp.Mmap(fifo)
    with pytest.raises(IsADirectoryError):
        gdscp.Mmap(tmp_path)
    path, _ = mapped_file
    for flags in (mmap.MAP_SHARED | mmap.MAP_ANONYMOUS, mmap.MAP_PRIVATE | 0x10, 0):
        with pytest.raises(ValueError, match="must map the file itself"):
            gdscp.Mmap(path, map_flags=flags)
    for flags in (mmap.MAP_SHARED | 2**40, -(2**31) - 1):  # past mmap(2)'s int
        with pytest.raises(OverflowError, match="map_flags"):
            gdscp.Mmap(path, map_flags=flags)
    with gdscp.Mmap(path, map_flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)) as m:
        assert m.read(np.zeros(10, np.uint8), 10) == 10


def filled_device(device, seed: int) -> bytes:
    """Writes random bytes over the whole of block device ``device`` (through
    its page cache, synced); returns them."""
    fd = os.open(device, os.O_RDWR)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        data = random_bytes(size, seed=seed)
        assert os.pwrite(fd, data, 0) == size
        os.fsync(fd)
    finally:
        os.close(fd)
    return data


def test_mmap_of_a_block_device_maps_the_device(loop_device):
    """A block device's st_size is 0: its size is the device's. Mmap maps all
    of it by default, or any region inside it, and reads its bytes as CuFile
    does; a region or read past its end raises IndexError."""
    data = filled_device(loop_device, 12)
    size = len(data)
    with gdscp.Mmap(loop_device) as m:
        assert (m.initial_map_size(), m.initial_map_offset(), m.file_size()) == (size, 0, size)
        out = np.zeros(size, np.uint8)
        assert m.read(out) == size and out.tobytes() == data
        with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}):
            out[:] = 0
            assert m.pread(out, task_size=MiB).get() == size and out.tobytes() == data
        part = bytearray(5000)
        assert m.read(part, 5000, size - 5000) == 5000 and bytes(part) == data[-5000:]
        with pytest.raises(IndexError):
            m.read(part, 10, size - 5)
    with gdscp.Mmap(loop_device, initial_map_size=PAGE, initial_map_offset=size - PAGE) as m:
        assert m.initial_map_size() == PAGE
        page = bytearray(PAGE)
        assert m.read(page, PAGE, size - PAGE) == PAGE and bytes(page) == data[-PAGE:]
    with pytest.raises(IndexError):
        gdscp.Mmap(loop_device, initial_map_size=PAGE, initial_map_offset=size)
    with gdscp.CuFile(loop_device) as f:
        out = np.zeros(size, np.uint8)
        assert f.read(out) == size and out.tobytes() == data


def test_mmap_pread_keeps_the_mapping_alive_after_close(mapped_file):
    path, data = mapped_file
    buf = np.zeros(len(data), np.uint8)
    m = gdscp.Mmap(path)
    with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}):
        future = m.pread(buf, task_size=PAGE)
        m.close()
        assert future.get() == len(data)
    assert buf.tobytes() == data


def test_mmap_close_unmaps_after_letting_go_of_its_lock(mapped_file):
    """While close() unmaps (held here just before its munmap, as the munmap
    of a large region holds it), the handle's other calls do not wait for it,
    though they hold the GIL: a read raises as closed, closed() is True, the
    sizes are 0, all while the munmap is still held."""
    from gdscp import _core

    path, _ = mapped_file
    m = gdscp.Mmap(path)
    _core.testing.arm_unmap_hold()
    closing = threading.Thread(target=m.close, daemon=True)
    closing.start()
    seen = []
    try:
        deadline = time.monotonic() + 60
        while not _core.testing.unmap_held() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _core.testing.unmap_held(), "close() never reached its munmap"
        with pytest.raises(RuntimeError, match="closed"):
            m.read(bytearray(10), 10)
        seen.append(_core.testing.unmap_held())
        seen.append((m.closed(), m.initial_map_size(), m.file_size()))
        seen.append(_core.testing.unmap_held())
    finally:
        _core.testing.disarm_fault()
        closing.join(60)
    assert not closing.is_alive()
    assert seen == [True, (True, 0, 0), True], "a call waited for close()'s munmap"


# --------------------------------------------------------------------------
# page cache helpers
# --------------------------------------------------------------------------
@pytest.fixture
def cached_file(page_cache_folder):
    """A file of 8 pages and a bit, written, synced and read back, so that
    all of its pages are in the page cache (on a filesystem that can drop them)."""
    path = page_cache_folder / "cached.bin"
    data = random_bytes(8 * PAGE + 10, seed=3)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    with open(path, "rb") as f:
        f.read()
    return path


def test_page_cache_info_and_drop(cached_file):
    assert cached(cached_file) == (9, 9)
    assert gdscp.get_page_cache_info(cached_file, PAGE + 1, 10) == (1, 1)
    assert gdscp.get_page_cache_info(cached_file, PAGE - 1, 2) == (2, 2)
    assert gdscp.get_page_cache_info(cached_file, 8 * PAGE, 10**9) == (1, 1)  # clamped to the file
    assert gdscp.get_page_cache_info(cached_file, 9 * PAGE) == (0, 0)  # past the end
    # Only pages wholly inside the range go; the kernel may cache a file in
    # folios of several pages and keep those that stick out of it.
    assert gdscp.drop_file_page_cache(cached_file, 2 * PAGE, 3 * PAGE) is None
    assert gdscp.get_page_cache_info(cached_file, 0, 2 * PAGE) == (2, 2)
    assert gdscp.get_page_cache_info(cached_file, 5 * PAGE) == (4, 4)
    gdscp.drop_file_page_cache(cached_file)
    assert cached(cached_file) == (0, 9)


def test_dropping_dirty_pages_writes_them_first(page_cache_folder):
    path = page_cache_folder / "dirty.bin"
    data = random_bytes(4 * PAGE, seed=4)
    with open(path, "wb") as f:
        f.write(data)  # not synced: the pages are dirty
    gdscp.drop_file_page_cache(path)  # sync_first=True
    assert cached(path) == (0, 4)
    assert path.read_bytes() == data


@pytest.mark.parametrize("kind", ["str", "bytes", "pathlib", "fd", "file object", "io.FileIO"])
def test_page_cache_helpers_take_paths_descriptors_and_file_objects(cached_file, kind):
    opened = []

    def arg():
        if kind == "str":
            return str(cached_file)
        if kind == "bytes":
            return os.fsencode(cached_file)
        if kind == "pathlib":
            return cached_file
        if kind == "fd":
            fd = os.open(cached_file, os.O_RDONLY)
            opened.append(fd)
            return fd
        f = open(cached_file, "rb") if kind == "file object" else io.FileIO(cached_file)
        opened.append(f)
        return f

    try:
        assert gdscp.get_page_cache_info(arg()) == (9, 9)
        gdscp.drop_file_page_cache(arg(), sync_first=False)
        assert gdscp.get_page_cache_info(arg()) == (0, 9)
    finally:
        for item in opened:
            os.close(item) if isinstance(item, int) else item.close()
    for item in opened:  # the caller's descriptors stay open until the caller closes them
        if isinstance(item, int):
            with pytest.raises(OSError):
                os.fstat(item)


@pytest.mark.parametrize("call", [gdscp.get_page_cache_info, gdscp.drop_file_page_cache])
def test_page_cache_helpers_bad_arguments(cached_file, tmp_path, call):
    with pytest.raises(FileNotFoundError) as info:
        call(tmp_path / "missing")
    assert isinstance(info.value, RuntimeError) and "missing" in str(info.value)
    with pytest.raises(OverflowError, match="offset"):
        call(cached_file, -1)
    with pytest.raises(OverflowError, match="length"):
        call(cached_file, 0, -1)
    for bad in (1.5, None, [cached_file]):  # KvikIO: ValueError; Python: TypeError
        with pytest.raises(TypeError):
            call(bad)
        with pytest.raises(ValueError):
            call(bad)
    with pytest.raises(ValueError, match="embedded null byte"):
        call(str(cached_file) + "\0x")
    # A file object with no descriptor behind it: the error says so, rather
    # than io's bare "fileno".
    for bad in (io.BytesIO(b"data"), io.StringIO("data")):
        with pytest.raises(gdscp.ArgumentError, match=f"{type(bad).__name__} has no file descriptor"):
            call(bad)
    fd = os.open(cached_file, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as info:
        call(fd)
    assert info.value.errno == errno.EBADF and isinstance(info.value, RuntimeError)
    for fd in (2**40, -(2**40)):  # not a C int, as KvikIO's binding refuses it
        with pytest.raises(OverflowError, match="file descriptor"):
            call(fd)


def test_drop_file_page_cache_leaves_pipes_alone():
    read, write = os.pipe()
    try:
        os.write(write, b"still here")
        gdscp.drop_file_page_cache(read)
        assert os.read(read, 100) == b"still here"
    finally:
        os.close(read)
        os.close(write)


def test_page_cache_helpers_do_not_wait_on_a_fifo_and_take_any_length(cached_file, tmp_path):
    """A FIFO's path is opened without waiting for a writer (it has no page
    cache: left alone, nothing cached); a length past any file's end means
    to the end."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    gdscp.drop_file_page_cache(fifo)
    assert gdscp.get_page_cache_info(fifo) == (0, 0)
    assert gdscp.get_page_cache_info(cached_file, PAGE + 1, 2**64 - 1) == (8, 8)
    assert gdscp.get_page_cache_info(cached_file, 2 * PAGE, 2**64 - PAGE) == (7, 7)
    gdscp.drop_file_page_cache(cached_file, 0, 2**63)
    assert cached(cached_file) == (0, 9)


@pytest.mark.parametrize("call", [gdscp.get_page_cache_info, gdscp.drop_file_page_cache])
def test_page_cache_helpers_leave_a_fifos_waiting_writer_alone(tmp_path, call):
    """A FIFO named by path is not opened: a writer waiting for a reader goes
    on waiting, and its bytes reach the reader that comes later, whole (an
    open and close would have released it into a FIFO without readers, to
    lose its bytes or die of SIGPIPE)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    wrote = []

    def writer():
        try:
            fd = os.open(fifo, os.O_WRONLY)  # waits for a reader
            time.sleep(0.2)
            os.write(fd, b"hello")
            os.close(fd)
            wrote.append("ok")
        except OSError as exc:
            wrote.append(exc.errno)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    time.sleep(0.2)  # the writer is waiting in its open
    assert call(fifo) == ((0, 0) if call is gdscp.get_page_cache_info else None)
    thread.join(1.0)
    assert thread.is_alive() and wrote == [], f"the writer was let go: {wrote}"
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the reader it waits for
    try:
        received = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 100)
            except BlockingIOError:
                time.sleep(0.01)
                continue
            if not chunk:  # no writer: not yet back from its open, or gone
                if wrote:
                    break
                time.sleep(0.01)
            received += chunk
    finally:
        os.close(fd)
    thread.join(30)
    assert received == b"hello" and wrote == ["ok"]


@pytest.mark.parametrize("call", [gdscp.get_page_cache_info, gdscp.drop_file_page_cache])
def test_page_cache_helpers_open_no_device_by_path(tmp_path, call, monkeypatch):
    """Character devices and sockets named by path are looked at, not
    opened: (0, 0), or left alone, as for their descriptors."""
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock"))
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(path) or real_open(path, *a, **k))
    try:
        for path in ("/dev/null", tmp_path / "sock"):
            assert call(path) == ((0, 0) if call is gdscp.get_page_cache_info else None)
    finally:
        server.close()
    assert opened == []


def test_page_cache_info_of_a_directory_is_an_is_a_directory_error(tmp_path):
    """A directory has no pages to count: IsADirectoryError (a RuntimeError,
    as KvikIO's failed mmap of it is) naming it, on any filesystem: mapping
    one fails with ENODEV on most, and procfs' directories have size 0."""
    folders = [tmp_path, pathlib.Path("/proc")] + [pathlib.Path(p) for p in ("/dev/shm",) if os.path.isdir(p)]
    for folder in folders:
        with pytest.raises(IsADirectoryError) as info:
            gdscp.get_page_cache_info(folder)
        assert isinstance(info.value, RuntimeError) and f"'{folder}'" in str(info.value)
        assert info.value.errno == errno.EISDIR and info.value.filename == str(folder)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(IsADirectoryError, match=f"file descriptor {fd}"):
                gdscp.get_page_cache_info(fd)
        finally:
            os.close(fd)
    gdscp.drop_file_page_cache(tmp_path)  # dropping a directory's pages stays possible


def test_drop_file_page_cache_errors_name_the_file(cached_file):
    """A descriptor that can do no I/O (O_PATH): the failing call and the
    descriptor are named, as get_page_cache_info names them."""
    fd = os.open(cached_file, os.O_PATH)
    try:
        for sync_first, what in ((True, "cannot sync"), (False, "cannot drop the cached pages of")):
            with pytest.raises(OSError) as info:
                gdscp.drop_file_page_cache(fd, sync_first=sync_first)
            assert isinstance(info.value, RuntimeError) and info.value.errno == errno.EBADF
            assert str(info.value) == f"{what} 'file descriptor {fd}': Bad file descriptor (errno 9)"
            assert info.value.filename == f"file descriptor {fd}"
    finally:
        os.close(fd)


def test_page_cache_info_of_a_block_device_counts_the_devices_pages(loop_device):
    """A block device's st_size is 0: its pages are those of the whole
    device, counted as a file's are."""
    size = len(filled_device(loop_device, 13))
    pages = size // PAGE
    # Open throughout: the kernel drops a block device's cached pages as its
    # last descriptor closes.
    with open(loop_device, "rb") as f:
        f.read()
        assert gdscp.get_page_cache_info(loop_device) == (pages, pages)
        assert gdscp.get_page_cache_info(loop_device, size - PAGE - 1, 10) == (2, 2)
        assert gdscp.get_page_cache_info(loop_device, size - PAGE, 10**9) == (1, 1)  # clamped to the device
        assert gdscp.get_page_cache_info(loop_device, size) == (0, 0)  # past the end
        f.seek(123)
        assert gdscp.get_page_cache_info(f) == (pages, pages) and f.tell() == 123  # its offset stays
        gdscp.drop_file_page_cache(loop_device)
        assert gdscp.get_page_cache_info(f) == (0, pages)


def test_drop_system_page_cache(cached_file, monkeypatch):
    dropped = gdscp.drop_system_page_cache(reclaim_dentries_and_inodes=False)
    assert dropped in (True, False)
    if dropped:
        assert cached(cached_file)[0] == 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert gdscp.clear_page_cache(False, False) in (True, False)
    assert [w.category for w in seen] == [FutureWarning]
    # Without root and without sudo: False, not an exception.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert gdscp.drop_system_page_cache(sync_first=False) is False


# --------------------------------------------------------------------------
# buffers, streams, remote files
# --------------------------------------------------------------------------
def test_bounce_buffer_free_returns_the_bytes_freed(tmp_file):
    """Unaligned host buffers go O_DIRECT through page-aligned bounce buffers
    (direct_io "on"); freeing the idle ones reports their bytes, then none."""
    path, data = tmp_file(4 * MiB + 4096)
    gdscp.bounce_buffer_free()
    raw = np.zeros(len(data) + 2, np.uint8)
    shift = 1 if (raw.ctypes.data + 1) % PAGE else 2
    buf = raw[shift : shift + len(data)]  # not page-aligned
    one_chunk = {"direct_io": "on", "bounce_buffer_size": MiB, "num_threads": 1, "task_size": 64 * MiB}
    with gdscp.defaults.set(one_chunk), gdscp.CuFile(path) as f:
        if not f.is_direct_io_supported():
            pytest.skip("this filesystem refuses O_DIRECT")
        assert f.read(buf) == len(data)
    assert buf.tobytes() == data
    freed = gdscp.bounce_buffer_free()
    assert freed >= MiB and freed % MiB == 0
    assert gdscp.bounce_buffer_free() == 0


def test_prepare_checks_its_arguments_before_the_gpu():
    """A workers that is no integer is a TypeError and one below 1 a
    ValueError, as documented, whether or not the GPU exists: the arguments
    are read before the GPU is looked for (GPU 10**6 exists nowhere)."""
    from gdscp.memory import DeviceError

    for device in (0, 10**6):
        for workers in ("a", 1.5, "2"):
            with pytest.raises(TypeError, match="workers") as info:
                gdscp.prepare(device, workers)
            assert not isinstance(info.value, DeviceError)
        for workers in (0, -3):
            with pytest.raises(ValueError, match="workers must be at least 1") as info:
                gdscp.prepare(device, workers)
            assert not isinstance(info.value, DeviceError)
    with pytest.raises(DeviceError):
        gdscp.prepare(10**6, 1)


def test_is_direct_io_supported_follows_direct_io(tmp_file):
    path, _ = tmp_file(10)
    with gdscp.CuFile(path) as f:
        with gdscp.defaults.set("direct_io", "off"):
            assert f.is_direct_io_supported() is False
        with gdscp.defaults.set("direct_io", "on"):
            assert f.is_direct_io_supported() is f._handle.direct_io_supported()


def test_memory_and_stream_registration_check_their_arguments():
    for buf in (np.zeros(10, np.uint8), bytearray(10), memoryview(bytearray(3))):
        assert gdscp.memory_register(buf) is None
        assert gdscp.memory_deregister(buf) is None
    def claiming(**attributes: object) -> object:
        return type("Claiming", (), attributes)()

    # An interface that describes no array is refused, as a transfer refuses it.
    malformed = [claiming(__cuda_array_interface__=5), claiming(__cuda_array_interface__="x"),
                 claiming(__cuda_array_interface__={}), claiming(__cuda_array_interface__={"data": (1 << 40, False)}),
                 claiming(__dlpack__=None), claiming(__dlpack__=5), claiming(__dlpack__=lambda self: None)]
    for bad in (5, None, "text", *malformed):
        with pytest.raises((TypeError, ValueError)) as registered:
            gdscp.memory_register(bad)
        with pytest.raises((TypeError, ValueError)) as deregistered:
            gdscp.memory_deregister(bad)
        assert type(registered.value) is type(deregistered.value)
        if bad is not None:
            with pytest.raises(type(registered.value)):
                with gdscp.CuFile(__file__) as f:
                    f.read(bad)
    # As in KvikIO, whatever the layout or the items: memory that no transfer
    # could take is still memory to register.
    strided_device = type("StridedDeviceArray", (), {"__cuda_array_interface__": {
        "shape": (4,), "strides": (8,), "typestr": "|u1", "data": (1 << 40, False), "version": 3}})()
    for buf in (np.zeros(10)[::2], np.zeros((3, 3)).T[::2], memoryview(bytearray(10))[::3],
                np.zeros(3, dtype=object), strided_device):
        assert gdscp.memory_register(buf) is None
        assert gdscp.memory_deregister(buf) is None
    assert gdscp.stream_register(0, 0) is None
    assert gdscp.stream_deregister(0) is None
    with pytest.raises(TypeError, match="raw_stream"):
        gdscp.stream_register(None, 0)
    with pytest.raises(TypeError, match="flags"):
        gdscp.stream_register(0, "now")
    # As KvikIO's binding converts them: a CUstream is a pointer, the flags an unsigned int.
    assert gdscp.stream_register(np.uint64(2**64 - 1), 2**32 - 1) is None
    for call in (lambda: gdscp.stream_register(-1, 0), lambda: gdscp.stream_register(2**64, 0),
                 lambda: gdscp.stream_deregister(-1)):
        with pytest.raises(OverflowError, match="raw_stream"):
            call()
    for flags in (-1, 2**32):
        with pytest.raises(OverflowError, match="flags"):
            gdscp.stream_register(0, flags)


def test_remote_files_are_not_supported():
    assert gdscp.is_remote_file_available() is False
    for call in (lambda: gdscp.RemoteFile(None), lambda: gdscp.RemoteFile.open_http("http://example.invalid/x"),
                 lambda: gdscp.RemoteFile.open_s3("bucket", "key"), lambda: gdscp.RemoteFile.open("s3://b/k")):
        with pytest.raises(NotImplementedError, match="remote files") as info:
            call()
        assert isinstance(info.value, RuntimeError)  # what KvikIO raises without remote support


def test_page_cache_functions_are_in_the_cufile_module_too():
    """KvikIO defines its page cache functions in ``kvikio.cufile`` (its
    ``__init__`` imports them from there): code that names that module finds
    gdscp's, the same objects as the package's."""
    code = (
        "import sys\n"
        "import gdscp as kvikio\n"
        "from gdscp.cufile import get_page_cache_info, drop_file_page_cache\n"
        "assert get_page_cache_info is kvikio.get_page_cache_info\n"
        "assert drop_file_page_cache is kvikio.drop_file_page_cache\n"
        "assert kvikio.cufile.drop_system_page_cache is kvikio.drop_system_page_cache\n"
        "assert kvikio.cufile.clear_page_cache is kvikio.clear_page_cache\n"
        "ns = {}\n"
        "exec('from gdscp.cufile import *', ns)\n"
        "assert ns['get_page_cache_info'] is kvikio.get_page_cache_info\n"
        "print(get_page_cache_info(sys.executable)[1] > 0)\n"
    )
    assert _fresh_interpreter(code) == "True\n"
    with pytest.raises(AttributeError, match="no_such_function"):
        gdscp.cufile.no_such_function  # noqa: B018


def test_mmap_maps_privately_by_default_as_kvikio(mapped_file):
    """map_flags=None means KvikIO's default, MAP_PRIVATE (a read-only private
    mapping, so no page is ever copied): /proc shows the mapping as private,
    and a change made to the file through another descriptor is read, as
    through a shared one. MAP_SHARED is still there for the asking."""
    import mmap

    path, data = mapped_file

    def mappings_of_the_file() -> list[str]:
        with open("/proc/self/maps") as maps:
            return [line.split()[1] for line in maps if line.rstrip().endswith(os.path.realpath(path))]

    with gdscp.Mmap(path) as m:
        assert mappings_of_the_file() == ["r--p"]
        with open(path, "r+b") as f:
            f.seek(100)
            f.write(b"changed")
        buf = np.zeros(len(data), np.uint8)
        assert m.read(buf) == len(data)
        assert buf.tobytes() == data[:100] + b"changed" + data[107:]
    assert mappings_of_the_file() == []
    with gdscp.Mmap(path, map_flags=mmap.MAP_SHARED):
        assert mappings_of_the_file() == ["r--s"]
