"""A program written the way KvikIO's documentation teaches, run with
``import gdscp as kvikio`` (and, on a GPU machine with KvikIO installed, with
KvikIO itself): settings, futures, stream-ordered I/O, the page cache helpers
and Mmap, checked byte for byte.

It uses only what both libraries do the same way: the ``defaults`` accessors
of older KvikIO releases only where the library has them, ``raw_read_async``'s
stream as a positional int, ``Mmap`` closed by hand. ``memory`` says what kind
of array the program runs on (``HostMemory`` below; the stand-ins' device
memory in tests/test_cufile_standin.py; CuPy in tests/test_kvikio_program.py).
"""

from __future__ import annotations

import importlib
import os
import time
import warnings

import numpy as np

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGESIZE")


class HostMemory:
    """numpy arrays."""

    device = False

    def empty(self, nbytes: int):
        return np.full(nbytes, 0xA5, np.uint8)

    def from_bytes(self, data: bytes):
        return np.frombuffer(data, np.uint8).copy()

    def to_bytes(self, array) -> bytes:
        return np.asarray(array).tobytes()

    def stream(self) -> int:
        return 0


def expect_error(errors, call) -> BaseException:
    try:
        call()
    except errors as exc:
        return exc
    raise AssertionError(f"{call} raised nothing; expected {errors}")


def run(kvikio, memory, folder: str, compat_mode=None) -> None:
    """The program. ``compat_mode``: a kvikio.CompatMode to run under (None:
    the library's own choice)."""
    # As KvikIO's documentation writes it: `import kvikio.defaults` (the package
    # does not import its defaults module by itself).
    defaults = importlib.import_module(f"{kvikio.__name__}.defaults")
    rng = np.random.default_rng(2024)
    data = rng.integers(0, 256, 2 * MiB + 12345, dtype=np.uint8).tobytes()
    path = os.path.join(folder, "kvikio-program.bin")
    before = {name: defaults.get(name) for name in ("num_threads", "task_size", "gds_threshold",
                                                   "bounce_buffer_size", "compat_mode")}

    # -- settings: get, set, with blocks that nest ---------------------------
    if compat_mode is not None:
        defaults.set("compat_mode", compat_mode)
    assert isinstance(defaults.get("compat_mode"), kvikio.CompatMode)
    assert isinstance(defaults.is_compat_mode_preferred(), bool)
    with defaults.set({"num_threads": 4, "task_size": 256 * 1024, "gds_threshold": 0}):
        assert defaults.get("num_threads") == 4
        with defaults.set("task_size", 64 * 1024):
            assert defaults.get("task_size") == 64 * 1024
        assert defaults.get("task_size") == 256 * 1024

        # -- parallel writes and reads with futures --------------------------
        a = memory.from_bytes(data)
        half = len(data) // 2
        with kvikio.CuFile(path, "w") as f:
            futures = [f.pwrite(a[:half]), f.pwrite(a[half:], file_offset=half)]
            # done() before get(): KvikIO's future is spent once get() returned.
            while not all(future.done() for future in futures):
                time.sleep(0.001)
            assert sum(future.get() for future in futures) == len(data)
        assert os.path.getsize(path) == len(data)

        b = memory.empty(len(data))
        with kvikio.CuFile(path, "r") as f:
            assert f.read(b) == len(data)
            c = memory.empty(100_000)
            future = f.pread(c, 99_999, 12_345, task_size=4096)
            while not future.done():
                time.sleep(0.001)
            assert future.get() == 99_999
        assert memory.to_bytes(b) == data
        assert memory.to_bytes(c)[:99_999] == data[12_345:112_344] and memory.to_bytes(c)[99_999] == 0xA5

        # Sizes below a page, which KvikIO accepts: the same bytes.
        with defaults.set({"task_size": 100, "bounce_buffer_size": 4095}):
            assert (defaults.get("task_size"), defaults.get("bounce_buffer_size")) == (100, 4095)
            d = memory.empty(50_001)
            with kvikio.CuFile(path, "r+") as f:
                assert f.pread(d, file_offset=7).get() == 50_001
                assert f.write(d, 10_000, len(data)) == 10_000
        assert memory.to_bytes(d) == data[7:50_008]
        with open(path, "rb") as raw:
            assert raw.read()[len(data):] == data[7:10_007]
        os.truncate(path, len(data))

    assert defaults.get("num_threads") == before["num_threads"]
    assert defaults.get("task_size") == before["task_size"]

    # -- KvikIO's older accessors, where the library still has them ------------
    if hasattr(defaults, "task_size_reset"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated since KvikIO 25.04
            old = defaults.task_size()
            defaults.task_size_reset(128 * 1024)
            assert defaults.task_size() == defaults.get("task_size") == 128 * 1024
            defaults.task_size_reset(old)
            assert defaults.num_threads() == defaults.get("num_threads")
            assert defaults.bounce_buffer_size() == defaults.get("bounce_buffer_size")

    # -- what KvikIO raises ----------------------------------------------------
    expect_error(KeyError, lambda: defaults.get("no_such_setting"))
    expect_error(ValueError, lambda: defaults.set("num_threads", 0))
    expect_error(OverflowError, lambda: defaults.set("task_size", -1))
    expect_error(TypeError, lambda: defaults.set("num_threads", "4"))
    expect_error(RuntimeError, lambda: kvikio.CuFile(os.path.join(folder, "missing.bin"), "r"))
    with kvikio.CuFile(path, "r") as f:
        small = memory.empty(16)
        expect_error(OverflowError, lambda: f.read(small, 8, -1))
        expect_error(ValueError, lambda: f.read(small, 17))
        if not memory.device:
            expect_error(ValueError, lambda: f.raw_read(small))

    # -- stream-ordered raw I/O (device memory) ----------------------------------
    if memory.device:
        stream = memory.stream()
        e = memory.empty(MiB)
        with kvikio.CuFile(path, "r+") as f:
            read = f.raw_read_async(e, stream, MiB, 4096)
            assert read.check_bytes_done() == MiB
            assert memory.to_bytes(e) == data[4096:4096 + MiB]
            written = f.raw_write_async(e, stream, 8192, len(data))
            assert written.check_bytes_done() == 8192
            assert f.raw_read(e, 4096, 0, 100) == 4096
        assert memory.to_bytes(e)[100:4196] == data[:4096]
        with open(path, "rb") as raw:
            assert raw.read()[len(data):] == data[4096:4096 + 8192]
        os.truncate(path, len(data))
        kvikio.memory_register(e)
        kvikio.memory_deregister(e)

    # -- the page cache ------------------------------------------------------------
    kvikio.drop_file_page_cache(path)
    cached, total = kvikio.get_page_cache_info(path)
    assert (cached, total) == (0, -(-len(data) // PAGE))
    with open(path, "rb") as raw:
        raw.read(PAGE)
    assert 0 < kvikio.get_page_cache_info(path)[0] <= total

    # -- Mmap -------------------------------------------------------------------------
    m = kvikio.Mmap(path, "r")
    try:
        assert (m.initial_map_size(), m.initial_map_offset(), m.file_size()) == (len(data), 0, len(data))
        g = memory.empty(len(data))
        assert m.read(g) == len(data)
        assert memory.to_bytes(g) == data
        h = memory.empty(300_000)
        assert m.pread(h, 300_000, 5, task_size=64 * 1024).get() == 300_000
        assert memory.to_bytes(h) == data[5:300_005]
    finally:
        m.close()
    assert m.closed()
    expect_error(RuntimeError, lambda: m.read(h, 10))
    region = kvikio.Mmap(path, "r", 10_000, PAGE + 1)
    try:
        k = memory.empty(10_000)
        assert region.read(k, 10_000, PAGE + 1) == 10_000
        assert memory.to_bytes(k) == data[PAGE + 1:PAGE + 10_001]
        expect_error(IndexError, lambda: region.read(k, 10, 0))
    finally:
        region.close()

    assert isinstance(kvikio.bounce_buffer_free(), int)
    defaults.set(before)
