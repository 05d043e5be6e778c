"""Shared fixtures: GPU detection, the ``gpu`` marker policy, ``xp``, ``tmp_file`` and ``loop_device``.

Tests marked ``gpu`` are skipped when no CUDA device is usable. On a machine
that is meant to have one, set ``GDSCP_REQUIRE_GPU=1`` so that a missing
device (or a broken CuPy) fails those tests instead of silently skipping them.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pytest


@functools.lru_cache(maxsize=None)
def gpu_status() -> tuple[bool, str]:
    """Return (available, reason): whether CuPy imports and sees at least one device.

    Cached so the CUDA runtime is probed once per test run; any failure while
    probing (no cupy, no driver, no device) counts as "no GPU", with the reason.
    """
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no usable CUDA device ({type(exc).__name__}: {exc})"
    if count <= 0:
        return False, "CUDA reports no devices"
    return True, f"{count} CUDA device(s)"


def has_gpu() -> bool:
    return gpu_status()[0]


def sanitized() -> bool:
    """Under the sanitizers' runtimes (scripts/sanitize.sh preloads them), which
    reserve terabytes of address space and so cannot run under an RLIMIT_AS."""
    preload = os.environ.get("LD_PRELOAD", "")
    return "libasan" in preload or "libtsan" in preload


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a true value (1, true, yes, on)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def require_gpu() -> bool:
    return env_flag("GDSCP_REQUIRE_GPU")


def beside_other_test_runs() -> bool:
    """Whether other test runs share this machine: set
    GDSCP_TESTS_BESIDE_OTHERS=1 (the sanitizer runs go side by side), or
    this run spread over processes of pytest-xdist, which run beside each
    other."""
    return env_flag("GDSCP_TESTS_BESIDE_OTHERS") or int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


def pytest_configure(config):
    # The CLI's tables take the width COLUMNS gives, else 160 columns where
    # the output is not a terminal; pytest-xdist's workers inherit a COLUMNS
    # of 80, which would cut long temporary paths short in some runs only.
    os.environ.pop("COLUMNS", None)
    # The signal tests send SIGINT, to this process and to the commands it
    # starts, and expect Python's own handling of it. A test run started as a
    # background job (`pytest &` in a script) inherits SIGINT ignored, and so
    # would every command it starts: give the signal back its default here.
    # The tests of a command started with SIGINT ignored ignore it themselves.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Dropping the whole machine's page cache (as root) would take the cached
    # pages from under the tests of the runs beside this one that read a file
    # they have just cached. There, gdscp is refused the drop, as a user
    # without root is.
    if beside_other_test_runs():
        import gdscp.page_cache

        gdscp.page_cache._set_drop_caches = lambda level: False


def pytest_report_header(config):
    available, reason = gpu_status()
    policy = "required" if require_gpu() else "optional"
    return f"gdscp GPU: {'yes' if available else 'no'} ({reason}); GPU tests {policy}"


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    """How many CUDA devices CuPy sees (0 without a usable GPU)."""
    if not has_gpu():
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    available, reason = gpu_status()
    if available and item.get_closest_marker("multi_gpu") is not None and gpu_count() < 2:
        pytest.skip(f"needs two GPUs: {reason}")
    if available:
        return
    if require_gpu():
        pytest.fail(f"GDSCP_REQUIRE_GPU=1 but no GPU: {reason}", pytrace=False)
    pytest.skip(f"needs a GPU: {reason}")


@pytest.fixture(scope="session")
def gpu_available() -> bool:
    return has_gpu()


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module for the buffer under test: numpy (host) or cupy (device)."""
    if request.param == "numpy":
        return np
    import cupy

    return cupy


def to_host(array) -> np.ndarray:
    """A numpy copy of ``array`` (numpy or cupy), for byte comparisons."""
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)
    if get is not None:
        return get()
    return np.asarray(array)


def as_bytes(array) -> bytes:
    return to_host(array).tobytes()


POISON = 0xA5


def from_bytes(xp, data: bytes):
    """A writable uint8 array of module ``xp`` holding ``data``."""
    return xp.asarray(np.frombuffer(data, dtype=np.uint8).copy())


def poisoned(xp, size: int, value: int = POISON):
    """A uint8 array of ``size`` bytes, all ``value``: bytes a read must not touch stay visible."""
    return xp.full(size, value, dtype=xp.uint8)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


def random_bytes(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def wait_for_held_workers(count: int, seconds: float = 60) -> None:
    """Waits until ``count`` workers wait at the engine's hold (testing.arm_hold);
    fails once ``seconds`` have passed."""
    from gdscp import _core

    deadline = time.monotonic() + seconds
    while _core.testing.held_workers() < count:
        assert time.monotonic() < deadline, f"{_core.testing.held_workers()} of {count} workers reached the hold"
        time.sleep(0.001)


class DLPackOnly:
    """An array seen only through DLPack, as from libraries without the buffer
    protocol or the CUDA array interface."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def wait_engine_idle(seconds: float = 10) -> bool:
    """Wait until no engine worker runs a task (a transfer returned or left
    running by an earlier test finishes); True once idle."""
    from gdscp import _core

    deadline = time.monotonic() + seconds
    while _core.testing.busy_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _core.testing.busy_threads() == 0


def first_page_cached(path: str) -> bool | None:
    """Whether the page cache holds the first page of ``path``, from cachestat(2)
    (Linux 6.5+, called through ctypes); None where the kernel cannot tell."""
    import ctypes

    class Range(ctypes.Structure):
        _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]

    libc = ctypes.CDLL(None, use_errno=True)
    stat = (ctypes.c_uint64 * 5)()
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.syscall(451, fd, ctypes.byref(Range(0, 1)), stat, 0) != 0:
            return None
    finally:
        os.close(fd)
    return stat[0] > 0


def drops_cached_pages(folder) -> bool:
    """Whether the filesystem of ``folder`` lets POSIX_FADV_DONTNEED drop a
    synced file's cached pages (tmpfs keeps them: they are its data)."""
    import tempfile

    import gdscp

    fd, path = tempfile.mkstemp(prefix="gdscp-drops-", dir=str(folder))
    try:
        os.write(fd, b"x" * 8192)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return gdscp.get_page_cache_info(path)[0] == 0
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.fixture
def page_cache_folder(tmp_path):
    """A folder whose files' cached pages can be dropped: ``tmp_path``, or
    where that is on tmpfs (a /tmp in memory), a fresh folder under /var/tmp
    or the home directory, removed afterwards; skipped if there is none."""
    import shutil
    import tempfile
    from pathlib import Path

    if drops_cached_pages(tmp_path):
        yield tmp_path
        return
    for base in ("/var/tmp", os.path.expanduser("~")):
        if os.path.isdir(base) and os.access(base, os.W_OK) and drops_cached_pages(base):
            folder = tempfile.mkdtemp(prefix="gdscp-test-", dir=base)
            yield Path(folder)
            shutil.rmtree(folder, ignore_errors=True)
            return
    pytest.skip("no folder here whose filesystem drops cached pages (tmpfs keeps them)")


@pytest.fixture
def loop_device(tmp_path):
    """A 16 MiB block device (a loop device over a file of 0xEE bytes), where
    this process may make one (root, with losetup); skipped elsewhere."""
    import subprocess
    from pathlib import Path

    image = tmp_path / "image"
    image.write_bytes(b"\xee" * (16 << 20))
    try:
        made = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no losetup here")
    if made.returncode != 0:
        pytest.skip(f"cannot make a loop device here: {made.stderr.strip()}")
    device = made.stdout.strip()
    try:
        yield Path(device)
    finally:
        subprocess.run(["losetup", "--detach", device], check=True)


@pytest.fixture
def tmp_file(tmp_path):
    """Factory: ``tmp_file(size, name=None, seed=None, dir=None)`` -> (path, bytes).

    Writes ``size`` random bytes to a fresh file and returns its path as a str
    together with the bytes written.
    """
    counter = iter(range(1 << 30))

    def make(size: int, name: str | None = None, seed: int | None = None, dir=None):
        index = next(counter)
        folder = tmp_path if dir is None else dir
        path = os.path.join(str(folder), name or f"data{index}.bin")
        data = random_bytes(size, seed if seed is not None else index + 1)
        with open(path, "wb") as f:
            f.write(data)
        return path, data

    return make


@pytest.fixture(autouse=True)
def _outside_the_source_tree(tmp_path_factory, monkeypatch):
    """Run every test from a scratch directory. Subprocesses (`python -c`,
    `python -m gdscp`) put their working directory on sys.path, and from the
    repository root they would import the uncompiled source tree instead of
    the installed package."""
    monkeypatch.chdir(tmp_path_factory.getbasetemp())


@pytest.fixture(autouse=True)
def _settings_restored():
    """Every test starts from the same settings: one that changes a setting
    (as a KvikIO-style program does) has it put back afterwards, so a later
    test's transfers are split the same way whatever ran before it."""
    from gdscp import defaults

    before = defaults.current()
    yield
    changed = {name: old for name, old in before.items() if defaults.current().get(name) != old}
    if changed:
        defaults.set(changed)
