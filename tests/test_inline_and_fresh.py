"""Two paths of host reads that callers never choose but always take:

* small synchronous calls (``CuFile.read``/``write`` of a request that runs as
  one task on the calling thread) go straight to the engine, without a future;
* large reads into a destination not yet mapped (a fresh ``numpy.empty``) map
  it ahead of the copy, each task a stripe.

Each test checks bytes: what the call moved against the file, and that nothing
outside the range asked for changed.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import pytest

import gdscp
from conftest import random_bytes

KiB, MiB = 1 << 10, 1 << 20
POISON = 0xA5
PAGE = mmap.PAGESIZE


@pytest.fixture
def data_file(tmp_path):
    data = random_bytes(3 * 4096 + 77, seed=5)
    path = tmp_path / "small.bin"
    path.write_bytes(data)
    return str(path), data


def _poisoned(kind: str, n: int, lead: int = 3):
    """A writable buffer of ``n`` bytes of ``kind`` (and the array around it, to
    check that nothing outside it changed)."""
    whole = np.full(n + lead + 5, POISON, np.uint8)
    if kind == "ndarray":
        return whole, whole[lead : lead + n]
    if kind == "memoryview":
        return whole, memoryview(whole)[lead : lead + n]
    if kind == "subclass":  # not a plain type: through gdscp._buffers
        return whole, whole[lead : lead + n].view(np.memmap)
    if kind == "bytearray":
        ba = bytearray(bytes([POISON]) * (n + lead + 5))
        return ba, memoryview(ba)[lead : lead + n]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["ndarray", "memoryview", "subclass", "bytearray"])
@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 64 * KiB])
@pytest.mark.parametrize("offset", [0, 1, 4095, 4097])
def test_small_reads_move_exactly_the_bytes_asked_for(data_file, kind, size, offset):
    path, data = data_file
    whole, buf = _poisoned(kind, size)
    with gdscp.CuFile(path, "r") as f:
        n = f.read(buf, size, offset)
    want = data[offset : offset + size]
    assert n == len(want)
    got = bytes(whole)
    assert got[3 : 3 + n] == want
    assert got[:3] + got[3 + n :] == bytes([POISON]) * (len(got) - n)


@pytest.mark.parametrize("offset_from_end", [10, 0, -1, -4096])
def test_small_reads_at_and_past_the_end_are_short(data_file, offset_from_end):
    path, data = data_file
    offset = len(data) - offset_from_end
    whole, buf = _poisoned("ndarray", 4096)
    with gdscp.CuFile(path, "r") as f:
        n = f.read(buf, None, offset)  # size None: the whole buffer
    assert n == max(0, offset_from_end)
    got = bytes(whole)
    assert got[3 : 3 + n] == data[offset : offset + n]
    assert got[3 + n :] == bytes([POISON]) * (len(got) - 3 - n)


@pytest.mark.parametrize("size", [1, 4095, 4096, 4097])
@pytest.mark.parametrize("offset", [0, 3, 4097, 20_000])
def test_small_writes_land_where_asked(tmp_path, size, offset):
    path = tmp_path / "w.bin"
    before = random_bytes(3 * 4096, seed=9)
    path.write_bytes(before)
    new = random_bytes(size, seed=size + offset)
    for source in (np.frombuffer(new, np.uint8), new, bytearray(new), memoryview(new)):
        with gdscp.CuFile(path, "r+") as f:
            assert f.write(source, size, offset) == size
        expect = bytearray(before)
        if offset > len(expect):
            expect += bytes(offset - len(expect))
        expect[offset : offset + size] = new
        assert path.read_bytes() == bytes(expect)


def test_small_appends_go_to_the_end(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"head")
    with gdscp.CuFile(path, "a") as f:
        assert f.write(b"one", file_offset=0) == 3
        assert f.write(np.frombuffer(b"-two", np.uint8)) == 4
    assert path.read_bytes() == b"headone-two"


def test_small_calls_keep_their_errors(data_file):
    path, _ = data_file
    with gdscp.CuFile(path, "r") as f:
        for readonly in (bytes(16), memoryview(bytes(16)), np.zeros(16, np.uint8)[::1].copy()):
            if isinstance(readonly, np.ndarray):
                readonly.flags.writeable = False
            with pytest.raises(ValueError, match="read-only"):
                f.read(readonly)
        with pytest.raises(ValueError, match="contiguous"):
            f.read(np.zeros(32, np.uint8)[::2])
        with pytest.raises(OverflowError):
            f.read(bytearray(16), 4, -1)
        with pytest.raises(OverflowError):
            f.read(bytearray(16), -1)
        with pytest.raises(ValueError, match="larger than the buffer"):
            f.read(bytearray(16), 17)
        with pytest.raises(TypeError):
            f.read(bytearray(16), 4.0)
        with pytest.raises(TypeError):
            f.read(bytearray(16), 4, "0")
        # numpy integers are taken, as by the general path
        buf = bytearray(8)
        assert f.read(buf, np.uint16(8), np.int64(1)) == 8
        with pytest.raises(OSError):
            f.write(b"abc")  # opened for reading only
    with pytest.raises(ValueError, match="closed"):
        f.read(bytearray(16))


def test_which_requests_run_inline():
    s = gdscp._core.Settings()
    s.gds_threshold, s.task_size = MiB, 16 * MiB
    runs = gdscp._core.Handle.runs_inline
    assert runs(0, s) and runs(4096, s)
    assert runs(MiB - 1, s) and not runs(MiB, s)
    s.task_size = 4096
    assert runs(4096, s) and not runs(4097, s)
    s.gds_threshold = 0
    assert not runs(0, s)


def test_small_reads_with_a_task_size_take_the_general_path(data_file):
    path, data = data_file
    buf = np.zeros(5000, np.uint8)
    with gdscp.CuFile(path, "r") as f:
        assert f.read(buf, 5000, 11, task_size=1000) == 5000
    assert buf.tobytes() == data[11:5011]


# -- fresh destinations --------------------------------------------------------------
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


class FreshMemory:
    """A private anonymous mapping nobody has touched (every page reads as zero
    and none is mapped yet), as a numpy array; its pages can be asked about."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.addr = libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE,
                              mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
        assert self.addr not in (None, ctypes.c_void_p(-1).value)
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.addr))

    def resident(self, start: int, stop: int) -> list[bool]:
        """Whether each page of bytes start..stop is mapped."""
        first = start // PAGE * PAGE
        pages = (stop - first + PAGE - 1) // PAGE
        vec = ctypes.create_string_buffer(pages)
        assert libc.mincore(self.addr + first, pages * PAGE, vec) == 0
        return [bool(b & 1) for b in vec.raw]

    def close(self):
        del self.array
        libc.munmap(self.addr, self.nbytes)


@pytest.fixture
def big_file(tmp_path):
    data = random_bytes(24 * MiB + 123, seed=17)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    return str(path), data


@pytest.mark.parametrize("threads", [1, 4, 16])
@pytest.mark.parametrize("lead,offset", [(0, 0), (5, 7), (4096, 4099), (2 * MiB - 1, 1)])
def test_fresh_destinations_get_the_file(big_file, threads, lead, offset):
    """numpy.empty, never touched, at unaligned starts and ends of the array:
    mapped ahead (a few tasks) or faulted by the copies (16)."""
    path, data = big_file
    size = len(data) - offset
    with gdscp.defaults.set("num_threads", threads), gdscp.CuFile(path, "r") as f:
        raw = np.empty(lead + size + 3, np.uint8)
        assert f.read(raw[lead : lead + size], size, offset) == size
        assert raw[lead : lead + size].tobytes() == data[offset:]


@pytest.mark.parametrize("threads", [4, 16])
def test_fresh_destination_past_the_end_of_the_file_stays_unmapped(big_file, threads):
    """The read maps only the pages it fills: the rest of a buffer larger than
    the file stays unmapped (and zero)."""
    path, data = big_file
    fresh = FreshMemory(48 * MiB)
    try:
        start = 100  # unaligned in the mapping
        buf = fresh.array[start : start + 40 * MiB]
        with gdscp.defaults.set("num_threads", threads), gdscp.CuFile(path, "r") as f:
            assert f.read(buf) == len(data)
        end = start + len(data)
        # Asked before anything reads the rest (a read maps the zero page).
        assert not any(fresh.resident(end // PAGE * PAGE + PAGE, 48 * MiB))
        assert all(fresh.resident(start, end))  # what the read filled is mapped
        assert buf[: len(data)].tobytes() == data
        assert not buf[len(data) :].any()
    finally:
        fresh.close()


def test_fresh_destination_inside_a_touched_array(big_file):
    """A view into a larger array that is already mapped: only the view changes."""
    path, data = big_file
    whole = np.full(len(data) + 8192, POISON, np.uint8)
    with gdscp.defaults.set("num_threads", 4), gdscp.CuFile(path, "r") as f:
        assert f.read(whole[4097 : 4097 + len(data)]) == len(data)
    assert whole[4097 : 4097 + len(data)].tobytes() == data
    assert (whole[:4097] == POISON).all() and (whole[4097 + len(data) :] == POISON).all()


def test_fresh_shared_file_mapping_as_destination(big_file, tmp_path):
    """A writable shared mapping of another file, never touched: that file ends
    up holding the bytes read, and nothing past them changes."""
    path, data = big_file
    target = tmp_path / "target.bin"
    size = len(data) + 5 * MiB
    old = random_bytes(size, seed=3)
    target.write_bytes(old)
    with open(target, "r+b") as t:
        os.posix_fadvise(t.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        mm = mmap.mmap(t.fileno(), size)
        try:
            view = np.frombuffer(mm, np.uint8)
            with gdscp.defaults.set("num_threads", 4), gdscp.CuFile(path, "r") as f:
                assert f.read(view) == len(data)
            del view
            mm.flush()
        finally:
            mm.close()
    assert target.read_bytes() == data + old[len(data) :]


def test_large_read_only_destinations_are_refused(big_file):
    path, _ = big_file
    ro = np.zeros(16 * MiB, np.uint8)
    ro.flags.writeable = False
    with gdscp.CuFile(path, "r") as f:
        with pytest.raises(ValueError, match="read-only"):
            f.read(ro)
        with pytest.raises(ValueError, match="read-only"):
            f.pread(ro).get()
    assert not ro.any()


@pytest.mark.parametrize("task_size", [None, 1 << 20])  # the inline path, and the pool's
def test_small_preads_are_futures_that_fail_where_parallel_ones_do(data_file, task_size):
    """pread/pwrite of a small request run at once but keep the future's
    contract: bytes and failures come from get(), a closed file's or a file's
    not open for the transfer too."""
    import errno

    path, data = data_file
    buf = np.zeros(4096, np.uint8)
    with gdscp.CuFile(path, "r") as f:
        fut = f.pread(buf, 4096, 5, task_size=task_size)
        assert isinstance(fut, gdscp.IOFuture) and fut.done()
        assert fut.get() == 4096 and fut.get() == 4096 and buf.tobytes() == data[5:4101]
        assert f.pread(buf, 100, len(data) - 10, task_size=task_size).get() == 10
        gdscp._core.testing.arm_fault("pread", 0, 1, errno.EIO)
        try:
            fut = f.pread(buf, 4096, 0, task_size=task_size)  # the failure waits for get()
        finally:
            gdscp._core.testing.disarm_fault()
        assert fut.done()
        with pytest.raises(OSError) as err:
            fut.get()
        assert err.value.errno == errno.EIO and path in str(err.value)
        fut = f.pwrite(b"abc", task_size=task_size)  # opened for reading only: refused by get()
        assert fut.done()
        with pytest.raises(OSError) as err:
            fut.get()
        assert err.value.errno == errno.EBADF
    fut = f.pread(buf, task_size=task_size)
    assert fut.done()
    with pytest.raises(ValueError, match="closed"):
        fut.get()
    with gdscp.CuFile(path, "r+") as f:
        fut = f.pwrite(np.frombuffer(b"xyz", np.uint8), 3, 4097, task_size=task_size)
        assert isinstance(fut, gdscp.IOFuture) and fut.get() == 3
    assert open(path, "rb").read() == data[:4097] + b"xyz" + data[4100:]
