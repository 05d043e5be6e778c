"""Many Python threads transferring at once: exact bytes, no deadlock.

Every thread is a daemon and is joined with a deadline, so a deadlock fails
the test instead of hanging the suite. Each test runs over host memory and,
with the ``gpu`` mark, over device memory (the ``xp`` fixture).
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import gdscp
from gdscp import _core
from conftest import sanitized, wait_engine_idle

MiB = 1 << 20
DEADLINE = 60  # seconds a thread may take before the test calls it stuck


def payload(size: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def to_host(array) -> np.ndarray:
    return array.get() if hasattr(array, "get") else array


def run_threads(target, count: int) -> None:
    """Run ``target(i)`` on ``count`` threads released together; re-raise the
    first failure, and fail if any thread is still running at the deadline."""
    start = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            start.wait(DEADLINE)
            target(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"io-{i}") for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {DEADLINE} s (deadlock?): {stuck}"
    if errors:
        raise errors[0]


def run_script(script: str, cwd, *args: str, timeout: float = 120, env: dict | None = None) -> str:
    """Runs ``script`` in a fresh interpreter with a deadline; fails unless it
    exits 0 having printed CHILD-OK. Its output."""
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args], cwd=str(cwd), capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"child hung\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    assert proc.returncode == 0 and "CHILD-OK" in proc.stdout, f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_threads_with_their_own_files(xp, tmp_path):
    """16 threads, each with its own CuFile, writing and reading at once."""

    def work(i: int) -> None:
        path = str(tmp_path / f"own{i}.bin")
        size = MiB + i * 4099 + 1  # odd sizes: chunk ends fall everywhere
        for round_ in range(3):
            data = payload(size, 100 * i + round_)
            with gdscp.CuFile(path, "w+") as f:
                assert f.write(xp.asarray(data), task_size=64 << 10) == size
                out = xp.full(size, 0xA5, dtype=xp.uint8)
                assert f.read(out, task_size=48 << 10) == size
            assert np.array_equal(to_host(out), data), f"thread {i} round {round_}: wrong bytes"

    run_threads(work, 16)


def test_threads_sharing_one_file(xp, tmp_path):
    """8 threads share one CuFile and each rewrites its own region while the
    others write theirs; all of them also read a region nobody writes."""
    workers = 8
    region = MiB + 512  # unaligned borders between regions
    stable = payload(2 * MiB, 7)
    stable_at = workers * region
    rounds = 4
    path = str(tmp_path / "shared.bin")
    f = gdscp.CuFile(path, "w+")
    try:
        assert f.write(stable, file_offset=stable_at) == stable.nbytes

        def work(i: int) -> None:
            offset = i * region
            for r in range(rounds):
                data = payload(region, 1000 * i + r)
                assert f.write(xp.asarray(data), file_offset=offset, task_size=96 << 10) == region
                out = xp.zeros(region, dtype=xp.uint8)
                assert f.pread(out, file_offset=offset, task_size=80 << 10).get() == region
                assert np.array_equal(to_host(out), data), f"thread {i} round {r}: own region wrong"
                seen = xp.zeros(stable.nbytes, dtype=xp.uint8)
                assert f.read(seen, file_offset=stable_at, task_size=128 << 10) == stable.nbytes
                assert np.array_equal(to_host(seen), stable), f"thread {i} round {r}: untouched region wrong"

        run_threads(work, workers)

        expected = np.concatenate([payload(region, 1000 * i + rounds - 1) for i in range(workers)] + [stable])
        whole = np.zeros(expected.nbytes, dtype=np.uint8)
        assert f.read(whole) == expected.nbytes
        assert np.array_equal(whole, expected)
    finally:
        f.close()
    assert os.path.getsize(path) == stable_at + stable.nbytes


def test_a_mapped_file_closed_while_threads_read_from_it(xp, tmp_path):
    """Threads read a mapped file (read, and pread in parallel tasks) while
    another closes it, twice: every read gives the file's bytes or raises as
    closed (a read in flight holds the mapping until it ends, whoever closed
    it), and every reader sees the close."""
    size = 4 * MiB + 123
    data = payload(size, 31)
    path = tmp_path / "mapped.bin"
    data.tofile(path)
    readers = 6
    for round_ in range(8):
        m = gdscp.Mmap(path)
        have_read = threading.Barrier(readers + 1)  # the close comes once every reader has read once
        whole = [0] * readers
        saw_close = [False] * readers

        def work(i: int) -> None:
            if i == readers:
                have_read.wait(DEADLINE)
                m.close()
                m.close()
                return
            offset = (i * 977 * 4096 + round_ * 12345) % (size // 2)
            length = size - offset - i
            while True:
                out = xp.zeros(length, dtype=xp.uint8)
                try:
                    if i % 2:
                        got = m.pread(out, length, offset, task_size=256 << 10).get()
                    else:
                        got = m.read(out, length, offset)
                except RuntimeError as exc:
                    assert "closed" in str(exc) and whole[i] > 0, exc
                    saw_close[i] = True
                    return
                assert got == length, f"reader {i} round {round_}: {got} of {length} bytes"
                assert np.array_equal(to_host(out), data[offset : offset + length]), f"reader {i}: wrong bytes"
                whole[i] += 1
                if whole[i] == 1:
                    have_read.wait(DEADLINE)

        with gdscp.defaults.set({"num_threads": 4}):
            run_threads(work, readers + 1)
        assert all(saw_close) and m.closed(), (round_, whole, saw_close)


def test_num_threads_changes_while_transfers_run(xp, tmp_path):
    """The pool grows and shrinks under running transfers; none is lost.

    Each thread does at least 6 rounds, and more until the pool has changed
    while the transfers of at least 3 rounds ran (the changer may be given
    the interpreter late), up to a deadline that fails the test."""
    original = gdscp.defaults.get("num_threads")
    stop = threading.Event()
    sizes_seen: set[int] = set()
    changes = [0]  # the changes of the pool's size made so far
    overlapped: list[tuple[int, int]] = []  # (thread, round) of each round a change landed in
    wanted = 3
    deadline = time.monotonic() + DEADLINE / 2  # the extra rounds end by then, before run_threads gives up

    def resize_forever() -> None:
        values = [1, 7, 2, 16, 3, 5]
        k = 0
        while not stop.is_set():
            gdscp.defaults.set("num_threads", values[k % len(values)])
            sizes_seen.add(_core.num_threads())
            changes[0] += 1
            k += 1

    changer = threading.Thread(target=resize_forever, daemon=True)

    def work(i: int) -> None:
        path = str(tmp_path / f"resize{i}.bin")
        size = 3 * MiB + 777 * i
        r = 0
        while r < 6 or (len(overlapped) < wanted and time.monotonic() < deadline):
            data = payload(size, 50 * i + r)
            before = changes[0]
            with gdscp.CuFile(path, "w+") as f:
                assert f.write(xp.asarray(data), task_size=32 << 10) == size
                out = xp.zeros(size, dtype=xp.uint8)
                assert f.read(out, task_size=32 << 10) == size
            if changes[0] != before:
                overlapped.append((i, r))
            assert np.array_equal(to_host(out), data), f"thread {i} round {r}: wrong bytes"
            r += 1

    changer.start()
    try:
        run_threads(work, 4)
    finally:
        stop.set()
        changer.join(DEADLINE)
        alive = changer.is_alive()
        if not alive:
            gdscp.defaults.set("num_threads", original)
    assert not alive, "set('num_threads') did not return (stuck joining a worker?)"
    assert len(overlapped) >= wanted, (
        f"the pool's size changed during the transfers of only {len(overlapped)} rounds in {DEADLINE / 2:.0f} s "
        f"({changes[0]} changes in all)")
    assert len(sizes_seen) > 1, "the pool size never changed while transfers ran"
    assert _core.num_threads() == original


def test_concurrent_num_threads_changes_do_not_deadlock(tmp_path):
    """Two threads resizing the pool at once, over and over: each call returns.

    In a child process with a deadline, because a stuck resize cannot be undone.
    """
    script = textwrap.dedent(
        """
        import threading, sys
        import numpy as np
        import gdscp
        from gdscp import _core

        for trial in range(400):
            _core.set_num_threads(16)
            gate = threading.Barrier(2)

            def resize(n):
                gate.wait()
                gdscp.defaults.set("num_threads", n)

            shrink = threading.Thread(target=resize, args=(1,), daemon=True)
            grow = threading.Thread(target=resize, args=(12,), daemon=True)
            shrink.start(); grow.start()
            shrink.join(20); grow.join(20)
            if shrink.is_alive() or grow.is_alive():
                print(f"trial {trial}: a resize never returned (shrink alive: {shrink.is_alive()}, "
                      f"grow alive: {grow.is_alive()})", flush=True)
                sys.stdout.flush()
                import os; os._exit(3)
            assert _core.num_threads() in (1, 12), _core.num_threads()

        # The pool still runs transfers after all that.
        data = np.arange(4 << 20, dtype=np.uint8)
        path = sys.argv[1]
        with gdscp.CuFile(path, "w+") as f:
            f.write(data, task_size=64 << 10)
            out = np.zeros_like(data)
            f.read(out, task_size=64 << 10)
        assert np.array_equal(out, data)
        print("CHILD-OK")
        """
    )
    run_script(script, tmp_path, str(tmp_path / "after.bin"))


def test_shrinking_parks_workers_and_growing_reuses_them(tmp_path):
    """A shrink parks surplus workers and a grow wakes them: no new threads
    (and so no new CUDA streams) when the size goes back up, and a parked
    worker takes no tasks."""
    original = gdscp.defaults.get("num_threads")
    path = str(tmp_path / "park.bin")
    data = payload(8 * MiB + 3, 9)

    def round_trip() -> None:
        with gdscp.CuFile(path, "w+") as f:
            assert f.write(data, task_size=256 << 10) == data.nbytes
            out = np.zeros_like(data)
            assert f.read(out, task_size=256 << 10) == data.nbytes
        assert np.array_equal(out, data)

    def os_threads() -> set[str]:
        return set(os.listdir("/proc/self/task"))  # thread ids: a new thread has a new one

    try:
        gdscp.defaults.set("num_threads", original + 6)
        round_trip()
        most = os_threads()
        gdscp.defaults.set("num_threads", 1)
        assert _core.num_threads() == 1
        round_trip()
        # a read of many tasks: the parked workers must not take any of them
        out = np.zeros(64 * MiB, np.uint8)
        big = str(tmp_path / "park-big.bin")
        payload(out.nbytes, 10).tofile(big)
        most_busy = 0
        with gdscp.CuFile(big, "r") as f:
            future = f.pread(out, task_size=64 << 10)
            while not future.done():
                most_busy = max(most_busy, _core.testing.busy_threads())
            assert future.get() == out.nbytes
        assert most_busy <= 1, f"{most_busy} workers busy with num_threads=1"
        gdscp.defaults.set("num_threads", original + 6)
        round_trip()
        assert os_threads() == most, "growing again replaced workers with new threads"
    finally:
        gdscp.defaults.set("num_threads", original)
    assert wait_engine_idle()


@pytest.mark.skipif(sanitized(), reason="an address-space limit cannot hold a sanitizer's shadow memory")
def test_pool_that_cannot_start_threads_stays_consistent(tmp_path):
    """num_threads = 4096 (the most it takes) under an address-space limit
    with room for a few dozen thread stacks: the pool grows as far as it can
    and raises an error that says how many workers run and why; the caller's
    signal mask is what it was; the setting reports what runs; every worker
    carries its name; and transfers still move exact bytes."""
    script = textwrap.dedent(
        """
        import os, resource, signal, sys
        import numpy as np
        import gdscp
        from gdscp import _core

        def worker_names():
            names = []
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = f.read().strip()
                if name.startswith("gdscp-io-"):
                    names.append(name)
            return sorted(names)

        def vm_size():
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmSize:"):
                        return int(line.split()[1]) * 1024

        data = np.random.default_rng(4).integers(0, 256, 8 << 20, dtype=np.uint8)
        path = sys.argv[1]
        data.tofile(path)
        before = _core.num_threads()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGINT not in mask and signal.SIGTERM not in mask, mask

        # Room for a few dozen more 8 MiB thread stacks, far from 4096.
        resource.setrlimit(resource.RLIMIT_AS, (vm_size() + (512 << 20), resource.RLIM_INFINITY))
        try:
            gdscp.defaults.set("num_threads", 4096)
        except RuntimeError as e:
            message = str(e)
        else:
            raise AssertionError("4096 threads started under the limit: the test proves nothing")
        running = _core.num_threads()
        print("error:", message)
        print("running:", running)
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask, "the caller's signal mask changed"
        assert gdscp.defaults.get("num_threads") == running, (gdscp.defaults.get("num_threads"), running)
        assert before < running < 4096, running
        assert f"runs {running} workers" in message and "4096" in message, message
        assert "Cannot allocate memory" in message or "Resource temporarily unavailable" in message, message
        assert worker_names() == sorted(f"gdscp-io-{i}" for i in range(running)), worker_names()
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))

        # Every running worker takes tasks: a read in many more tasks than workers.
        out = np.zeros_like(data)
        with gdscp.CuFile(path, "r") as f:
            assert f.read(out, task_size=64 << 10) == data.nbytes
        assert np.array_equal(out, data)
        gdscp.defaults.set("num_threads", 4)
        assert gdscp.defaults.get("num_threads") == _core.num_threads() == 4
        out[:] = 0
        with gdscp.CuFile(path, "r") as f:
            assert f.read(out, task_size=64 << 10) == data.nbytes
        assert np.array_equal(out, data)
        print("CHILD-OK")
        """
    )
    print(run_script(script, tmp_path, str(tmp_path / "data.bin")), end="")


# -- appends from many handles and processes ------------------------------------------

RECORD_HEADER = struct.Struct("<4sIIQ")  # magic, writer, sequence number, record size


def record(writer: int, seq: int, size: int) -> np.ndarray:
    """Record ``seq`` of ``writer``: a header naming both and the size, then
    bytes that depend on all three."""
    body = np.random.default_rng([writer, seq, size]).integers(0, 256, size - RECORD_HEADER.size, dtype=np.uint8)
    head = np.frombuffer(RECORD_HEADER.pack(b"REC:", writer, seq, size), dtype=np.uint8)
    return np.concatenate([head, body])


def check_records(path: str, expected: dict[tuple[int, int], int]) -> None:
    """The file is the records of ``expected`` ((writer, seq) -> size), each
    whole and exactly once, in any order."""
    data = np.fromfile(path, dtype=np.uint8)
    assert data.nbytes == sum(expected.values()), f"{data.nbytes} bytes, expected {sum(expected.values())}"
    seen = set()
    pos = 0
    while pos < data.nbytes:
        magic, writer, seq, size = RECORD_HEADER.unpack(data[pos : pos + RECORD_HEADER.size].tobytes())
        assert magic == b"REC:" and expected.get((writer, seq)) == size, f"no record starts at offset {pos}"
        assert (writer, seq) not in seen, f"record {writer}/{seq} twice (again at offset {pos})"
        assert np.array_equal(data[pos : pos + size], record(writer, seq, size)), (
            f"record {writer}/{seq} at offset {pos} is damaged")
        seen.add((writer, seq))
        pos += size
    assert seen == set(expected)


def append_sizes(writer: int, count: int) -> list[int]:
    """Mostly 4 KiB records (one O_APPEND write each), every fourth one a large
    one that the engine writes as a reserved range, in parallel tasks."""
    return [MiB + 4096 * (writer + 1) if seq % 4 == 3 else 4096 for seq in range(count)]


def test_appends_from_many_handles_never_overlap(xp, tmp_path):
    """8 threads, each with its own CuFile(path, "a"), appending records at
    once: every record lands whole, once, without overwriting another."""
    path = str(tmp_path / "log.bin")
    writers, count = 8, 60
    expected = {(w, s): n for w in range(writers) for s, n in enumerate(append_sizes(w, count))}

    def work(w: int) -> None:
        with gdscp.CuFile(path, "a") as f:
            for seq, size in enumerate(append_sizes(w, count)):
                assert f.write(xp.asarray(record(w, seq, size)), task_size=64 << 10) == size

    run_threads(work, writers)
    check_records(path, expected)


def test_small_appends_are_atomic_against_plain_o_append_writers(tmp_path):
    """gdscp's small appends (one O_APPEND write each) and os.write on an
    O_APPEND descriptor, from threads at once: no record splits another."""
    path = str(tmp_path / "log.bin")
    count = 300
    expected = {(w, s): 4096 + 512 * w for w in range(4) for s in range(count)}

    def work(w: int) -> None:
        size = 4096 + 512 * w
        if w % 2:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                for seq in range(count):
                    assert os.write(fd, record(w, seq, size).tobytes()) == size
            finally:
                os.close(fd)
        else:
            with gdscp.CuFile(path, "a") as f:
                for seq in range(count):
                    assert f.write(record(w, seq, size)) == size

    run_threads(work, 4)
    check_records(path, expected)


def test_large_appends_are_safe_against_plain_writers_that_take_the_lock(tmp_path):
    """gdscp's large appends (a range reserved under an exclusive flock, then
    filled in parallel) and os.write on an O_APPEND descriptor under the same
    flock, from threads at once: no record overwrites or splits another."""
    path = str(tmp_path / "log.bin")
    count = 200
    expected = {(w, s): (n if w % 2 == 0 else 64 + 8 * w)
                for w in range(4) for s, n in enumerate(append_sizes(w, count))}

    def work(w: int) -> None:
        if w % 2:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                for seq in range(count):
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    try:
                        assert os.write(fd, record(w, seq, 64 + 8 * w).tobytes()) == 64 + 8 * w
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        else:
            with gdscp.CuFile(path, "a") as f:
                for seq, size in enumerate(append_sizes(w, count)):
                    assert f.write(record(w, seq, size), task_size=64 << 10) == size

    run_threads(work, 4)
    check_records(path, expected)


APPEND_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import gdscp
    sys.path.insert(0, sys.argv[1])
    from test_concurrency import append_sizes, record

    path, writer, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    records = [record(writer, seq, size) for seq, size in enumerate(append_sizes(writer, count))]
    with gdscp.CuFile(path, "a") as f:
        sys.stdin.readline()  # every process starts appending at once
        for r in records:
            assert f.write(r, task_size=64 << 10) == r.nbytes
    print("CHILD-OK")
    """
)


def test_appends_from_many_processes_never_overlap(tmp_path):
    """4 processes, each with its own CuFile(path, "a"), appending at once:
    every record lands whole and once."""
    path = str(tmp_path / "log.bin")
    writers, count = 4, 60
    expected = {(w, s): n for w in range(writers) for s, n in enumerate(append_sizes(w, count))}
    tests = os.path.dirname(os.path.abspath(__file__))
    procs = [
        subprocess.Popen([sys.executable, "-c", APPEND_CHILD, tests, path, str(w), str(count)], cwd=str(tmp_path),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in range(writers)
    ]
    outputs = []
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        outputs.append((p.returncode, out, err))
    for rc, out, err in outputs:
        assert rc == 0 and "CHILD-OK" in out, f"exit {rc}\n{out}\n{err}"
    check_records(path, expected)


DROPPED = r"""
import os, sys, threading, time, numpy as np, gdscp
from gdscp import _core
folder, what = sys.argv[1], sys.argv[2]
gdscp.defaults.set("num_threads", 2)
if what == "job":  # each of the pool's two workers waits for a FIFO's writer, a Python thread
    fifos = [os.path.join(folder, f"fifo{i}") for i in range(2)]
    for fifo in fifos:
        os.mkfifo(fifo)
    held = [gdscp.read_files(fifos, [bytearray(10), bytearray(10)])]
else:  # a read of several tasks, each held at its chunk until a Python thread lets them go
    path = os.path.join(folder, "data")
    data = np.random.default_rng(2).integers(0, 256, 8 << 20, dtype=np.uint8)
    data.tofile(path)
    f = gdscp.CuFile(path)
    out = np.zeros_like(data)
    _core.testing.arm_hold(0)
    held = [f.pread(out, task_size=1 << 20)]
    while not _core.testing.hold_reached():
        time.sleep(0.001)
assert not held[0].done()

def writer():
    if what == "job":
        for fifo in fifos:
            with open(fifo, "wb") as w:
                w.write(b"x")
    else:
        _core.testing.disarm_fault()

t = threading.Thread(target=writer)
t.start()
held.clear()  # the last reference: waits for the transfer, which needs the writer thread to run
t.join()
if what == "future":
    assert (out == data).all()
print("ok")
"""


@pytest.mark.parametrize("what", ["future", "job"])
def test_dropping_a_running_transfer_lets_other_threads_run(tmp_path, what):
    """An IOFuture or a bulk job dropped before its transfer ends waits for it
    (its buffer is still being written) without holding the GIL: here the
    transfer can only end once another Python thread has run, and the drop
    returns."""
    proc = subprocess.run([sys.executable, "-c", DROPPED, str(tmp_path), what], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stderr[-2000:]


# The fork scripts wait for their child through this: its wait status, or
# "hung" (the child killed) once `seconds` have passed.
WAIT_FOR_CHILD = r"""
import os, time


def wait_for_child(pid, seconds):
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.01)
"""


FORK_SCRIPT = WAIT_FOR_CHILD + r"""
import os, sys, time, warnings
import gdscp
from gdscp import _core, bulk

warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running: what this checks
job = gdscp.read_files([sys.argv[1]], [bytearray(10)])  # waits for a writer that never comes
_core.testing.take_staging()
_core.testing.hold_staging_lock(0.3)  # a worker's moment in the staging pool, as fork() comes
pid = os.fork()
if pid == 0:
    _core.testing.take_staging()  # the pool's lock, inherited held, hung the child for good
    bulk.stop_running_jobs()      # the parent's job is not the child's: nothing to wait for
    os._exit(0)
status = wait_for_child(pid, 30)
job.cancel()
job.wait()
sys.exit(0 if status == 0 else f"the child ended with status {status}")
"""


def test_a_forked_child_neither_inherits_a_held_lock_nor_its_parents_jobs(tmp_path):
    """fork() while a worker holds the staging pool's lock: the child gets the
    lock free (the engine holds its locks across fork), and stopping every
    job in the child does not wait for the parent's, whose workers the child
    does not have."""
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-c", FORK_SCRIPT, fifo], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _threads_after_fork() -> dict:
    """The environment for a child that starts threads after a fork with
    threads running: ThreadSanitizer (scripts/sanitize.sh) ends such a child
    unless told not to."""
    env = dict(os.environ)
    if "TSAN_OPTIONS" in env:
        env["TSAN_OPTIONS"] += ":die_after_fork=0"
    return env


FUTURE_FORK_SCRIPT = WAIT_FOR_CHILD + r"""
import gc, os, sys, time, traceback, warnings
import numpy as np
import gdscp
from gdscp import _core

warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running: what this checks
path = sys.argv[1]
data = open(path, "rb").read()
size = len(data)
gdscp.defaults.set({"num_threads": 3, "gds_threshold": 0})
f = gdscp.CuFile(path)
buf = np.zeros(size, np.uint8)
_core.testing.arm_hold(1)  # the second chunk claimed, and every one after, waits: the read is in flight
fut = f.pread(buf, task_size=1 << 20)
# Every worker waiting at the hold, doing nothing else: a fork while one of
# them is inside malloc can leave the child's allocator locked for ever where
# the allocator does not prepare for fork (AddressSanitizer's, in GCC 12).
deadline = time.monotonic() + 60
while _core.testing.held_workers() < 3:
    assert time.monotonic() < deadline, f"{_core.testing.held_workers()} of 3 workers reached the hold"
    time.sleep(0.001)
pid = os.fork()
if pid == 0:
    code = 1
    try:
        _core.testing.disarm_fault()  # the child's copy of the hold: its own workers must not wait on it
        parent = os.getppid()
        for call in (fut.get, fut.done, fut.cancelled):
            try:
                call()
            except RuntimeError as exc:
                assert f"started by process {parent} before it forked" in str(exc), exc
            else:
                raise AssertionError(f"IOFuture.{call.__name__}() of the parent's transfer worked in the child")
        fut.cancel()  # the parent's transfer: nothing to cancel here
        # gdscp works in the child, on a pool of its own: the parent's file and new ones
        out = np.zeros(size, np.uint8)
        assert f.read(out, task_size=1 << 20) == size and out.tobytes() == data
        out[:] = 0
        with gdscp.CuFile(path) as g:
            assert g.pread(out, task_size=1 << 18).get() == size and out.tobytes() == data
        with gdscp.CuFile(path + ".child", "w") as g:
            assert g.write(out, task_size=1 << 20) == size
        assert open(path + ".child", "rb").read() == data
        assert _core.num_threads() == 3
        del fut  # the parent's tasks never finish here: dropping their future must not wait for them
        gc.collect()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)
_core.testing.disarm_fault()
n = fut.get()  # the parent's transfer finishes as if no fork had happened
assert n == size and buf.tobytes() == data and not fut.cancelled(), n
status = wait_for_child(pid, 60)
if status == "hung":
    sys.exit("the child hung")
assert os.waitstatus_to_exitcode(status) == 0, status
os.unlink(path + ".child")
print("CHILD-OK")
"""


def test_a_child_forked_while_a_pread_runs(tmp_path):
    """fork() while a CuFile.pread is certainly in flight (its workers held
    between chunks): in the child the parent's future raises RuntimeError
    naming the fork where it used to wait for ever (get, done, and dropping it
    at exit), and gdscp reads and writes on a pool of the child's own, through
    the inherited file and new ones; the parent's read completes with every byte."""
    path = tmp_path / "data.bin"
    path.write_bytes(payload(8 * MiB + 12345, 41).tobytes())
    run_script(FUTURE_FORK_SCRIPT, tmp_path, str(path), env=_threads_after_fork())


MULTIPROCESSING_FORK_SCRIPT = r"""
import multiprocessing, os, sys, time, warnings
import numpy as np
import gdscp
from gdscp import _core

warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running: what this checks


def read_back(path):
    out = np.zeros(os.path.getsize(path), np.uint8)
    with gdscp.CuFile(path) as f:
        n = f.pread(out, task_size=1 << 18).get()
    return n, out.tobytes()


if __name__ == "__main__":
    path = sys.argv[1]
    data = open(path, "rb").read()
    gdscp.defaults.set({"num_threads": 4, "gds_threshold": 0})
    buf = np.zeros(len(data), np.uint8)
    with gdscp.CuFile(path) as f:  # the pool has started, and a transfer runs as the workers fork
        _core.testing.arm_hold(1)  # held between chunks (and in nothing else, malloc included) as they fork
        fut = f.pread(buf, task_size=1 << 18)
        deadline = time.monotonic() + 60
        while _core.testing.held_workers() < 4:
            assert time.monotonic() < deadline, f"{_core.testing.held_workers()} of 4 workers reached the hold"
            time.sleep(0.001)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(3, initializer=_core.testing.disarm_fault) as pool:  # the children's copy of the hold
            results = pool.map(read_back, [path] * 6)
        assert not fut.done()
        _core.testing.disarm_fault()
        assert fut.get() == len(data) and buf.tobytes() == data
    assert all(r == (len(data), data) for r in results)
    print("CHILD-OK")
"""


def test_multiprocessing_fork_workers_use_gdscp(tmp_path):
    """A fork-started multiprocessing pool, made after gdscp's pool started
    and while a parent's read is certainly in flight (its workers held between
    chunks): each worker reads on its own pool, and the parent's read then
    completes with every byte."""
    path = tmp_path / "data.bin"
    path.write_bytes(payload(4 * MiB + 7, 43).tobytes())
    run_script(MULTIPROCESSING_FORK_SCRIPT, tmp_path, str(path), env=_threads_after_fork())


SETTINGS_FORK_SCRIPT = WAIT_FOR_CHILD + r"""
import os, sys, threading, time, warnings
import gdscp
from gdscp import defaults

warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads running: what this checks
held, release = threading.Event(), threading.Event()


def setting():  # a defaults.set() in progress on another thread as the process forks
    with defaults._changing:
        held.set()
        release.wait()


thread = threading.Thread(target=setting)
thread.start()
held.wait()
pid = os.fork()
if pid == 0:
    with defaults.set("task_size", 1 << 20):  # hung for good on the lock the other thread held
        ok = defaults.get("task_size") == 1 << 20
    os._exit(0 if ok else 1)
release.set()
thread.join()
status = wait_for_child(pid, 60)
if status == "hung":
    sys.exit("the child hung")
assert os.waitstatus_to_exitcode(status) == 0, status
print("CHILD-OK")
"""


def test_a_child_forked_during_a_settings_change_can_change_settings(tmp_path):
    """fork() while another thread is inside defaults.set(): the child's
    settings lock is free (that thread does not exist in the child)."""
    run_script(SETTINGS_FORK_SCRIPT, tmp_path)


def _cancelled_while_held(f, buf) -> tuple:
    """``f.pread(buf)`` in 1 MiB tasks, cancelled while a worker is held
    between chunks (certainly in flight): the future and what get() gives."""
    _core.testing.arm_hold(1)
    try:
        fut = f.pread(buf, task_size=MiB)
        deadline = time.monotonic() + DEADLINE
        while not _core.testing.hold_reached():
            assert time.monotonic() < deadline, "no worker reached the hold"
            time.sleep(0.001)
        fut.cancel()
        return fut, fut.get()
    finally:
        _core.testing.disarm_fault()


def test_cancel_skips_the_rest_and_cancelled_tells_it_from_end_of_file(tmp_path):
    """cancel() while a pread is certainly in flight (its workers held between
    chunks): get() returns the bytes before the first piece skipped, all of
    them right, and cancelled() is True. A read cut short by the end of the
    file, a whole one, and a cancel after the end report False."""
    data = payload(8 * MiB + 100, 44)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())
    with gdscp.defaults.set({"num_threads": 2, "gds_threshold": 0}), gdscp.CuFile(path) as f:
        buf = np.zeros(data.size, np.uint8)
        fut, n = _cancelled_while_held(f, buf)
        assert fut.done() and fut.cancelled()
        assert n < data.size and np.array_equal(buf[:n], data[:n])
        fut.cancel()  # again: harmless
        assert fut.cancelled() and fut.get() == n

        whole = f.pread(buf, task_size=MiB)
        assert whole.get() == data.size and not whole.cancelled()
        whole.cancel()  # after the end: the transfer stays whole
        assert not whole.cancelled() and whole.get() == data.size
        past_the_end = f.pread(buf, file_offset=MiB, task_size=MiB)
        assert past_the_end.get() == data.size - MiB and not past_the_end.cancelled()
        small = f.pread(buf[:100])  # run on this thread: nothing left to cancel
        small.cancel()
        assert small.get() == 100 and not small.cancelled()


def test_a_cancelled_mmap_read_is_counted_as_a_cufile_read_is(tmp_path):
    """An Mmap pread cancelled while its workers are held between chunks:
    get() returns the bytes before the first chunk skipped, all of them
    right, and cancelled() is True; a whole read, or a cancel after it
    ended, reports False."""
    data = payload(8 * MiB + 100, 45)
    path = tmp_path / "data.bin"
    path.write_bytes(data.tobytes())
    with gdscp.defaults.set({"num_threads": 2, "gds_threshold": 0}), gdscp.Mmap(path) as f:
        buf = np.zeros(data.size, np.uint8)
        fut, n = _cancelled_while_held(f, buf)
        assert fut.done() and fut.cancelled()
        assert 0 < n < data.size and n % MiB == 0, n
        assert np.array_equal(buf[:n], data[:n]) and not buf[n:].any()
        assert fut.cancelled() and fut.get() == n

        whole = f.pread(buf, task_size=MiB)
        assert whole.get() == data.size and not whole.cancelled()
        whole.cancel()
        assert not whole.cancelled() and whole.get() == data.size
        assert np.array_equal(buf, data)
