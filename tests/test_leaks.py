"""No leaks: file descriptors and pinned memory return to where they started.

Descriptors are counted in /proc/self/fd. Each test warms up first (the first
open may load libraries that keep a descriptor for the life of the process),
then takes its baseline.
"""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import gdscp
from gdscp import _core

MiB = 1 << 20


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")


@pytest.fixture
def small_file(tmp_path):
    path = str(tmp_path / "small.bin")
    np.random.default_rng(1).integers(0, 256, 64 << 10, dtype=np.uint8).tofile(path)
    return path


def test_open_close_cycles(small_file, tmp_path):
    """10,000 opens and closes, in every mode, leave no descriptor or pinned byte behind."""
    scratch = str(tmp_path / "scratch.bin")
    gdscp.CuFile(small_file).close()
    fds, pinned = open_fds(), _core.testing.pinned_bytes()
    modes = [(small_file, "r"), (small_file, "r+"), (scratch, "w"), (scratch, "a"), (scratch, "w+")]
    for i in range(10_000):
        path, mode = modes[i % len(modes)]
        if i % 2:
            with gdscp.CuFile(path, mode) as f:
                assert not f.closed
        else:
            f = gdscp.CuFile(path, mode)
            f.close()
            f.close()  # a second close is harmless
        assert f.closed
    assert open_fds() == fds
    assert _core.testing.pinned_bytes() == pinned


def test_failed_opens(small_file, tmp_path):
    """1,000 of each kind of failed open leave the descriptor count where it was."""
    missing = str(tmp_path / "missing.bin")
    folder = str(tmp_path)
    gdscp.CuFile(small_file).close()
    fds, pinned = open_fds(), _core.testing.pinned_bytes()
    for _ in range(1000):
        with pytest.raises(FileNotFoundError):
            gdscp.CuFile(missing, "r")
        with pytest.raises(IsADirectoryError):  # opened, then found to be a directory
            gdscp.CuFile(folder, "r")
        with pytest.raises(FileExistsError):
            gdscp.CuFile(small_file, "x")
        with pytest.raises(ValueError):
            gdscp.CuFile(small_file, "rw")
    assert open_fds() == fds
    assert _core.testing.pinned_bytes() == pinned
    assert not os.path.exists(missing)


def test_failed_opens_after_the_file_is_open(small_file):
    """compat_mode OFF demands cuFile: where it is missing, the open fails
    after both descriptors were opened, and must close them again."""
    with gdscp.defaults.set("compat_mode", "off"):
        try:
            gdscp.CuFile(small_file).close()
        except RuntimeError:
            pass
        fds = open_fds()
        failures = 0
        for _ in range(1000):
            try:
                gdscp.CuFile(small_file).close()
            except RuntimeError:
                failures += 1
    assert open_fds() == fds
    print(f"{failures} of 1000 opens refused (cuFile {'missing' if failures else 'present'})")


def test_errors_inside_with_blocks_close_the_file(small_file):
    gdscp.CuFile(small_file).close()
    fds = open_fds()
    for _ in range(1000):
        with pytest.raises(ZeroDivisionError):
            with gdscp.CuFile(small_file, "r"):
                1 / 0
    assert open_fds() == fds


@pytest.mark.parametrize("op", ["pread", "pwrite"])
def test_close_while_a_transfer_is_in_flight(tmp_path, op):
    """close() with a transfer running: the transfer still completes with exact
    bytes, and once get() returns the descriptors are gone."""
    path = str(tmp_path / "inflight.bin")
    data = np.random.default_rng(2).integers(0, 256, 8 * MiB, dtype=np.uint8)
    data.tofile(path)
    gdscp.CuFile(path).close()
    fds = open_fds()
    for i in range(50):
        f = gdscp.CuFile(path, "r+")
        out = np.zeros_like(data)
        future = f.pread(out, task_size=64 << 10) if op == "pread" else f.pwrite(data, task_size=64 << 10)
        f.close()
        assert f.closed
        assert future.get() == data.nbytes
        assert open_fds() == fds, f"iteration {i}: descriptors still open after close() and get()"
        if op == "pread":
            assert np.array_equal(out, data)
    assert np.array_equal(np.fromfile(path, dtype=np.uint8), data)
    with pytest.raises(ValueError, match="closed"):
        f.read(np.zeros(16, np.uint8))


def test_failed_transfers_release_descriptors(tmp_path):
    """A transfer that fails part way (injected EIO) holds nothing once get() raised."""
    path = str(tmp_path / "eio.bin")
    data = np.random.default_rng(3).integers(0, 256, 8 * MiB, dtype=np.uint8)
    data.tofile(path)
    gdscp.CuFile(path).close()
    fds = open_fds()
    for i in range(100):
        out = np.zeros_like(data)
        with gdscp.CuFile(path, "r") as f:
            _core.testing.arm_fault("pread", i % 8, 1, errno.EIO)
            try:
                with pytest.raises(OSError) as info:
                    f.read(out, task_size=MiB)
            finally:
                _core.testing.disarm_fault()
        assert info.value.errno == errno.EIO
        assert open_fds() == fds, f"iteration {i}: descriptors left open"


@pytest.mark.gpu
def test_pinned_memory_returns_after_trim(tmp_path):
    """Staged device transfers lease pinned buffers; after many of them (some
    failing) and trim_pools(), the pinned total is back where it started."""
    import threading

    import cupy

    path = str(tmp_path / "pinned.bin")
    data = np.random.default_rng(4).integers(0, 256, 24 * MiB + 333, dtype=np.uint8)
    data.tofile(path)
    # compat_mode ON: device memory goes through gdscp's pinned staging path.
    with gdscp.defaults.set({"compat_mode": "on", "bounce_buffer_size": MiB}):
        _core.trim_pools()
        start = _core.testing.pinned_bytes()

        def work(i: int, errors: list) -> None:
            try:
                dev = cupy.zeros(data.nbytes, dtype=cupy.uint8)
                with gdscp.CuFile(path, "r+") as f:
                    for r in range(10):
                        assert f.read(dev, task_size=2 * MiB) == data.nbytes
                        assert f.write(dev, task_size=3 * MiB) == data.nbytes
                cupy.cuda.get_current_stream().synchronize()
                assert np.array_equal(cupy.asnumpy(dev), data)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        errors: list = []
        threads = [threading.Thread(target=work, args=(i, errors), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "device transfers did not finish"
        assert not errors, errors[0]

        dev = cupy.zeros(data.nbytes, dtype=cupy.uint8)
        for i in range(20):  # failures return their leases too
            with gdscp.CuFile(path, "r") as f:
                _core.testing.arm_fault("pread", i, 1, errno.EIO)
                try:
                    with pytest.raises(OSError):
                        f.read(dev, task_size=2 * MiB)
                finally:
                    _core.testing.disarm_fault()

        assert _core.testing.pinned_bytes() > start, "the staging path never leased pinned memory"
        _core.trim_pools()
        assert _core.testing.pinned_bytes() == start
