"""Cached reads into host memory copied out of a mapping with streaming stores.

The copy must give exactly what the OS reads at every edge (sizes around the
1 MiB floor, unaligned file offsets and destinations, the end of the file), and
must be taken only when it should: host memory, data in the page cache,
``mapped_reads`` on and ``direct_io`` not forced.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import pytest

import gdscp
from gdscp import _core, memory
from gdscp.bench.files import drop_cache
from conftest import wait_engine_idle

MiB = 1 << 20
PAGE = mmap.PAGESIZE


def _payload(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.fixture(autouse=True)
def engine_idle():
    """The byte counter is process-wide: wait until no transfer that an earlier
    test left running (a closed handle finishes its transfers) is still moving
    bytes."""
    assert wait_engine_idle(30), "workers still busy from an earlier test"


@pytest.fixture(autouse=True)
def four_workers():
    """The chunk sizes these tests reason about: with 4 workers a request of
    several MiB splits into chunks of 1 MiB or more, the size from which a
    chunk is a mapped read. (With 16 or 32 workers, a 7-17 MiB request splits
    into chunks under 1 MiB, which pread reads.)"""
    with gdscp.defaults.set("num_threads", 4):
        yield


@pytest.fixture
def hot_file(tmp_path):
    """A 20 MiB + 4097 file, written with plain Python I/O so it sits in the
    page cache, and held there (its pages locked in memory, where the process
    may lock them) for the test: on a machine short of memory the kernel could
    otherwise evict some, and a read of them rightly goes through pread."""
    data = _payload(20 * MiB + 4097, 1)
    path = tmp_path / "hot.bin"
    path.write_bytes(data.tobytes())
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as pages:
        view = np.frombuffer(pages, np.uint8)
        span = (ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(view.nbytes))
        locked = libc.mlock(*span) == 0
        try:
            yield str(path), data
        finally:
            if locked:
                libc.munlock(*span)
            del view


def _os_read(path: str, size: int, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


@pytest.mark.parametrize("size", [MiB - 1, MiB, MiB + 1, 3 * MiB + PAGE - 1, 17 * MiB + PAGE + 1])
@pytest.mark.parametrize("offset", [0, 1, PAGE - 1, PAGE + 1, 5 * MiB + 3])
@pytest.mark.parametrize("shift", [0, 1, 15, 17])
def test_bytes_match_the_os(hot_file, size, offset, shift):
    path, _ = hot_file
    want = _os_read(path, size, offset)
    buf = np.full(size + shift + 64, 0xA5, np.uint8)
    before = _core.testing.mapped_read_bytes()
    with gdscp.CuFile(path, "r") as f:
        n = f.read(buf[shift : shift + size], file_offset=offset, task_size=4 * MiB)
    assert n == len(want)
    assert buf[shift : shift + n].tobytes() == want
    assert (buf[:shift] == 0xA5).all() and (buf[shift + size :] == 0xA5).all(), "wrote outside the buffer"
    if size >= 4 * MiB:
        assert _core.testing.mapped_read_bytes() > before, "a hot read of 4 MiB tasks did not use the mapping"


@pytest.mark.parametrize("past", [1, PAGE, 3 * MiB])
def test_reads_past_end_of_file_are_short_and_exact(hot_file, past):
    path, data = hot_file
    offset = data.nbytes - 2 * MiB - 5
    buf = np.zeros(2 * MiB + 5 + past, np.uint8)
    with gdscp.CuFile(path, "r") as f:
        n = f.read(buf, file_offset=offset)
        assert n == 2 * MiB + 5
        assert np.array_equal(buf[:n], data[offset:])
        assert (buf[n:] == 0).all()
        assert f.read(buf, file_offset=data.nbytes) == 0
        assert f.read(buf, file_offset=data.nbytes + 10 * MiB) == 0


def test_whole_file_in_many_tasks(hot_file):
    path, data = hot_file
    out = np.empty_like(data)
    before = _core.testing.mapped_read_bytes()
    with gdscp.CuFile(path, "r") as f:
        futures = [f.pread(out[i : i + 7 * MiB], file_offset=i, task_size=2 * MiB) for i in range(0, data.nbytes, 7 * MiB)]
        assert sum(fut.get() for fut in futures) == data.nbytes
    assert np.array_equal(out, data)
    assert _core.testing.mapped_read_bytes() - before >= 18 * MiB


@pytest.mark.parametrize("setting", [{"mapped_reads": False}, {"direct_io": True}], ids=["mapped_reads-off", "direct_io-on"])
def test_turned_off(hot_file, setting):
    path, data = hot_file
    out = np.empty_like(data)
    before = _core.testing.mapped_read_bytes()
    with gdscp.defaults.set(setting), gdscp.CuFile(path, "r") as f:
        assert f.read(out, task_size=4 * MiB) == data.nbytes
    assert np.array_equal(out, data)
    assert _core.testing.mapped_read_bytes() == before


def _resident_pages(path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = os.path.getsize(path)
    vec = ctypes.create_string_buffer((size + PAGE - 1) // PAGE)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw)


def test_cold_data_is_read_with_pread(hot_file):
    """Pages not in the page cache are not faulted in through the mapping
    (slower than pread's readahead): the engine reads them with pread."""
    path, data = hot_file
    drop_cache(path, use_drop_caches=False)
    if _resident_pages(path) > 0:
        pytest.skip("this filesystem keeps the file cached after POSIX_FADV_DONTNEED")
    out = np.empty_like(data)
    before = _core.testing.mapped_read_bytes()
    # One task: with several, readahead from one worker's pread may cache the
    # next chunk before its worker looks (then mapping it is right).
    with gdscp.defaults.set("num_threads", 1), gdscp.CuFile(path, "r") as f:
        assert f.read(out, task_size=64 * MiB) == data.nbytes
    assert np.array_equal(out, data)
    assert _core.testing.mapped_read_bytes() == before
    # Now cached: the same read goes through the mapping. Nothing holds the
    # pages here (the file runs cold only where the fixture's lock did not
    # take, as under AddressSanitizer, whose mlock locks nothing), and another
    # process may drop the whole machine's page cache meanwhile (as root,
    # test_kvikio_api's drop_system_page_cache does, in a sanitizer run beside
    # this one): warmed again and read again, up to three times, until a read
    # used the mapping.
    for _ in range(3):
        assert _os_read(path, data.nbytes, 0) == data.tobytes()
        with gdscp.CuFile(path, "r") as f:
            assert f.read(out, task_size=4 * MiB) == data.nbytes
        assert np.array_equal(out, data)
        if _core.testing.mapped_read_bytes() > before:
            break
    assert _core.testing.mapped_read_bytes() > before


def test_not_a_regular_file():
    """Character devices are read with pread (here /dev/zero, never mapped)."""
    before = _core.testing.mapped_read_bytes()
    out = np.full(4 * MiB, 7, np.uint8)
    with gdscp.CuFile("/dev/zero", "r") as f:
        assert f.read(out, task_size=4 * MiB) == out.nbytes
    assert (out == 0).all()
    assert _core.testing.mapped_read_bytes() == before


@pytest.mark.parametrize("path", ["/proc/version", "/proc/self/mountinfo", "/sys/kernel/mm/transparent_hugepage/enabled"])
@pytest.mark.parametrize("size", [16, 2 * MiB, 4 * MiB, 16 * MiB])
def test_files_that_report_no_size_read_their_contents(path, size):
    """procfs and sysfs files report 0 bytes but have contents: a read of any
    size gives what the OS reads (a mapped read has nothing to map there), as
    one request and as a bulk job."""
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this machine")
    fd = os.open(path, os.O_RDONLY)
    try:
        want = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    assert want and os.stat(path).st_size in (0, 4096)
    for setting in (True, False):
        with gdscp.defaults.set("mapped_reads", setting):
            buf = np.zeros(size, np.uint8)
            with gdscp.CuFile(path, "r") as f:
                assert f.read(buf) == len(want), setting
                assert f.pread(buf).get() == len(want)
            assert buf[: len(want)].tobytes() == want
            assert not buf[len(want):].any()
            buf = np.zeros(size, np.uint8)
            (result,) = gdscp.read_files([path], [buf]).results()
            assert (result.status, result.bytes) == ("done", len(want))
            assert buf[: len(want)].tobytes() == want


def test_handle_opened_for_update(tmp_path):
    """A file written and read back through one "w+" handle (the written bytes
    are in the page cache unless O_DIRECT wrote them)."""
    data = _payload(9 * MiB + 11, 3)
    path = str(tmp_path / "rw.bin")
    with gdscp.defaults.set("direct_io", False), gdscp.CuFile(path, "w+") as f:
        assert f.write(data) == data.nbytes
        out = np.empty_like(data)
        before = _core.testing.mapped_read_bytes()
        assert f.read(out, task_size=4 * MiB) == data.nbytes
    assert np.array_equal(out, data)
    assert _core.testing.mapped_read_bytes() > before


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 63, 64, 65, 4095, MiB + 3])
@pytest.mark.parametrize("src_shift, dst_shift", [(0, 0), (1, 0), (0, 1), (7, 13)])
def test_stream_copy_is_exact(size, src_shift, dst_shift):
    """The streaming copy itself (also the benchmark's host ceiling): every
    length around its 16- and 64-byte steps, any alignment, nothing outside."""
    src = _payload(size + 64, size)
    dst = np.full(size + 64, 0xA5, np.uint8)
    memory.stream_copy(dst[dst_shift : dst_shift + size], src[src_shift : src_shift + size])
    assert np.array_equal(dst[dst_shift : dst_shift + size], src[src_shift : src_shift + size])
    assert (dst[:dst_shift] == 0xA5).all() and (dst[dst_shift + size :] == 0xA5).all()


def test_stream_copy_checks_its_buffers():
    """The public copy takes buffers, not addresses: one size, a writable
    destination (a read-only one is named), contiguous memory; anything else
    is refused untouched."""
    src = _payload(4096, 1)
    dst = np.zeros(4096, np.uint8)
    with pytest.raises(ValueError, match="one size"):
        memory.stream_copy(dst[:-1], src)
    read_only = np.zeros(4096, np.uint8)
    read_only.flags.writeable = False
    for dst_ro in (bytes(4096), read_only, memoryview(bytearray(4096)).toreadonly()):
        with pytest.raises(ValueError, match=f"cannot copy into dst: the {type(dst_ro).__name__} is read-only"):
            memory.stream_copy(dst_ro, src)
    assert not read_only.any()
    with pytest.raises((TypeError, BufferError, ValueError)):
        memory.stream_copy(dst, np.zeros(8192, np.uint8)[::2])
    assert not dst.any()
    memory.stream_copy(dst, src)
    assert np.array_equal(dst, src)


def test_stream_copy_refuses_overlapping_buffers():
    """Views of one buffer that share bytes are refused untouched, whichever
    way they overlap and whatever objects view them; views that only meet
    are copied exactly."""
    a = _payload(4096, 2)
    before = a.copy()
    for dst, src in ((a[10:60], a[0:50]), (a[0:50], a[10:60]), (a[0:50], a[0:50]), (a[49:99], a[0:50]),
                     (a[1:], a[:-1])):
        with pytest.raises(ValueError, match="overlap"):
            memory.stream_copy(dst, src)
    raw = bytearray(before.tobytes())
    with pytest.raises(ValueError, match="overlap"):
        memory.stream_copy(memoryview(raw)[100:3100], np.frombuffer(raw, np.uint8)[0:3000])
    assert np.array_equal(a, before) and bytes(raw) == before.tobytes()
    memory.stream_copy(a[2048:], a[:2048])
    assert np.array_equal(a[2048:], before[:2048]) and np.array_equal(a[:2048], before[:2048])
    memory.stream_copy(a[5:5], a[5:5])  # nothing to copy
