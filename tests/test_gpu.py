"""Device memory conformance: every GPU path checked byte for byte against
numpy reads and os.pread of the same file.

All tests carry the ``gpu`` marker; conftest skips them without a device
(and fails them when GDSCP_REQUIRE_GPU=1). CuPy, PyTorch and cuda.core are
imported inside the tests, so collecting this file needs none of them.
"""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

import gdscp
from gdscp import CompatMode
from conftest import POISON, DLPackOnly, first_page_cached, has_gpu, random_bytes, wait_engine_idle

pytestmark = pytest.mark.gpu

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture
def cp():
    import cupy

    return cupy


@pytest.fixture(autouse=True)
def free_gpu_memory():
    """Give cached device and pinned memory back after each test, so the suite's
    peak stays the largest single test's need."""
    yield
    if not has_gpu():
        return
    import cupy

    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()


def file_bytes(path: str, size: int | None = None, offset: int = 0) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        if size is None:
            size = os.fstat(fd).st_size - offset
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


def device(cp, data: bytes):
    return cp.asarray(np.frombuffer(data, dtype=np.uint8))


def host_of(array) -> bytes:
    return array.get().tobytes()


def numpy_read(path: str, size: int, offset: int = 0) -> tuple[int, bytes]:
    """The same read through gdscp into host memory, the reference for device reads."""
    buf = np.full(size, POISON, np.uint8)
    with gdscp.CuFile(path) as f:
        n = f.read(buf, size, offset)
    return n, buf.tobytes()


# --------------------------------------------------------------------------
# reads and writes of device memory
# --------------------------------------------------------------------------
DEVICE_SIZES = [0, 1, 4095, 4096, 4097, MiB + 3, 9 * MiB + 7]


@pytest.mark.parametrize("size", DEVICE_SIZES)
def test_device_read_matches_numpy(cp, tmp_file, size):
    path, data = tmp_file(size)
    buf = cp.full(size, POISON, dtype=cp.uint8)
    with gdscp.CuFile(path) as f:
        assert f.backend in ("posix", "cufile")
        assert isinstance(f.backend_reason, str) and f.backend_reason
        assert f.read(buf) == size
    n, reference = numpy_read(path, size)
    assert n == size
    assert host_of(buf) == reference == data


def test_fortran_ordered_device_arrays(cp, tmp_file, tmp_path):
    """A Fortran-ordered CuPy array is one block: the file's bytes fill it in
    memory order (as KvikIO takes it), one request and a bulk job alike, and
    a write stores it as it lies; a strided one is refused."""
    path, data = tmp_file(5 * 7 * 4 + 3)
    nbytes = 5 * 7 * 4
    want = np.frombuffer(data[:nbytes], np.float32).reshape((7, 5)).T
    arr = cp.zeros((5, 7), cp.float32, order="F")
    with gdscp.CuFile(path) as f:
        assert f.read(arr) == nbytes
    assert np.array_equal(cp.asnumpy(arr), want)
    arr = cp.zeros((5, 7), cp.float32, order="F")
    (result,) = gdscp.read_files([path], [arr]).results()
    assert result.status == "done" and np.array_equal(cp.asnumpy(arr), want)
    out = str(tmp_path / "f.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(arr) == nbytes
    assert file_bytes(out) == data[:nbytes]
    with gdscp.CuFile(path) as f:
        with pytest.raises(ValueError, match="contiguous"):
            f.read(cp.zeros((5, 14), cp.float32, order="F")[:, ::2])


@pytest.mark.parametrize("size", DEVICE_SIZES)
def test_device_write_then_os_pread(cp, tmp_path, size):
    data = random_bytes(size, seed=size + 17)
    path = str(tmp_path / "dev.bin")
    with gdscp.CuFile(path, "w") as f:
        assert f.write(device(cp, data)) == size
    assert file_bytes(path) == data


@pytest.mark.parametrize("bounce", [64 * KiB, 1 * MiB + 4096])
@pytest.mark.parametrize("depth", [2, 8])
def test_larger_than_task_size_and_bounce_buffer(cp, tmp_file, tmp_path, bounce, depth):
    """Many staging pieces per task and many tasks per request, so the staging
    pipeline wraps around its slots several times."""
    size = 7 * MiB + 5
    path, data = tmp_file(size)
    settings = {"bounce_buffer_size": bounce, "task_size": 2 * MiB, "pipeline_depth": depth, "gds_threshold": 0}
    with gdscp.defaults.set(settings):
        buf = cp.full(size + 3, POISON, dtype=cp.uint8)
        with gdscp.CuFile(path) as f:
            assert f.read(buf[3:]) == size
        got = host_of(buf)
        assert got[3:] == data and got[:3] == bytes([POISON]) * 3

        out = str(tmp_path / "copy.bin")
        with gdscp.CuFile(out, "w") as f:
            assert f.write(buf[3:]) == size
        assert file_bytes(out) == data


@pytest.mark.parametrize("threads", [1, 3, 16])
@pytest.mark.parametrize("size", [4 * MiB, 4 * MiB + 1, 10 * MiB + 4097])
def test_staging_over_many_chunks(cp, tmp_file, threads, size):
    """Reads of several chunks, each worker staging 256 KiB pieces of 2 MiB
    chunks, so every worker's ring of staging buffers wraps many times: the
    file's bytes, at an unaligned file offset into an unaligned device view."""
    path, data = tmp_file(size + 4095)
    settings = {
        "num_threads": threads,
        "task_size": 2 * MiB,
        "bounce_buffer_size": 256 * KiB,
        "gds_threshold": 0,
    }
    with gdscp.defaults.set(settings):
        buf = cp.full(size + 8, POISON, dtype=cp.uint8)
        with gdscp.CuFile(path) as f:
            assert f.read(buf[3 : 3 + size], size, 4095) == size
    got = host_of(buf)
    assert got[3 : 3 + size] == data[4095 : 4095 + size]
    assert got[:3] == bytes([POISON]) * 3 and got[3 + size :] == bytes([POISON]) * 5


def test_cold_then_hot_device_read(cp, tmp_file):
    """Data not in the page cache, then the same data cached: both reads give
    the file's bytes."""
    from gdscp.bench.files import drop_cache

    size = 40 * MiB + 7
    path, data = tmp_file(size)
    drop_cache(path, use_drop_caches=False)
    if first_page_cached(path) is not False:
        pytest.skip("the file's pages could not be dropped, or cachestat(2) is missing")
    settings = {"num_threads": 8, "task_size": 4 * MiB, "gds_threshold": 0}
    with gdscp.defaults.set(settings), gdscp.CuFile(path) as f:
        buf = cp.zeros(size, dtype=cp.uint8)
        assert f.read(buf) == size
    assert host_of(buf) == data
    with gdscp.CuFile(path) as f:  # now cached, with the default settings
        buf = cp.zeros(size, dtype=cp.uint8)
        assert f.read(buf) == size
    assert host_of(buf) == data


def test_device_staging_errors_and_cancel(cp, tmp_file):
    """A failing pread among the staged pieces of a device read: a clean error,
    no worker left stuck; a cancelled read returns; then exact bytes."""
    import errno

    from gdscp import _core

    size = 48 * MiB + 5
    path, data = tmp_file(size)
    settings = {
        "num_threads": 8,
        "task_size": 2 * MiB,
        "bounce_buffer_size": 512 * KiB,
        "compat_mode": "on",
    }
    with gdscp.defaults.set(settings), gdscp.CuFile(path) as f:
        buf = cp.zeros(size, dtype=cp.uint8)
        for skip in (0, 5, 37):
            _core.testing.arm_fault("pread", skip, 1, errno.EIO)
            try:
                with pytest.raises(OSError) as e:
                    f.read(buf)
                assert e.value.errno == errno.EIO
            finally:
                _core.testing.disarm_fault()
        future = f.pread(buf)
        future.cancel()
        assert 0 <= future.get() <= size
        assert f.read(buf) == size
    assert host_of(buf) == data
    assert wait_engine_idle(), "a worker is stuck"


@pytest.mark.parametrize("file_offset", [1, 4095, 4097, 1_000_003])
@pytest.mark.parametrize("dev_start", [1, 3, 4096 + 5])
def test_unaligned_file_and_device_offsets(cp, tmp_file, file_offset, dev_start):
    path, data = tmp_file(6 * MiB + 11)
    size = 5 * MiB + 1
    buf = cp.full(dev_start + size + 100, POISON, dtype=cp.uint8)
    with gdscp.defaults.set("bounce_buffer_size", MiB), gdscp.CuFile(path) as f:
        assert f.read(buf[dev_start:], size, file_offset) == size
    got = host_of(buf)
    assert got[dev_start : dev_start + size] == data[file_offset : file_offset + size]
    assert got[:dev_start] == bytes([POISON]) * dev_start
    assert got[dev_start + size :] == bytes([POISON]) * 100


@pytest.mark.parametrize("file_offset", [3, 4097, 2 * MiB + 1])
def test_unaligned_device_write(cp, tmp_file, file_offset):
    path, original = tmp_file(4 * MiB)
    new = random_bytes(3 * MiB + 9, seed=file_offset)
    src = device(cp, b"\0" * 5 + new)[5:]
    with gdscp.defaults.set("bounce_buffer_size", MiB), gdscp.CuFile(path, "r+") as f:
        assert f.write(src, file_offset=file_offset) == len(new)
    expect = bytearray(original)
    expect[file_offset : file_offset + len(new)] = new
    assert file_bytes(path) == bytes(expect)


@pytest.mark.parametrize("file_size", [1, 4097, 5 * MiB + 3])
def test_device_read_past_eof(cp, tmp_file, file_size):
    path, data = tmp_file(file_size)
    extra = 2 * MiB + 1
    buf = cp.full(file_size + extra, POISON, dtype=cp.uint8)
    with gdscp.defaults.set({"bounce_buffer_size": MiB, "gds_threshold": 0}), gdscp.CuFile(path) as f:
        assert f.read(buf, task_size=MiB) == file_size
        assert f.read(buf, file_offset=file_size + 10) == 0
    got = host_of(buf)
    assert got[:file_size] == data
    assert got[file_size:] == bytes([POISON]) * extra


def test_many_device_preads_in_flight(cp, tmp_file):
    size = 12 * MiB + 5
    path, data = tmp_file(size)
    buf = cp.full(size, POISON, dtype=cp.uint8)
    bounds = [size * i // 23 for i in range(24)]
    with gdscp.CuFile(path) as f:
        futures = [f.pread(buf[lo:hi], hi - lo, lo) for lo, hi in zip(bounds, bounds[1:])]
        assert sum(fut.get() for fut in futures) == size
        assert all(fut.done() for fut in futures)
    assert host_of(buf) == data


def test_producer_stream_is_respected(cp, tmp_path):
    """An array filled on a non-default stream, written inside that stream's
    context: the write must see the copy that the stream was still doing."""
    data = random_bytes(32 * MiB, seed=77)
    host = np.frombuffer(data, np.uint8)
    path = str(tmp_path / "stream.bin")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        src = cp.empty(len(data), dtype=cp.uint8)
        src.set(host, stream=stream)
        with gdscp.CuFile(path, "w") as f:
            assert f.write(src) == len(data)
    stream.synchronize()
    assert file_bytes(path) == data


def test_work_on_the_per_thread_default_stream_comes_first(cp, tmp_path):
    """Arrays made under CuPy's per-thread default stream name it (2) in their
    array interface, and that stream does not wait for other streams, nor they
    for it: a read lands after the kernel still filling the array there, and a
    write takes the kernel's result."""
    size = 4 * MiB
    data = random_bytes(size, seed=78)
    path = tmp_path / "ptds.bin"
    path.write_bytes(data)
    ptds = cp.cuda.Stream.ptds

    def busy():  # milliseconds of work queued ahead of the fill
        m = cp.ones((4096, 4096), dtype=cp.float64)
        for _ in range(4):
            m = m @ m
        return m

    with ptds, gdscp.CuFile(str(path), "r+") as f:
        keep = busy()
        buf = cp.full(size, 0x11, dtype=cp.uint8)
        assert buf.__cuda_array_interface__["stream"] == 2
        assert f.read(buf) == size
        ptds.synchronize()
        assert buf.get().tobytes() == data
        keep = busy()
        src = cp.full(size, 0x5A, dtype=cp.uint8)
        assert f.write(src) == size
        del keep
    assert file_bytes(str(path)) == b"\x5a" * size


def test_copy_through_a_gpu_imports_no_cupy(tmp_path):
    """A copy's staging is the engine's own device memory: a new process copying
    through GPU 0 never pays for importing CuPy (or numpy), and the bytes arrive."""
    import subprocess
    import sys

    src, data = tmp_path / "src.bin", random_bytes(3 * MiB + 5, 11)
    src.write_bytes(data)
    program = (
        "import sys, gdscp\n"
        f"(r,) = gdscp.copy_files([({str(src)!r}, {str(tmp_path / 'dst.bin')!r})], device=0).results()\n"
        "print(r.status, r.bytes, 'cupy' in sys.modules, 'numpy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["done", str(len(data)), "False", "False"]
    assert (tmp_path / "dst.bin").read_bytes() == data
    # The same through the command line, a tree this time.
    (tmp_path / "tree").mkdir()
    os.replace(src, tmp_path / "tree" / "src.bin")
    program = (
        "import sys\nfrom gdscp.cli.app import run\n"
        f"code = run(['copy', '-r', '-q', '--device', '0', {str(tmp_path / 'tree')!r}, {str(tmp_path / 'out')!r}])\n"
        "print(code, 'cupy' in sys.modules, 'numpy' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "False", "False"], done.stderr
    assert (tmp_path / "out" / "src.bin").read_bytes() == data


# --------------------------------------------------------------------------
# files past 4 GiB
# --------------------------------------------------------------------------
@pytest.mark.slow
def test_file_larger_than_4_gib(cp, tmp_path):
    size = 4 * GiB + 32 * MiB + 5
    path = str(tmp_path / "big.bin")
    regions = {
        0: random_bytes(MiB, seed=1),
        4 * GiB - 3 * MiB + 1: random_bytes(5 * MiB + 7, seed=2),  # straddles 2**32
        size - (MiB + 5): random_bytes(MiB + 5, seed=3),  # the end
    }
    with open(path, "wb") as f:
        f.truncate(size)
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, data in regions.items():
            assert os.pwrite(fd, data, offset) == len(data)
    finally:
        os.close(fd)
    assert os.path.getsize(path) == size

    try:
        # The whole file into one device buffer: device offsets past 2**32 too.
        big = cp.full(size, POISON, dtype=cp.uint8)
        with gdscp.CuFile(path) as f:
            assert f.read(big) == size
        expected_nonzero = 0
        for offset, data in regions.items():
            assert host_of(big[offset : offset + len(data)]) == data, offset
            expected_nonzero += np.count_nonzero(np.frombuffer(data, np.uint8))
        # Everything outside the regions is a hole, so zero.
        assert int(cp.count_nonzero(big)) == expected_nonzero

        # raw_read into the big buffer at a device offset past 2**32.
        small_offset = 4 * GiB - 7
        big[:] = 0
        with gdscp.CuFile(path) as f:
            assert f.raw_read(big, MiB, small_offset, 4 * GiB + 100) == MiB
        assert host_of(big[4 * GiB + 100 : 4 * GiB + 100 + MiB]) == file_bytes(path, MiB, small_offset)
        del big
        cp.get_default_memory_pool().free_all_blocks()

        # Ranges around 2**32 and at the end, into small buffers.
        with gdscp.CuFile(path) as f:
            for offset in (4 * GiB - 1000, 4 * GiB, 4 * GiB + 1, size - 3 * MiB):
                buf = cp.full(3 * MiB, POISON, dtype=cp.uint8)
                n = f.read(buf, file_offset=offset)
                expect = file_bytes(path, 3 * MiB, offset)
                assert n == len(expect)
                assert host_of(buf)[:n] == expect
            tail = cp.full(2 * MiB, POISON, dtype=cp.uint8)
            assert f.read(tail, file_offset=size - 1000) == 1000
            got = host_of(tail)
            assert got[:1000] == regions[size - (MiB + 5)][-1000:]
            assert got[1000:] == bytes([POISON]) * (2 * MiB - 1000)

        # Writes past 2**32 from device memory.
        new = random_bytes(3 * MiB + 3, seed=4)
        at = 4 * GiB + 10 * MiB + 1
        with gdscp.CuFile(path, "r+") as f:
            assert f.write(device(cp, new), file_offset=at) == len(new)
            assert f.raw_write(device(cp, new[:4097]), None, size + 5, 0) == 4097
        assert file_bytes(path, len(new), at) == new
        assert file_bytes(path, 4097, size + 5) == new[:4097]
        assert os.path.getsize(path) == size + 5 + 4097
    finally:
        os.unlink(path)


# --------------------------------------------------------------------------
# raw and stream-ordered I/O
# --------------------------------------------------------------------------
@pytest.mark.parametrize("dev_offset", [0, 1, 4096, 12345])
def test_raw_read_and_write_with_dev_offset(cp, tmp_file, tmp_path, dev_offset):
    path, data = tmp_file(3 * MiB + 3)
    size = 2 * MiB + 1
    file_offset = 4097
    buf = cp.full(dev_offset + size + 64, POISON, dtype=cp.uint8)
    with gdscp.CuFile(path) as f:
        assert f.raw_read(buf, size, file_offset, dev_offset) == size
    got = host_of(buf)
    assert got[dev_offset : dev_offset + size] == data[file_offset : file_offset + size]
    assert got[:dev_offset] == bytes([POISON]) * dev_offset
    assert got[dev_offset + size :] == bytes([POISON]) * 64

    out = str(tmp_path / "raw.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.raw_write(buf, size, 10, dev_offset) == size
    assert file_bytes(out) == bytes(10) + data[file_offset : file_offset + size]


def test_raw_read_defaults_and_eof(cp, tmp_file):
    path, data = tmp_file(10_000)
    buf = cp.full(20_000, POISON, dtype=cp.uint8)
    with gdscp.CuFile(path) as f:
        # size=None: the rest of the buffer after dev_offset; a short count at EOF.
        assert f.raw_read(buf, None, 0, 100) == 10_000
        assert f.raw_read(buf, None, 10_000) == 0
    got = host_of(buf)
    assert got[100:10_100] == data
    assert got[:100] == bytes([POISON]) * 100 and got[10_100:] == bytes([POISON]) * 9_900


def test_raw_argument_checks(cp, tmp_file):
    path, _ = tmp_file(1000)
    buf = cp.zeros(100, dtype=cp.uint8)
    with gdscp.CuFile(path, "r+") as f:
        with pytest.raises(ValueError):
            f.raw_read(buf, 10, 0, 101)  # dev_offset past the end
        with pytest.raises(ValueError):
            f.raw_read(buf, 60, 0, 50)  # size past the end after dev_offset
        with pytest.raises(OverflowError):  # a negative size, as KvikIO reports it
            f.raw_write(buf, -1)
        with pytest.raises(ValueError):
            f.raw_read(buf[::2])


def _check_async_round_trip(cp, f, path, data, stream, sync):
    size = 3 * MiB + 1
    buf = cp.full(size + 16, POISON, dtype=cp.uint8)
    # The fill ran on the legacy stream, which a non-blocking stream does not wait for.
    cp.cuda.Device().synchronize()
    future = f.raw_read_async(buf, stream, size, 5, 8)
    assert isinstance(future, gdscp.IOFutureStream)
    assert future.check_bytes_done() == size
    sync()
    got = host_of(buf)
    assert got[8 : 8 + size] == data[5 : 5 + size]
    assert got[:8] == bytes([POISON]) * 8 and got[8 + size :] == bytes([POISON]) * 8

    future = f.raw_write_async(buf, stream, size, len(data) + 3, 8)
    assert future.check_bytes_done() == size
    sync()
    assert file_bytes(path, size, len(data) + 3) == data[5 : 5 + size]


def test_raw_async_with_cupy_stream(cp, tmp_file):
    path, data = tmp_file(4 * MiB)
    stream = cp.cuda.Stream(non_blocking=True)
    with gdscp.CuFile(path, "r+") as f:
        _check_async_round_trip(cp, f, path, data, stream, stream.synchronize)


def test_raw_async_with_integer_stream(cp, tmp_file):
    path, data = tmp_file(4 * MiB)
    stream = cp.cuda.Stream(non_blocking=True)
    with gdscp.CuFile(path, "r+") as f:
        _check_async_round_trip(cp, f, path, data, int(stream.ptr), stream.synchronize)
        # 0 and None: the legacy default stream.
        _check_async_round_trip(cp, f, path, data, 0, cp.cuda.Device().synchronize)
        _check_async_round_trip(cp, f, path, data, None, cp.cuda.Device().synchronize)


def test_raw_writes_in_append_mode_land_once_at_the_end(cp, tmp_file):
    path, data = tmp_file(5000)
    src = cp.asarray(cp.arange(4096, dtype=cp.int64).astype(cp.uint8))
    with gdscp.CuFile(path, "a") as f:
        assert f.raw_write(src, 1000, 0, 7) == 1000
        stream = cp.cuda.Stream(non_blocking=True)
        assert f.raw_write_async(src, stream, 3000, 0, 11).check_bytes_done() == 3000
    want = data + src[7:1007].get().tobytes() + src[11:3011].get().tobytes()
    assert file_bytes(path) == want


def _cuda_core_device():
    try:
        from cuda.core import Device
    except ImportError:
        try:
            from cuda.core.experimental import Device
        except ImportError:
            pytest.skip("cuda.core is not installed")
    return Device


def test_raw_async_with_cuda_core_stream(cp, tmp_file):
    Device = _cuda_core_device()
    dev = Device(cp.cuda.Device().id)
    dev.set_current()
    stream = dev.create_stream()
    path, data = tmp_file(4 * MiB)
    try:
        with gdscp.CuFile(path, "r+") as f:
            _check_async_round_trip(cp, f, path, data, stream, stream.sync)
    finally:
        stream.close()


def test_raw_async_is_ordered_on_its_stream(cp, tmp_file, tmp_path):
    """Work queued on the stream before a raw_write_async is in the file; work
    queued after a raw_read_async sees the bytes read."""
    path, data = tmp_file(8 * MiB)
    stream = cp.cuda.Stream(non_blocking=True)
    src = cp.empty(8 * MiB, dtype=cp.uint8)
    out = str(tmp_path / "ordered.bin")
    with stream:
        src.set(np.frombuffer(data, np.uint8), stream=stream)
        with gdscp.CuFile(out, "w") as f:
            fut = f.raw_write_async(src, stream)
            assert fut.check_bytes_done() == 8 * MiB
    assert file_bytes(out) == data

    dst = cp.zeros(8 * MiB, dtype=cp.uint8)
    cp.cuda.Device().synchronize()
    with gdscp.CuFile(path) as f:
        fut = f.raw_read_async(dst, stream)
        with stream:
            doubled = dst.astype(cp.uint16) * 2
        assert fut.check_bytes_done() == 8 * MiB
    stream.synchronize()
    assert doubled.get().tobytes() == (np.frombuffer(data, np.uint8).astype(np.uint16) * 2).tobytes()


# --------------------------------------------------------------------------
# kinds of device (and pinned) memory
# --------------------------------------------------------------------------
def test_torch_cuda_tensors(cp, tmp_file, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch was built without CUDA")
    path, data = tmp_file(5 * MiB + 8)
    t = torch.full((5 * MiB + 8,), POISON, dtype=torch.uint8, device="cuda")
    with gdscp.CuFile(path) as f:
        assert f.read(t) == 5 * MiB + 8
        torch.cuda.synchronize()
        assert t.cpu().numpy().tobytes() == data
        halves = torch.zeros(((5 * MiB + 8) // 2,), dtype=torch.float16, device="cuda")
        assert f.read(halves) == 5 * MiB + 8
        assert halves.cpu().numpy().tobytes() == data
        matrix = torch.zeros((1024, 1024), dtype=torch.float32, device="cuda")
        assert f.read(matrix.t()) == 4 * MiB  # Fortran order: filled in memory order
        torch.cuda.synchronize()
        assert matrix.cpu().numpy().tobytes() == data[: 4 * MiB]
        with pytest.raises(ValueError, match="contiguous"):
            f.read(matrix[:, ::2])
    out = str(tmp_path / "torch.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(t[3:]) == 5 * MiB + 5
    assert file_bytes(out) == data[3:]


def test_dlpack_only_device_object(cp, tmp_file, tmp_path):
    path, data = tmp_file(3 * MiB + 4)
    arr = cp.full(3 * MiB + 4, POISON, dtype=cp.uint8)
    wrapped = DLPackOnly(arr)
    assert not hasattr(wrapped, "__cuda_array_interface__")
    with gdscp.CuFile(path) as f:
        assert f.read(wrapped) == 3 * MiB + 4
        assert f.raw_read(DLPackOnly(arr[1:]), 100, 0) == 100
    got = host_of(arr)
    assert got[0:1] == data[0:1] and got[1:101] == data[:100] and got[101:] == data[101:]
    out = str(tmp_path / "dl.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(DLPackOnly(arr[7:])) == 3 * MiB - 3
    assert file_bytes(out) == got[7:]
    with gdscp.CuFile(path) as f:
        with pytest.raises(ValueError):
            f.read(DLPackOnly(cp.zeros(100, dtype=cp.uint8)[::2]))


@pytest.fixture
def allocator(cp):
    """Swap CuPy's allocator for one test and put the old one back."""
    get = getattr(cp.cuda, "get_allocator", None)
    previous = get() if get is not None else cp.get_default_memory_pool().malloc
    yield lambda alloc: cp.cuda.set_allocator(alloc)
    cp.cuda.set_allocator(previous)


def test_cupy_async_memory_pool(cp, allocator, tmp_file, tmp_path):
    pool = cp.cuda.MemoryAsyncPool()
    allocator(pool.malloc)
    path, data = tmp_file(6 * MiB + 1)
    buf = cp.full(6 * MiB + 1, POISON, dtype=cp.uint8)
    with gdscp.CuFile(path) as f:
        assert f.read(buf) == 6 * MiB + 1
        assert f.raw_read(buf[5:], 4096, 0) == 4096
    got = host_of(buf)
    assert got[:5] == data[:5] and got[5 : 5 + 4096] == data[:4096] and got[5 + 4096 :] == data[5 + 4096 :]
    out = str(tmp_path / "async-pool.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(buf) == 6 * MiB + 1
    assert file_bytes(out) == got
    del buf
    pool.free_all_blocks()


@pytest.mark.parametrize("size", [4097, 5 * MiB + 1])
def test_managed_memory(cp, allocator, tmp_file, tmp_path, size):
    allocator(cp.cuda.malloc_managed)
    path, data = tmp_file(size)
    buf = cp.full(size, POISON, dtype=cp.uint8)
    with gdscp.CuFile(path) as f:
        assert f.read(buf) == size
        assert f.raw_read(buf[1:], 100, 7) == 100
    cp.cuda.Device().synchronize()
    got = host_of(buf)
    assert got[:1] == data[:1] and got[1:101] == data[7:107] and got[101:] == data[101:]
    out = str(tmp_path / "managed.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(buf) == size
    assert file_bytes(out) == got


def test_pinned_host_memory_counts_as_host(cp, tmp_file, tmp_path):
    import cupyx

    path, data = tmp_file(3 * MiB + 3)
    pinned = cupyx.empty_pinned((3 * MiB + 3,), dtype=np.uint8)
    pinned[:] = POISON
    with gdscp.CuFile(path) as f:
        assert f.read(pinned) == 3 * MiB + 3
        with pytest.raises(ValueError):
            f.raw_read(pinned)
        with pytest.raises(ValueError):
            f.raw_read_async(pinned, None)
    assert pinned.tobytes() == data
    out = str(tmp_path / "pinned.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(pinned[1:]) == 3 * MiB + 2
    assert file_bytes(out) == data[1:]


# --------------------------------------------------------------------------
# threads and devices
# --------------------------------------------------------------------------
def test_thread_without_cuda_context(cp, tmp_file, tmp_path):
    """A plain thread that never used CUDA (so no current context) moves device memory."""
    path, data = tmp_file(6 * MiB + 1)
    dst = cp.full(6 * MiB + 1, POISON, dtype=cp.uint8)
    out = str(tmp_path / "thread.bin")
    errors: list[BaseException] = []
    counts: list[int] = []

    def work():
        try:
            with gdscp.CuFile(path) as f:
                counts.append(f.read(dst))
                counts.append(f.raw_read(dst, 4096, 0, 10))
            with gdscp.CuFile(out, "w") as f:
                counts.append(f.write(dst))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert not errors, errors
    assert counts == [6 * MiB + 1, 4096, 6 * MiB + 1]
    expect = data[:10] + data[:4096] + data[10 + 4096 :]
    assert host_of(dst) == expect
    assert file_bytes(out) == expect


def test_eight_threads_each_with_own_file(cp, tmp_path):
    count = 8
    sizes = [5 * MiB + 3 + 4099 * i for i in range(count)]
    payloads = [random_bytes(n, seed=100 + i) for i, n in enumerate(sizes)]
    sources = [device(cp, p) for p in payloads]
    targets = [cp.full(n, POISON, dtype=cp.uint8) for n in sizes]
    paths = [str(tmp_path / f"t{i}.bin") for i in range(count)]
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def work(i):
        try:
            barrier.wait()
            for _ in range(2):
                with gdscp.CuFile(paths[i], "w+") as f:
                    assert f.write(sources[i]) == sizes[i]
                    assert f.pread(targets[i]).get() == sizes[i]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(count):
        assert file_bytes(paths[i]) == payloads[i], i
        assert host_of(targets[i]) == payloads[i], i


def test_two_gpus(cp, tmp_file, tmp_path):
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    path, data = tmp_file(5 * MiB + 1)
    with cp.cuda.Device(1):
        on_one = cp.full(5 * MiB + 1, POISON, dtype=cp.uint8)
    with cp.cuda.Device(0):
        on_zero = cp.full(5 * MiB + 1, POISON, dtype=cp.uint8)
        # Current device 0, memory on device 1: the pointer decides.
        with gdscp.CuFile(path) as f:
            assert f.read(on_one) == 5 * MiB + 1
            assert f.read(on_zero) == 5 * MiB + 1
            assert f.raw_read(on_one, 4096, 1, 3) == 4096
    expect_one = data[:3] + data[1:4097] + data[4099:]
    assert host_of(on_one) == expect_one
    assert host_of(on_zero) == data
    out = str(tmp_path / "gpu1.bin")
    with gdscp.CuFile(out, "w") as f:
        assert f.write(on_one) == 5 * MiB + 1
    assert file_bytes(out) == expect_one


# --------------------------------------------------------------------------
# compat_mode and the backend choice
# --------------------------------------------------------------------------
def test_compat_mode_on_uses_posix(cp, tmp_file):
    path, data = tmp_file(2 * MiB + 1)
    with gdscp.defaults.set("compat_mode", CompatMode.ON):
        with gdscp.CuFile(path) as f:
            assert f.backend == "posix"
            assert "compat_mode" in f.backend_reason
            buf = cp.zeros(2 * MiB + 1, dtype=cp.uint8)
            assert f.read(buf) == 2 * MiB + 1
    assert host_of(buf) == data


def test_compat_mode_auto_without_nvidia_fs_uses_posix(cp, tmp_file):
    if os.path.exists("/proc/driver/nvidia-fs/version"):
        pytest.skip("nvidia-fs is loaded here")
    path, _ = tmp_file(10)
    with gdscp.defaults.set("compat_mode", CompatMode.AUTO), gdscp.CuFile(path) as f:
        assert f.backend == "posix"
        assert "nvidia-fs" in f.backend_reason


def test_compat_mode_off(cp, tmp_file):
    """OFF needs cuFile: either it opens (libcufile, in its own compatibility
    mode where nvidia-fs is missing) and moves the right bytes, or it refuses
    with a clear RuntimeError."""
    path, data = tmp_file(6 * MiB + 5)
    with gdscp.defaults.set("compat_mode", CompatMode.OFF):
        try:
            f = gdscp.CuFile(path, "r+")
        except RuntimeError as exc:
            assert "cuFile" in str(exc) or "cufile" in str(exc).lower(), str(exc)
            return
        with f:
            assert f.backend == "cufile", f.backend_reason
            aligned = cp.full(6 * MiB + 5, POISON, dtype=cp.uint8)
            assert f.read(aligned) == 6 * MiB + 5
            assert host_of(aligned) == data

            unaligned = cp.full(2 * MiB + 10, POISON, dtype=cp.uint8)
            assert f.read(unaligned[3:], 2 * MiB + 1, 4097) == 2 * MiB + 1
            got = host_of(unaligned)
            assert got[3 : 3 + 2 * MiB + 1] == data[4097 : 4097 + 2 * MiB + 1]
            assert got[:3] == bytes([POISON]) * 3 and got[3 + 2 * MiB + 1 :] == bytes([POISON]) * 6

            assert f.raw_read(unaligned, 4096, 8192, 1) == 4096
            assert host_of(unaligned)[1:4097] == data[8192 : 8192 + 4096]

            tail = cp.full(MiB, POISON, dtype=cp.uint8)
            assert f.read(tail, file_offset=6 * MiB) == 5
            assert host_of(tail)[:5] == data[-5:]

            new = random_bytes(3 * MiB + 1, seed=8)
            assert f.write(device(cp, new), file_offset=4096) == len(new)
            assert file_bytes(path, len(new), 4096) == new

            stream = cp.cuda.Stream(non_blocking=True)
            dst = cp.full(MiB, POISON, dtype=cp.uint8)
            cp.cuda.Device().synchronize()
            fut = f.raw_read_async(dst, stream, MiB, 4096)
            assert fut.check_bytes_done() == MiB
            stream.synchronize()
            assert host_of(dst) == new[:MiB]


def test_device_buffer_on_a_real_gpu(cp, tmp_path):
    """gdscp's own device memory (what the command line uses without CuPy) on
    a real GPU: cuMemAlloc'd, filled and copied synchronously, read and written
    by gdscp on each backend, and seen by CuPy through the CUDA array interface
    and DLPack, zero-copy."""
    from gdscp import _core, memory

    data = random_bytes(5 * MiB + 3, seed=41)
    path = str(tmp_path / "d.bin")
    with open(path, "wb") as f:
        f.write(data)
    buf = _core.DeviceBuffer(len(data), 0)
    free, total = _core.device_memory_info(0)
    assert 0 < free <= total
    buf.fill(POISON)
    assert bytes(cp.asnumpy(cp.asarray(buf))) == bytes([POISON]) * len(data)
    for mode in (CompatMode.ON, CompatMode.AUTO):
        with gdscp.defaults.set({"compat_mode": mode, "gds_threshold": 0}), gdscp.CuFile(path, "r+") as f:
            buf.fill(POISON)
            assert f.read(buf, task_size=MiB) == len(data)
            assert memory.to_host(buf).tobytes() == data
            view = cp.from_dlpack(buf[MiB : 2 * MiB])  # the same memory
            view[:] = 7
            cp.cuda.Device().synchronize()
            assert f.write(buf[MiB : 2 * MiB], file_offset=MiB) == MiB
            assert file_bytes(path, MiB, MiB) == b"\x07" * MiB
            buf.copy_from_host(data)
            assert f.write(buf) == len(data)
            assert file_bytes(path) == data
    memory.fill(buf, "random", 9, 100)
    assert memory.first_difference(buf, memory.pattern(len(data), "random", 9, 100)) is None
    out = np.empty(MiB, np.uint8)
    memory.download(buf[4 * MiB :], out)
    assert np.array_equal(out, memory.pattern(MiB, "random", 9, 100 + 4 * MiB))


def test_command_line_on_a_real_gpu_without_cupy(tmp_path):
    """Where CuPy is missing, write, read and copy still run in GPU memory
    (gdscp's own, from cuMemAlloc), and every byte checks out against the OS."""
    import json
    import subprocess
    import sys

    from gdscp import memory

    def gdscp_without_cupy(*args: str) -> dict:
        program = (
            "import sys; sys.modules['cupy'] = None\n"
            "from gdscp.cli.app import run\n"
            "sys.exit(run(sys.argv[1:]))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", program, *args, "--json"], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"gdscp {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
        assert "host memory instead" not in done.stderr, done.stderr
        return json.loads(done.stdout)

    size = 21 * MiB + 4097
    path, copy = str(tmp_path / "w.bin"), str(tmp_path / "c.bin")
    doc = gdscp_without_cupy("write", path, "--size", str(size), "--pattern", "random", "--seed", "3", "--verify")
    assert doc["memory"] == "gpu" and doc["device"] == 0, doc
    assert file_bytes(path) == memory.pattern(size, "random", 3).tobytes()
    doc = gdscp_without_cupy("read", path, "--chunk-size", "4M", "--verify")
    assert doc["memory"] == "gpu" and doc["bytes"] == size and doc["verified"], doc
    # The GPU's context was made before the clock started, and reported apart.
    assert doc["setup_seconds"] > 0 and doc["seconds"] > 0, doc
    doc = gdscp_without_cupy("copy", path, copy, "--device", "0", "--chunk-size", "1M", "--verify")
    assert doc["memory"] == "gpu" and doc["ok"], doc
    assert file_bytes(copy) == file_bytes(path)
    # The many-files benchmark copies through the GPU named, else as gdscp copy runs by default.
    for named, kind, command in (((), "host", "gdscp copy -r SRC"),
                                 (("--device", "0"), "gpu", "gdscp copy -r --device 0 SRC")):
        doc = gdscp_without_cupy("benchmark", "--files", "12", "--file-size", "1K-8K", "--mode", "copy", "--runs", "3",
                                 "--dir", str(tmp_path), *named)
        (work,) = doc["workloads"]
        assert work["memory"] == kind and work["results"][0]["what"].startswith(command), work
    doc = gdscp_without_cupy("benchmark", "--size", "8M", "--threads", "2", "--runs", "3", "--mode", "read",
                             "--dir", str(tmp_path))
    assert doc["ok"] and doc["config"]["memory"] == "gpu", doc["config"]
    assert doc["baselines"]["numpy_cupy"]["available"] is False
    assert any(r["tool"] == "gdscp" and r["mode"] == "read" for r in doc["results"])


def test_command_line_writes_and_reads_several_files_in_gpu_memory(tmp_path):
    """gdscp write of several FILEs from one GPU pattern buffer, then gdscp read
    of them all (its workers' staging made before the clock): every byte
    checks out against the OS."""
    import json
    import subprocess
    import sys

    from gdscp import memory

    def gdscp(*args: str) -> dict:
        done = subprocess.run([sys.executable, "-m", "gdscp", *args, "--json"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"gdscp {' '.join(args)}: exit {done.returncode}\n{done.stderr}"
        return json.loads(done.stdout)

    size = 5 * MiB + 7
    paths = [str(tmp_path / f"m{i}.bin") for i in range(6)]
    doc = gdscp("write", *paths, "--size", str(size), "--pattern", "random", "--seed", "8", "--device", "0",
                "--verify")
    assert doc["memory"] == "gpu" and doc["ok"] and doc["bytes"] == 6 * size, doc
    expect = memory.pattern(size, "random", 8).tobytes()
    for p in paths:
        assert file_bytes(p) == expect, p
    doc = gdscp("read", *paths, "--device", "0", "--verify")
    assert doc["ok"] and doc["bytes"] == 6 * size and doc["verified"] and doc["setup_seconds"] > 0, doc


def test_prepare_then_read_on_a_real_gpu(cp, tmp_path):
    """gdscp.prepare makes the staging a read then uses: the bytes land, and
    the idle staging it made can be freed; a GPU that is not there is an error."""
    from gdscp import memory

    gdscp.bounce_buffer_free()
    data = random_bytes(9 * MiB + 5, seed=31)
    path = tmp_path / "p.bin"
    path.write_bytes(data)
    with gdscp.defaults.set({"compat_mode": CompatMode.ON, "num_threads": 4}):
        gdscp.prepare(0)
        buf = cp.full(len(data), POISON, dtype=cp.uint8)
        with gdscp.CuFile(path, "r") as f:
            assert f.read(buf) == len(data)
        assert cp.asnumpy(buf).tobytes() == data
    assert gdscp.bounce_buffer_free() >= 4 * 2 * gdscp.defaults.get("bounce_buffer_size")
    with pytest.raises(memory.DeviceError):
        gdscp.prepare(1 << 20)
