"""Faults surface as clear errors, never as hangs or crashes.

Each fault (a full disk, an I/O error in the middle of a file, a file cut short
while it is read, a refused permission, the GPU out of memory, Ctrl-C) runs in
a child interpreter with a deadline, so that a hang fails one test instead of
stopping the suite, and a crash shows up as the child's exit status. After
each fault the child proves the engine is healthy: the handle closes, every
worker is free, and the next transfer moves exact bytes.

The second half interrupts ``gdscp copy`` with SIGINT and SIGTERM at random
moments and fills the disk under it: the destination is then absent, intact
or complete, never partial, and no temporary file is left behind.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import standin
from conftest import random_bytes, wait_engine_idle

CHILD_TIMEOUT = 60
MiB = 1 << 20

# Shared by every child: builds data, and checks that the engine still works.
PRELUDE = r'''
import errno, os, resource, signal, sys, threading
import numpy as np
import gdscp
from gdscp import _core

MiB = 1 << 20

def payload(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)

def round_trip(folder, xp=np, size=4 * MiB + 12345, name="healthy.bin"):
    """Write and read back through a fresh handle, split into many tasks."""
    path = os.path.join(folder, name)
    data = payload(size, 99)
    src = xp.asarray(data)
    with gdscp.CuFile(path, "w") as f:
        assert f.write(src, task_size=256 << 10) == size
    out = xp.full(size, 0xA5, dtype=xp.uint8)
    with gdscp.CuFile(path, "r") as f:
        assert f.read(out, task_size=256 << 10) == size
    host = out.get() if hasattr(out, "get") else out
    assert np.array_equal(host, data), "round trip after the fault moved wrong bytes"
    os.unlink(path)

def assert_healthy(folder, xp=np):
    """No worker is stuck and transfers work, on one worker and on all.

    Once the transfers have returned every worker must go idle (a worker
    still busy seconds later is stuck, and the parent's deadline catches a
    transfer that never returns).
    """
    with gdscp.defaults.set("num_threads", 1):
        round_trip(folder, xp)
    round_trip(folder, xp)
    assert wait_engine_idle(), f"{_core.testing.busy_threads()} workers still busy"

def expect_os_error(call, err, path):
    try:
        call()
    except OSError as e:
        assert e.errno == err, f"errno {e.errno} ({e}), expected {err}"
        assert isinstance(e, RuntimeError), "engine OS errors are RuntimeError too (KvikIO compatibility)"
        assert e.filename == path, f"filename {e.filename!r}, expected {path!r}"
        assert path in str(e), f"message does not name the file: {e}"
        return e
    raise AssertionError(f"no OSError (expected errno {err})")
'''
# The child has no conftest: it gets the same idle check, by its source.
PRELUDE += "import time\n" + inspect.getsource(wait_engine_idle)



def run_child(code: str, cwd, *, timeout: float = CHILD_TIMEOUT, preexec_fn=None, env=None) -> subprocess.CompletedProcess:
    """Run PRELUDE + code in a fresh interpreter; fail on a hang or a non-zero exit.

    The child runs outside the source tree so that it imports the installed
    package (which matters for the sanitizer builds).
    """
    script = PRELUDE + textwrap.dedent(code) + '\nprint("CHILD-OK")\n'
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            cwd=str(cwd),
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=preexec_fn,
            env=env,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"child hung for {timeout} s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    if proc.returncode == 77 and "SKIP:" in proc.stdout:
        pytest.skip(proc.stdout.split("SKIP:", 1)[1].strip())
    if proc.returncode != 0 or "CHILD-OK" not in proc.stdout:
        pytest.fail(f"child exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    print(proc.stdout, end="")  # what the child observed, for -s / -rP
    return proc


# -- a disk that fills ----------------------------------------------------------


@pytest.mark.parametrize("direct_io", [False, True], ids=["buffered", "direct"])
def test_disk_full_raises_efbig_and_recovers(tmp_path, direct_io):
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        gdscp.defaults.set("direct_io", {direct_io!r})
        limit = 1 * MiB
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        path = os.path.join(folder, "full.bin")
        data = payload(8 * MiB, 1)

        # Split over the workers, and on the calling thread (a small write
        # that crosses the limit: the first pwrite is short, the next fails).
        cases = [(data, 0, MiB), (data[: 512 << 10], 768 << 10, MiB)]
        for buf, offset, task in cases:
            f = gdscp.CuFile(path, "w")
            e = expect_os_error(lambda: f.write(buf, file_offset=offset, task_size=task), errno.EFBIG, path)
            assert e.offset is not None and limit <= e.offset < offset + buf.nbytes, e.offset
            assert "offset" in str(e), str(e)
            f.close()
            assert f.closed
            assert os.path.getsize(path) <= limit

        # Lift the limit (as when space is freed): the same work now succeeds.
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert_healthy(folder)
        with gdscp.CuFile(path, "w+") as f:
            assert f.write(data, task_size=MiB) == data.nbytes
            out = np.empty_like(data)
            assert f.read(out) == data.nbytes
        assert np.array_equal(out, data)
        """,
        tmp_path,
    )


# -- an I/O error in the middle of a file --------------------------------------


@pytest.mark.parametrize("direct_io", [False, True], ids=["buffered", "direct"])
@pytest.mark.parametrize("op", ["pread", "pwrite"])
def test_io_error_mid_file_is_reported_and_recovers(tmp_path, op, direct_io):
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        op = {op!r}
        gdscp.defaults.set("direct_io", {direct_io!r})
        path = os.path.join(folder, "eio.bin")
        data = payload(8 * MiB, 2)
        with gdscp.CuFile(path, "w") as f:
            f.write(data)

        # skip: how many system calls succeed first; count: a one-off error or
        # a device that keeps failing.
        for skip in (0, 3, 7):
            for count in (1, 10_000):
                f = gdscp.CuFile(path, "r+")
                out = np.zeros_like(data)
                _core.testing.arm_fault(op, skip, count, errno.EIO)
                try:
                    if op == "pread":
                        future = f.pread(out, task_size=MiB)
                    else:
                        future = f.pwrite(data, task_size=MiB)
                    e = expect_os_error(future.get, errno.EIO, path)
                    assert future.done()
                finally:
                    _core.testing.disarm_fault()
                assert e.offset is not None and 0 <= e.offset < data.nbytes, e.offset
                assert "Input/output error" in str(e), str(e)
                f.close()

                # The same file, reopened, reads and writes exact bytes again.
                with gdscp.CuFile(path, "r+") as f:
                    assert f.write(data, task_size=MiB) == data.nbytes
                    assert f.read(out, task_size=MiB) == data.nbytes
                assert np.array_equal(out, data)
        assert_healthy(folder)
        """,
        tmp_path,
    )


@pytest.mark.parametrize("op", ["pread", "pwrite"])
def test_interrupted_system_calls_are_retried(tmp_path, op):
    """EINTR is not a failure: the engine retries and the bytes are exact."""
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "eintr.bin")
        data = payload(6 * MiB + 17, 3)
        with gdscp.CuFile(path, "w") as f:
            f.write(data)
        out = np.zeros_like(data)
        _core.testing.arm_fault({op!r}, 2, 5, errno.EINTR)
        try:
            with gdscp.CuFile(path, "r+") as f:
                assert f.write(data, task_size=MiB) == data.nbytes
                assert f.read(out, task_size=MiB) == data.nbytes
        finally:
            _core.testing.disarm_fault()
        assert np.array_equal(out, data)
        """,
        tmp_path,
    )


@pytest.mark.gpu
def test_io_error_into_device_memory(tmp_path):
    """A failing pread under the pinned staging path: clean error, then exact bytes."""
    run_child(
        f"""
        import cupy
        folder = {str(tmp_path)!r}
        gdscp.defaults.set("compat_mode", "on")  # the engine's own path, where the hook applies
        path = os.path.join(folder, "eio-device.bin")
        data = payload(16 * MiB, 4)
        with gdscp.CuFile(path, "w") as f:
            f.write(data)
        for op in ("pread", "pwrite"):
            dev = cupy.asarray(data)
            with gdscp.CuFile(path, "r+") as f:
                _core.testing.arm_fault(op, 2, 1, errno.EIO)
                try:
                    call = (lambda: f.read(dev, task_size=MiB)) if op == "pread" else (lambda: f.write(dev, task_size=MiB))
                    expect_os_error(call, errno.EIO, path)
                finally:
                    _core.testing.disarm_fault()
        # An append from GPU memory that fails part-way leaves the file as it was.
        before = np.fromfile(path, np.uint8)
        with gdscp.CuFile(path, "a") as f:
            _core.testing.arm_fault("pwrite", 2, 1, errno.EIO)
            try:
                expect_os_error(lambda: f.write(cupy.asarray(data), task_size=MiB), errno.EIO, path)
            finally:
                _core.testing.disarm_fault()
        assert np.array_equal(np.fromfile(path, np.uint8), before)
        assert_healthy(folder, cupy)
        """,
        tmp_path,
    )


# -- an append that fails or is cancelled -----------------------------------------
# A large append reserves its range at the end of the file, then fills it in
# parallel. One that fails or is cancelled part-way gives the range back: the
# file is as it was, and the next append lands where this one would have.


@pytest.mark.parametrize("direct_io", [False, True], ids=["buffered", "direct"])
def test_a_failed_append_leaves_the_file_as_it_was(tmp_path, direct_io):
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        gdscp.defaults.set({{"direct_io": {direct_io!r}, "num_threads": 4}})
        path = os.path.join(folder, "log.bin")
        before = payload(3 * MiB + 123, 1)  # an end that is not block-aligned
        before.tofile(path)
        data = payload(8 * MiB + 7, 2)
        # skip: system calls that succeed first (0: the first piece fails;
        # 5: some pieces are in the file when one fails); count: once, or
        # every call after.
        for call in ("write", "pwrite"):
            for skip in (0, 5):
                for count in (1, 10_000):
                    with gdscp.CuFile(path, "a") as f:
                        _core.testing.arm_fault("pwrite", skip, count, errno.EIO)
                        try:
                            if call == "write":
                                expect_os_error(lambda: f.write(data, task_size=MiB), errno.EIO, path)
                            else:
                                expect_os_error(f.pwrite(data, task_size=MiB).get, errno.EIO, path)
                        finally:
                            _core.testing.disarm_fault()
                    got = np.fromfile(path, np.uint8)
                    assert got.nbytes == before.nbytes, (call, skip, count, got.nbytes)
                    assert np.array_equal(got, before), (call, skip, count)
        # The next append lands right after the old end.
        with gdscp.CuFile(path, "a") as f:
            assert f.write(data, task_size=MiB) == data.nbytes
        assert np.array_equal(np.fromfile(path, np.uint8), np.concatenate([before, data]))
        assert_healthy(folder)
        """,
        tmp_path,
    )


def test_an_append_past_the_file_size_limit_changes_nothing(tmp_path):
    """The reservation itself is refused (EFBIG): nothing is written."""
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "log.bin")
        before = payload(MiB + 5, 1)
        before.tofile(path)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * MiB, hard))
        with gdscp.CuFile(path, "a") as f:
            e = expect_os_error(lambda: f.write(payload(8 * MiB, 2), task_size=MiB), errno.EFBIG, path)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert "append" in str(e), str(e)
        assert np.array_equal(np.fromfile(path, np.uint8), before)
        assert_healthy(folder)
        """,
        tmp_path,
    )


def test_a_small_append_cut_short_by_the_file_size_limit_changes_nothing(tmp_path):
    """A small append from host memory is one O_APPEND write, which the kernel
    takes only in part where the file reaches its size limit: the next write
    for the rest fails (EFBIG). What the first took is given back."""
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "log.bin")
        limit = MiB + 4096
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        calls = {{"write": lambda f, buf: f.write(buf), "pwrite": lambda f, buf: f.pwrite(buf).get()}}
        for size in (1, 3097, 8192, MiB - 1):
            data = payload(size, size)
            # over: bytes past the limit (one, or half the append); size 1: none fits.
            for over in sorted({{1, (size + 1) // 2}}):
                before = payload(limit - size + over, over)
                for name, call in calls.items():
                    before.tofile(path)
                    with gdscp.CuFile(path, "a") as f:
                        expect_os_error(lambda: call(f, data), errno.EFBIG, path)
                    with open(path, "rb") as got:
                        assert got.read() == before.tobytes(), (name, size, over, os.path.getsize(path))
        # The next append, the limit lifted, lands right after the old end.
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        with gdscp.CuFile(path, "a") as f:
            assert f.write(data) == data.nbytes
        with open(path, "rb") as got:
            assert got.read() == before.tobytes() + data.tobytes()
        assert_healthy(folder)
        """,
        tmp_path,
    )


@pytest.mark.parametrize("large", ["kept", "cancelled"])
def test_a_small_append_cut_short_behind_a_large_one_in_flight(tmp_path, large):
    """A small append that the file size limit cuts short lands after a large
    append of the same handle whose range is reserved and still being
    written: it gives back only its own bytes. The large one is then kept
    whole, or, cancelled, gives its range back too: the file as it was."""
    run_child(
        f"""
        import time
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "log.bin")
        before = payload(1000, 1)
        before.tofile(path)
        big = payload(8 * MiB, 2)
        small = payload(8192, 3)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        # Room for the large append and 3096 bytes of the small one.
        resource.setrlimit(resource.RLIMIT_FSIZE, (before.nbytes + big.nbytes + 3096, hard))
        gdscp.defaults.set("num_threads", 2)
        with gdscp.CuFile(path, "a") as f:
            _core.testing.arm_hold(1)  # the second chunk claimed, and every one after, waits
            try:
                future = f.pwrite(big, task_size=MiB)
                deadline = time.monotonic() + 30
                while _core.testing.held_workers() < 2:
                    assert time.monotonic() < deadline, "the append's workers never reached the hold"
                    time.sleep(0.001)
                expect_os_error(lambda: f.write(small), errno.EFBIG, path)
                assert os.path.getsize(path) == before.nbytes + big.nbytes, os.path.getsize(path) - before.nbytes
                if {large!r} == "cancelled":
                    future.cancel()
            finally:
                _core.testing.disarm_fault()
            assert future.get() == (big.nbytes if {large!r} == "kept" else 0)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        with open(path, "rb") as got:
            assert got.read() == before.tobytes() + (big.tobytes() if {large!r} == "kept" else b"")
        assert_healthy(folder)
        """,
        tmp_path,
    )


@pytest.mark.parametrize("later", [False, True], ids=["alone", "another-append-after-it"])
def test_a_cancelled_append_is_given_back(tmp_path, later):
    """An append cancelled while its first chunk is written and the rest wait
    reports 0 bytes and leaves the file as it was; where another append has
    landed after its range meanwhile, the range stays (what it wrote, zeros
    elsewhere) and that append is kept whole."""
    run_child(
        f"""
        import time
        folder = {str(tmp_path)!r}
        later = {later!r}
        path = os.path.join(folder, "log.bin")
        before = payload(MiB + 5, 1)
        before.tofile(path)
        data = payload(8 * MiB, 2)
        tail = payload(1000, 3)
        gdscp.defaults.set("num_threads", 2)
        with gdscp.CuFile(path, "a") as f:
            _core.testing.arm_hold(1)  # the second chunk claimed, and every one after, waits for the cancel
            try:
                future = f.pwrite(data, task_size=MiB)
                deadline = time.monotonic() + 30
                while _core.testing.held_workers() < 2:
                    assert time.monotonic() < deadline, "the append's workers never reached the hold"
                    time.sleep(0.001)
                if later:
                    with gdscp.CuFile(path, "a") as g:
                        assert g.write(tail) == tail.nbytes
                future.cancel()
                assert future.get() == 0
                assert future.cancelled()
            finally:
                _core.testing.disarm_fault()
        got = np.fromfile(path, np.uint8)
        if not later:
            assert np.array_equal(got, before)
        else:
            assert got.nbytes == before.nbytes + data.nbytes + tail.nbytes, got.nbytes
            assert np.array_equal(got[: before.nbytes], before)
            assert np.array_equal(got[-tail.nbytes :], tail)
            middle = got[before.nbytes : before.nbytes + data.nbytes].reshape(8, MiB)
            for i, chunk in enumerate(middle):
                assert np.array_equal(chunk, data[i * MiB : (i + 1) * MiB]) or not chunk.any(), i
        assert_healthy(folder)
        """,
        tmp_path,
    )


# -- a file cut short while it is read ------------------------------------------


@pytest.mark.parametrize(
    "device, task_size",
    [
        (False, 128 << 10),
        (False, 2 * MiB),
        pytest.param(True, 128 << 10, marks=pytest.mark.gpu),
        pytest.param(True, 2 * MiB, marks=pytest.mark.gpu),
    ],
    ids=["host-pread", "host-mapped", "device", "device-pieces"],
)
def test_file_truncated_while_read(tmp_path, device, task_size):
    """Another thread shrinks the file during a read, many times: a short count
    or a clean error; the count never covers a byte that was not read (a chunk
    cut short ends it, even where later chunks were read whole before the cut),
    and it reaches at least the final size. With 2 MiB tasks host reads copy
    out of a mapping, where pages cut off raise SIGBUS, and device reads stage
    each chunk in 256 KiB pieces (a short piece in a chunk)."""
    trials = 20 if device else 100
    run_child(
        f"""
        import random
        folder = {str(tmp_path)!r}
        if {device!r}:
            import cupy as xp
        else:
            xp = np
        path = os.path.join(folder, "shrinking.bin")
        gdscp.defaults.set({{"bounce_buffer_size": 256 << 10}})
        size = 16 * MiB
        data = payload(size, 5)
        rng = random.Random(7)
        outcomes = set()
        # One buffer, poisoned again for every trial, and no other 16 MiB
        # array made per trial: new ones made most of this test's run time
        # under ThreadSanitizer (its shadow of every mapping made and unmapped).
        out = xp.empty(size, dtype=xp.uint8)
        differs = np.empty(size, dtype=bool)
        for trial in range({trials}):
            with open(path, "wb") as w:
                w.write(memoryview(data))
            final = rng.randrange(0, size)
            steps = sorted({{rng.randrange(final, size + 1) for _ in range(3)}} | {{final}}, reverse=True)
            delay = rng.random() * 0.004
            out.fill(0xA5)

            def shrink():
                threading.Event().wait(delay)
                for n in steps:  # never grows: bytes below each size stay valid
                    os.truncate(path, n)

            t = threading.Thread(target=shrink, daemon=True)
            with gdscp.CuFile(path, "r") as f:
                t.start()
                try:
                    n = f.read(out, task_size={task_size})
                except RuntimeError as e:  # every gdscp error is one (OSError ones too)
                    assert path in str(e), e
                    outcomes.add("error")
                    n = None
            t.join(30)
            assert not t.is_alive()
            if n is not None:
                outcomes.add("full" if n == size else "short")
                assert final <= n <= size, (n, final)
                host = out.get() if hasattr(out, "get") else out
                # The count covers only bytes that were read: a chunk cut
                # short must not be counted past, whatever later chunks read,
                # so no byte of it still holds the poison. (A read racing a
                # truncation may copy the zeros the kernel writes over the cut
                # part of a page: past the final size, zeros were read.)
                wrong = np.flatnonzero(np.not_equal(host[:n], data[:n], out=differs[:n]))
                assert wrong.size == 0 or (wrong[0] >= final and not host[wrong].any()), (
                    f"the count {{n}} covers bytes that were never read (from offset {{wrong[0]}})")
        print("outcomes", sorted(outcomes))
        assert_healthy(folder, xp)
        """,
        tmp_path,
    )


@pytest.mark.parametrize("task_size", [64 << 10, 2 * MiB], ids=["pread", "mapped"])
def test_a_short_chunk_ends_the_count(tmp_path, task_size):
    """One chunk of a parallel read comes up short (its read returns 0, as at
    end of file) while the chunks after it are read whole: the count is the
    part of the range before that chunk, never the sum of what the tasks read,
    and the bytes it covers are exact."""
    run_child(
        f"""
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "gap.bin")
        size = 32 * MiB
        data = payload(size, 6)
        data.tofile(path)
        task = {task_size}
        counts = []
        # Two workers, whatever the machine: the plan is then whole chunks of
        # `task` up to its last few, which taper (on many cores every chunk
        # of this file would, and a chunk boundary would not be a multiple of task).
        with gdscp.defaults.set("num_threads", 2), gdscp.CuFile(path, "r") as f:
            for skip in (0, 3, 7, 11):
                out = np.full(size, 0xA5, dtype=np.uint8)
                _core.testing.arm_fault("pread", skip, 1, 0)
                try:
                    n = f.read(out, task_size=task)
                finally:
                    _core.testing.disarm_fault()
                counts.append(n)
                assert n < size, "no chunk came up short"
                assert n % task == 0, f"the count {{n}} ends inside a chunk"
                assert np.array_equal(out[:n], data[:n]), "the count covers bytes that were never read"
                assert (out[n : n + task] == 0xA5).all(), "the short chunk was read after all"
        print("counts", counts)
        assert_healthy(folder)
        """,
        tmp_path,
    )


def test_mapped_copy_survives_pages_cut_off(tmp_path):
    """The mapped copy that host reads use, on a range reaching past the end of
    the file (what a truncation by another process does to a mapping): the
    SIGBUS guard catches the fault and the copy reports it; no crash. With
    faulthandler on (it owns SIGBUS first), off, and after it was turned off
    again; after each, reads of the file's tail still go through the mapping
    and give exact bytes."""
    run_child(
        f"""
        import faulthandler
        from gdscp._core import testing
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "tail.bin")
        data = payload(8 * MiB + 4097, 6)
        data.tofile(path)
        tail = 3 * MiB + 5
        start = data.nbytes - tail
        # one worker, one task: the whole tail is one mapped copy, whatever the core count
        gdscp.defaults.set("num_threads", 1)
        fd = os.open(path, os.O_RDONLY)
        for phase in ("faulthandler on", "faulthandler off", "faulthandler on again"):
            if phase == "faulthandler off":
                faulthandler.disable()
            else:
                faulthandler.enable()
            for dst_shift in (0, 1):
                out = np.zeros(tail + dst_shift, np.uint8)
                # inside the file: every byte copied
                assert testing.mapped_copy(fd, out[dst_shift:], start), phase
                assert np.array_equal(out[dst_shift:], data[-tail:]), phase
                # the same length 4 MiB further on: past the end, the guard catches the fault
                before = testing.mapped_read_bytes()
                assert testing.mapped_copy(fd, out[dst_shift:], start + 4 * MiB) is False, phase
                assert testing.mapped_read_bytes() == before
                out[:] = 0
                with gdscp.CuFile(path, "r") as f:
                    n = f.read(out[dst_shift:], file_offset=start, task_size=64 * MiB)
                assert n == tail, (phase, n)
                assert testing.mapped_read_bytes() == before + tail, phase
                assert np.array_equal(out[dst_shift:], data[-tail:]), phase
        os.close(fd)
        assert_healthy(folder)
        """,
        tmp_path,
    )


@pytest.fixture(scope="module")
def foreign_sigbus(tmp_path_factory):
    """tests/foreign_sigbus.c (another library's SIGBUS handlers) built into a
    shared library: its path."""
    if os.uname().machine != "x86_64":
        pytest.skip("the SIGBUS guard is x86-64 only")
    try:
        cc = standin.find_compiler()
    except standin.Unavailable as exc:
        pytest.skip(str(exc))
    lib = tmp_path_factory.mktemp("foreign-sigbus") / "libforeign_sigbus.so"
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "foreign_sigbus.c")
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), source], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return str(lib)


@pytest.mark.parametrize("how", ["Mmap", "CuFile"])
def test_a_handler_found_before_the_guard_gets_every_sigbus_not_its_own(tmp_path, foreign_sigbus, how):
    """A library that recovers from faults on its own mappings with
    siglongjmp, its handler installed before gdscp's guard: every one of its
    faults reaches it, on any thread, however many there are and whether or
    not gdscp reads between them, and the guard still catches its own."""
    run_child(
        f"""
        import ctypes
        from gdscp._core import testing
        folder = {str(tmp_path)!r}
        lib = ctypes.CDLL({foreign_sigbus!r})
        assert lib.install_recovering() == 0
        small = os.path.join(folder, "small.bin").encode()
        with open(small, "wb") as f:
            f.write(b"A" * 4096)
        path = os.path.join(folder, "data.bin")
        data = payload(4 * MiB, 7)
        data.tofile(path)
        gdscp.defaults.set("num_threads", 1)  # one task: a mapped read whatever the core count

        def gdscp_read():
            out = np.zeros(data.size, np.uint8)
            before = testing.mapped_read_bytes()
            if {how!r} == "Mmap":
                with gdscp.Mmap(path) as m:
                    assert m.read(out) == data.size
            else:
                with gdscp.CuFile(path, "r") as f:
                    assert f.read(out, task_size=4 * MiB) == data.size
                assert testing.mapped_read_bytes() == before + data.size  # out of the page cache's mapping
            assert np.array_equal(out, data)

        def faults(count):
            # inside the file: the byte; a page past its end: the fault, recovered by the library
            for _ in range(count):
                assert lib.read_mapped(small, 4096, 100) == ord("A")
                assert lib.read_mapped(small, 3 * 4096, 8192) == -1

        assert lib.read_mapped(small, 3 * 4096, 8192) == -1  # before gdscp
        gdscp_read()  # the guard goes in front of the library's handler
        faults(3)
        for _ in range(2):
            gdscp_read()
            faults(2)
        errors = []
        def on_a_thread():
            try:
                faults(3)
                gdscp_read()
                faults(1)
            except BaseException as exc:
                errors.append(exc)
        t = threading.Thread(target=on_a_thread)
        t.start()
        t.join(60)
        assert not t.is_alive() and not errors, errors
        assert lib.recovered_faults() == 1 + 3 + 2 * 2 + 3 + 1
        # the guard's own faults are still its own
        out = np.zeros(MiB, np.uint8)
        fd = os.open(path, os.O_RDONLY)
        assert testing.mapped_copy(fd, out, data.size - 4096) is False
        os.close(fd)
        assert lib.recovered_faults() == 12
        faults(1)
        assert lib.recovered_faults() == 13
        assert_healthy(folder)
        """,
        tmp_path,
    )


@pytest.mark.parametrize("how", ["sent", "fault", "fault, faulthandler", "fault, a handler raising it inside"])
def test_unrelated_sigbus_still_kills(tmp_path, how, request):
    """The guard only catches faults of its own copies: any other SIGBUS (sent,
    or a fault on a mapping of its own) still has its default effect once gdscp
    has installed the guard, and promptly. With Python's faulthandler turned on
    after the guard (which gdscp's next read puts back in front of it), the
    fault is reported once, then kills: the two handlers do not hand it back
    and forth; nor with a handler that puts the guard back and raises the
    signal again with SIGBUS unblocked, so that the guard runs inside it."""
    lib = request.getfixturevalue("foreign_sigbus") if how == "fault, a handler raising it inside" else None
    script = PRELUDE + textwrap.dedent(
        f"""
        import ctypes, faulthandler, mmap
        path = os.path.join({str(tmp_path)!r}, "x.bin")
        payload(4 * MiB, 1).tofile(path)
        # One worker, one task: on a machine with many cores the request would
        # otherwise be split below the size that mapped reads take.
        gdscp.defaults.set("num_threads", 1)
        def read():
            with gdscp.CuFile(path, "r") as f:
                f.read(np.empty(4 * MiB, np.uint8), task_size=4 * MiB)
        read()
        if {how!r} == "fault, faulthandler":
            faulthandler.enable()
            read()
        if {how!r} == "fault, a handler raising it inside":
            assert ctypes.CDLL({lib!r}).install_reporting() == 0
            read()
        assert _core.testing.mapped_read_bytes() > 0
        sys.stdout.flush()
        if {how!r} == "sent":
            os.kill(os.getpid(), signal.SIGBUS)
        else:
            fd = os.open(path, os.O_RDWR)
            m = mmap.mmap(fd, MiB)
            os.ftruncate(fd, 0)
            m[8192]
        print("survived")
        """
    )
    env = dict(os.environ)
    for name in ("ASAN_OPTIONS", "TSAN_OPTIONS"):  # under scripts/sanitize.sh: the death is expected, not a report
        env[name] = env.get(name, "") + ":handle_sigbus=0"
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=str(tmp_path), capture_output=True, text=True, timeout=CHILD_TIMEOUT, env=env
    )
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "survived" not in proc.stdout
    # One report at most: faulthandler's, where it is on (here, or for the
    # whole run, as under the sanitizers); never the two handlers' loop.
    reports = proc.stderr.count("Fatal Python error: Bus error") + proc.stderr.count("foreign handler: SIGBUS")
    assert reports <= 1 and (reports == 1 or not how.startswith("fault, ")), proc.stderr[-2000:]


# -- permission denied -----------------------------------------------------------

# Root ignores file modes through two capabilities; the child gives them up
# (effective set only, so nothing outside the child changes) and is then
# refused like any other user. capget/capset through libc, version 3 headers.
DROP_DAC_OVERRIDE = r"""
import ctypes
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
if os.geteuid() == 0:
    _libc = ctypes.CDLL(None, use_errno=True)
    _hdr, _data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    if _libc.capget(ctypes.byref(_hdr), _data) != 0:
        print("SKIP: capget failed:", os.strerror(ctypes.get_errno())); sys.exit(77)
    _data[0].effective &= ~((1 << 1) | (1 << 2))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
    if _libc.capset(ctypes.byref(_hdr), _data) != 0:
        print("SKIP: capset failed:", os.strerror(ctypes.get_errno())); sys.exit(77)
"""


def test_permission_denied(tmp_path):
    """Refused opens are PermissionError naming the file, and leave no file
    behind; then the next open works."""
    secret = tmp_path / "secret.bin"
    readable = tmp_path / "readable.bin"
    locked = tmp_path / "locked"
    scratch = tmp_path / "scratch"
    data = np.random.default_rng(6).integers(0, 256, 3 << 20, dtype=np.uint8)
    data.tofile(secret)
    data.tofile(readable)
    locked.mkdir()
    scratch.mkdir()
    os.chmod(secret, 0o000)
    os.chmod(readable, 0o444)
    os.chmod(locked, 0o555)
    try:
        run_child(
            DROP_DAC_OVERRIDE
            + f"""
folder = {str(tmp_path)!r}
secret, readable = {str(secret)!r}, {str(readable)!r}
new = os.path.join({str(locked)!r}, "new.bin")
for _ in range(3):
    expect_os_error(lambda: gdscp.CuFile(secret, "r"), errno.EACCES, secret)
    expect_os_error(lambda: gdscp.CuFile(readable, "r+"), errno.EACCES, readable)
    expect_os_error(lambda: gdscp.CuFile(new, "w"), errno.EACCES, new)
    try:
        gdscp.CuFile(secret, "r")
    except PermissionError:
        pass  # the Pythonic class, as well as RuntimeError
assert not os.path.exists(new)
expected = np.fromfile(readable, dtype=np.uint8)
out = np.empty(expected.nbytes, dtype=np.uint8)
with gdscp.CuFile(readable, "r") as f:
    assert f.read(out, task_size=MiB) == out.nbytes
assert np.array_equal(out, expected)
assert_healthy({str(scratch)!r})
""",
            tmp_path,
        )
    finally:
        os.chmod(secret, 0o600)
        os.chmod(locked, 0o755)


def test_a_directory_that_may_be_written_but_not_read_takes_copies(tmp_path):
    """A drop box (write and search permission, no read) cannot be opened to
    fsync the names put in it: they are made durable through a sync of its
    filesystem instead, and every file is put in place and reported done, as
    cp copies into such a directory. A few files into one, files into four
    (one sync per filesystem), and the command line's own renames (write,
    and the directories and links of copy -r)."""
    src = tmp_path / "src"
    src.mkdir()
    data = {f"f{i}": random_bytes(1000 + i, i) for i in range(20)}
    for name, content in data.items():
        (src / name).write_bytes(content)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file").write_bytes(b"in a tree")
    os.symlink("sub/file", tree / "link")
    boxes = [tmp_path / f"box{i}" for i in range(4)]
    for box in boxes:
        box.mkdir()
        os.chmod(box, 0o333)
    try:
        run_child(
            DROP_DAC_OVERRIDE
            + f"""
from gdscp.cli.app import run
src, tree = {str(src)!r}, {str(tree)!r}
boxes = {[str(b) for b in boxes]!r}
try:
    os.listdir(boxes[0])
except PermissionError:
    pass
else:
    print("SKIP: the drop box could be read"); sys.exit(77)
few = gdscp.copy_files([(os.path.join(src, n), os.path.join(boxes[0], n)) for n in ("f0", "f1")]).results()
assert [r.status for r in few] == ["done"] * 2, few
many = gdscp.copy_files([(os.path.join(src, f"f{{i}}"), os.path.join(boxes[i % 4], f"f{{i}}"))
                         for i in range(2, 20)]).results()
assert [r.status for r in many] == ["done"] * 18, [r.error for r in many if r.status != "done"]
assert run(["write", "-q", "--host", os.path.join(boxes[1], "written"), "--size", "1K"]) == 0
assert run(["copy", "-r", "-q", "--host", tree, boxes[2]]) == 0
""",
            tmp_path,
        )
    finally:
        for box in boxes:
            os.chmod(box, 0o755)
    for i in range(20):
        assert (boxes[0 if i < 2 else i % 4] / f"f{i}").read_bytes() == data[f"f{i}"]
    assert (boxes[1] / "written").read_bytes() == bytes(1024)
    assert (boxes[2] / "tree" / "sub" / "file").read_bytes() == b"in a tree"
    assert os.readlink(boxes[2] / "tree" / "link") == "sub/file"
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".gdscp-tmp")]


def test_copies_of_read_only_files_and_writes_under_a_strict_umask(tmp_path):
    """A temporary file is written through its path as well as its descriptor
    (files of 1 MiB and more): the copy of a read-only file, and any new file
    under a umask that takes the owner's write bit (0277), must still let its
    owner write it until it gets its mode, once written."""
    big = random_bytes(2 * 1024 * 1024 + 5, 8)
    (tmp_path / "read-only.bin").write_bytes(big)
    os.chmod(tmp_path / "read-only.bin", 0o444)
    (tmp_path / "plain.bin").write_bytes(big)
    out = tmp_path / "out"
    out.mkdir()
    run_child(
        DROP_DAC_OVERRIDE
        + f"""
from gdscp.cli.app import run
folder, out = {str(tmp_path)!r}, {str(out)!r}
def where(name):
    return os.path.join(out, name)
try:
    open(os.path.join(folder, "read-only.bin"), "r+b")
except PermissionError:
    pass
else:
    print("SKIP: a read-only file could be written"); sys.exit(77)
copies = gdscp.copy_files([(os.path.join(folder, "read-only.bin"), where("copy.bin"))]).results()
copies += gdscp.copy_files([(os.path.join(folder, "read-only.bin"), where("preserved.bin"))], preserve=True).results()
assert [r.status for r in copies] == ["done"] * 2, [r.error for r in copies]
os.umask(0o277)
buffer = np.frombuffer(bytes(range(256)) * 8192, dtype=np.uint8)
written = gdscp.write_files([buffer], [where("written.bin")]).results()
written += gdscp.copy_files([(os.path.join(folder, "plain.bin"), where("umask.bin"))]).results()
assert [r.status for r in written] == ["done"] * 2, [r.error for r in written]
assert run(["write", "-q", "--host", where("one.bin"), "--size", "2M"]) == 0
""",
        tmp_path,
    )
    for name, mode in (("copy.bin", 0o444), ("preserved.bin", 0o444), ("umask.bin", 0o400)):
        assert (out / name).read_bytes() == big, name
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    assert (out / "written.bin").read_bytes() == bytes(range(256)) * 8192
    assert stat.S_IMODE((out / "written.bin").stat().st_mode) == 0o400
    assert (out / "one.bin").stat().st_size == 2 * 1024 * 1024
    assert stat.S_IMODE((out / "one.bin").stat().st_mode) == 0o400
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".gdscp-tmp")]


def test_a_write_in_place_of_a_new_file_under_a_strict_umask(tmp_path):
    """``write_files(atomic=False)`` makes a new file of 1 MiB or more that it
    opens again by its path: under a umask that takes the owner's write bit
    (0277) it is still written, then given its mode, as ``open(path, "wb")``
    writes one (it failed, and left the file empty)."""
    run_child(
        DROP_DAC_OVERRIDE
        + f"""
path = os.path.join({str(tmp_path)!r}, "in-place.bin")
os.umask(0o277)
buffer = np.frombuffer(bytes(range(256)) * 8192, dtype=np.uint8)
(result,) = gdscp.write_files([buffer], [path], atomic=False).results()
assert result.status == "done", result.error
""",
        tmp_path,
    )
    assert (tmp_path / "in-place.bin").read_bytes() == bytes(range(256)) * 8192
    assert stat.S_IMODE((tmp_path / "in-place.bin").stat().st_mode) == 0o400


# -- the GPU out of memory ---------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.alone  # it fills the GPU's memory
def test_gpu_out_of_memory_leaves_gdscp_working(tmp_path):
    run_child(
        f"""
        import cupy
        folder = {str(tmp_path)!r}
        free, total = cupy.cuda.runtime.memGetInfo()
        try:
            cupy.empty(total + (1 << 30), dtype=cupy.uint8)
        except cupy.cuda.memory.OutOfMemoryError:
            pass
        else:
            raise AssertionError("an allocation larger than the GPU succeeded")
        # Fill most of what is free, then transfer into the rest.
        hog = cupy.empty(max(free - (2 << 30), 0), dtype=cupy.uint8)
        assert_healthy(folder, cupy)
        del hog
        cupy.get_default_memory_pool().free_all_blocks()
        assert_healthy(folder, cupy)
        """,
        tmp_path,
    )


# -- Ctrl-C while a transfer is in flight ------------------------------------------


def test_keyboard_interrupt_while_waiting(tmp_path):
    """SIGINT during get(): the transfer is cancelled, KeyboardInterrupt
    propagates, and the engine is healthy afterwards."""
    run_child(
        f"""
        import time
        folder = {str(tmp_path)!r}
        path = os.path.join(folder, "big.bin")
        data = payload(64 * MiB, 8)
        with gdscp.CuFile(path, "w") as f:
            f.write(data)
        gdscp.defaults.set("num_threads", 1)
        interrupted = 0
        for trial in range(5):
            out = np.zeros_like(data)
            with gdscp.CuFile(path, "r") as f:
                waiting = threading.Event()

                def interrupt():
                    waiting.wait()
                    time.sleep(0.01)
                    os.kill(os.getpid(), signal.SIGINT)

                t = threading.Thread(target=interrupt, daemon=True)
                t.start()
                future = f.pread(out, task_size=4096)
                try:
                    waiting.set()
                    n = future.get()
                    t.join()
                    time.sleep(0.2)  # the signal lands here if the read won the race
                    assert n == data.nbytes and np.array_equal(out, data)
                except KeyboardInterrupt:
                    interrupted += 1
                    assert future.done(), "get() returned before the cancelled tasks finished"
                    assert future.progress() <= data.nbytes
                t.join()
        print("interrupted", interrupted, "of 5")
        gdscp.defaults.set("num_threads", 4)
        assert_healthy(folder)
        """,
        tmp_path,
    )


# -- interpreter exit while daemon threads are inside the engine -------------------

EXIT_SCRIPT = r"""
import os, sys, threading
import numpy as np
import gdscp

folder = sys.argv[1]
source = os.path.join(folder, "source.bin")
data = np.random.default_rng(3).integers(0, 256, 8 << 20, dtype=np.uint8)
with gdscp.CuFile(source, "w") as f:
    f.write(data)

def loop(i, call):
    # Each thread signals once it has gone round at least once, then never stops.
    while True:
        call()
        started[i].set()

def reader(size, task_size):
    buf = np.empty(size, np.uint8)
    f = gdscp.CuFile(source, "r")
    return lambda: f.read(buf, task_size=task_size)

def writer(name, size):
    buf = data[:size]
    f = gdscp.CuFile(os.path.join(folder, name), "w")
    return lambda: f.write(buf, task_size=256 << 10)

calls = [
    reader(4096, None),               # on the calling thread (below gds_threshold)
    reader(8 << 20, 256 << 10),       # 32 tasks: the caller waits in Future.wait
    reader(8 << 20, 256 << 10),
    writer("w1.bin", 4 << 20),
    writer("w2.bin", 64 << 10),
]
started = [threading.Event() for _ in calls]
for i, call in enumerate(calls):
    threading.Thread(target=loop, args=(i, call), daemon=True).start()
for event in started:
    assert event.wait(60), "a thread never finished a transfer"
print("exiting", flush=True)
"""


def test_interpreter_exit_while_daemon_threads_transfer(tmp_path):
    """The main thread returns while daemon threads are inside read() and
    write() (on the calling thread, and waiting for the workers): CPython ends
    such threads as they take the GIL back, by an unwinding pthread_exit that
    used to abort the process from inside the bindings. The process must exit
    with status 0 and nothing on stderr, every time."""
    runs = 20
    for run in range(runs):
        try:
            proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(tmp_path)], cwd=str(tmp_path),
                                  capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"run {run}: the interpreter did not exit in {CHILD_TIMEOUT} s\n{e.stderr}")
        assert "exiting" in proc.stdout, f"run {run}: the threads never got going\n{proc.stderr}"
        assert proc.returncode == 0, f"run {run} of {runs}: exit status {proc.returncode}\n{proc.stderr}"
        assert proc.stderr == "", f"run {run} of {runs}: unexpected output on stderr:\n{proc.stderr}"


BLOCKED_AT_EXIT_SCRIPT = r"""
import os, sys, threading, time
import gdscp

fifo = sys.argv[1]
waiting = threading.Event()

def wait_for_a_writer_that_never_comes():
    job = gdscp.read_files([fifo], [bytearray(10)])
    waiting.set()
    job.wait()

threading.Thread(target=wait_for_a_writer_that_never_comes, daemon=True).start()
assert waiting.wait(30)
time.sleep(0.2)  # inside wait(), the GIL released
print("exiting", flush=True)
"""


def test_interpreter_exit_with_a_daemon_thread_blocked_in_the_engine(tmp_path):
    """A daemon thread still inside an engine call when the interpreter ends
    never comes back for what its frames hold: nanobind reported those
    objects as leaks of the bindings. Nothing on stderr, status 0."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    for run in range(3):
        proc = subprocess.run([sys.executable, "-c", BLOCKED_AT_EXIT_SCRIPT, fifo], cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        assert "exiting" in proc.stdout, proc.stderr
        assert (proc.returncode, proc.stderr) == (0, ""), f"run {run}"


# -- gdscp copy under signals and a full disk ---------------------------------------

COPY_SIZE = 200 * MiB
OLD_CONTENT = b"the old destination, which must survive a failed copy\n" * 100


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(4 * MiB), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("copy-src")
    path = str(folder / "big.bin")
    rng = np.random.default_rng(9)
    with open(path, "wb") as f:
        for _ in range(COPY_SIZE // (8 * MiB)):
            f.write(rng.integers(0, 256, 8 * MiB, dtype=np.uint8).tobytes())
    yield path, _digest(path)
    os.unlink(path)


def _copy_argv(src: str, dst: str) -> list[str]:
    # Small tasks so that a copy takes long enough to be interrupted part way.
    return [sys.executable, "-m", "gdscp", "copy", src, dst, "--task-size", "256KiB"]


def _check_destination(folder: str, dst: str, rc: int, src_digest: str, had_old: bool, what: str) -> str:
    """The destination folder holds only the destination, which is old, new or absent."""
    leftovers = sorted(set(os.listdir(folder)) - {os.path.basename(dst)})
    assert not leftovers, f"{what}: temporary files left behind: {leftovers}"
    if not os.path.exists(dst):
        assert rc != 0, f"{what}: exit status 0 but no destination"
        return "absent"
    if had_old and os.path.getsize(dst) == len(OLD_CONTENT):
        with open(dst, "rb") as f:
            if f.read() == OLD_CONTENT:
                assert rc != 0, f"{what}: exit status 0 but the old destination is still there"
                return "old"
    assert os.path.getsize(dst) == COPY_SIZE, f"{what}: partial destination ({os.path.getsize(dst)} bytes)"
    assert _digest(dst) == src_digest, f"{what}: destination differs from the source"
    return "complete"


def _run_copy(src: str, dst: str, tmp_path, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        _copy_argv(src, dst), cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen
    )


def _finish(proc: subprocess.Popen, what: str) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{what}: gdscp copy hung\nstderr:\n{err.decode(errors='replace')}")
    return proc.returncode, err.decode(errors="replace")


def _interrupt_copies(big_source, tmp_path, sig: int, iterations: int) -> None:
    src, src_digest = big_source
    rng = random.Random(f"{sig}-{iterations}")

    # One uninterrupted copy: it must succeed, and it sets the range of delays.
    folder = tmp_path / "baseline"
    folder.mkdir()
    dst = str(folder / "dst.bin")
    started = time.monotonic()
    rc, err = _finish(_run_copy(src, dst, tmp_path), "baseline")
    duration = time.monotonic() - started
    assert rc == 0, err
    assert _check_destination(str(folder), dst, rc, src_digest, False, "baseline") == "complete"

    outcomes = []
    for i in range(iterations):
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        dst = str(folder / "dst.bin")
        had_old = i % 2 == 0
        if had_old:
            with open(dst, "wb") as f:
                f.write(OLD_CONTENT)
        delay = rng.uniform(0.0, duration)
        what = f"{signal.Signals(sig).name} after {delay:.3f} s (copy takes {duration:.3f} s), old destination: {had_old}"
        proc = _run_copy(src, dst, tmp_path)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(sig)
        rc, err = _finish(proc, what)
        state = _check_destination(str(folder), dst, rc, src_digest, had_old, what)
        if state != "complete":
            assert rc != 0, f"{what}: exit status 0 but the copy did not happen"
        outcomes.append((round(delay, 3), rc, state))
        shutil.rmtree(folder)
    print(f"{signal.Signals(sig).name} outcomes (delay, exit status, destination):", outcomes)


SIGNAL_AS_A_JOB_STARTS = textwrap.dedent("""
    import os, signal, sys
    import gdscp.bulk
    engine_job = gdscp.bulk._core.BulkJob
    sig = int(sys.argv[1])

    def start_then_signal(*args, **kwargs):
        job = engine_job(*args, **kwargs)
        os.kill(os.getpid(), sig)  # its handler runs before the job is held
        return job

    gdscp.bulk._core.BulkJob = start_then_signal
    sys.argv = ["gdscp", "copy", sys.argv[2], sys.argv[3]]
    from gdscp.cli.main import main
    main()
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_as_a_copy_starts_stops_it(tmp_path, sig):
    """A signal whose handler runs between the engine starting the copy and
    the command holding its job: the copy still stops, with no destination
    and no temporary file (the source, a FIFO whose writer is silent, keeps
    the copy in flight until then)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    held = os.open(fifo, os.O_RDWR)
    try:
        done = subprocess.run([sys.executable, "-c", SIGNAL_AS_A_JOB_STARTS, str(int(sig)), str(fifo), str(out / "dst")],
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    finally:
        os.close(held)
    assert done.returncode == 128 + int(sig), done.stderr  # 130, 143, 129
    assert os.listdir(out) == [], done.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_copy_interrupted(big_source, tmp_path, sig):
    _interrupt_copies(big_source, tmp_path, sig, iterations=4)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_copy_interrupted_many_times(big_source, tmp_path, sig):
    _interrupt_copies(big_source, tmp_path, sig, iterations=30)


def _interrupt_tree_copies(tmp_path, sig: int, iterations: int) -> None:
    """``gdscp copy -r`` of 500 files, interrupted at random moments: exit 130
    or 143 (0 if it was over), no temporary file anywhere, every file in the
    destination complete and exact (hundreds of files are in flight when the
    signal lands during the copy)."""
    from gdscp.bench.tree import make_tree

    tree = make_tree(str(tmp_path / "src"), 500, 1, 128 << 10, seed=sig)
    rng = random.Random(f"tree-{sig}")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gdscp", "copy", "-r", "--host", tree.root, str(tmp_path / "base")],
                          capture_output=True, timeout=CHILD_TIMEOUT)
    duration = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(tmp_path / "base")
    outcomes = []
    for i in range(iterations):
        dst = tmp_path / f"run{i}"
        what = f"{signal.Signals(sig).name}, run {i} (the copy takes {duration:.3f} s)"
        proc = subprocess.Popen([sys.executable, "-m", "gdscp", "copy", "-r", "--host", tree.root, str(dst)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The destination directory appears once gdscp runs (its handlers in
        # place): the signal lands from then on, before or after the files'.
        began = time.monotonic()
        while not dst.exists() and proc.poll() is None and time.monotonic() - began < CHILD_TIMEOUT:
            time.sleep(0.001)
        delay = rng.uniform(0.0, duration / 2)
        what += f", {delay:.3f} s after the destination appeared"
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(sig)
        rc, err = _finish(proc, what)
        copied = 0
        umask = os.umask(0)
        os.umask(umask)
        for folder, _, names in os.walk(dst):
            source_dir = os.path.join(tree.root, os.path.relpath(folder, dst))
            want = stat.S_IMODE(os.stat(source_dir).st_mode) & ~umask
            assert stat.S_IMODE(os.stat(folder).st_mode) == want, f"{what}: {folder} left at another mode"
            for name in names:
                assert not name.endswith(".gdscp-tmp"), f"{what}: {name} left behind"
                path = os.path.join(folder, name)
                source = os.path.join(tree.root, os.path.relpath(path, dst))
                with open(path, "rb") as a, open(source, "rb") as b:
                    assert a.read() == b.read(), f"{what}: {path} is not its source"
                copied += 1
        # 0: over before the signal; -sig: it landed on the way out, after the copy.
        assert rc in (0, 128 + sig) or (rc == -sig and copied == len(tree.paths)), f"{what}: exit {rc}\n{err}"
        assert rc != 0 or copied == len(tree.paths), f"{what}: exit status 0 with {copied} files"
        outcomes.append((round(delay, 3), rc, copied))
        shutil.rmtree(dst, ignore_errors=True)
    print(f"{signal.Signals(sig).name} outcomes (delay, exit status, files complete):", outcomes)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_tree_copy_interrupted(tmp_path, sig):
    _interrupt_tree_copies(tmp_path, sig, iterations=6)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_tree_copy_interrupted_many_times(tmp_path, sig):
    _interrupt_tree_copies(tmp_path, sig, iterations=40)


def _cap_file_size(limit: int):
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return preexec


@pytest.mark.parametrize("had_old", [False, True], ids=["new", "over-old"])
def test_copy_disk_full(big_source, tmp_path, had_old):
    src, src_digest = big_source
    folder = tmp_path / "dst"
    folder.mkdir()
    dst = str(folder / "dst.bin")
    if had_old:
        with open(dst, "wb") as f:
            f.write(OLD_CONTENT)
    proc = _run_copy(src, dst, tmp_path, preexec_fn=_cap_file_size(50 * MiB))
    rc, err = _finish(proc, "disk full")
    assert rc == 1, f"exit status {rc}, expected 1\n{err}"
    assert "File too large" in err or "EFBIG" in err or "errno 27" in err, err
    state = _check_destination(str(folder), dst, rc, src_digest, had_old, "disk full")
    assert state == ("old" if had_old else "absent"), state
