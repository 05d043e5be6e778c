"""CuFile on host (numpy) and device (cupy) memory, checked byte for byte
against what os.pread / os.pwrite see in the file."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gdscp
from gdscp import _core
from gdscp.bench.files import drop_cache
from conftest import POISON, as_bytes, from_bytes, poisoned, random_bytes

MiB = 1 << 20
SIZES = [0, 1, 4095, 4096, 4097, 3 * MiB + 5]
THREADS = [1, 2, 4, 16]


def file_bytes(path: str) -> bytes:
    """The whole file as os.pread sees it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        os.close(fd)


def write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.pwrite(fd, data, 0) == len(data)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_read_whole_file(xp, tmp_file, size):
    path, data = tmp_file(size)
    buf = poisoned(xp, size)
    with gdscp.CuFile(path, "r") as f:
        assert f.read(buf) == size
    assert as_bytes(buf) == data


@pytest.mark.parametrize("size", SIZES)
def test_pread_future(xp, tmp_file, size):
    path, data = tmp_file(size)
    buf = poisoned(xp, size)
    with gdscp.CuFile(path) as f:
        future = f.pread(buf)
        assert isinstance(future, gdscp.IOFuture)
        assert future.get() == size
        assert future.done()
    assert as_bytes(buf) == data


@pytest.mark.parametrize("size", SIZES)
def test_write_then_os_pread(xp, tmp_path, size):
    data = random_bytes(size, seed=size)
    path = str(tmp_path / "out.bin")
    with gdscp.CuFile(path, "w") as f:
        assert f.write(from_bytes(xp, data)) == size
    assert file_bytes(path) == data


@pytest.mark.parametrize("size", SIZES)
def test_pwrite_future(xp, tmp_path, size):
    data = random_bytes(size, seed=size + 1)
    path = str(tmp_path / "out.bin")
    with gdscp.CuFile(path, "w") as f:
        future = f.pwrite(from_bytes(xp, data))
        assert isinstance(future, gdscp.IOFuture)
        assert future.get() == size
        assert future.done()
    assert file_bytes(path) == data


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("task_size", [4096, 65536 + 3, MiB, 64 * MiB])
def test_threads_and_task_sizes(xp, tmp_path, threads, task_size):
    """Task sizes below and above the request, on pools of 1 to 16 workers;
    gds_threshold 0 so that even the small pieces go through the pool."""
    size = 3 * MiB + 4097
    data = random_bytes(size, seed=threads * 7 + task_size)
    path = str(tmp_path / "t.bin")
    with gdscp.defaults.set({"num_threads": threads, "gds_threshold": 0}):
        with gdscp.CuFile(path, "w+") as f:
            assert f.write(from_bytes(xp, data), task_size=task_size) == size
            assert file_bytes(path) == data
            buf = poisoned(xp, size)
            assert f.read(buf, task_size=task_size) == size
            assert as_bytes(buf) == data
            # A range in the middle, through the future.
            part = poisoned(xp, MiB + 13)
            assert f.pread(part, file_offset=12345, task_size=task_size).get() == MiB + 13
            assert as_bytes(part) == data[12345 : 12345 + MiB + 13]


@pytest.mark.parametrize("task_size", [1, 3])
def test_tiny_task_sizes(xp, tmp_file, task_size):
    path, data = tmp_file(10_001)
    buf = poisoned(xp, 10_001)
    with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}), gdscp.CuFile(path, "r+") as f:
        assert f.read(buf, task_size=task_size) == 10_001
        assert as_bytes(buf) == data
        assert f.write(buf[::-1].copy(), task_size=task_size) == 10_001
    assert file_bytes(path) == data[::-1]


def test_num_threads_setting_reaches_engine():
    for n in THREADS:
        with gdscp.defaults.set("num_threads", n):
            assert gdscp.defaults.get("num_threads") == n
            assert _core.num_threads() == n


@pytest.mark.parametrize("file_offset", [1, 511, 4095, 4097, 1_000_003])
@pytest.mark.parametrize("view_start", [0, 3, 1000])
def test_unaligned_read(xp, tmp_file, file_offset, view_start):
    path, data = tmp_file(2 * MiB + 123)
    size = MiB + 77
    backing = poisoned(xp, view_start + size + 50)
    view = backing[view_start:]
    with gdscp.defaults.set("gds_threshold", 0), gdscp.CuFile(path) as f:
        assert f.read(view, size, file_offset, task_size=65536) == size
    got = as_bytes(backing)
    assert got[view_start : view_start + size] == data[file_offset : file_offset + size]
    assert got[:view_start] == bytes([POISON]) * view_start
    assert got[view_start + size :] == bytes([POISON]) * 50


@pytest.mark.parametrize("file_offset", [1, 4095, 4097, 1_000_003])
@pytest.mark.parametrize("view_start", [3, 1000])
def test_unaligned_write(xp, tmp_file, file_offset, view_start):
    path, original = tmp_file(2 * MiB + 123)
    size = MiB + 77
    new = random_bytes(view_start + size, seed=file_offset + view_start)
    src = from_bytes(xp, new)[view_start:]
    with gdscp.defaults.set("gds_threshold", 0), gdscp.CuFile(path, "r+") as f:
        assert f.write(src, size, file_offset, task_size=65536) == size
    expect = bytearray(original)
    expect[file_offset : file_offset + size] = new[view_start:]
    assert file_bytes(path) == bytes(expect)


def test_write_beyond_end_leaves_hole_of_zeros(xp, tmp_file):
    path, original = tmp_file(1000)
    data = random_bytes(5000, seed=3)
    with gdscp.CuFile(path, "r+") as f:
        assert f.write(from_bytes(xp, data), file_offset=10_000) == 5000
    assert file_bytes(path) == original + bytes(9000) + data


# --------------------------------------------------------------------------
# end of file
# --------------------------------------------------------------------------
@pytest.mark.parametrize("file_size", [1, 4097, 3 * MiB + 5])
@pytest.mark.parametrize("task_size", [4096, 4 * MiB])
def test_read_past_eof_is_short_and_leaves_rest(xp, tmp_file, file_size, task_size):
    path, data = tmp_file(file_size)
    extra = 3 * 4096 + 7
    buf = poisoned(xp, file_size + extra)
    with gdscp.defaults.set("gds_threshold", 0), gdscp.CuFile(path) as f:
        assert f.read(buf, task_size=task_size) == file_size
    got = as_bytes(buf)
    assert got[:file_size] == data
    assert got[file_size:] == bytes([POISON]) * extra


def test_read_straddling_eof(xp, tmp_file):
    path, data = tmp_file(10_000)
    buf = poisoned(xp, 100)
    with gdscp.CuFile(path) as f:
        assert f.read(buf, 100, 9_990) == 10
    got = as_bytes(buf)
    assert got[:10] == data[-10:]
    assert got[10:] == bytes([POISON]) * 90


@pytest.mark.parametrize("offset_past_end", [0, 1, 4096, 10 * MiB])
def test_read_at_or_beyond_eof_returns_zero(xp, tmp_file, offset_past_end):
    path, _ = tmp_file(5000)
    buf = poisoned(xp, 8192)
    with gdscp.CuFile(path) as f:
        assert f.read(buf, file_offset=5000 + offset_past_end) == 0
        assert f.pread(buf, file_offset=5000 + offset_past_end).get() == 0
    assert as_bytes(buf) == bytes([POISON]) * 8192


def test_read_empty_file(xp, tmp_file):
    path, _ = tmp_file(0)
    buf = poisoned(xp, 4096)
    with gdscp.CuFile(path) as f:
        assert f.read(buf) == 0
    assert as_bytes(buf) == bytes([POISON]) * 4096


# --------------------------------------------------------------------------
# size argument
# --------------------------------------------------------------------------
def test_size_none_means_whole_buffer(xp, tmp_file):
    path, data = tmp_file(10_000)
    buf = poisoned(xp, 6000)
    with gdscp.CuFile(path) as f:
        assert f.read(buf, None, 100) == 6000
    assert as_bytes(buf) == data[100:6100]


def test_size_smaller_than_buffer_touches_only_size(xp, tmp_file, tmp_path):
    path, data = tmp_file(10_000)
    buf = poisoned(xp, 6000)
    with gdscp.CuFile(path) as f:
        assert f.read(buf, 2500) == 2500
    got = as_bytes(buf)
    assert got[:2500] == data[:2500]
    assert got[2500:] == bytes([POISON]) * 3500

    out = str(tmp_path / "partial.bin")
    src = from_bytes(xp, data)
    with gdscp.CuFile(out, "w") as f:
        assert f.write(src, 777, 0) == 777
    assert file_bytes(out) == data[:777]


def test_dtype_size_counts_bytes_not_elements(xp, tmp_file):
    path, data = tmp_file(8000)
    buf = xp.zeros(1000, dtype=xp.float64)
    with gdscp.CuFile(path) as f:
        assert f.read(buf) == 8000
    assert as_bytes(buf) == data


# --------------------------------------------------------------------------
# open flags (as Python's open())
# --------------------------------------------------------------------------
def test_flag_r_reads_and_refuses_writes(tmp_file):
    path, data = tmp_file(100)
    with gdscp.CuFile(path, "r") as f:
        buf = np.empty(100, np.uint8)
        assert f.read(buf) == 100
        with pytest.raises(OSError) as info:
            f.write(buf)
        assert isinstance(info.value, RuntimeError)
        assert path in str(info.value)
    assert file_bytes(path) == data


def test_default_flag_is_read_only(tmp_file):
    path, _ = tmp_file(100)
    with gdscp.CuFile(path) as f:
        assert f.open_flags() & os.O_ACCMODE == os.O_RDONLY
        with pytest.raises(OSError):
            f.pwrite(np.zeros(10, np.uint8)).get()


def test_flag_w_truncates_creates_and_refuses_reads(tmp_file, tmp_path):
    path, _ = tmp_file(10_000)
    with gdscp.CuFile(path, "w") as f:
        assert os.path.getsize(path) == 0
        with pytest.raises(OSError) as info:
            f.read(np.empty(10, np.uint8))
        assert isinstance(info.value, RuntimeError)
        assert path in str(info.value)
        assert f.write(np.frombuffer(b"hello", np.uint8)) == 5
    assert file_bytes(path) == b"hello"

    fresh = str(tmp_path / "new.bin")
    with gdscp.CuFile(fresh, "w") as f:
        pass
    assert os.path.exists(fresh) and os.path.getsize(fresh) == 0


def test_flag_x_creates_or_refuses_existing(tmp_file, tmp_path):
    path, data = tmp_file(100)
    with pytest.raises(FileExistsError) as info:
        gdscp.CuFile(path, "x")
    assert isinstance(info.value, RuntimeError)
    assert path in str(info.value)
    assert file_bytes(path) == data

    fresh = str(tmp_path / "x.bin")
    with gdscp.CuFile(fresh, "x") as f:
        assert f.write(np.frombuffer(b"abc", np.uint8)) == 3
        with pytest.raises(OSError):
            f.read(np.empty(3, np.uint8))
    assert file_bytes(fresh) == b"abc"


def test_flag_x_plus_reads_back(tmp_path):
    fresh = str(tmp_path / "xp.bin")
    with gdscp.CuFile(fresh, "x+") as f:
        f.write(np.frombuffer(b"abcdef", np.uint8))
        buf = np.empty(6, np.uint8)
        assert f.read(buf) == 6
    assert buf.tobytes() == b"abcdef"


def test_flag_a_appends_ignoring_offset(xp, tmp_file, tmp_path):
    path, data = tmp_file(5000)
    first = random_bytes(3000, seed=1)
    second = random_bytes(MiB + 5, seed=2)
    with gdscp.CuFile(path, "a") as f:
        assert f.write(from_bytes(xp, first), file_offset=0) == 3000
        assert f.pwrite(from_bytes(xp, second), file_offset=17, task_size=65536).get() == MiB + 5
        with pytest.raises(OSError):
            f.read(poisoned(xp, 10))
    assert file_bytes(path) == data + first + second

    fresh = str(tmp_path / "a.bin")
    with gdscp.CuFile(fresh, "a") as f:
        f.write(from_bytes(xp, first))
    assert file_bytes(fresh) == first


def test_flag_a_sees_appends_made_by_others(tmp_file):
    path, data = tmp_file(100)
    with gdscp.CuFile(path, "a") as f:
        with open(path, "ab") as other:
            other.write(b"xyz")
        f.write(np.frombuffer(b"123", np.uint8))
    assert file_bytes(path) == data + b"xyz" + b"123"


def test_flag_a_plus_reads_and_appends(tmp_file):
    path, data = tmp_file(4097)
    with gdscp.CuFile(path, "a+") as f:
        buf = np.empty(4097, np.uint8)
        assert f.read(buf) == 4097
        assert buf.tobytes() == data
        assert f.write(np.frombuffer(b"tail", np.uint8), file_offset=0) == 4
    assert file_bytes(path) == data + b"tail"


def test_flag_r_plus_keeps_content(xp, tmp_file):
    path, data = tmp_file(10_000)
    patch = random_bytes(100, seed=9)
    with gdscp.CuFile(path, "r+") as f:
        assert f.write(from_bytes(xp, patch), file_offset=5000) == 100
        buf = poisoned(xp, 10_000)
        assert f.read(buf) == 10_000
    expect = data[:5000] + patch + data[5100:]
    assert as_bytes(buf) == expect
    assert file_bytes(path) == expect


def test_flag_r_plus_needs_existing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        gdscp.CuFile(str(tmp_path / "nope"), "r+")


def test_flag_w_plus_truncates_and_reads_back(xp, tmp_file):
    path, _ = tmp_file(10_000)
    data = random_bytes(4097, seed=4)
    with gdscp.CuFile(path, "w+") as f:
        assert os.path.getsize(path) == 0
        f.write(from_bytes(xp, data))
        buf = poisoned(xp, 5000)
        assert f.read(buf) == 4097
    assert as_bytes(buf)[:4097] == data
    assert file_bytes(path) == data


@pytest.mark.parametrize(
    "flags, access",
    [
        ("r", os.O_RDONLY),
        ("w", os.O_WRONLY),
        ("a", os.O_WRONLY),
        ("r+", os.O_RDWR),
        ("w+", os.O_RDWR),
        ("a+", os.O_RDWR),
        ("rb", os.O_RDONLY),
        ("wb+", os.O_RDWR),
    ],
)
def test_open_flags_match_descriptor(tmp_file, flags, access):
    path, _ = tmp_file(10)
    with gdscp.CuFile(path, flags) as f:
        got = f.open_flags()
        assert got == fcntl.fcntl(f.fileno(), fcntl.F_GETFL)
        assert got & os.O_ACCMODE == access
        # The buffered descriptor: O_DIRECT lives on the second one only.
        assert not got & os.O_DIRECT


def test_open_flags_x(tmp_path):
    with gdscp.CuFile(str(tmp_path / "x"), "x") as f:
        assert f.open_flags() & os.O_ACCMODE == os.O_WRONLY


def test_fileno_is_the_file(tmp_file):
    path, data = tmp_file(5000)
    with gdscp.CuFile(path) as f:
        fd = f.fileno()
        assert isinstance(fd, int) and fd >= 0
        assert os.fstat(fd).st_ino == os.stat(path).st_ino
        assert os.pread(fd, 100, 10) == data[10:110]
        assert os.get_inheritable(fd) is False


def test_pathlib_path(tmp_file):
    import pathlib

    path, data = tmp_file(300)
    with gdscp.CuFile(pathlib.Path(path)) as f:
        buf = bytearray(300)
        assert f.read(buf) == 300
        assert f.name == path
    assert bytes(buf) == data


# --------------------------------------------------------------------------
# closing
# --------------------------------------------------------------------------
def test_closed_property_and_close(tmp_file):
    path, _ = tmp_file(10)
    f = gdscp.CuFile(path)
    assert f.closed is False
    f.close()
    assert f.closed is True
    f.close()  # a second close is harmless, as for Python files
    assert f.closed is True


def test_context_manager_closes_even_on_error(tmp_file):
    path, _ = tmp_file(10)
    with gdscp.CuFile(path) as f:
        assert f.closed is False
    assert f.closed
    with pytest.raises(KeyError):
        with gdscp.CuFile(path) as g:
            raise KeyError("boom")
    assert g.closed


def test_close_releases_descriptor(tmp_file):
    path, _ = tmp_file(10)
    f = gdscp.CuFile(path)
    fd = f.fileno()
    f.close()
    with pytest.raises(OSError) as info:
        os.fstat(fd)
    assert info.value.errno == errno.EBADF


def test_close_with_transfer_in_flight(tmp_file):
    """Closing while a pread runs: the transfer still finishes with the right bytes."""
    path, data = tmp_file(8 * MiB)
    buf = np.empty(8 * MiB, np.uint8)
    with gdscp.defaults.set("num_threads", 4):
        f = gdscp.CuFile(path)
        future = f.pread(buf, task_size=256 * 1024)
        f.close()
        assert future.get() == 8 * MiB
    assert buf.tobytes() == data


# --------------------------------------------------------------------------
# futures
# --------------------------------------------------------------------------
def test_many_preads_in_flight(xp, tmp_file):
    size = 4 * MiB + 3
    path, data = tmp_file(size)
    buf = poisoned(xp, size)
    pieces = 37
    bounds = [size * i // pieces for i in range(pieces + 1)]
    with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}), gdscp.CuFile(path) as f:
        futures = [
            f.pread(buf[lo:hi], hi - lo, lo, task_size=16384) for lo, hi in zip(bounds, bounds[1:])
        ]
        counts = [fut.get() for fut in futures]
        assert all(fut.done() for fut in futures)
    assert counts == [hi - lo for lo, hi in zip(bounds, bounds[1:])]
    assert as_bytes(buf) == data


def test_many_pwrites_in_flight(xp, tmp_path):
    size = 4 * MiB + 3
    data = random_bytes(size, seed=11)
    src = from_bytes(xp, data)
    path = str(tmp_path / "many.bin")
    pieces = 29
    bounds = [size * i // pieces for i in range(pieces + 1)]
    with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}), gdscp.CuFile(path, "w") as f:
        futures = [f.pwrite(src[lo:hi], hi - lo, lo, task_size=8192) for lo, hi in zip(bounds, bounds[1:])]
        assert sum(fut.get() for fut in futures) == size
    assert file_bytes(path) == data


def test_future_get_twice_and_done(tmp_file):
    path, _ = tmp_file(4 * MiB)
    buf = np.empty(4 * MiB, np.uint8)
    with gdscp.CuFile(path) as f:
        future = f.pread(buf, task_size=65536)
        assert future.get() == 4 * MiB
        assert future.done() is True
        assert future.get() == 4 * MiB


@pytest.mark.parametrize("ends_by", ["get", "done"])
@pytest.mark.parametrize("write", [False, True], ids=["pread", "pwrite"])
def test_a_finished_future_lets_go_of_its_buffer(tmp_file, ends_by, write):
    """Once a parallel transfer has ended (get() returned, or done() said so),
    its buffer is the caller's again: a bytearray can grow, though the future
    is still held."""
    path, data = tmp_file(4 * MiB)
    buf = bytearray(os.urandom(4 * MiB)) if write else bytearray(4 * MiB)
    expected = bytes(buf) if write else data
    with gdscp.CuFile(path, "r+") as f:
        future = (f.pwrite if write else f.pread)(buf, task_size=65536)
        if ends_by == "get":
            assert future.get() == 4 * MiB
        else:
            while not future.done():
                time.sleep(0.001)
        buf.extend(b"x")  # BufferError while anything still holds an export of it
        assert future.get() == 4 * MiB
    assert bytes(buf[:-1]) == expected == file_bytes(path)


# --------------------------------------------------------------------------
# O_DIRECT
# --------------------------------------------------------------------------
@pytest.fixture(params=["tmp_path", "dev_shm"])
def direct_dir(request, tmp_path):
    """A directory on the test's filesystem, and one on tmpfs (which refuses O_DIRECT)."""
    if request.param == "tmp_path":
        yield str(tmp_path)
        return
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)):
        pytest.skip("no writable /dev/shm")
    folder = tempfile.mkdtemp(prefix="gdscp-test-", dir="/dev/shm")
    try:
        yield folder
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


@pytest.mark.parametrize("mode", ["on", "auto"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("file_offset", [0, 4096, 3, 4097])
@pytest.mark.parametrize("view_start", [0, 3])
def test_direct_io_same_bytes(xp, direct_dir, mode, threads, file_offset, view_start):
    size = 4 * MiB + 4099
    data = random_bytes(file_offset + size + 10_000, seed=file_offset + view_start)
    path = os.path.join(direct_dir, "direct.bin")
    write_file(path, data)
    drop_cache(path, use_drop_caches=False)
    # A page-aligned host allocation, so that view_start=0 really is aligned.
    backing = poisoned(xp, size + 8192 + view_start)
    if xp is np:
        shift = (-backing.ctypes.data) % 4096
        backing = backing[shift:]
    view = backing[view_start : view_start + size]
    new = random_bytes(size, seed=99 + file_offset)
    with gdscp.defaults.set({"direct_io": mode, "num_threads": threads}):
        with gdscp.CuFile(path, "r+") as f:
            assert f.read(view, size, file_offset) == size
            assert as_bytes(view) == data[file_offset : file_offset + size]
            # Past end of file, through the O_DIRECT path too.
            drop_cache(path, use_drop_caches=False)
            tail = poisoned(xp, 3 * MiB)
            n = len(data) - (2 * MiB + 1)
            assert f.read(tail, file_offset=2 * MiB + 1) == n
            assert as_bytes(tail)[:n] == data[2 * MiB + 1 :]
            assert as_bytes(tail)[n:] == bytes([POISON]) * (3 * MiB - n)

            src = from_bytes(xp, bytes(view_start) + new)[view_start:]
            assert f.write(src, size, file_offset) == size
    expect = bytearray(data)
    expect[file_offset : file_offset + size] = new
    assert file_bytes(path) == bytes(expect)


def test_direct_io_write_extends_file(direct_dir):
    size = 6 * MiB + 1
    data = random_bytes(size, seed=5)
    path = os.path.join(direct_dir, "grow.bin")
    buf = np.frombuffer(data, np.uint8)
    with gdscp.defaults.set({"direct_io": "on", "num_threads": 2}), gdscp.CuFile(path, "w") as f:
        assert f.write(buf) == size
    assert file_bytes(path) == data


@pytest.mark.parametrize("file_size", [3 * MiB + 5, 3 * MiB, 2 * MiB + 4096 * 7 + 1])
@pytest.mark.parametrize("task_size", [MiB, 8 * MiB])
def test_direct_io_read_past_eof_leaves_rest_of_aligned_memory(tmp_path, file_size, task_size):
    """A read into page-aligned host memory with direct_io "on" that runs past
    the end of the file: the bytes after the count stay as they were. An
    O_DIRECT read reaching the end writes zeros into the memory past it (on
    ext4 to the end of the request): 1 MiB - 5 bytes of a 3 MiB + 5 file read
    into 8 MiB were zeroed."""
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    data = random_bytes(file_size, seed=31)
    path = str(tmp_path / "short.bin")
    write_file(path, data)
    room = 8 * MiB
    raw = np.full(room + 4096, POISON, np.uint8)
    start = -raw.ctypes.data % 4096
    buf = raw[start : start + room]
    assert buf.ctypes.data % 4096 == 0
    settings = {"direct_io": "on", "gds_threshold": 0, "num_threads": 2, "mapped_reads": False}
    with gdscp.defaults.set(settings), gdscp.CuFile(path) as f:
        assert f.is_direct_io_supported()
        assert f.read(buf, task_size=task_size) == file_size
        assert buf[:file_size].tobytes() == data
        assert buf[file_size:].tobytes() == bytes([POISON]) * (room - file_size)
        tail = buf[: 2 * MiB]
        tail[:] = POISON
        assert f.pread(tail, file_offset=file_size - 10, task_size=task_size).get() == 10
        assert tail[:10].tobytes() == data[-10:]
        assert tail[10:].tobytes() == bytes([POISON]) * (2 * MiB - 10)


# A buffer whose pages fault (a mapping of a file cut short since) handed to an
# O_DIRECT transfer from unaligned memory, which copies it through an aligned
# staging buffer. Run in a child: before that copy was guarded, the SIGBUS
# ended the process.
_FAULTING_BUFFER_PROGRAM = """
import mmap, os, sys
import gdscp
call, path, target = sys.argv[1:]
# O_DIRECT asked for: the default ("auto") leaves the choice to the machine's
# file system and measurements, and only O_DIRECT stages through aligned memory.
size = (32 if call == "write_files" else 6) << 20
with open(target, "r+b") as t, mmap.mmap(t.fileno(), size + 4096) as pages:
    os.truncate(target, 0)  # every page of the mapping now faults when touched
    view = memoryview(pages)[1 : size + 1]  # unaligned: copied through staging
    settings = {"direct_io": "on", "num_threads": 1, "task_size": size, "mapped_reads": False}
    try:
        if call == "write_files":
            with gdscp.defaults.set(settings):
                (result,) = gdscp.write_files([view], [path]).results()
            print(result.errno, result.status == "failed", result.error)
        else:
            with gdscp.defaults.set(settings), gdscp.CuFile(path, "r" if call == "read" else "w") as f:
                assert f.is_direct_io_supported()
                getattr(f, call)(view)
            print("nothing raised")
    except OSError as exc:
        print(exc.errno, isinstance(exc, RuntimeError), exc)
    del view
"""


@pytest.mark.parametrize("call", ["read", "write", "write_files"])
def test_direct_io_through_a_buffer_that_faults_is_efault(tmp_path, call):
    """Copying between such a buffer and the staging buffer is a failed
    transfer (EFAULT, as pread and pwrite report such memory), not the
    process killed by SIGBUS; a failed write_files leaves no file."""
    if os.uname().machine != "x86_64":
        pytest.skip("the SIGBUS guard is x86-64 only")
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644))
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    os.unlink(probe)
    path = str(tmp_path / "file.bin")
    if call == "read":
        write_file(path, random_bytes(6 * MiB + 4096, seed=41))
    target = tmp_path / "target.bin"
    target.write_bytes(bytes(32 * MiB + 4096))
    child = subprocess.run([sys.executable, "-c", _FAULTING_BUFFER_PROGRAM, call, path, str(target)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert child.returncode == 0, f"the child ended with {child.returncode}: {child.stderr[-2000:]}"
    code, runtime_error, message = child.stdout.strip().split(" ", 2)
    assert (int(code), runtime_error) == (errno.EFAULT, "True"), child.stdout
    assert "O_DIRECT" in message and path in message, message
    if call == "write_files":
        assert sorted(os.listdir(tmp_path)) == ["target.bin"]  # neither the file nor a temporary


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------
def test_missing_file_is_file_not_found_and_runtime_error(tmp_path):
    missing = str(tmp_path / "does-not-exist.bin")
    with pytest.raises(FileNotFoundError) as info:
        gdscp.CuFile(missing)
    assert isinstance(info.value, RuntimeError)
    assert info.value.errno == errno.ENOENT
    assert missing in str(info.value)
    with pytest.raises(RuntimeError):  # how KvikIO code catches it
        gdscp.CuFile(missing, "r")


def test_os_errors_survive_pickling(tmp_path):
    """A process pool's worker sends its failure back pickled: gdscp's OS
    errors (made per errno, both the OSError subclass and RuntimeError) come
    back as themselves, with their fields and message."""
    import pickle

    missing = str(tmp_path / "does-not-exist.bin")
    with pytest.raises(FileNotFoundError) as info:
        gdscp.CuFile(missing)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is type(info.value) and isinstance(copy, RuntimeError)
    assert (copy.errno, copy.strerror, copy.filename, copy.args) == (
        info.value.errno, info.value.strerror, info.value.filename, info.value.args)
    assert str(copy) == str(info.value) and missing in str(copy)
    bad = gdscp.EnvironmentVariableError("GDSCP_TASK_SIZE='x' is not valid", "GDSCP_TASK_SIZE")
    copy = pickle.loads(pickle.dumps(bad))
    assert type(copy) is gdscp.EnvironmentVariableError
    assert (str(copy), copy.variable) == (str(bad), "GDSCP_TASK_SIZE")


def test_missing_directory_for_write(tmp_path):
    target = str(tmp_path / "no-such-dir" / "f.bin")
    with pytest.raises(FileNotFoundError) as info:
        gdscp.CuFile(target, "w")
    assert target in str(info.value)


@pytest.mark.parametrize("flags", ["r", "r+", "w", "a"])
def test_directory_is_rejected(tmp_path, flags):
    with pytest.raises(IsADirectoryError) as info:
        gdscp.CuFile(str(tmp_path), flags)
    assert isinstance(info.value, RuntimeError)
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize("flags", ["r", "r+", "w", "a"])
def test_a_fifo_is_refused_at_once(tmp_path, flags):
    """A FIFO has no offsets: refused as it is opened, without waiting for its
    other end (a wait that Ctrl-C could not end), and without a reader or a
    writer ever seeing an open."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as info:
        gdscp.CuFile(str(fifo), flags)
    assert info.value.errno == errno.ESPIPE
    assert "FIFO" in str(info.value) and str(fifo) in str(info.value)


def test_a_socket_is_refused(tmp_path):
    import socket

    path = str(tmp_path / "sock")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        with pytest.raises(OSError) as info:
            gdscp.CuFile(path, "r")
    # Linux refuses to open a socket (ENXIO) before gdscp sees it.
    assert info.value.errno in (errno.ESPIPE, errno.ENXIO)
    assert path in str(info.value)


def test_a_character_device_reads_as_open_would(tmp_path):
    """Opened without blocking to see what it is, a device is then read with
    blocking reads, as Python's open() reads it."""
    buf = bytearray(b"\xff" * 10000)
    with gdscp.CuFile("/dev/zero", "r") as f:
        assert os.get_blocking(f.fileno())
        assert f.read(buf) == len(buf)
    assert buf == bytes(len(buf))


@pytest.mark.parametrize("flags", ["w", "w+", "a", "x"])
def test_an_open_that_fails_for_want_of_cufile_leaves_the_file(tmp_path, flags):
    """compat_mode OFF where cuFile cannot take the file (no libcufile, or a
    filesystem without O_DIRECT): the open fails, and the file it would have
    truncated keeps its bytes, the one it would have created is not there."""
    folder = str(tmp_path)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        folder = tempfile.mkdtemp(prefix="gdscp-test-", dir="/dev/shm")  # tmpfs: no O_DIRECT, so no cuFile
    try:
        kept = os.path.join(folder, "kept.bin")
        write_file(kept, b"precious")
        target = os.path.join(folder, "new.bin") if flags in ("a", "x") else kept
        try:
            with gdscp.defaults.set("compat_mode", "off"):
                gdscp.CuFile(target, flags).close()
        except (RuntimeError, OSError):
            pass
        else:
            pytest.skip("cuFile opens files of this filesystem")
        assert file_bytes(kept) == b"precious"
        assert sorted(os.listdir(folder)) == ["kept.bin"]
    finally:
        if folder != str(tmp_path):
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("flags", ["", "q", "rw", "r++", "wa", "+", "R", "ax", "rw+", "rbt", "rbb", "wtt"])
def test_unknown_flags(tmp_file, flags):
    path, data = tmp_file(10)
    with pytest.raises(ValueError) as info:
        gdscp.CuFile(path, flags)
    assert repr(flags)[1:-1] in str(info.value) or flags == ""
    assert file_bytes(path) == data


@pytest.mark.parametrize("flags, access", [("rt", os.O_RDONLY), ("r+t", os.O_RDWR), ("wt", os.O_WRONLY),
                                           ("w+t", os.O_RDWR), ("at", os.O_WRONLY)])
def test_text_flag_is_taken_as_open_and_kvikio_take_it(tmp_file, flags, access):
    """Python's open() takes "t" (the default) and KvikIO reads only the
    first two characters: "rt" or "w+t" open as "r" or "w+" do."""
    path, data = tmp_file(10)
    with gdscp.CuFile(path, flags) as f:
        assert f.open_flags() & os.O_ACCMODE == access
        if flags[0] == "r":
            buf = bytearray(10)
            assert f.read(buf) == 10 and bytes(buf) == data
        if flags[0] == "w":
            assert f.write(b"hello", file_offset=2) == 5
    want = {"r": data, "w": b"\0\0hello", "a": data}[flags[0]]
    assert file_bytes(path) == want


def test_flags_must_be_a_string(tmp_file):
    """KvikIO raises ValueError for flags of another type; Python's open()
    TypeError: gdscp's ArgumentError is both."""
    path, _ = tmp_file(10)
    for error in (TypeError, ValueError):
        with pytest.raises(error):
            gdscp.CuFile(path, 0)


@pytest.mark.parametrize("name", ["victim\0suffix", b"victim\0suffix"])
@pytest.mark.parametrize("flags", ["w", "a", "r+", "x"])
def test_nul_byte_in_path_truncates_nothing(tmp_path, monkeypatch, name, flags):
    """The OS would read the path up to the NUL and open (for "w": truncate)
    ``victim``: refused as open() refuses it."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    with pytest.raises(ValueError, match="embedded null byte"):
        gdscp.CuFile(name, flags)
    with pytest.raises(ValueError, match="embedded null byte"):
        gdscp.Mmap(name)
    assert victim.read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["victim"]


def test_direct_io_support_of_a_closed_file_is_false(tmp_file):
    """Not I/O: a closed file has no O_DIRECT descriptor, so False (KvikIO's
    answer), not an error."""
    path, _ = tmp_file(10)
    f = gdscp.CuFile(path, "r")
    f.close()
    assert f.is_direct_io_supported() is False


@pytest.mark.parametrize(
    "call",
    [
        lambda f, b: f.read(b),
        lambda f, b: f.write(b),
        lambda f, b: f.pread(b).get(),
        lambda f, b: f.pwrite(b).get(),
        lambda f, b: f.open_flags(),
    ],
    ids=["read", "write", "pread", "pwrite", "open_flags"],
)
def test_io_on_closed_file(tmp_file, call):
    """The error is a ValueError, as Python's file objects raise, and a
    RuntimeError, as KvikIO raises; it names the file. Nothing is written.
    pread/pwrite report it from the future's get(), as KvikIO's do."""
    path, data = tmp_file(10)
    f = gdscp.CuFile(path, "r+")
    f.close()
    buf = np.zeros(10, np.uint8)
    with pytest.raises(gdscp.ClosedFileError) as info:
        call(f, buf)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert "closed" in str(info.value)
    assert path in str(info.value)
    assert not buf.any() and file_bytes(path) == data


def _failed_future(future: object) -> BaseException:
    """The exception a future that failed before it started raises: it is
    done, has moved nothing, and raises the same at every get()."""
    assert isinstance(future, gdscp.IOFuture) and future.done()
    assert future.progress() == 0 and future.cancel() is None and future.cancelled() is False
    with pytest.raises(RuntimeError) as first:
        future.get()
    with pytest.raises(RuntimeError) as again:
        future.get()
    assert type(again.value) is type(first.value) and str(again.value) == str(first.value)
    # each get() raises an error of its own, as a transfer that ran does: one
    # object raised again would carry a longer traceback at every call
    assert again.value is not first.value
    assert len(traceback.extract_tb(again.value.__traceback__)) == len(traceback.extract_tb(first.value.__traceback__))
    return first.value


@pytest.mark.parametrize("size", [10, 3 * MiB + 5])
def test_a_failed_future_holds_neither_the_buffer_nor_the_file(tmp_file, size):
    """The future of a pread on a closed file keeps its error, not the frames
    of the call that made it: the buffer is freed once its owner drops it."""
    path, _ = tmp_file(10)
    f = gdscp.CuFile(path, "r+")
    f.close()
    buf = np.zeros(size, np.uint8)
    held = weakref.ref(buf)
    future = f.pread(buf, None, 0, MiB)
    del buf
    assert held() is None
    with pytest.raises(gdscp.ClosedFileError):
        future.get()


@pytest.mark.parametrize("task_size", [None, MiB])  # a small request, and the pool's path
@pytest.mark.parametrize("size", [10, 3 * MiB + 5])
def test_pread_and_pwrite_report_the_file_from_the_future(tmp_file, tmp_path, task_size, size):
    """As KvikIO's: pread/pwrite on a file not open for them, or closed,
    return a future whose get() raises; code that submits every request first
    and catches RuntimeError at get() sees each failure there. What KvikIO
    refuses at the call (a size larger than the buffer, a negative number, an
    argument of the wrong type) is refused there still, as is a read-only
    buffer to read into. Nothing moves."""
    path, data = tmp_file(100)
    src = np.full(size, 7, np.uint8)
    dst = np.zeros(size, np.uint8)
    ro = np.zeros(size, np.uint8)
    ro.flags.writeable = False
    written = str(tmp_path / "written.bin")

    def refused_at_the_call(f: gdscp.CuFile) -> None:
        for call, buf in ((f.pread, dst), (f.pwrite, src)):
            with pytest.raises(ValueError):
                call(buf, size + 1, 0, task_size)
            with pytest.raises(OverflowError):
                call(buf, size, -1, task_size)
            with pytest.raises(TypeError):
                call(buf, size, "0", task_size)
            with pytest.raises(OverflowError):
                call(buf, size, 0, -1)
        with pytest.raises(ValueError, match="read-only"):
            f.pread(ro, None, 0, task_size)

    with gdscp.CuFile(path, "r") as r, gdscp.CuFile(written, "w") as w:
        futures = [r.pwrite(src, None, 0, task_size), w.pread(dst, None, 0, task_size)]
        errors = [_failed_future(future) for future in futures]
        for exc in errors:
            assert isinstance(exc, OSError) and exc.errno == errno.EBADF
        assert path in str(errors[0]) and written in str(errors[1])
        refused_at_the_call(r)
        refused_at_the_call(w)
    closed = [r.pread(dst, None, 0, task_size), r.pwrite(src, None, 0, task_size)]
    for future in closed:
        exc = _failed_future(future)
        assert isinstance(exc, gdscp.ClosedFileError) and path in str(exc)
    refused_at_the_call(r)
    assert not dst.any()
    assert file_bytes(path) == data and file_bytes(written) == b""


def test_fileno_of_a_closed_file_is_minus_one(tmp_file):
    """As KvikIO's: the descriptor while open, -1 once closed."""
    path, _ = tmp_file(10)
    f = gdscp.CuFile(path)
    fd = f.fileno()
    assert fd >= 0 and os.fstat(fd).st_ino == os.stat(path).st_ino
    f.close()
    assert f.fileno() == -1


@pytest.mark.parametrize("umask", [0, 0o002, 0o022, 0o077])
@pytest.mark.parametrize("flags", ["w", "w+", "a", "x"])
def test_a_new_file_gets_0644_less_the_umask(tmp_path, umask, flags):
    """As KvikIO's FileHandle: never writable by others because the umask is
    loose; an existing file keeps its mode."""
    path = tmp_path / "new.bin"
    old = os.umask(umask)
    try:
        with gdscp.CuFile(path, flags) as f:
            f.write(b"abc")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644 & ~umask
    if flags != "x":
        os.chmod(path, 0o660)
        gdscp.CuFile(path, flags).close()
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o660


def test_read_into_readonly_buffers(tmp_file):
    path, data = tmp_file(10)
    ro = np.zeros(10, np.uint8)
    ro.flags.writeable = False
    with gdscp.CuFile(path) as f:
        with pytest.raises(ValueError):
            f.read(bytes(10))
        with pytest.raises(ValueError):
            f.pread(ro)
        with pytest.raises(ValueError):
            f.read(memoryview(bytearray(10)).toreadonly())
    assert not ro.any()


def test_size_larger_than_buffer(tmp_file):
    path, _ = tmp_file(100)
    buf = np.zeros(10, np.uint8)
    with gdscp.CuFile(path, "r+") as f:
        with pytest.raises(ValueError):
            f.read(buf, 11)
        with pytest.raises(ValueError):
            f.pwrite(buf, 11)
        with pytest.raises(ValueError):
            f.write(buf[5:], 6)
    assert file_bytes(path) != bytes(100)  # nothing written


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"size": -1}, OverflowError),
        ({"file_offset": -1}, OverflowError),
        ({"file_offset": -4096}, OverflowError),
        ({"task_size": -1}, OverflowError),
        ({"file_offset": 2**63}, OverflowError),
        ({"file_offset": 2**64}, OverflowError),
        ({"size": 2**64}, OverflowError),
        ({"task_size": 2**64}, OverflowError),
    ],
)
def test_bad_numbers_raise_kvikios_exception_types(tmp_file, kwargs, error):
    """As KvikIO: negative (or too large) offsets and sizes are OverflowErrors;
    each message names the argument and its value, never the binding's signature."""
    path, data = tmp_file(100)
    buf = np.zeros(10, np.uint8)
    (name, value), = kwargs.items()
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.pwrite):
            with pytest.raises(error) as info:
                call(buf, **kwargs)
            assert name in str(info.value)
            if error is OverflowError:
                assert str(value) in str(info.value) and "incompatible" not in str(info.value)
    assert not buf.any()
    assert file_bytes(path) == data


@pytest.mark.parametrize("name", ["size", "file_offset", "task_size"])
@pytest.mark.parametrize("value", [10**5000, -(10**5000)], ids=["huge", "huge-negative"])
def test_numbers_of_thousands_of_digits_are_overflow_errors(tmp_file, name, value):
    """A number longer than Python writes as text (4300 digits) is the
    OverflowError of any other number out of range, its message naming the
    argument and the number's length; nothing is read or written."""
    path, data = tmp_file(100)
    buf = np.zeros(10, np.uint8)
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.write, lambda *a, **k: f.pread(*a, **k).get(), lambda *a, **k: f.pwrite(*a, **k).get()):
            with pytest.raises(OverflowError) as info:
                call(buf, **{name: value})
            assert str(info.value).startswith(f"{name} (a {'negative ' if value < 0 else ''}number of 5001 digits) ")
    assert not buf.any()
    assert file_bytes(path) == data


@pytest.mark.parametrize("task_size", [0, False, np.int64(0)])
def test_a_task_size_of_zero_means_the_default(tmp_file, task_size):
    """As KvikIO's binding (`task_size if task_size else defaults.task_size()`):
    a call's task_size of 0 or False is the default, not an error."""
    path, data = tmp_file(3 * MiB + 5)
    with gdscp.defaults.set("task_size", MiB), gdscp.CuFile(path, "r+") as f:
        buf = np.zeros(len(data), np.uint8)
        assert f.read(buf, task_size=task_size) == len(data)
        assert buf.tobytes() == data
        assert f.pread(buf[:100], task_size=task_size).get() == 100
        new = np.arange(len(data), dtype=np.uint8)
        assert f.pwrite(new, task_size=task_size).get() == len(data)
    assert file_bytes(path) == new.tobytes()


def test_bounce_buffers_stay_few_whatever_the_request_sizes(tmp_path):
    """Writes of many different lengths from memory O_DIRECT cannot take
    (a numpy array's data is 16 bytes past a page) go through aligned bounce
    buffers, sized by each request's chunks. The pool keeps them in a few size
    classes: 40 lengths leave tens of MiB idle, not a buffer of each length
    (1.5 GB before the classes). Every file holds its bytes."""
    probe = tmp_path / "probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
        os.close(fd)
    except OSError:
        pytest.skip("this filesystem refuses O_DIRECT")
    src = np.frombuffer(random_bytes(72 * MiB, 4), np.uint8)
    if src.ctypes.data % 4096 == 0:
        src = np.frombuffer(random_bytes(72 * MiB + 16, 4), np.uint8)[16:]
    path = tmp_path / "out.bin"
    _core.trim_pools()
    for k in range(40):
        n = 64 * MiB + k * 151_552
        with gdscp.defaults.set("direct_io", "auto"), gdscp.CuFile(path, "w") as f:
            assert f.write(src[:n]) == n
        if k % 13 == 0:
            assert file_bytes(path) == src[:n].tobytes()
    freed = _core.trim_pools()
    assert 0 < freed < 256 * MiB, f"{freed / MiB:.0f} MiB of idle buffers after 40 writes"


@pytest.mark.parametrize("size", [1, 4096, 64 * MiB])
def test_a_range_past_the_largest_offset_is_refused(tmp_file, size):
    """An offset that fits, but whose range ends past the largest offset a
    file can have, is an OverflowError naming both, for every call, before
    anything moves (not a wrapped-around offset the OS refuses)."""
    path, data = tmp_file(100)
    buf = np.zeros(size, np.uint8)
    start = 2**63 - size + 1
    with gdscp.CuFile(path, "r+") as f:
        for call in (f.read, f.write, lambda b, n, o: f.pread(b, n, o).get(), lambda b, n, o: f.pwrite(b, n, o).get()):
            with pytest.raises(OverflowError) as info:
                call(buf, size, start)
            # The offset itself out of range (size 1) is an argument error; a
            # range that ends past 2**63-1 also the RuntimeError KvikIO raises.
            assert isinstance(info.value, RuntimeError) == (start < 2**63)
            assert isinstance(info.value, gdscp.RangeEndError) == (start < 2**63)
            assert str(start) in str(info.value) and str(size) in str(info.value)
        assert f.read(buf[:0], 0, 2**63 - 1) == 0
        if start < 2**63:  # pread/pwrite report it from the future, as KvikIO's do
            for future in (f.pread(buf, size, start), f.pwrite(buf, size, start)):
                assert isinstance(_failed_future(future), OverflowError)
    assert not buf.any() and file_bytes(path) == data


def test_offset_past_off_t_says_what_fits(tmp_file):
    path, _ = tmp_file(100)
    with gdscp.CuFile(path) as f, pytest.raises(OverflowError) as info:
        f.read(bytearray(10), 10, 2**63)
    assert str(info.value) == "file_offset 9223372036854775808 is out of range (at most 2**63-1)"


def test_non_integer_arguments(tmp_file):
    path, _ = tmp_file(100)
    buf = np.zeros(10, np.uint8)
    with gdscp.CuFile(path) as f:
        with pytest.raises(TypeError):
            f.read(buf, 2.5)
        with pytest.raises(TypeError):
            f.read(buf, file_offset="0")


def test_non_contiguous_arrays(tmp_file):
    path, data = tmp_file(1000)
    strided = np.zeros(100, np.uint8)[::2]
    columns = np.zeros((10, 10), np.uint8, order="F")[:, ::2]
    rows = np.zeros((10, 10), np.uint8)[::2]
    with gdscp.CuFile(path, "r+") as f:
        for buf in (strided, columns, rows):
            with pytest.raises(ValueError):
                f.read(buf)
            with pytest.raises(ValueError):
                f.write(buf)
    assert file_bytes(path) == data


@pytest.mark.parametrize("obj", [object(), 42, "text", None, [1, 2, 3]])
def test_not_a_buffer(tmp_file, obj):
    path, _ = tmp_file(100)
    with gdscp.CuFile(path, "r+") as f:
        with pytest.raises(TypeError):
            f.read(obj)
        with pytest.raises(TypeError):
            f.write(obj)


@pytest.mark.parametrize("method", ["raw_read", "raw_write"])
def test_raw_io_needs_device_memory(tmp_file, method):
    path, data = tmp_file(100)
    buf = np.zeros(100, np.uint8)
    with gdscp.CuFile(path, "r+") as f:
        with pytest.raises(ValueError):
            getattr(f, method)(buf)
        with pytest.raises(ValueError):
            getattr(f, method + "_async")(buf, None)
    assert not buf.any()
    assert file_bytes(path) == data


def _open_denied(target: str) -> int:
    """0 when opening ``target`` raises a PermissionError that is also a
    RuntimeError and names the file; another number for each way it did not."""
    try:
        gdscp.CuFile(target)
    except PermissionError as exc:
        if not isinstance(exc, RuntimeError):
            return 3
        return 0 if target in str(exc) else 4
    except BaseException:
        return 5
    return 2


def test_permission_denied():
    folder = tempfile.mkdtemp(prefix="gdscp-perm-")
    target = os.path.join(folder, "secret.bin")
    try:
        os.chmod(folder, 0o755)
        write_file(target, b"secret")
        os.chmod(target, 0)
        if os.geteuid() != 0:
            assert _open_denied(target) == 0
            return
        # Root bypasses file modes: drop to an unprivileged user in a forked
        # child (gdscp is already imported there, so nothing else needs access).
        with warnings.catch_warnings():
            # Python 3.12 warns about fork() with threads running; the child
            # only opens a file (compat_mode ON: no CUDA, no cuFile) and exits.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 6
            try:
                os.setgid(65534)
                os.setuid(65534)
                gdscp.defaults.set("compat_mode", "on")
            except BaseException:
                os._exit(7)
            try:
                code = _open_denied(target)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 7:
            pytest.skip("running as root and cannot drop privileges to provoke EACCES")
        assert code == 0, {2: "opened", 3: "not a RuntimeError", 4: "message lacks the path", 5: "other error"}.get(code, code)
    finally:
        if os.path.exists(target):
            os.unlink(target)
        os.rmdir(folder)


# --------------------------------------------------------------------------
# failure in the middle of a transfer
# --------------------------------------------------------------------------
def test_mid_transfer_read_failure_then_recovers(tmp_file):
    size = 2 * MiB
    path, data = tmp_file(size)
    buf = np.zeros(size, np.uint8)
    with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}), gdscp.CuFile(path) as f:
        try:
            _core.testing.arm_fault("pread", 2, 1, errno.EIO)
            with pytest.raises(OSError) as info:
                f.read(buf, task_size=65536)
        finally:
            _core.testing.disarm_fault()
        exc = info.value
        assert exc.errno == errno.EIO
        assert isinstance(exc, RuntimeError)
        assert path in str(exc)
        assert exc.offset is not None and 0 <= exc.offset < size
        assert f"offset {exc.offset}" in str(exc)
        # The handle is still usable, and get() returned only after every task ended.
        buf[:] = 0
        assert f.read(buf, task_size=65536) == size
    assert buf.tobytes() == data


def test_mid_transfer_write_failure_then_recovers(tmp_path):
    size = 2 * MiB
    data = random_bytes(size, seed=21)
    path = str(tmp_path / "w.bin")
    src = np.frombuffer(data, np.uint8)
    with gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0}), gdscp.CuFile(path, "w+") as f:
        try:
            _core.testing.arm_fault("pwrite", 3, 2, errno.ENOSPC)
            with pytest.raises(OSError) as info:
                f.pwrite(src, task_size=65536).get()
        finally:
            _core.testing.disarm_fault()
        assert info.value.errno == errno.ENOSPC
        assert isinstance(info.value, RuntimeError)
        assert path in str(info.value)
        assert f.write(src, task_size=65536) == size
    assert file_bytes(path) == data


def test_eintr_is_retried(tmp_file):
    path, data = tmp_file(MiB)
    buf = np.zeros(MiB, np.uint8)
    with gdscp.CuFile(path) as f:
        try:
            _core.testing.arm_fault("pread", 0, 3, errno.EINTR)
            assert f.read(buf, task_size=65536) == MiB
        finally:
            _core.testing.disarm_fault()
    assert buf.tobytes() == data


# --------------------------------------------------------------------------
# random round trips
# --------------------------------------------------------------------------
HYPO_FILE_SIZE = 2 * MiB + 333


@pytest.fixture(scope="module")
def hypo_file(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hypo") / "random.bin")
    data = random_bytes(HYPO_FILE_SIZE, seed=2024)
    write_file(path, data)
    return path, data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.integers(0, HYPO_FILE_SIZE + 5000),
    offset=st.integers(0, HYPO_FILE_SIZE + 5000),
    view_start=st.integers(0, 4097),
    task_size=st.sampled_from([511, 4096, 65537, MiB, 16 * MiB]),
    threads=st.sampled_from([1, 2, 3, 8]),
    gds_threshold=st.sampled_from([0, MiB]),
)
def test_random_reads_match_os_pread(hypo_file, size, offset, view_start, task_size, threads, gds_threshold):
    path, data = hypo_file
    backing = np.full(view_start + size + 16, POISON, np.uint8)
    view = backing[view_start : view_start + size]
    fd = os.open(path, os.O_RDONLY)
    try:
        expect = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    with gdscp.defaults.set({"num_threads": threads, "gds_threshold": gds_threshold}):
        with gdscp.CuFile(path) as f:
            assert f.read(view, size, offset, task_size) == len(expect)
    got = backing.tobytes()
    assert got[view_start : view_start + len(expect)] == expect
    assert got[:view_start] == bytes([POISON]) * view_start
    assert got[view_start + len(expect) :] == bytes([POISON]) * (len(got) - view_start - len(expect))


@settings(max_examples=60, deadline=None)
@given(
    writes=st.lists(
        st.tuples(st.integers(0, 3 * MiB), st.integers(0, MiB + 4097), st.integers(0, 2**31)),
        min_size=1,
        max_size=4,
    ),
    task_size=st.sampled_from([1000, 4096, 65537, MiB, 16 * MiB]),
    threads=st.sampled_from([1, 2, 4, 16]),
)
def test_random_writes_match_model(writes, task_size, threads):
    model = bytearray()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "w.bin")
        with gdscp.defaults.set({"num_threads": threads, "gds_threshold": 0}), gdscp.CuFile(path, "w+") as f:
            for offset, size, seed in writes:
                data = random_bytes(size, seed)
                assert f.pwrite(np.frombuffer(data, np.uint8), size, offset, task_size).get() == size
                if size:
                    if len(model) < offset:
                        model.extend(bytes(offset - len(model)))
                    model[offset : offset + size] = data
        assert file_bytes(path) == bytes(model)


@pytest.mark.parametrize("closed", [False, True])
@pytest.mark.parametrize(
    "kind, why",
    [
        ("CuFile", "a file handle belongs to the process that opened it (pickle its name, and open that again)"),
        ("Mmap", "a mapped file belongs to the process that mapped it (pickle its name, and map that again)"),
    ],
)
def test_a_handle_cannot_be_pickled_or_copied(tmp_file, closed, kind, why):
    """As Python's own file objects: a TypeError naming the public class (not
    the engine's internal one), open or closed."""
    import copy
    import pickle

    path, _ = tmp_file(10)
    handle = getattr(gdscp, kind)(path)
    if closed:
        handle.close()
    try:
        for attempt in (pickle.dumps, copy.copy):
            with pytest.raises(TypeError) as info:
                attempt(handle)
            assert str(info.value) == f"cannot pickle '{kind}' object: {why}"
    finally:
        handle.close()
