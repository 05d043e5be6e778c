"""Bulk jobs (gdscp.bulk): many files read, written and copied at once.

Every byte is checked against what the OS reads. Sizes cover 0, 1, a page
and either side of it, and files cut into many chunks (small task and
staging sizes); trees of hundreds of files come from the benchmark's own
generator. Failures (missing, unreadable, a directory, a full disk, I/O
errors from the engine's fault injection) must leave the other files right
and no partial destination and no temporary file behind; cancelling with
hundreds of files in flight, and Ctrl-C in a child process, likewise.
Device memory runs over the libcuda/libcufile stand-ins (tests/standin), in
child processes, as in tests/test_cufile_standin.py.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import mmap
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

import gdscp
import standin
from conftest import POISON, random_bytes, sanitized, wait_for_held_workers
from gdscp import _core, bulk
from gdscp.bench.tree import make_tree
from test_cufile_standin import folder, go, poisoned, standin_build  # noqa: F401 - fixtures and helpers

KiB, MiB = 1 << 10, 1 << 20
PAGE = 4096
SIZES = [0, 1, PAGE - 1, PAGE, PAGE + 1, 3 * MiB + 17]


def temporaries(root) -> list[str]:
    return [
        os.path.join(d, f)
        for d, _, files in os.walk(root)
        for f in files
        if f.endswith(bulk.TEMPORARY_SUFFIX)
    ]


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.fixture
def small_chunks():
    """Files split into many chunks and staged through small slots."""
    with gdscp.defaults.set({"task_size": 64 * KiB, "min_task_size": 4096, "num_threads": 4}):
        yield


def files_of(folder: Path, sizes, seed=0) -> list[tuple[str, bytes]]:
    out = []
    for i, size in enumerate(sizes):
        data = random_bytes(size, seed + i)
        path = folder / f"f{i}.bin"
        path.write_bytes(data)
        out.append((str(path), data))
    return out


# -- reads -----------------------------------------------------------------------------


def test_read_files_into_buffers_and_new_arrays(tmp_path, small_chunks):
    files = files_of(tmp_path, SIZES * 3)
    buffers = [np.full(len(d) + 5, POISON, dtype=np.uint8) for _, d in files]
    job = gdscp.read_files([p for p, _ in files], buffers)
    results = job.results()
    for (path, data), buf, r in zip(files, buffers, results):
        assert r.status == "done" and r.bytes == len(data) and r.source == path and r.error is None
        assert buf[: len(data)].tobytes() == data
        assert (buf[len(data):] == POISON).all(), "bytes past the end of the file were touched"
    job = gdscp.read_files([p for p, _ in files])
    assert all(r.status == "done" for r in job.results())
    assert [a.tobytes() for a in job.arrays] == [d for _, d in files]
    p = job.progress()
    assert p.finished and p.files_done == len(files) and p.bytes_done == sum(len(d) for _, d in files)


def test_read_failures_are_per_file(tmp_path):
    files = files_of(tmp_path, [1000, 2000, 3000])
    paths = [files[0][0], str(tmp_path / "missing.bin"), files[1][0], str(tmp_path), files[2][0]]
    buffers = [np.zeros(4000, dtype=np.uint8) for _ in paths]
    results = gdscp.read_files(paths, buffers).results()
    assert [r.status for r in results] == ["done", "failed", "done", "failed", "done"]
    assert results[1].errno == errno.ENOENT and "missing.bin" in results[1].error
    assert results[3].errno == errno.EISDIR and str(tmp_path) in results[3].error
    for r, buf in zip(results, buffers):
        if r.status == "done":
            assert buf[: r.bytes].tobytes() == Path(r.source).read_bytes()
    job = gdscp.read_files(paths, buffers)
    job.wait()
    failures = job.failures()
    assert [f.index for f in failures] == [1, 3] or [f.index for f in failures] == [3, 1]


def test_stream_files_reads_ranges_and_verifies(tmp_path, small_chunks):
    files = files_of(tmp_path, [MiB + 3, 5000])
    job = bulk.stream_files([p for p, _ in files], ranges=[(4097, 300 * KiB), (0, None)], verify=True,
                            staging_size=256 * KiB)
    results = job.results()
    assert [r.bytes for r in results] == [300 * KiB, 5000] and {r.status for r in results} == {"done"}
    # A range past the end of the file is a failure, not a short read.
    (r,) = bulk.stream_files([files[1][0]], ranges=[(0, 6000)]).results()
    assert r.status == "failed" and "has no bytes [0, 6000) to read (it has 5000)" in r.error
    # verify compares with a plain read: corrupted bytes are caught.
    _core.testing.arm_fault("land", 0, 1, 1)
    try:
        (r,) = bulk.stream_files([files[1][0]], verify=True).results()
    finally:
        _core.testing.disarm_fault()
    assert r.status == "failed" and "verify failed" in r.error


def test_a_read_into_host_memory_says_why_it_took_the_posix_path(tmp_path, small_chunks):
    """Host memory always takes the POSIX path, whatever compat_mode says: the
    result says that, not the compat_mode it was never chosen by."""
    (path, data), = files_of(tmp_path, [MiB + 1])
    buf = np.zeros(len(data), dtype=np.uint8)
    (r,) = gdscp.read_files([path], [buf]).results()
    assert r.status == "done" and buf.tobytes() == data
    assert r.backend_reason == "host memory always takes the POSIX path"


@pytest.mark.parametrize("threads", [1, 4])
def test_a_read_cut_short_in_the_middle_reports_only_the_bytes_before_the_cut(tmp_path, threads):
    """One chunk comes up short (the file shrank as it was read) while later
    chunks move all their bytes: the read reports the bytes up to the cut, as
    CuFile.pread does, never a count that runs over the gap."""
    (path, data), = files_of(tmp_path, [2 * MiB + 5])
    settings = {"task_size": 64 * KiB, "min_task_size": 4096, "num_threads": threads, "mapped_reads": False}
    with gdscp.defaults.set(settings):
        buf = np.zeros(len(data), dtype=np.uint8)
        _core.testing.arm_fault("pread", 5, 1, 0)  # the sixth pread finds the end of the file
        try:
            job = gdscp.read_files([path], [buf])
            job.wait()
        finally:
            _core.testing.disarm_fault()
    (r,) = job.results()
    assert r.status == "done" and 0 < r.bytes < len(data)
    assert buf[: r.bytes].tobytes() == data[: r.bytes]


def test_read_of_files_without_a_size(tmp_path):
    proc = "/proc/self/status"
    if not os.path.exists(proc) or os.stat(proc).st_size != 0:
        pytest.skip("no zero-size procfs file here")
    (r,) = bulk.stream_files([proc]).results()
    assert r.status == "done" and r.bytes > 0
    assert r.backend_reason and "front to back" in r.backend_reason


# -- writes ----------------------------------------------------------------------------


def test_write_files_are_exact_and_keep_modes(tmp_path, small_chunks):
    datas = [random_bytes(n, i) for i, n in enumerate(SIZES * 2)]
    paths = [tmp_path / f"w{i}.bin" for i in range(len(datas))]
    paths[0].write_bytes(b"old")
    paths[0].chmod(0o640)
    buffers = [np.frombuffer(d, dtype=np.uint8) for d in datas]
    results = gdscp.write_files(buffers, paths).results()
    assert {r.status for r in results} == {"done"}
    for path, data in zip(paths, datas):
        assert path.read_bytes() == data
    assert stat.S_IMODE(paths[0].stat().st_mode) == 0o640
    assert stat.S_IMODE(paths[1].stat().st_mode) == 0o666 & ~umask()
    assert temporaries(tmp_path) == []
    # no_clobber: existing files are left alone.
    results = gdscp.write_files([np.zeros(3, np.uint8)] * 2, [paths[1], tmp_path / "new.bin"], no_clobber=True).results()
    assert [(r.status, r.note) for r in results] == [("skipped", "exists"), ("done", None)]
    assert paths[1].read_bytes() == datas[1]
    # Not atomic: written in place.
    results = gdscp.write_files([np.ones(5, np.uint8)], [paths[2]], atomic=False, fsync=False).results()
    assert results[0].status == "done" and paths[2].read_bytes() == b"\x01" * 5
    # A directory in the way fails alone, and says so.
    (tmp_path / "d").mkdir()
    r1, r2 = gdscp.write_files([np.ones(5, np.uint8)] * 2, [tmp_path / "d", paths[3]]).results()
    assert r1.status == "failed" and r1.error == f"cannot write '{tmp_path / 'd'}': it is a directory"
    assert r2.status == "done" and paths[3].read_bytes() == b"\x01" * 5
    assert os.listdir(tmp_path / "d") == [] and temporaries(tmp_path) == []


# -- copies ----------------------------------------------------------------------------


def test_copies_of_every_size(tmp_path, small_chunks):
    src = tmp_path / "src"
    src.mkdir()
    (tmp_path / "dst").mkdir()
    files = files_of(src, SIZES * 4)
    for i, (path, _) in enumerate(files):
        os.chmod(path, [0o600, 0o644, 0o755, 0o640][i % 4])
    pairs = [(p, str(tmp_path / "dst" / os.path.basename(p))) for p, _ in files]
    job = gdscp.copy_files(pairs, staging_size=256 * KiB, sizes=[len(d) for _, d in files])
    results = job.results()
    assert {r.status for r in results} == {"done"}
    for (s, d), (_, data), r in zip(pairs, files, results):
        assert Path(d).read_bytes() == data and r.bytes == len(data)
        assert stat.S_IMODE(os.stat(d).st_mode) == stat.S_IMODE(os.stat(s).st_mode) & ~umask()
        assert r.read_backend == r.write_backend == "posix"
    p = job.progress()
    assert p.bytes_total == p.bytes_done == sum(len(d) for _, d in files)
    assert temporaries(tmp_path) == []


KERNEL = "copied inside the kernel (copy_file_range)"


def kernel_copies(folder: Path) -> bool:
    """Whether the kernel copies between two files of `folder` (copy_file_range)."""
    a, b = folder / "probe.a", folder / "probe.b"
    a.write_bytes(b"x" * 4096)
    try:
        with open(a, "rb") as fa, open(b, "wb") as fb:
            return os.copy_file_range(fa.fileno(), fb.fileno(), 4096) == 4096
    except OSError:
        return False
    finally:
        a.unlink()
        b.unlink(missing_ok=True)


def test_host_copies_go_inside_the_kernel(tmp_path, small_chunks):
    """Copies through host memory of regular files are made by the kernel
    (copy_file_range, as cp does), every size exact, a file of many chunks
    included; the result says how. Asked for O_DIRECT, the bytes go through
    memory instead (the kernel's copy would go through the page cache)."""
    if not kernel_copies(tmp_path):
        pytest.skip("the kernel cannot copy_file_range on this filesystem")
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    files = files_of(src, SIZES + [9 * MiB + 5])
    for direct_io, kernel in (("auto", True), ("on", False)):
        pairs = [(p, str(dst / f"{direct_io}-{os.path.basename(p)}")) for p, _ in files]
        with gdscp.defaults.set("direct_io", direct_io):
            results = gdscp.copy_files(pairs, staging_size=256 * KiB).results()
        for (_, d), (_, data), r in zip(pairs, files, results):
            assert (r.status, r.bytes) == ("done", len(data)) and Path(d).read_bytes() == data, d
            if data:  # an empty file is read front to back, as a procfs file is
                assert (r.backend_reason == KERNEL) == kernel, (d, r.backend_reason)
    assert temporaries(tmp_path) == []


def test_a_kernel_that_stops_copying_leaves_the_rest_to_memory(tmp_path, small_chunks):
    """When copy_file_range fails part way (a filesystem that cannot, an
    error), the rest of the file goes through memory: every byte lands, and
    the result tells how many the kernel copied."""
    if not kernel_copies(tmp_path):
        pytest.skip("the kernel cannot copy_file_range on this filesystem")
    data = random_bytes(5 * MiB + 3, 11)
    (tmp_path / "a").write_bytes(data)
    for err in (errno.EXDEV, errno.EIO, 0):  # 0: the kernel copies nothing, as at the end of the file
        out = tmp_path / f"b-{err}"
        _core.testing.arm_fault("copy_file_range", 3, 1, err)
        try:
            (r,) = gdscp.copy_files([(tmp_path / "a", out)]).results()
        finally:
            _core.testing.disarm_fault()
        assert (r.status, r.bytes) == ("done", len(data)) and out.read_bytes() == data
        kernel, _, rest = r.backend_reason.partition(" of ")
        assert 3 * 64 * KiB <= int(kernel) < len(data), r.backend_reason
        assert rest == f"{len(data)} bytes copied inside the kernel (copy_file_range), the rest through host memory"
    assert temporaries(tmp_path) == []


def sparse_file(path: Path, size: int, extents: list[tuple[int, int]], seed: int) -> bytes:
    """A file of `size` bytes with random data at each (offset, length) of
    `extents` and holes elsewhere; returns its bytes."""
    content = bytearray(size)
    with open(path, "wb") as f:
        for i, (offset, length) in enumerate(extents):
            data = random_bytes(length, seed + i)
            f.seek(offset)
            f.write(data)
            content[offset:offset + length] = data
        f.truncate(size)
    return bytes(content)


@pytest.mark.parametrize("layout", [
    [(0, MiB), (21 * MiB + 5, PAGE + 7)],          # data, hole, data, a hole to the end
    [(3 * MiB + 1, 2 * PAGE)],                      # a hole first
    [],                                             # nothing but a hole
    [(0, 64 * KiB), (96 * KiB, 200 * KiB), (MiB - 3, 10)],  # runs across chunk edges
])
def test_sparse_files_stay_sparse(tmp_path, small_chunks, layout):
    """A copy without a GPU of a sparse file copies its data and keeps its
    holes, as cp does: every byte equal (the holes read as zeros), and the
    copy holds no more blocks than its source. With O_DIRECT asked for, or
    the kernel failing part way, the bytes are still exact."""
    size = 30 * MiB
    data = sparse_file(tmp_path / "src", size, layout, seed=len(layout))
    src_blocks = os.stat(tmp_path / "src").st_blocks * 512
    if src_blocks >= size // 2:
        pytest.skip("this filesystem does not keep holes")
    (r,) = gdscp.copy_files([(tmp_path / "src", tmp_path / "dst")], staging_size=256 * KiB).results()
    assert (r.status, r.bytes) == ("done", size) and (tmp_path / "dst").read_bytes() == data, r
    assert os.stat(tmp_path / "dst").st_blocks * 512 <= src_blocks + 64 * KiB
    if layout:  # (a file of nothing but a hole has no byte to say how it moved)
        assert r.backend_reason.endswith("holes kept"), r.backend_reason
    with gdscp.defaults.set("direct_io", "on"):
        (r,) = gdscp.copy_files([(tmp_path / "src", tmp_path / "dense")]).results()
    assert r.status == "done" and (tmp_path / "dense").read_bytes() == data
    _core.testing.arm_fault("copy_file_range", 1, 1, errno.EXDEV)
    try:
        (r,) = gdscp.copy_files([(tmp_path / "src", tmp_path / "mixed")], staging_size=256 * KiB).results()
    finally:
        _core.testing.disarm_fault()
    assert r.status == "done" and (tmp_path / "mixed").read_bytes() == data
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("path", ["/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/profiling",
                                  "/proc/self/mountinfo", "/proc/cpuinfo"])
def test_copies_of_kernel_files_whose_size_says_nothing(tmp_path, path):
    """sysfs gives a size of 4096 to an attribute of a few bytes, procfs 0 to
    files with content: they are copied to their end, as cp copies them."""
    if not os.path.isfile(path):
        pytest.skip(f"{path} is not here")
    with open(path, "rb") as f:
        want = f.read()
    (r,) = gdscp.copy_files([(path, tmp_path / "out")]).results()
    assert r.status == "done", r.error
    got = (tmp_path / "out").read_bytes()
    if "self" in path:  # another process's mounts: compare what does not change
        assert got.splitlines()[0] == want.splitlines()[0]
    else:
        assert got == want
    assert r.bytes == len(got) and temporaries(tmp_path) == []


def test_copies_preserve_no_clobber_and_existing_modes(tmp_path):
    (a, da), (b, db) = files_of(tmp_path, [5000, 7000])
    os.chmod(a, 0o751)
    os.utime(a, ns=(1_000_000_000, 2_000_000_123))
    out = tmp_path / "out"
    out.mkdir()
    (out / "b").write_bytes(b"old")
    os.chmod(out / "b", 0o600)
    results = gdscp.copy_files([(a, out / "a"), (b, out / "b")], preserve=True).results()
    assert {r.status for r in results} == {"done"}
    st = os.stat(out / "a")
    assert stat.S_IMODE(st.st_mode) == 0o751 and st.st_mtime_ns == 2_000_000_123
    assert stat.S_IMODE(os.stat(out / "b").st_mode) == stat.S_IMODE(os.stat(b).st_mode)
    # Without preserve an existing destination keeps its mode.
    os.chmod(out / "b", 0o600)
    gdscp.copy_files([(b, out / "b")]).wait()
    assert stat.S_IMODE(os.stat(out / "b").st_mode) == 0o600 and (out / "b").read_bytes() == db
    # no_clobber never replaces, and says why.
    (r,) = gdscp.copy_files([(a, out / "b")], no_clobber=True).results()
    assert (r.status, r.note) == ("skipped", "exists") and (out / "b").read_bytes() == db
    # Same file, and a directory in the way.
    r1, r2 = gdscp.copy_files([(a, a), (a, out)]).results()
    assert r1.status == "failed" and "same file" in r1.error
    assert r2.status == "failed" and "cannot overwrite directory" in r2.error
    assert Path(a).read_bytes() == da and temporaries(tmp_path) == []


def test_copies_verified_refuse_a_bad_copy(tmp_path):
    (a, da), (b, db) = files_of(tmp_path, [3000, 3000])
    _core.testing.arm_fault("land", 0, 1, 1)  # the first copy checked reads back one wrong byte
    try:
        r1, r2 = gdscp.copy_files([(a, tmp_path / "a2"), (b, tmp_path / "b2")], verify=True).results()
    finally:
        _core.testing.disarm_fault()
    bad, good = (r1, r2) if r1.status == "failed" else (r2, r1)
    assert bad.status == "failed" and "verify failed" in bad.error and "was not changed" in bad.error
    assert good.status == "done"
    assert not os.path.exists(bad.destination) and temporaries(tmp_path) == []


def read_or_copy_swapped(where: Path, kind: str, direct_io: str = "auto") -> tuple[bytes, bytes]:
    """A 2 MiB source read or copied with a 3 MiB file renamed over its path
    once it is opened and measured, before it is read (the fault hook, every
    time): its bytes and what the job gave, which must be the same."""
    src, other, dst = where / "src", where / "other", where / "dst"
    first, second = random_bytes(2 * MiB, 11), random_bytes(3 * MiB, 12)
    src.write_bytes(first)
    other.write_bytes(second)
    buf = np.zeros(2 * MiB + 5, dtype=np.uint8)
    _core.testing.arm_source_swap(str(other))
    try:
        with gdscp.defaults.set("direct_io", direct_io):
            job = gdscp.copy_files([(src, dst)]) if kind == "copy" else gdscp.read_files([src], [buf])
            (r,) = job.results()
    finally:
        _core.testing.disarm_fault()
    assert not other.exists() and src.read_bytes() == second  # the swap happened
    assert r.status == "done" and r.bytes == 2 * MiB, r
    assert temporaries(where) == []
    if kind == "read":
        assert not buf[2 * MiB:].any()
        return first, buf[: 2 * MiB].tobytes()
    return first, dst.read_bytes()


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_a_destination_directory_moved_as_its_file_opens_is_named_so(tmp_path, kind):
    """The destination's directory renamed just after the temporary file is
    made in it and before that file is opened again by its path (a file of 1
    MiB or more): the file fails saying its directory was moved or removed
    (not that its temporary file is missing), the old file in the moved
    directory is intact and no temporary file is left, there or anywhere."""
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    folder.mkdir()
    (folder / "d").write_bytes(b"good")
    src = tmp_path / "src"
    data = random_bytes(2 * MiB, 31)
    src.write_bytes(data)
    _core.testing.arm_destination_move(str(moved_to))
    try:
        if kind == "copy":
            job = gdscp.copy_files([(src, folder / "d")])
        else:
            job = gdscp.write_files([np.frombuffer(data, dtype=np.uint8)], [folder / "d"])
        (r,) = job.results()
    finally:
        _core.testing.disarm_fault()
    assert not folder.exists() and sorted(os.listdir(moved_to)) == ["d"]  # the move happened
    assert (moved_to / "d").read_bytes() == b"good"
    assert temporaries(tmp_path) == [] and temporaries(moved_to) == []
    assert r.status == "failed", r
    assert r.error == (f"the destination directory '{folder}' was moved or removed during the {kind}"), r.error


@pytest.mark.parametrize("kind", ["copy", "read"])
def test_a_source_renamed_over_mid_transfer_is_read_as_it_was_opened(tmp_path, kind):
    """A source of 1 MiB or more is opened, measured, then read through a file
    handle. Another file renamed over its path in between: what is read is
    the file measured, whole, never the other one for its size nor a mix of
    the two, as cp reads the file it opened."""
    first, got = read_or_copy_swapped(tmp_path, kind)
    assert got == first


@pytest.mark.parametrize("kind", ["copy", "read"])
def test_a_source_renamed_over_is_read_as_it_was_opened_with_o_direct(folder, kind):
    """As above, through O_DIRECT (direct_io "on", on a filesystem that takes
    it): the file handle's O_DIRECT descriptor is of the file measured too."""
    first, got = read_or_copy_swapped(Path(folder), kind, "on")
    assert got == first


def scenario_swapped_source_through_cufile(folder):
    """read_files into device memory and copy_files through it, over cuFile
    (compat_mode off, which reads through the O_DIRECT descriptor): a file
    renamed over the source once measured is not what is read."""
    import gdscp
    from gdscp import _core

    src, other, dst = (os.path.join(folder, n) for n in ("src", "other", "dst"))
    first = random_bytes(2 * MiB, 21)
    for kind in ("read", "copy"):
        with open(src, "wb") as f:
            f.write(first)
        with open(other, "wb") as f:
            f.write(random_bytes(3 * MiB, 22))
        buf = poisoned(2 * MiB)
        _core.testing.arm_source_swap(other)
        try:
            with gdscp.defaults.set({"compat_mode": "off"}):
                job = gdscp.read_files([src], [buf]) if kind == "read" else gdscp.copy_files([(src, dst)], device=0)
                (r,) = job.results()
        finally:
            _core.testing.disarm_fault()
        assert not os.path.exists(other), kind
        assert r.status == "done" and r.bytes == 2 * MiB and r.read_backend == "cufile", (kind, r)
        if kind == "read":
            assert buf.bytes() == first
        else:
            with open(dst, "rb") as f:
                assert f.read() == first


def test_a_source_renamed_over_is_read_as_it_was_opened_through_cufile(go):
    go(scenario_swapped_source_through_cufile)


@pytest.mark.parametrize("size", [5000, 2 * MiB])
@pytest.mark.parametrize("swapped", ["link", "fifo", "file"])
def test_a_copy_given_its_sources_ids_reads_only_those_files(tmp_path, size, swapped):
    """copy_files(_source_ids=...), as gdscp copy -r calls it: a source that
    is no longer the file found (a symbolic link to a file elsewhere, a FIFO,
    another file in its place) fails, naming it, at once (a FIFO is not
    waited on) and with the old destination as it was; the other pairs are
    copied as usual."""
    (a, da), (b, db) = files_of(tmp_path, [size, size])
    found = os.lstat(a)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not to be copied")
    new = tmp_path / "new"
    if swapped == "link":
        os.symlink(secret, new)
    elif swapped == "fifo":
        os.mkfifo(new)
    else:
        new.write_bytes(da)  # the same bytes in another file (made while the first holds its inode)
    os.replace(new, a)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_bytes(b"old")
    job = gdscp.copy_files([(a, out / "a"), (b, out / "b")], _source_ids=[(found.st_dev, found.st_ino), None])
    if not job.wait(20):  # a writer come and gone lets the read end, and the job with it
        os.close(os.open(a, os.O_WRONLY | os.O_NONBLOCK))
        job.wait(60)
        pytest.fail("the copy waited on the FIFO")
    r1, r2 = job.results()
    assert r1.status == "failed" and r1.error == f"'{a}' was replaced while being copied", r1
    assert (out / "a").read_bytes() == b"old"
    assert r2.status == "done" and (out / "b").read_bytes() == db
    assert temporaries(tmp_path) == []
    # The file found is copied as usual.
    found_b = os.lstat(b)
    (r,) = gdscp.copy_files([(b, out / "c")], _source_ids=[(found_b.st_dev, found_b.st_ino)]).results()
    assert r.status == "done" and (out / "c").read_bytes() == db


@pytest.mark.parametrize("size", [5000, 2 * MiB])
@pytest.mark.parametrize("swapped", ["link", "fifo", "file"])
def test_no_clobber_skips_a_replaced_source_whose_destination_exists(tmp_path, size, swapped):
    """With no_clobber, a source that is no longer the file found but whose
    destination exists is skipped as any pair with an existing destination
    is ("exists"): nothing would have been written. One whose destination
    does not exist still fails as replaced, with nothing written (a FIFO is
    not waited on either way)."""
    (a, _), (b, _), (c, dc) = files_of(tmp_path, [size, size, size])
    ids = []
    for path in (a, b):
        found = os.lstat(path)
        ids.append((found.st_dev, found.st_ino))
        new = tmp_path / "new"
        if swapped == "link":
            os.symlink(tmp_path / "secret", new)
        elif swapped == "fifo":
            os.mkfifo(new)
        else:
            new.write_bytes(b"another file")
        os.replace(new, path)
    (tmp_path / "secret").write_bytes(b"not to be copied")
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_bytes(b"old a")
    (out / "c").write_bytes(b"old c")
    found_c = os.lstat(c)
    job = gdscp.copy_files([(a, out / "a"), (b, out / "b"), (c, out / "c")], no_clobber=True,
                           _source_ids=ids + [(found_c.st_dev, found_c.st_ino)])
    if not job.wait(20):  # a writer come and gone lets the read end, and the job with it
        for path in (a, b):
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        job.wait(60)
        pytest.fail("the copy waited on the FIFO")
    ra, rb, rc = job.results()
    # The same as the pair whose source was not replaced.
    assert (ra.status, ra.note, ra.error, ra.bytes) == (rc.status, rc.note, rc.error, rc.bytes) == (
        "skipped", "exists", None, 0), (ra, rc)
    assert (out / "a").read_bytes() == b"old a" and (out / "c").read_bytes() == b"old c"
    assert rb.status == "failed" and rb.error == f"'{b}' was replaced while being copied", rb
    assert not (out / "b").exists() and temporaries(tmp_path) == []
    assert Path(c).read_bytes() == dc


@pytest.mark.parametrize("size", [0, 1, PAGE + 1, 3 * MiB + 17])
def test_writes_verified_before_they_take_the_name(tmp_path, size):
    """write_files(verify=True) reads each file back from storage and compares
    it with its buffer before the rename: files that match are in place, and
    one that reads back wrong fails, naming the offset, while the old file
    under its name stays as it was."""
    bufs = [np.frombuffer(random_bytes(size, s), np.uint8) for s in (1, 2)]
    paths = [tmp_path / "a", tmp_path / "b"]
    for p in paths:
        p.write_bytes(b"old")
    results = gdscp.write_files(bufs, paths, verify=True).results()
    assert [r.status for r in results] == ["done", "done"]
    assert [p.read_bytes() for p in paths] == [b.tobytes() for b in bufs]
    if size == 0:
        return
    for p in paths:
        p.write_bytes(b"old")
    _core.testing.arm_fault("land", 0, 1, 1)  # the first file checked reads back one wrong byte
    try:
        r1, r2 = gdscp.write_files(bufs, paths, verify=True).results()
    finally:
        _core.testing.disarm_fault()
    (bad, good) = (0, 1) if r1.status == "failed" else (1, 0)
    r = (r1, r2)[bad]
    assert "verify failed" in r.error and "offset 0" in r.error and "not put in place" in r.error, r
    assert (r1, r2)[good].status == "done"
    assert paths[bad].read_bytes() == b"old" and paths[good].read_bytes() == bufs[good].tobytes()
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("kind", ["copy", "write"])
def test_a_failure_of_a_large_file_names_its_destination(tmp_path, kind):
    """A file large enough to be written through a File opened by the path of
    its temporary file failed naming that file, removed by then; it names
    the destination, as the failure of a small file does."""
    data = random_bytes(3 * MiB, 5)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(data)
    _core.testing.arm_fault("pwrite", 0, 1, errno.EIO)
    try:
        job = gdscp.copy_files([(src, dst)]) if kind == "copy" else gdscp.write_files([data], [dst])
        (result,) = job.results()
    finally:
        _core.testing.disarm_fault()
    assert result.status == "failed" and result.errno == errno.EIO and result.destination == str(dst)
    assert re.fullmatch(rf"pwrite.* '{re.escape(str(dst))}' at offset \d+: Input/output error.*", result.error), \
        result.error
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_copies_of_a_tree_with_failures_leave_no_partial_file(tmp_path):
    tree = make_tree(str(tmp_path / "src"), 300, 1, 20 * KiB, seed=3)
    (tmp_path / "dst").mkdir()
    pairs = [(p, str(tmp_path / "dst" / f"{i}.bin")) for i, p in enumerate(tree.paths)]
    vanished = set(random.Random(1).sample(range(len(pairs)), 20))
    for i in vanished:
        os.unlink(pairs[i][0])
    # An I/O error on some writes (the engine's fault injection) as well.
    _core.testing.arm_fault("pwrite", 40, 5, errno.EIO)
    try:
        results = gdscp.copy_files(pairs).results()
    finally:
        _core.testing.disarm_fault()
    failed = [r for r in results if r.status == "failed"]
    assert {r.index for r in failed} >= vanished and len(failed) == len(vanished) + 5
    for r in failed:
        assert r.errno in (errno.ENOENT, errno.EIO), r
        # The reason names the file: the source that vanished, the temporary file a write failed in.
        assert r.source in r.error if r.errno == errno.ENOENT else os.path.basename(r.destination) in r.error
        assert not os.path.exists(r.destination)
    for r, (src, dst) in zip(results, pairs):
        if r.status == "done":
            assert Path(dst).read_bytes() == Path(src).read_bytes()
    assert temporaries(tmp_path) == []


LOW_FD_LIMIT = r"""
import resource, sys, gdscp
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[3]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
src, dst = sys.argv[1], sys.argv[2]
names = sorted(__import__("os").listdir(src))
gdscp.defaults.set("num_threads", 8)
results = gdscp.copy_files([(f"{src}/{n}", f"{dst}/{n}") for n in names]).results()
bad = [r for r in results if r.status != "done"]
print(len(results), len(bad), bad[0].error if bad else "")
"""


@pytest.mark.parametrize("limit", [128, 512])
def test_copies_of_many_files_fit_a_low_descriptor_limit(tmp_path, limit):
    """Each file waiting for its batch keeps one descriptor open; batches are
    sized to the process's limit, so a job of many more files than the limit
    allows open at once still copies every one (through 2 MiB files too, which
    the engine opens as File objects)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    datas = {}
    for i in range(1500):
        datas[f"f{i:04d}"] = random_bytes(2 * MiB + 1 if i % 500 == 7 else 1 + i % 3000, seed=i)
        (src / f"f{i:04d}").write_bytes(datas[f"f{i:04d}"])
    proc = subprocess.run([sys.executable, "-c", LOW_FD_LIMIT, str(src), str(dst), str(limit)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["1500", "0"], proc.stdout
    for name, data in datas.items():
        assert (dst / name).read_bytes() == data, name
    assert temporaries(tmp_path) == []


FEW_DESCRIPTORS = r"""
import os, resource, sys
import numpy as np
import gdscp
from gdscp import bulk, memory

src, dst, spare = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = sorted(os.listdir(src))
datas = [open(f"{src}/{n}", "rb").read() for n in names]
gdscp.defaults.set("num_threads", 16)
# What the process holds open once a job has run, plus `spare` for the jobs
# below: 16 workers opening files at once find too few for all of them.
gdscp.read_files([f"{src}/{names[0]}"]).results()
limit = len(os.listdir("/proc/self/fd")) + spare
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
jobs = {}  # one at a time: each may use every descriptor there is
for kind, start in (
    ("copy", lambda: gdscp.copy_files([(f"{src}/{n}", f"{dst}/c-{n}") for n in names])),
    ("write", lambda: gdscp.write_files([np.frombuffer(d, np.uint8) for d in datas], [f"{dst}/w-{n}" for n in names])),
    ("read", lambda: gdscp.read_files([f"{src}/{n}" for n in names])),
):
    jobs[kind] = start()
    bad = [r for r in jobs[kind].results() if r.status != "done"]
    print(kind, len(bad), bad[0].error if bad else "")
print("read-bytes", all(bytes(a) == d for a, d in zip(jobs["read"].arrays, datas)))
"""


@pytest.mark.parametrize("spare", [7, 11, 31])
def test_a_job_short_of_descriptors_has_fewer_files_in_flight(tmp_path, spare):
    """Under a limit on open files too low for the workers' files and a
    batch waiting for its sync (ulimit -n leaving 7 to 31 descriptors free,
    16 workers), a file that cannot open for want of a descriptor waits for
    one of the job's to close, and the job keeps fewer files in flight from
    then on: every file of a copy, a write and a read arrives whole, where
    they had failed by the hundred."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    datas = {}
    for i in range(300):
        datas[f"f{i:03d}"] = random_bytes(2 * MiB + 1 if i % 100 == 7 else 1 + i * 37 % 5000, seed=i)
        (src / f"f{i:03d}").write_bytes(datas[f"f{i:03d}"])
    proc = subprocess.run([sys.executable, "-c", FEW_DESCRIPTORS, str(src), str(dst), str(spare)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["copy 0 ", "write 0 ", "read 0 ", "read-bytes True"], proc.stdout
    for name, data in datas.items():
        assert (dst / f"c-{name}").read_bytes() == data and (dst / f"w-{name}").read_bytes() == data, name
    assert temporaries(tmp_path) == []


ONE_AT_A_TIME = r"""
import os, sys
import gdscp
from gdscp import _core

src, dst, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = sorted(os.listdir(src))
gdscp.defaults.set("num_threads", workers)
# Every worker's first file fails to open for want of descriptors, all of
# them together: the job goes one file at a time from then on.
_core.testing.arm_descriptor_shortage(workers)
job = gdscp.copy_files([(f"{src}/{n}", f"{dst}/{n}") for n in names])
ended = job.wait(20)
if not ended:
    job.cancel()
    job.wait(30)
print("ended" if ended else "hung", sorted({r.status for r in job.results()}))
"""


@pytest.mark.parametrize("workers", [2, 4])
def test_a_job_gone_one_file_at_a_time_commits_each_file_it_waits_for(tmp_path, workers):
    """Where every worker's first file fails to open for want of descriptors
    at once, none of the job's files open, the job goes one file at a time:
    each file written then holds the only place in flight until it is
    committed, so it is committed at once, and every file arrives whole.
    Left for a batch of more to fill, the last file written waited for it,
    holding that place, while the other workers, each with a file claimed,
    waited for the place (a recursive copy under ulimit -n 8 hung now and
    then)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    for i in range(40):
        (src / f"f{i:02d}").write_bytes(random_bytes(1 + i * 97, seed=i))
    proc = subprocess.run([sys.executable, "-c", ONE_AT_A_TIME, str(src), str(dst), str(workers)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ended ['done']", proc.stdout
    for i in range(40):
        assert (dst / f"f{i:02d}").read_bytes() == random_bytes(1 + i * 97, seed=i)
    assert temporaries(tmp_path) == []


NO_DESCRIPTOR_LEFT = r"""
import errno, os, resource, sys
import gdscp
from gdscp import bulk

src, dst = sys.argv[1], sys.argv[2]
pairs = [(f"{src}/{n}", f"{dst}/{n}") for n in sorted(os.listdir(src))]
gdscp.defaults.set("num_threads", 16)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError as exc:
    assert exc.errno == errno.EMFILE
starved = gdscp.copy_files(pairs).results()
for fd in held:
    os.close(fd)
failed = [r for r in starved if r.status == "failed"]
print(sorted({r.status for r in starved}), len(failed), failed[0].errno, failed[0].error)
print(os.listdir(dst))
print(sorted({r.status for r in gdscp.copy_files(pairs).results()}))
"""


def test_a_job_with_no_descriptor_to_spare_fails_once_naming_the_limit(tmp_path):
    """Where the process's other descriptors leave none for even one file of
    the job (nothing of its own to wait for), the first file fails naming the
    limit and the job stops: the rest are cancelled, nothing is written, and
    the next job, with descriptors again, copies everything."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    for i in range(100):
        (src / f"f{i:03d}").write_bytes(random_bytes(1 + i, seed=i))
    proc = subprocess.run([sys.executable, "-c", NO_DESCRIPTOR_LEFT, str(src), str(dst)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, written, second = proc.stdout.splitlines()
    assert first.startswith(f"['cancelled', 'failed'] 1 {errno.EMFILE} cannot open "), first
    assert first.endswith("Too many open files (errno 24); the 64 descriptors this process may have open "
                          "(ulimit -n) are all in use, none by this job"), first
    assert written == "[]" and second == "['done']"
    for i in range(100):
        assert (dst / f"f{i:03d}").read_bytes() == random_bytes(1 + i, seed=i)
    assert temporaries(tmp_path) == []


DESCRIPTOR_TABLE = r"""
import os, sys, gdscp
def table():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("FDSize:"))
before = table()
missing = sys.argv[1]
results = gdscp.copy_files([(f"{missing}/nothing", f"{missing}/out{i}") for i in range(int(sys.argv[2]))]).results()
print(before, table(), sum(r.status == "failed" for r in results))
"""


def test_a_job_grows_the_descriptor_table_up_front(tmp_path):
    """A job that may keep many temporary files open grows the process's
    descriptor table to fit them in one step as it starts, instead of the
    kernel growing it past each power of two while the job runs (where
    threads share the table, each growth waits for an RCU grace period).
    Here every source is missing, so no temporary file is ever opened: the
    table is as large as it is only because the job made room first."""
    if not os.path.exists("/proc/self/status") or "FDSize:" not in Path("/proc/self/status").read_text():
        pytest.skip("no FDSize in /proc/self/status")
    files = 700
    proc = subprocess.run([sys.executable, "-c", DESCRIPTOR_TABLE, str(tmp_path / "gone"), str(files)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after, failed = map(int, proc.stdout.split())
    assert failed == files
    assert before < files <= after


def test_fail_fast_cancels_the_rest(tmp_path):
    files = files_of(tmp_path, [2000] * 200)
    pairs = [(p, str(tmp_path / f"c{i}")) for i, (p, _) in enumerate(files)]
    pairs.insert(3, (str(tmp_path / "missing"), str(tmp_path / "c-missing")))
    with gdscp.defaults.set("num_threads", 1):  # one worker: the files after the failure are not started
        results = gdscp.copy_files(pairs, fail_fast=True).results()
    statuses = [r.status for r in results]
    assert statuses[3] == "failed" and statuses.count("cancelled") > 0
    for r, (src, dst) in zip(results, pairs):
        if r.status == "done":
            assert Path(dst).read_bytes() == Path(src).read_bytes()
        else:
            assert not os.path.exists(dst)
    assert temporaries(tmp_path) == []


def test_files_written_are_taken_from_their_directories_in_turn(tmp_path):
    """Workers creating and renaming files in one directory wait on its lock:
    a job writing into several takes their files in turn. With one worker, of
    two missing sources (the second file of directory a, the first of b) the
    one in b is started, and fails, first; every other file is copied."""
    src = tmp_path / "src"
    src.mkdir()
    pairs = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        for i in range(3):
            source = src / f"{d}{i}"
            if (d, i) not in (("a", 1), ("b", 0)):
                source.write_bytes(random_bytes(1000 + i, i))
            pairs.append((str(source), str(tmp_path / d / f"f{i}")))
    with gdscp.defaults.set("num_threads", 1):
        job = gdscp.copy_files(pairs)
        job.wait()
    assert [pairs[f.index][1] for f in job.failures()] == [str(tmp_path / "b" / "f0"), str(tmp_path / "a" / "f1")]
    for r, (source, dst) in zip(job.results(), pairs):
        if os.path.exists(source):
            assert r.status == "done" and Path(dst).read_bytes() == Path(source).read_bytes(), dst
        else:
            assert r.status == "failed" and not os.path.exists(dst), dst
    assert temporaries(tmp_path) == []


def test_cancel_with_hundreds_of_files_in_flight(tmp_path, small_chunks):
    tree = make_tree(str(tmp_path / "src"), 600, 1, 200 * KiB, seed=5)
    (tmp_path / "dst").mkdir()
    old = tmp_path / "dst" / "0.bin"
    old.write_bytes(b"precious")
    pairs = [(p, str(tmp_path / "dst" / f"{i}.bin")) for i, p in enumerate(tree.paths)]
    job = gdscp.copy_files(pairs, staging_size=256 * KiB)
    while job.progress().bytes_done == 0 and not job.done():
        time.sleep(0.001)
    job.cancel()
    assert job.wait(60)
    results = job.results()
    for r, (src, dst) in zip(results, pairs):
        assert r.status in ("done", "cancelled"), r
        if r.status == "done":
            assert Path(dst).read_bytes() == Path(src).read_bytes()
        elif dst == str(old):
            assert old.read_bytes() == b"precious"
        else:
            assert not os.path.exists(dst)
    assert temporaries(tmp_path) == []


def test_a_cancelled_job_queued_behind_another_ends_at_once(tmp_path):
    """Jobs share the engine's workers: a job whose workers all still wait
    behind another job's has ended once cancel() returns, its file cancelled
    and nothing of it written, instead of when the job before it finishes;
    that job goes on untouched."""
    data = random_bytes(300_000, 15)
    src = tmp_path / "src"
    src.write_bytes(data)
    with gdscp.defaults.set("num_threads", 2):
        _core.testing.arm_hold(0)  # the first job's two workers wait at their first chunks
        try:
            first = gdscp.copy_files([(src, tmp_path / f"a{i}") for i in range(4)])
            wait_for_held_workers(2)
            second = gdscp.copy_files([(src, tmp_path / "b")])
            second.cancel()
            ended = second.done()
        finally:
            _core.testing.disarm_fault()
        assert first.wait(60)
    assert ended, "a cancelled job waited for the job before it"
    assert [r.status for r in second.results()] == ["cancelled"]
    assert second.progress() == (0, 0, 0, 0, 1, True)
    assert [r.status for r in first.results()] == ["done"] * 4
    assert all((tmp_path / f"a{i}").read_bytes() == data for i in range(4))
    assert sorted(os.listdir(tmp_path)) == ["a0", "a1", "a2", "a3", "src"]


def test_each_file_time_is_its_own(tmp_path):
    """With one worker the files run one after another: if a file's time
    counted its wait in the queue, the times would add up to many times the
    job's."""
    files = files_of(tmp_path, [64 * KiB] * 100)
    with gdscp.defaults.set("num_threads", 1):
        start = time.perf_counter()
        results = gdscp.copy_files([(p, f"{p}.copy") for p, _ in files]).results()
        wall = time.perf_counter() - start
    assert all(r.seconds > 0 for r in results)
    assert sum(r.seconds for r in results) <= wall


# -- temporary files -------------------------------------------------------------------


def test_dead_temporaries_are_cleaned_and_live_ones_kept(tmp_path):
    (src, data), = files_of(tmp_path, [100])
    out = tmp_path / "out"
    out.mkdir()
    dead = out / f".x.bin.abcdefgh{bulk.TEMPORARY_SUFFIX}"
    dead.write_bytes(b"left by a killed run")
    fd, live = bulk.create_temporary(str(out / "y.bin"))
    try:
        assert os.path.basename(live).startswith(".y.bin.") and live.endswith(bulk.TEMPORARY_SUFFIX)
        unrelated = out / "keep.gdscp-tmp.txt"
        unrelated.write_bytes(b"data")
        gdscp.copy_files([(src, out / "x.bin")]).wait()
        assert not dead.exists(), "a run into the directory removes the dead run's temporary file"
        assert os.path.exists(live), "a temporary file held by a live writer is not touched"
        assert unrelated.exists()
        assert bulk.clean_temporaries(out) == 0
    finally:
        os.close(fd)
    assert bulk.clean_temporaries(out) == 1 and not os.path.exists(live)


KILLED = r"""
import os, sys, gdscp
from gdscp import bulk
fd, path = bulk.create_temporary(sys.argv[1])
os.write(fd, b"partial")
print(path, flush=True)
os.kill(os.getpid(), 9)
"""


def test_temporaries_of_a_killed_writer_are_recognised(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "f.bin")], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL
    path = proc.stdout.strip()
    assert os.path.exists(path)
    assert bulk.clean_temporaries(tmp_path) == 1 and not os.path.exists(path)


def unnamed_files_work_in(folder) -> bool:
    """Whether `folder`'s filesystem makes unnamed files (O_TMPFILE) that this
    process can link to a name."""
    try:
        fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY)
    except OSError:
        return False
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:  # (with a dir_fd, os.link follows the /proc link: linkat with AT_SYMLINK_FOLLOW)
        os.link(f"/proc/self/fd/{fd}", "probe", dst_dir_fd=dfd, follow_symlinks=True)
        os.unlink("probe", dir_fd=dfd)
    except OSError:
        return False
    finally:
        os.close(fd)
        os.close(dfd)
    return True


KILLED_JOB = r"""
import sys, gdscp
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
job = gdscp.copy_files([(f"{src}/f{i:04d}", f"{dst}/f{i:04d}") for i in range(n)])
print("started", flush=True)
job.wait()
print("done", flush=True)
"""


def test_a_killed_job_leaves_new_files_whole_or_absent(tmp_path):
    """A new file's copy has no name until it is complete (an unnamed file,
    linked into place): a job killed at any moment leaves each destination
    whole or absent, and no temporary file at all, before any cleanup. Killed
    at varied moments."""
    if not unnamed_files_work_in(tmp_path):
        pytest.skip("this filesystem makes no unnamed files that can be linked (O_TMPFILE)")
    n = 1500  # more than one commit batch (1,024 files)
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(3)
    data = [random_bytes(rng.randint(1, 8_000), i) for i in range(n)]
    for i, d in enumerate(data):
        (src / f"f{i:04d}").write_bytes(d)
    mid_job = 0
    for attempt in range(8):
        dst = tmp_path / f"dst{attempt}"
        dst.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", KILLED_JOB, str(src), str(dst), str(n)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "started"
        time.sleep(attempt * 0.015)
        proc.kill()
        mid_job += "done" not in proc.stdout.read()
        proc.wait(timeout=60)
        names = sorted(os.listdir(dst))
        assert not [x for x in names if not x.startswith("f")], (attempt, names)
        for name in names:
            assert (dst / name).read_bytes() == data[int(name[1:])], (attempt, name)
    assert mid_job, "no kill landed while the job ran: nothing was checked mid-way"


@pytest.mark.parametrize("no_clobber", [False, True])
def test_a_destination_that_appears_while_its_copy_runs(tmp_path, no_clobber):
    """The destination did not exist when its copy began and appears before it
    ends: the copy replaces it whole, or with no_clobber leaves it as it is (the
    file skipped, "appeared"); no temporary file is left either way. (A FIFO
    source holds the copy open until the test has made the destination.)"""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dst = tmp_path / "out"
    data = random_bytes(70_000, 9)
    job = gdscp.copy_files([(fifo, dst)], no_clobber=no_clobber)
    try:
        w = open(fifo, "wb", buffering=0)  # once the job has opened the FIFO
        w.write(data[:1000])  # the copy begins
        deadline = time.monotonic() + 20
        while True:  # the job holds the destination's temporary file open: it has looked for the name
            held = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    held.append(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass
            if any(h.startswith(str(tmp_path) + "/") and h != str(fifo) for h in held):
                break
            assert time.monotonic() < deadline, "the job never opened its destination"
            time.sleep(0.01)
        dst.write_bytes(b"made meanwhile")
        w.write(data[1000:])
        w.close()
    except BaseException:
        job.cancel()
        raise
    assert job.wait(30)
    (r,) = job.results()
    if no_clobber:
        assert (r.status, r.note) == ("skipped", "appeared")
        assert dst.read_bytes() == b"made meanwhile"
    else:
        assert r.status == "done", r
        assert dst.read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["fifo", "out"]


# -- interrupts ------------------------------------------------------------------------

CHILD = r"""
import os, signal, sys, time, gdscp
src, dst = sys.argv[1], sys.argv[2]
names = sorted(os.listdir(src))
job = gdscp.copy_files([(os.path.join(src, n), os.path.join(dst, n)) for n in names], staging_size=1 << 20)
print("started", flush=True)
try:
    job.wait()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_while_waiting_cancels_the_job(tmp_path):
    """Ctrl-C in a program waiting on a job: every file is either complete or
    absent, and no temporary file is left. Run many times, at varied moments."""
    tree = make_tree(str(tmp_path / "src"), 400, 1, 64 * KiB, seed=9, dirs=1)
    src = os.path.join(tree.root, "d000")
    rng = random.Random(4)
    for attempt in range(15):
        dst = tmp_path / f"dst{attempt}"
        dst.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, src, str(dst)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0, 0.05))
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        # 0: the job was over before the signal; -SIGINT: it landed on the way out.
        assert proc.returncode in (0, 130, -signal.SIGINT), out
        for name in os.listdir(dst):
            assert not name.endswith(bulk.TEMPORARY_SUFFIX), f"attempt {attempt}: {name} left behind"
            assert (dst / name).read_bytes() == Path(src, name).read_bytes(), f"attempt {attempt}: {name} differs"


POLLING_CHILD = r"""
import sys, time, gdscp
def main():
    job = gdscp.copy_files([(sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])])
    print("started", flush=True)
    for polls in range(10**9):
        if job.done():
            break
        if sys.argv[5] == "error" and polls == 10:
            raise RuntimeError("the program failed")
        time.sleep(0.01)
main()
"""


@pytest.mark.parametrize("how", ["interrupt", "error"])
def test_a_program_ended_by_an_uncaught_exception_cancels_its_jobs(tmp_path, how):
    """Ctrl-C (or an error) in a loop that polls a job, outside any wait:
    the program ends at once, its jobs cancelled as a wait would have
    cancelled them. It waited for every file, deaf to more Ctrl-C: here, a
    copy from a FIFO whose writer never writes, for ever."""
    fifo, small = tmp_path / "fifo", tmp_path / "small"
    os.mkfifo(fifo)
    small.write_bytes(b"small")
    held = os.open(fifo, os.O_RDWR)  # a writer that never writes: the copy stays in flight
    try:
        argv = [sys.executable, "-c", POLLING_CHILD, fifo, tmp_path / "out", small, tmp_path / "copy", how]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "started"
            if how == "interrupt":
                proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
    finally:
        os.close(held)
    said = "KeyboardInterrupt" if how == "interrupt" else "RuntimeError: the program failed"
    assert proc.returncode in (1, -signal.SIGINT) and said in err, err
    assert not (tmp_path / "out").exists() and temporaries(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) in (["fifo", "small"], ["copy", "fifo", "small"])


def test_a_second_interrupt_while_stopping_still_waits(tmp_path, monkeypatch):
    """Ctrl-C again while a cancelled job stops (here: every wait interrupted):
    the exception leaves only once the files in flight have stopped and their
    temporary files are gone."""
    tree = make_tree(str(tmp_path / "src"), 400, 1, 64 * KiB, seed=11, dirs=1)
    src = os.path.join(tree.root, "d000")
    dst = tmp_path / "dst"
    dst.mkdir()
    job = gdscp.copy_files([(os.path.join(src, n), str(dst / n)) for n in sorted(os.listdir(src))])

    def interrupted(self, timeout=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(bulk.BulkJob, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with job:
            raise KeyboardInterrupt
    assert job.done()
    for name in os.listdir(dst):
        assert not name.endswith(bulk.TEMPORARY_SUFFIX), f"{name} left behind"
        assert (dst / name).read_bytes() == Path(src, name).read_bytes(), name


# -- device memory over the stand-ins ---------------------------------------------------


def test_bulk_jobs_with_device_memory(go):
    go(scenario_device_bulk)


def test_bulk_copy_through_device_staging(go):
    go(scenario_device_copy)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_bulk_jobs_wait_for_work_queued_on_the_default_streams(go, compat):
    go(scenario_device_bulk_default_streams, compat=compat)


def test_a_finished_device_job_lets_its_memory_go(go):
    go(scenario_finished_device_jobs_let_go)


def scenario_finished_device_jobs_let_go(folder):
    """Device buffers read into, and device staging that copies and streams
    went through, are freed once the caller drops them and the job is seen
    finished, though the job itself is still held; every byte as the OS
    reads it."""
    import gc
    import weakref

    import gdscp

    datas = [random_bytes(n, 70 + i) for i, n in enumerate([1, 4097, 3 * MiB + 5])]
    paths, pairs = [], []
    for i, data in enumerate(datas):
        paths.append(os.path.join(folder, f"r{i}.bin"))
        with open(paths[-1], "wb") as f:
            f.write(data)
        pairs.append((paths[-1], os.path.join(folder, f"d{i}.bin")))
    with gdscp.defaults.set({"compat_mode": "on", "task_size": MiB, "bounce_buffer_size": 64 * KiB}):
        bufs = [poisoned(len(d)) for d in datas]
        job = gdscp.read_files(paths, bufs)
        assert job.wait(60)
        for path, buf in zip(paths, bufs):
            with open(path, "rb") as f:
                assert buf.bytes() == f.read(), path
        gone = [weakref.ref(b) for b in bufs]
        del bufs, buf
        gc.collect()
        assert [w() for w in gone] == [None] * len(gone), "device memory read into outlived the job's end"
        assert [r.status for r in job.results()] == ["done"] * len(datas)

        staging = standin.cuda.alloc(MiB)
        gone = weakref.ref(staging)
        job = gdscp.copy_files(pairs, staging=staging)
        del staging
        assert [r.status for r in job.results()] == ["done"] * len(datas)
        gc.collect()
        assert gone() is None, "the copy's staging outlived the job's end"
        for src, dst in pairs:
            with open(src, "rb") as a, open(dst, "rb") as b:
                assert a.read() == b.read(), dst

        staging = standin.cuda.alloc(MiB)
        gone = weakref.ref(staging)
        job = gdscp.bulk.stream_files(paths, staging=staging)
        del staging
        assert job.wait(60)
        gc.collect()
        assert gone() is None, "the stream's staging outlived the job's end"
        assert [(r.status, r.bytes) for r in job.results()] == [("done", len(d)) for d in datas]


def scenario_device_bulk(folder):
    """read_files into device buffers and write_files from them: every byte
    through pinned staging and the stand-in's copies; failures per file."""
    import gdscp

    sizes = [0, 1, 4095, 4096, 4097, 3 * MiB + 5] * 3
    datas = [random_bytes(n, i) for i, n in enumerate(sizes)]
    paths = []
    for i, data in enumerate(datas):
        path = os.path.join(folder, f"r{i}.bin")
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    with gdscp.defaults.set({"compat_mode": "on", "task_size": MiB, "bounce_buffer_size": 64 * KiB}):
        bufs = [poisoned(n + 3) for n in sizes]
        # Device arrays resolve in the C++ pass; one naming a stream of its own
        # (to be waited for) sends the list through gdscp._buffers.
        from gdscp import _core

        assert _core.plain_buffer_items(0, paths, bufs) is not None
        assert _core.plain_buffer_items(0, paths[:1], [bufs[0].with_stream(1)]) is not None
        assert _core.plain_buffer_items(0, paths[:1], [bufs[0].with_stream(standin.cuda.stream())]) is None
        results = gdscp.read_files(paths + [os.path.join(folder, "missing")], bufs + [poisoned(10)]).results()
        assert [r.status for r in results] == ["done"] * len(sizes) + ["failed"]
        for data, buf, r in zip(datas, bufs, results):
            got = buf.bytes()
            assert r.bytes == len(data) and got[: len(data)] == data and got[len(data):] == bytes([POISON]) * 3
            assert r.read_backend == "posix"
        srcs = [standin.cuda.alloc(len(d) or 1).set(d) for d in datas]
        outs = [os.path.join(folder, f"w{i}.bin") for i in range(len(datas))]
        results = gdscp.write_files([s[: len(d)] for s, d in zip(srcs, datas)], outs).results()
        assert {r.status for r in results} == {"done"}
        for out, data in zip(outs, datas):
            with open(out, "rb") as f:
                assert f.read() == data
        assert all(c.flags & standin.PINNED_HOST for c in standin.cuda.calls("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync"))


def scenario_device_bulk_default_streams(folder, compat):
    """read_files and write_files of device arrays whose
    ``__cuda_array_interface__`` names the legacy default stream (1) or the
    per-thread one (2), with a fill still queued there: a read lands after the
    fill and a write takes its result, as CuFile's calls do. The per-thread
    default stream is the caller's own and no stream of the engine waits for
    it, so such an array takes the general path, which synchronises it on the
    caller's thread (in the memory's context, whatever is current there)."""
    import gdscp
    from gdscp import _core

    CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
    sizes = [4096, 2 * MiB + 3]
    datas = [random_bytes(n, 60 + i) for i, n in enumerate(sizes)]
    paths = []
    for i, data in enumerate(datas):
        paths.append(os.path.join(folder, f"in{i}.bin"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    outs = [os.path.join(folder, f"out{i}.bin") for i in range(len(sizes))]
    with gdscp.defaults.set({"compat_mode": compat, "num_threads": 4, "task_size": MiB, "gds_threshold": 0}):
        for stream in (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD):
            for current in (0, -1):
                case = f"stream={stream} current={current} compat={compat}"
                standin.cuda.make_current(0)
                bufs = [poisoned(n) for n in sizes]
                for buf in bufs:
                    standin.cuda.fill_async(stream, buf, 0x11)
                standin.cuda.make_current(current)
                results = gdscp.read_files(paths, [b.with_stream(stream) for b in bufs]).results()
                assert [r.status for r in results] == ["done"] * len(sizes), (case, [r.error for r in results])
                assert standin.cuda.pending() == 0, case  # the fills ran before the reads, not after them
                for data, buf in zip(datas, bufs):
                    assert buf.bytes() == data, case

                standin.cuda.make_current(0)
                srcs = [standin.cuda.alloc(n).set(d) for n, d in zip(sizes, datas)]
                for src in srcs:
                    standin.cuda.fill_async(stream, src, 0x5A)
                standin.cuda.make_current(current)
                results = gdscp.write_files([s.with_stream(stream) for s in srcs], outs).results()
                assert [r.status for r in results] == ["done"] * len(sizes), (case, [r.error for r in results])
                assert standin.cuda.pending() == 0, case
                for n, out in zip(sizes, outs):
                    with open(out, "rb") as f:
                        assert f.read() == b"\x5a" * n, case
    # The legacy default stream's arrays stay on the C++ pass.
    assert _core.plain_buffer_items(0, paths[:1], [poisoned(10).with_stream(CU_STREAM_LEGACY)]) is not None
    assert _core.plain_buffer_items(0, paths[:1], [poisoned(10).with_stream(CU_STREAM_PER_THREAD)]) is None


def scenario_device_copy(folder):
    """copy_files through device staging (storage -> GPU -> storage): bytes
    exact, every byte copied to the GPU and back, the staging bounded."""
    import gdscp

    sizes = [0, 1, 4097, 200 * KiB, 3 * MiB + 5] * 4
    pairs = []
    for i, n in enumerate(sizes):
        src = os.path.join(folder, f"s{i}.bin")
        with open(src, "wb") as f:
            f.write(random_bytes(n, 100 + i))
        pairs.append((src, os.path.join(folder, f"d{i}.bin")))
    # Staging of any size: each worker's share stays inside it, however small.
    for size in (MiB, 40 * KiB, 5000):
        staging = standin.cuda.alloc(size)
        for _, dst in pairs:
            if os.path.exists(dst):
                os.unlink(dst)
        with gdscp.defaults.set({"compat_mode": "on", "bounce_buffer_size": 64 * KiB, "num_threads": 4}):
            standin.cuda.reset()
            results = gdscp.copy_files(pairs, staging=staging, verify=True).results()
        assert {r.status for r in results} == {"done"}, [r.error for r in results if r.error]
        for src, dst in pairs:
            with open(src, "rb") as a, open(dst, "rb") as b:
                assert a.read() == b.read()
        up = standin.cuda.calls("cuMemcpyHtoDAsync")
        down = standin.cuda.calls("cuMemcpyDtoHAsync")
        assert sum(c.size for c in up) == sum(c.size for c in down) == sum(sizes)
        for c in up + down:
            assert staging.ptr <= c.ptr and c.ptr + c.size <= staging.ptr + size, "a copy outside the staging memory"
    assert not [n for n in os.listdir(folder) if n.endswith(".gdscp-tmp")]


_MiB = 1 << 20


# -- the engine's parts: ranges of a file written into an existing temporary file -----------


@pytest.mark.parametrize("cuts", [[0, 1], [0, 4095, 4096, 4097, 5 * _MiB + 3], [0, 3 * _MiB, 3 * _MiB, 7 * _MiB]])
def test_parts_fill_an_existing_temporary_file(tmp_path, cuts):
    size = cuts[-1]
    data = os.urandom(size)
    src = tmp_path / "src"
    src.write_bytes(data)
    fd, tmp = bulk.create_temporary(str(tmp_path / "dst"))
    try:
        os.ftruncate(fd, size)
        ranges = [(a, b - a) for a, b in zip(cuts, cuts[1:])]
        job = bulk.copy_files([(src, tmp)] * len(ranges), ranges=ranges, verify=True, clean=False)
        results = job.results()
        assert [r.status for r in results] == ["done"] * len(ranges)
        assert [r.bytes for r in results] == [n for _, n in ranges]
        assert Path(tmp).read_bytes() == data
        assert not (tmp_path / "dst").exists()  # a part never renames
    finally:
        os.close(fd)


def test_a_part_past_the_end_of_its_source_fails(tmp_path):
    (tmp_path / "src").write_bytes(b"x" * 100)
    fd, tmp = bulk.create_temporary(str(tmp_path / "dst"))
    try:
        job = bulk.copy_files([(tmp_path / "src", tmp)], ranges=[(90, 11)], clean=False)
        (r,) = job.results()
        assert r.status == "failed" and "[90, 101)" in r.error
        assert os.path.getsize(tmp) == 0
    finally:
        os.close(fd)


def test_a_part_needs_an_existing_file(tmp_path):
    (tmp_path / "src").write_bytes(b"x" * 100)
    job = bulk.copy_files([(tmp_path / "src", tmp_path / "missing")], ranges=[(0, 100)])
    (r,) = job.results()
    assert r.status == "failed" and r.errno == 2
    assert not (tmp_path / "missing").exists()


def test_names_that_are_not_utf8(tmp_path):
    """Names whose bytes are not UTF-8, as str (surrogates) or bytes, reach the
    files they name in every call, and come back unchanged in results and errors."""
    root = os.fsencode(tmp_path)
    names = [os.path.join(root, b"in-\xff-%d" % i) for i in range(3)]
    payloads = [random_bytes(n, seed=i + 1) for i, n in enumerate((0, 4097, 70_001))]
    for name, data in zip(names, payloads):
        with open(name, "wb") as f:
            f.write(data)
    as_str = [os.fsdecode(n) for n in names]

    for given in (as_str, names):
        bufs = [np.empty(len(d), np.uint8) for d in payloads]
        results = gdscp.read_files(given, bufs).results()
        assert [r.status for r in results] == ["done"] * 3
        assert [b.tobytes() for b in bufs] == payloads
    with gdscp.CuFile(names[2]) as f:
        buf = np.empty(len(payloads[2]), np.uint8)
        assert f.read(buf) == len(payloads[2]) and buf.tobytes() == payloads[2]
    mapped = gdscp.Mmap(as_str[2])
    buf = np.empty(100, np.uint8)
    assert mapped.read(buf, 100, 5) == 100 and buf.tobytes() == payloads[2][5:105]
    mapped.close()
    assert gdscp.get_page_cache_info(as_str[2])[1] == (len(payloads[2]) + 4095) // 4096

    outs = [os.path.join(root, b"out-\xfe-%d" % i) for i in range(3)]
    results = gdscp.write_files([np.frombuffer(d, np.uint8) for d in payloads], [os.fsdecode(n) for n in outs]).results()
    assert [r.destination for r in results] == [os.fsdecode(n) for n in outs]
    copies = [os.path.join(root, b"copy-\xfd-%d" % i) for i in range(3)]
    assert [r.status for r in gdscp.copy_files(list(zip(as_str, copies))).results()] == ["done"] * 3
    for written in (outs, copies):
        for name, data in zip(written, payloads):
            with open(name, "rb") as f:
                assert f.read() == data
    assert not [n for n in os.listdir(root) if n.endswith(b".gdscp-tmp")]

    missing = os.fsdecode(os.path.join(root, b"missing-\xfc"))
    with pytest.raises(FileNotFoundError) as caught:
        gdscp.CuFile(missing)
    assert caught.value.filename == missing and missing in str(caught.value)
    (failed,) = gdscp.read_files([missing], [np.empty(1, np.uint8)]).results()
    assert failed.status == "failed" and failed.source == missing and missing in failed.error


def test_a_destination_given_twice_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "src"
    src.write_bytes(b"source")
    ones, zeros = np.ones(5, np.uint8), np.zeros(7, np.uint8)
    twice_over = (["d", "d"], ["d", "./d"], ["d", str(tmp_path / "d")], ["sub/d", "sub//d"],
                  [str(tmp_path / "sub" / "d"), "sub/./d"], [f"{tmp_path}//d", "d"])
    for twice in twice_over:
        said = (r"destination 'd' is given twice \(items 0 and 1\)" if twice[0] == twice[1] else
                rf"destinations '{re.escape(twice[0])}' \(item 0\) and '{re.escape(twice[1])}' \(item 1\) name the same file")
        with pytest.raises(ValueError, match=said):
            gdscp.write_files([ones, zeros], twice)
        with pytest.raises(ValueError, match=said):
            gdscp.copy_files([(src, twice[0]), (src, twice[1])])
    assert sorted(os.listdir(tmp_path)) == ["src"]
    with pytest.raises(ValueError, match=r"'e' is given twice \(items 1 and 3\)"):
        gdscp.copy_files([(src, "x"), (src, "e"), (src, "y"), (src, "e")])
    # "a/../d" need not be "d" (a may be a link): not refused.
    (tmp_path / "a").mkdir()
    assert [r.status for r in gdscp.write_files([ones, zeros], ["d", "a/../d2"]).results()] == ["done", "done"]
    # Ranges of one file share their destination by design.
    tmp = tmp_path / "whole"
    tmp.write_bytes(bytes(6))
    job = gdscp.copy_files([(src, tmp), (src, tmp)], ranges=[(0, 3), (3, 3)], clean=False)
    assert [r.status for r in job.results()] == ["done", "done"] and tmp.read_bytes() == b"source"


def test_a_buffer_mapping_its_own_file_elsewhere_is_not_written_in_place(tmp_path):
    """A memmap of the destination, sliced so that its bytes come from other
    offsets of the file than they are written to, was written in place by
    chunks at once: some chunks read bytes another had already overwritten,
    and the file held wrong bytes though its item was "done". It is refused
    naming the file, the file left as it was; written back at its own
    offsets, or with atomic=True (from the old file into a new one), it is
    written as asked."""
    n = 2 * _MiB
    data = random_bytes(n, seed=7)
    path = tmp_path / "m"
    path.write_bytes(data)
    m = np.memmap(path, np.uint8, "r+")
    with open(path, "r+b") as f:
        plain = np.frombuffer(mmap.mmap(f.fileno(), n), np.uint8)  # an exact ndarray: the engine's own pass
    later = np.memmap(path, np.uint8, "r+", offset=4096)[:_MiB]
    for buf, where in ((m[4096:], "[4096, 2097152)"), (later, "[4096, 1052672)"), (plain[1:], "[1, 2097152)")):
        with pytest.raises(ValueError, match=re.escape(f"buffers[1] maps bytes {where} of '{path}'")):
            gdscp.write_files([b"x", buf], [tmp_path / "other", path], atomic=False)
        assert path.read_bytes() == data and not (tmp_path / "other").exists()
    (r,) = gdscp.write_files([m], [path], atomic=False).results()
    assert r.status == "done" and path.read_bytes() == data
    (r,) = gdscp.write_files([m[:_MiB]], [tmp_path / "other"], atomic=False).results()  # another file
    assert r.status == "done" and (tmp_path / "other").read_bytes() == data[:_MiB]
    (r,) = gdscp.write_files([m[4096:]], [path], atomic=True).results()
    assert r.status == "done" and path.read_bytes() == data[4096:]
    # Bytes read from a part of the file that the write does not reach: in place.
    apart = np.memmap(path, np.uint8, "r+", offset=_MiB)
    (r,) = gdscp.write_files([apart], [path], atomic=False).results()
    assert r.status == "done" and path.read_bytes() == data[4096 + _MiB:]
    del m, plain, later, apart


def test_buffers_of_every_kind_resolve_alike(tmp_path):
    """Common buffers (exact numpy arrays, bytearray, memoryview, bytes) are
    resolved in one C++ pass; anything else, or one buffer that would be
    refused, sends the whole list through gdscp._buffers, whose errors name the
    problem. Both give the same items and the same bytes."""
    sizes = [0, 1, 4097, 70_001]
    paths, payloads = [], []
    for i, n in enumerate(sizes):
        p = tmp_path / f"f{i}"
        payloads.append(random_bytes(n, seed=i + 5))
        p.write_bytes(payloads[-1])
        paths.append(str(p))

    class Sub(np.ndarray):
        pass

    def kinds():
        return [np.zeros(sizes[0], np.uint8), bytearray(sizes[1]), memoryview(bytearray(sizes[2])),
                np.zeros(sizes[3], np.uint8)]

    fast = kinds()
    assert _core.plain_buffer_items(0, paths, fast) is not None
    mixed = kinds()
    mixed[3] = np.zeros(sizes[3], np.uint8).view(Sub)  # a subclass: the general path
    assert _core.plain_buffer_items(0, paths, mixed) is None
    for bufs in (fast, mixed):
        job = gdscp.read_files(paths, bufs)
        assert [r.bytes for r in job.results()] == sizes
        assert [bytes(b) for b in bufs] == payloads
    fast_items, _ = bulk._buffer_items(bulk._READ, paths, kinds())
    general = [b for b in kinds()]
    slow_items = []
    for p, b in zip(paths, general):
        r = gdscp._buffers.resolve(b, writable=True)
        slow_items.append((0, p, "", r.ptr, r.device, r.nbytes, 0, False, -1, True, False, 0, 0, False))
    assert [i[:3] + i[4:] for i in fast_items] == [i[:3] + i[4:] for i in slow_items]

    # A bytearray cannot be resized while a job holds it.
    grow = bytearray(sizes[3])
    job = gdscp.read_files([paths[3]], [grow])
    with pytest.raises(BufferError):
        grow.extend(b"x")
    job.wait()
    grow.extend(b"x")  # a finished job holds it no more

    # Buffers the engine must refuse: the general path's words.
    readonly = np.zeros(10, np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gdscp.read_files([paths[1]], [readonly])
    with pytest.raises(ValueError, match="read-only"):
        gdscp.read_files([paths[1]], [b"0123456789"])
    with pytest.raises(ValueError, match="contiguous"):
        gdscp.read_files([paths[1]], [np.zeros((4, 4), np.uint8)[:, ::2]])
    with pytest.raises(TypeError, match="expected a buffer"):
        gdscp.read_files([paths[1]], [object()])
    # bytes may be written from.
    out = tmp_path / "out"
    assert gdscp.write_files([b"written"], [out]).results()[0].status == "done"
    assert out.read_bytes() == b"written"


def test_new_arrays_need_a_size_the_kernel_tells(tmp_path):
    """read_files without buffers sizes each array by the file: a FIFO, a device
    or a procfs file (0 bytes by stat, with content) would silently read
    nothing, so they are refused before anything is read; an empty file reads
    as an empty array."""
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, why in ((fifo, "not a regular file"), ("/dev/null", "not a regular file"),
                      ("/proc/version", "report 0 bytes")):
        if not os.path.exists(path) or (why == "report 0 bytes" and os.stat(path).st_size != 0):
            continue
        with pytest.raises(ValueError, match=f"cannot size a buffer for '{path}': .*{why}"):
            gdscp.read_files([empty, path])
    job = gdscp.read_files([empty])
    assert [(r.status, r.bytes) for r in job.results()] == [("done", 0)] and len(job.arrays[0]) == 0
    # With a buffer of its own, a procfs file reads its content.
    if os.path.exists("/proc/version"):
        buf = np.zeros(4096, np.uint8)
        (r,) = gdscp.read_files(["/proc/version"], [buf]).results()
        assert r.status == "done" and bytes(buf[: r.bytes]) == Path("/proc/version").read_bytes()


# -- jobs dropped while they run -------------------------------------------------------

DROPPED = r"""
import gc, os, sys
import numpy as np
import gdscp
folder, case = sys.argv[1], sys.argv[2]
names = [os.path.join(folder, f"w{i:03d}.bin") for i in range(24)]
if case == "write":
    # Each file's bytes in a buffer nobody else holds, the job not kept either;
    # then new arrays where the freed ones were.
    gdscp.write_files([np.full(1 << 20, i % 251, np.uint8) for i in range(len(names))], names, fsync=False)
    gc.collect()
    junk = [np.full(1 << 20, 255, np.uint8) for _ in range(len(names))]
elif case == "read":
    job = gdscp.read_files(names)
    del job
    gc.collect()
    junk = [np.full(1 << 20, 255, np.uint8) for _ in range(len(names))]
else:  # exit: the interpreter ends with the job running
    job = gdscp.write_files([np.full(1 << 20, i % 251, np.uint8) for i in range(len(names))], names)
print("ok", flush=True)
"""


@pytest.mark.parametrize("case", ["write", "read", "exit"])
def test_a_job_dropped_while_it_runs_keeps_its_buffers(tmp_path, case):
    """The engine's job holds the buffers it moves until its workers are done:
    a job (and its arrays) dropped while it runs, or left running at
    interpreter exit, neither crashes nor writes freed memory; every file
    written holds its own bytes and no temporary file is left."""
    if case == "read":
        for i in range(24):
            (tmp_path / f"w{i:03d}.bin").write_bytes(bytes([i % 251]) * MiB)
    for attempt in range(5):
        proc = subprocess.run([sys.executable, "-c", DROPPED, str(tmp_path), case], capture_output=True, text=True,
                              timeout=120)
        assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), (attempt, proc.returncode, proc.stderr[-2000:])
        names = sorted(os.listdir(tmp_path))
        assert names == [f"w{i:03d}.bin" for i in range(24)], (attempt, names)
        for i, name in enumerate(names):
            assert (tmp_path / name).read_bytes() == bytes([i % 251]) * MiB, (attempt, name)


# -- what a finished job lets go ----------------------------------------------------------

class Owned(np.ndarray):
    """An array of a subclass: gdscp._buffers' general path, not the C++ one."""


def finish(job, seen_by: str) -> None:
    """Waits until ``job`` has finished, as ``seen_by`` (one of its calls) sees it."""
    deadline = time.monotonic() + 60
    if seen_by == "wait":
        assert job.wait(60)
    elif seen_by == "results":
        job.results()
    else:
        while not (job.done() if seen_by == "done" else job.progress().finished):
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.01)


@pytest.mark.parametrize("seen_by", ["wait", "done", "progress", "results"])
def test_a_finished_job_lets_its_buffers_go(tmp_path, small_chunks, seen_by):
    """Once a job is seen finished it holds none of the buffers it was given
    (those resolved in C++ and those through gdscp._buffers alike): a
    bytearray can be resized, an array its owner drops is freed; the bytes
    written and read are those the OS reads."""
    payloads = [random_bytes(n, 40 + i) for i, n in enumerate([PAGE + 1, 3 * MiB + 17, 5000])]
    ins = [tmp_path / f"in{i}" for i in range(len(payloads))]
    for path, data in zip(ins, payloads):
        path.write_bytes(data)
    outs = [tmp_path / f"out{i}" for i in range(len(payloads))]

    for general in (False, True):
        # Writes from a bytearray and arrays nobody else holds.
        grow = bytearray(payloads[0])
        arrays = [np.frombuffer(d, np.uint8).copy() for d in payloads[1:]]
        if general:
            arrays = [a.view(Owned) for a in arrays]
        gone = [weakref.ref(a) for a in arrays] + [weakref.ref(a.base) for a in arrays if a.base is not None]
        job = gdscp.write_files([grow, *arrays], outs, fsync=False)
        finish(job, seen_by)
        grow.extend(b"more")
        del arrays
        gc.collect()
        assert [w() for w in gone] == [None] * len(gone), (general, "a written array outlived the job's end")
        assert [r.status for r in job.results()] == ["done"] * 3
        for out, data in zip(outs, payloads):
            with open(out, "rb") as f:
                assert f.read() == data, (general, out)
        assert bytes(grow) == payloads[0] + b"more"

        # Reads into a bytearray and arrays the caller then drops.
        grow = bytearray(len(payloads[0]))
        arrays = [np.zeros(len(d), np.uint8) for d in payloads[1:]]
        if general:
            arrays = [a.view(Owned) for a in arrays]
        job = gdscp.read_files(ins, [grow, *arrays])
        finish(job, seen_by)
        grow.extend(b"more")
        for path, buf in zip(ins, [grow[: len(payloads[0])], *arrays]):
            with open(path, "rb") as f:
                assert bytes(buf) == f.read(), (general, path)
        gone = [weakref.ref(a) for a in arrays] + [weakref.ref(a.base) for a in arrays if a.base is not None]
        del arrays, buf
        gc.collect()
        assert [w() for w in gone] == [None] * len(gone), (general, "a read array outlived the job's end")
        assert [r.status for r in job.results()] == ["done"] * 3


class Landed(np.ndarray):
    """An array that, as it is freed, says what it held."""

    held: list = []

    def __del__(self):
        Landed.held.append(bytes(self))


@pytest.mark.parametrize("general", [False, True])
def test_a_buffer_its_caller_drops_lives_until_the_job_ends(tmp_path, general):
    """A buffer whose caller drops it while the job still reads into it (a
    FIFO whose writer has not written yet) lives until the job ends, takes
    every byte, and is freed once the job is seen finished, though the job
    itself is still held."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = random_bytes(300_000, 17)
    Landed.held.clear()
    buf = np.zeros(len(data), np.uint8)
    if general:
        buf = buf.view(Landed)
    alive = weakref.ref(buf)
    job = gdscp.read_files([fifo], [buf])
    del buf
    gc.collect()
    time.sleep(0.2)
    assert alive() is not None and not job.done()
    fd = os.open(fifo, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    assert job.wait(60)
    gc.collect()
    assert alive() is None, "the buffer outlived the job's end"
    (result,) = job.results()
    assert (result.status, result.bytes) == ("done", len(data))
    if general:
        assert Landed.held == [data]


# -- sources that wait: FIFOs -----------------------------------------------------------

def assert_cancel_ends(job) -> None:
    """`job`, of one file held up, is still running a moment later; cancel()
    ends it soon after, the file as cancelled."""
    time.sleep(0.3)
    assert not job.done()
    job.cancel()
    assert job.wait(10), "the job did not end after cancel()"
    (result,) = job.results()
    assert result.status == "cancelled", result


@pytest.mark.parametrize("kind", ["read", "copy"])
@pytest.mark.parametrize("writer", ["none", "silent"])
def test_cancel_ends_a_wait_on_a_fifo(tmp_path, kind, writer):
    """A FIFO with no writer, or with one that writes nothing, holds no worker
    where a cancel cannot reach it: the job ends soon after cancel() (the
    worker looks every 0.1 s), the file as cancelled, and a copy leaves no
    destination or temporary."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR) if writer == "silent" else None  # a writer end that never writes
    try:
        if kind == "read":
            job = gdscp.read_files([fifo], [bytearray(10)])
        else:
            job = gdscp.copy_files([(fifo, tmp_path / "out")])
        assert_cancel_ends(job)
    finally:
        if held is not None:
            os.close(held)
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_a_few_files_copied_take_their_names_without_waiting_for_the_others(tmp_path):
    """A job of a few files fsyncs each on its own: each takes its name once
    written, while another file of the job (a FIFO whose writer writes
    nothing) is still in flight, and a cancel then leaves them in place."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sources = [tmp_path / f"s{i}" for i in range(3)]
    for i, source in enumerate(sources):
        source.write_bytes(random_bytes(1000 * i + 1, i))
    pairs = [(sources[0], tmp_path / "d0"), (fifo, tmp_path / "dfifo"), *((s, tmp_path / f"d{i}") for i, s in
                                                                         enumerate(sources) if i)]
    held = os.open(fifo, os.O_RDWR)  # a writer end that never writes
    try:
        job = gdscp.copy_files(pairs)
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"d{i}").exists() for i in range(3)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not job.done()
        job.cancel()
        assert job.wait(10), "the job did not end after cancel()"
    finally:
        os.close(held)
    assert [r.status for r in job.results()] == ["done", "cancelled", "done", "done"]
    for i, source in enumerate(sources):
        assert (tmp_path / f"d{i}").read_bytes() == source.read_bytes()
    assert not (tmp_path / "dfifo").exists() and temporaries(tmp_path) == []


def test_stopping_every_job_finds_one_its_caller_never_held(tmp_path, monkeypatch):
    """An interrupt between the engine starting a job and ``BulkJob`` holding
    it leaves a job that no wait will cancel: ``stop_running_jobs`` (what the
    command line runs on its way out) still finds it, cancels it and waits,
    and its destination and temporary file are gone."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer that never writes: the copy stays in flight
    started = []
    engine_job = bulk._core.BulkJob

    def start_then_interrupt(*args, **kwargs):
        started.append(engine_job(*args, **kwargs))  # kept alive, as a traceback keeps it
        raise KeyboardInterrupt

    monkeypatch.setattr(bulk._core, "BulkJob", start_then_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            gdscp.copy_files([(fifo, tmp_path / "out")])
        (job,) = started
        assert not job.done()
        bulk.stop_running_jobs()
        assert job.done()
    finally:
        os.close(held)
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_a_fifo_is_read_once_its_writer_comes(tmp_path):
    """Opened without blocking, a FIFO still waits for its writer as a
    blocking open would: the bytes written later all arrive, in order."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = random_bytes(3 * MiB + 17, 5)

    def write_later() -> None:
        time.sleep(0.3)
        with open(fifo, "wb") as f:
            for i in range(0, len(data), 100_000):
                f.write(data[i : i + 100_000])
                f.flush()
                time.sleep(0.002)

    import threading

    for kind in ("read", "copy"):
        writer = threading.Thread(target=write_later)
        writer.start()
        try:
            if kind == "read":
                buf = bytearray(len(data) + 10)
                (result,) = gdscp.read_files([fifo], [buf]).results()
                got = bytes(buf[: result.bytes])
            else:
                (result,) = gdscp.copy_files([(fifo, tmp_path / "out")]).results()
                got = (tmp_path / "out").read_bytes()
        finally:
            writer.join()
        assert (result.status, result.bytes) == ("done", len(data)), result
        assert got == data


def test_cancel_ends_a_write_into_a_fifo_nobody_reads(tmp_path):
    """A FIFO destination whose reader never reads holds no worker where a
    cancel cannot reach it: the job ends soon after cancel(), the file as
    cancelled."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    src = tmp_path / "src"
    src.write_bytes(random_bytes(4 * MiB, 6))
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # there, but never reading
    try:
        assert_cancel_ends(gdscp.copy_files([(src, fifo)]))
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(os.listdir(tmp_path)) == ["fifo", "src"]


def test_a_slow_fifo_reader_gets_every_byte_in_order(tmp_path):
    """Written without blocking, a FIFO destination still takes every byte,
    in order, from a reader that drains it in small, slow reads."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = random_bytes(2 * MiB + 33, 8)
    src = tmp_path / "src"
    src.write_bytes(data)
    got = bytearray()

    def read_slowly() -> None:
        with open(fifo, "rb", buffering=0) as f:
            while chunk := f.read(50_000):
                got.extend(chunk)
                time.sleep(0.001)

    import threading

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        (result,) = gdscp.copy_files([(src, fifo)]).results()
    finally:
        reader.join(30)
    assert (result.status, result.bytes) == ("done", len(data)), result
    assert bytes(got) == data


def _each_moves_all(jobs, size: int, stuck: str) -> None:
    """Waits for ``jobs`` (a minute each; all are cancelled afterwards, ended
    or not) and checks that each ended with its one file done, ``size`` bytes
    moved; ``stuck`` is the failure's message where one did not end."""
    try:
        ended = [job.wait(60) for job in jobs]
    finally:
        for job in jobs:
            job.cancel()
            job.wait()
    assert ended == [True] * len(jobs), stuck
    for job in jobs:
        (result,) = job.results()
        assert (result.status, result.bytes) == ("done", size), result


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("first", ["reader", "writer"])
def test_a_job_waiting_on_a_fifo_lets_a_later_job_open_its_other_end(tmp_path, threads, first):
    """Jobs share the engine's workers, a later job's waiting for an earlier
    one's: a job that waits on a FIFO (for its writer, its reader, or room)
    lets a later job take workers meanwhile, so that a job copying out of a
    FIFO and one copying into it, started one after the other in either
    order, both end, every byte in order."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = random_bytes(MiB + 3, 13)  # more than a FIFO holds: each end waits for the other in turn
    src, out = tmp_path / "src", tmp_path / "out"
    src.write_bytes(data)
    start = {"reader": lambda: gdscp.copy_files([(fifo, out)]), "writer": lambda: gdscp.copy_files([(src, fifo)])}
    with gdscp.defaults.set("num_threads", threads):
        jobs = [start[first]()]
        jobs.append(start["writer" if first == "reader" else "reader"]())
        _each_moves_all(jobs, len(data), "the jobs at the two ends of one FIFO waited for each other")
    assert out.read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["fifo", "out", "src"]


@pytest.mark.parametrize("threads", [2, 4])
def test_jobs_writing_into_fifos_let_their_readers_jobs_started_after_run(tmp_path, threads):
    """A job's workers wait for the one opening its file (which may turn into
    chunks for them): where that open waits for a FIFO's reader, the workers
    waiting with it must not hold the engine's workers from the reader's job
    either. Two jobs each copying into a FIFO, then two copying out of them:
    all four end, every byte in order (the readers' jobs stayed queued, and
    the four waited for each other for good)."""
    data = random_bytes(MiB + 3, 17)  # more than a FIFO holds: each end waits for the other in turn
    src = tmp_path / "src"
    src.write_bytes(data)
    fifos = [tmp_path / f"fifo{i}" for i in range(2)]
    for fifo in fifos:
        os.mkfifo(fifo)
    with gdscp.defaults.set("num_threads", threads):
        jobs = [gdscp.copy_files([(src, fifo)]) for fifo in fifos]
        jobs += [gdscp.copy_files([(fifo, tmp_path / f"out{i}")]) for i, fifo in enumerate(fifos)]
        _each_moves_all(jobs, len(data), "jobs at the two ends of FIFOs waited for each other")
    for i in range(2):
        assert (tmp_path / f"out{i}").read_bytes() == data
    assert sorted(os.listdir(tmp_path)) == ["fifo0", "fifo1", "out0", "out1", "src"]


@pytest.mark.parametrize("kind", ["read", "copy"])
def test_verify_of_a_fifo_source_is_refused(tmp_path, kind):
    """A FIFO cannot be read a second time to check what was read from it:
    verify is refused for it up front, naming the file, and a copy leaves
    nothing behind (rather than waiting forever to read it again)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer end, so that nothing waits for one
    try:
        os.write(writer, b"some bytes")
        if kind == "read":
            job = gdscp.read_files([fifo], [bytearray(100)], verify=True)
        else:
            job = gdscp.copy_files([(fifo, tmp_path / "out")], verify=True)
        assert job.wait(10), "the job did not end"
        (result,) = job.results()
    finally:
        os.close(writer)
    assert result.status == "failed" and "cannot verify" in result.error and str(fifo) in result.error, result
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_a_dangling_symbolic_link_is_not_written_through(tmp_path):
    """As GNU cp: a destination that is a link to an existing file gets the
    bytes in that file; a link to nothing fails, and stays as it was."""
    src = tmp_path / "src"
    src.write_bytes(b"new bytes")
    (tmp_path / "target").write_bytes(b"old")
    os.symlink("target", tmp_path / "live")
    os.symlink("missing", tmp_path / "dangling")
    live, dangling = gdscp.copy_files([(src, tmp_path / "live"), (src, tmp_path / "dangling")]).results()
    assert live.status == "done"
    assert os.path.islink(tmp_path / "live") and (tmp_path / "target").read_bytes() == b"new bytes"
    assert dangling.status == "failed" and "dangling symbolic link" in dangling.error
    assert os.readlink(tmp_path / "dangling") == "missing" and not (tmp_path / "missing").exists()
    (result,) = gdscp.write_files([b"x"], [tmp_path / "dangling"]).results()
    assert result.status == "failed" and not (tmp_path / "missing").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(bulk.TEMPORARY_SUFFIX)]


_READ_ONLY = r"""
import os, sys, gdscp
from gdscp import bulk
d = sys.argv[1]
src, dst, new = (os.path.join(d, n) for n in ("src", "dst", "new"))
(r,) = gdscp.copy_files([(src, dst)]).results()
assert r.status == "failed" and r.errno == 13 and f"cannot overwrite '{dst}'" in r.error, r
(r,) = gdscp.write_files([b"x" * 5000], [dst]).results()
assert r.status == "failed" and r.errno == 13, r
try:
    bulk.create_temporary(dst)
except PermissionError as exc:
    assert "cannot overwrite" in str(exc)
else:
    raise AssertionError("create_temporary made a temporary file to replace a read-only file")
(r,) = gdscp.copy_files([(src, new)]).results()  # a new name is no one's file: copied
assert r.status == "done", r
"""


def _without_write_override(argv: list[str]) -> list[str]:
    """argv run as a process that file permissions bind: as it is for a user,
    without CAP_DAC_OVERRIDE for root (which would write any file)."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root, and no setpriv to drop CAP_DAC_OVERRIDE with")
    return [setpriv, "--inh-caps=-dac_override", "--bounding-set=-dac_override", *argv]


def test_a_destination_without_write_permission_is_not_replaced(tmp_path):
    """cp refuses to copy over a file it may not write (to all but root); so
    do copy_files, write_files, create_temporary and the command line, though
    a rename in a writable directory would replace it. The file stays as it
    was, and no temporary file is left."""
    (tmp_path / "src").write_bytes(b"new bytes")
    (tmp_path / "dst").write_bytes(b"old")
    os.chmod(tmp_path / "dst", 0o444)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(_without_write_override([sys.executable, "-c", _READ_ONLY, str(tmp_path)]),
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    for command in (["copy", "--host", str(tmp_path / "src"), str(tmp_path / "dst")],
                    ["write", "--host", str(tmp_path / "dst"), "--size", "1K"]):
        done = subprocess.run(_without_write_override([sys.executable, "-m", "gdscp", *command]),
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 1 and "Permission denied" in done.stderr, (command, done.stderr)
    assert (tmp_path / "dst").read_bytes() == b"old" and (tmp_path / "new").read_bytes() == b"new bytes"
    assert temporaries(tmp_path) == []


def test_bad_numbers_are_refused_before_anything_moves(tmp_path):
    src = tmp_path / "src"
    src.write_bytes(b"0123456789")
    pairs = [(src, tmp_path / "dst")]
    # As CuFile's offsets: a negative or too large number is an OverflowError, another type a TypeError.
    huge = 10**5000  # more digits than Python writes as text: named by their count
    for ranges, error, said in (([(0, -5)], OverflowError, "range (0, -5) of"),
                                ([(-3, 10)], OverflowError, "range (-3, 10) of"),
                                ([(2**63, 1)], OverflowError, "ends past 2**63-1"),
                                ([(huge, 1)], OverflowError, "range ((a number of 5001 digits), 1) of"),
                                ([(0, -huge)], OverflowError, "range (0, (a negative number of 5001 digits)) of"),
                                ([(1.5, 2)], TypeError, "range offset must be an integer")):
        with pytest.raises(error) as info:
            bulk.stream_files([src], ranges=ranges)
        assert type(info.value) is error and said in str(info.value)
        with pytest.raises(error) as info:
            gdscp.copy_files(pairs, ranges=ranges)
        assert type(info.value) is error and said in str(info.value)
    for sizes, error in (([-5], OverflowError), ([2**63], OverflowError), ([huge], OverflowError), (["9"], TypeError)):
        with pytest.raises(error, match=r"sizes\[0\]"):
            gdscp.copy_files(pairs, sizes=sizes)
    # staging_size is the engine's size_t: never the binding's own TypeError.
    for bad, error in ((0, ValueError), (-1, OverflowError), (2**64, OverflowError), (huge, OverflowError),
                       (1.5, TypeError)):
        for start in (lambda: gdscp.copy_files(pairs, staging_size=bad),
                      lambda: bulk.stream_files([src], staging_size=bad)):
            with pytest.raises(error) as info:
                start()
            assert type(info.value) is error and str(info.value).startswith("staging_size "), info.value
    for device, error in ((1.5, TypeError), (huge, ValueError)):
        with pytest.raises(error, match="device|GPU \\(a number of 5001 digits\\)"):
            gdscp.copy_files(pairs, device=device)
    assert sorted(os.listdir(tmp_path)) == ["src"]
    job = gdscp.copy_files(pairs)
    with pytest.raises(ValueError, match="NaN"):
        job.wait(float("nan"))
    assert job.wait(30) and (tmp_path / "dst").read_bytes() == b"0123456789"
    (result,) = bulk.stream_files([src], ranges=[(3, None)]).results()
    assert (result.status, result.bytes) == ("done", 7)


def test_a_buffer_refused_names_its_item_and_file(tmp_path):
    """A buffer that cannot be used raises what it raised before, naming
    which item it is and its file; nothing is read or written."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A" * 100)
    b.write_bytes(b"B" * 100)
    ok = bytearray(100)
    readonly = np.zeros(100, np.uint8)
    readonly.flags.writeable = False
    for buffers, error, said in (([ok, np.zeros(200, np.uint8)[::2]], ValueError,
                                  f"buffers[1] (for '{b}'): buffer must be contiguous (ndarray is not)"),
                                 ([readonly, ok], ValueError,
                                  f"buffers[0] (for '{a}'): cannot read into a read-only buffer (ndarray)"),
                                 ([ok, object()], TypeError, f"buffers[1] (for '{b}'): expected a buffer")):
        with pytest.raises(error) as info:
            gdscp.read_files([a, b], buffers)
        assert type(info.value) is error and str(info.value).startswith(said), info.value
    assert ok == bytearray(100) and not readonly.any()
    out = [tmp_path / "c", tmp_path / "d"]
    with pytest.raises(TypeError) as info:
        gdscp.write_files([b"written", 7], out)
    assert str(info.value).startswith(f"buffers[1] (for '{out[1]}'): expected a buffer"), info.value
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def test_progress_counts_sizes_not_given_once_files_open(tmp_path):
    """Without ``sizes`` a copy's total grows by each file's size as it is
    opened, so that a finished job's total is what it moved; sizes given
    count from the start."""
    (tmp_path / "dst").mkdir()
    pairs, total = [], 0
    for i, size in enumerate([0, 1, 4097, 3 * MiB + 5, 70_000]):
        src = tmp_path / f"s{i}"
        src.write_bytes(os.urandom(size))
        pairs.append((src, tmp_path / "dst" / f"s{i}"))
        total += size
    job = gdscp.copy_files(pairs)
    assert {r.status for r in job.results()} == {"done"}
    p = job.progress()
    assert p.bytes_total == p.bytes_done == total
    job = gdscp.copy_files(pairs, sizes=[os.path.getsize(s) for s, _ in pairs])
    assert job.progress().bytes_total == total
    assert job.wait(60) and job.progress().bytes_total == total


# -- what callers pass, and what a job reports ---------------------------------------------


def test_a_write_over_its_own_file_through_a_mapping_of_it_keeps_the_bytes(tmp_path):
    """Written in place (``atomic=False``), a file is not emptied before its
    buffer is read: a memmap of the file itself, written back, keeps its
    bytes. A shorter buffer leaves the file at the buffer's length."""
    path = tmp_path / "f.bin"
    data = random_bytes(MiB + 123, 21)
    path.write_bytes(data)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    (result,) = gdscp.write_files([mapped], [path], atomic=False).results()
    del mapped
    assert result.status == "done", result
    assert path.read_bytes() == data
    (result,) = gdscp.write_files([data[:5000]], [path], atomic=False).results()
    assert result.status == "done" and path.read_bytes() == data[:5000]


def test_one_path_where_several_are_expected_is_a_type_error(tmp_path):
    """A str given for the list of paths would be taken as paths of one
    character each; a pair that is not (src, dst) as its first two items."""
    with pytest.raises(TypeError, match="several paths"):
        gdscp.write_files([b"1", b"2", b"3"], str(tmp_path / "out"))
    with pytest.raises(TypeError, match="several paths"):
        gdscp.read_files(tmp_path / "f")
    with pytest.raises(TypeError, match="pairs must be"):
        gdscp.copy_files(str(tmp_path / "a"))
    with pytest.raises(TypeError, match=r"pairs\[0\] must be a \(src, dst\) pair"):
        gdscp.copy_files((str(tmp_path / "a"), str(tmp_path / "b")))
    with pytest.raises(TypeError, match=r"pairs\[0\] must be a \(src, dst\) pair"):
        gdscp.copy_files(["ab"])
    with pytest.raises(ValueError, match=r"paths\[1\] is an empty path"):
        gdscp.write_files([b"1", b"2"], [tmp_path / "x", ""])
    with pytest.raises(TypeError, match=r"must be \(offset, length\)"):
        gdscp.bulk.stream_files([tmp_path / "x"], ranges=[(0, 5, 6)])
    assert os.listdir(tmp_path) == []


def test_a_destination_spelled_two_ways_is_refused_before_anything_is_written(tmp_path):
    """The same file named through ".." or through a link to its directory is
    the same destination twice."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to("sub")
    for other in (tmp_path / "sub" / ".." / "x", tmp_path / "sub" / "y"):
        first = tmp_path / "x" if other.name == "x" else tmp_path / "link" / "y"
        with pytest.raises(ValueError, match=f"destinations '{first}' \\(item 0\\) and '{other}' \\(item 1\\) name "
                                             "the same file"):
            gdscp.write_files([b"A", b"B"], [first, other])
    assert sorted(os.listdir(tmp_path)) == ["link", "sub"] and os.listdir(tmp_path / "sub") == []


def test_a_source_that_another_item_replaces_is_refused_before_anything_is_written(tmp_path):
    """A job reads sources while its copies take their names, batch by batch:
    a swap of two files among thousands read the second after the first copy
    had replaced it, so both ended as one file, every item "done". A source
    that another item replaces, however it is named, is refused, naming both
    items; a hard link to a destination is another name, left as it was."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    (tmp_path / "link").symlink_to("b")
    (tmp_path / "sub").mkdir()
    cases = [([(a, b), (b, a)], 0, 1), ([(b, c), (a, b)], 0, 1), ([(a, b), (tmp_path / "link", c)], 1, 0),
             ([(a, c), (tmp_path / "sub" / ".." / "b", tmp_path / "d"), (a, tmp_path / "link")], 1, 2)]
    for pairs, reader, writer in cases:
        said = (f"source '{pairs[reader][0]}' (item {reader}) is the destination '{pairs[writer][1]}' of item "
                f"{writer}: whether item {reader} copies it before or after item {writer} replaces it depends on timing")
        with pytest.raises(ValueError, match=re.escape(said)):
            gdscp.copy_files(pairs)
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "link", "sub"]
    assert (a.read_bytes(), b.read_bytes()) == (b"A", b"B")
    # A hard link to a destination keeps its bytes when the destination is replaced.
    os.link(b, tmp_path / "hard")
    job = gdscp.copy_files([(a, b), (tmp_path / "hard", c)])
    assert [r.status for r in job.results()] == ["done", "done"]
    assert (b.read_bytes(), c.read_bytes()) == (b"A", b"B")
    # A file read twice, and a copy onto its own source, are each's own business.
    job = gdscp.copy_files([(a, tmp_path / "x"), (a, tmp_path / "y"), (a, a)])
    assert [r.status for r in job.results()] == ["done", "done", "failed"]
    assert "are the same file" in job.results()[2].error and a.read_bytes() == b"A"


def test_ranges_that_meet_another_item_are_refused_before_anything_is_written(tmp_path):
    """A range written in place into a file that another item replaces,
    writes in an overlapping range, or reads, left bytes that depended on
    timing while both items said "done" (a destination holding the other's
    bytes alone, or old and new bytes mixed). Each is refused naming both
    items, as for whole files; ranges that do not overlap share their
    destination, from one source or several."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    files = {a: b"\xaa" * 4096, b: b"\xbb" * 4096, c: b"\xcc" * 4096}
    for path, data in files.items():
        path.write_bytes(data)
    os.link(b, tmp_path / "hard")
    n = 4096
    cases = [
        ([(a, b), (b, c)], [(0, n), None],
         f"source '{b}' (item 1) is the destination '{b}' of item 0, which writes its range (0, {n}): whether item 1 "
         "copies those bytes before or after item 0 writes them depends on timing"),
        ([(b, c), (a, b)], [None, (0, n)],
         f"source '{b}' (item 0) is the destination '{b}' of item 1, which writes its range (0, {n})"),
        ([(a, b), (b, c)], [(0, 10), (9, 10)], f"source '{b}' (item 1) is the destination '{b}' of item 0"),
        ([(a, b), (tmp_path / "hard", c)], [(100, 1), None], f"source '{tmp_path / 'hard'}' (item 1) is the "
         f"destination '{b}' of item 0, which writes its range (100, 1)"),
        ([(a, b), (c, b)], [None, (0, n)], f"destination '{b}' is given twice (items 0 and 1)"),
        ([(a, c), (c, b), (a, b)], [(0, 1), (0, n), None], f"destination '{b}' is given twice (items 1 and 2)"),
        ([(a, b), (c, b)], [(0, n), (100, n - 100)],
         f"destination '{b}' takes overlapping ranges (0, {n}) (item 0) and (100, {n - 100}) (item 1): whose "
         "bytes remain there depends on timing"),
        ([(a, b), (a, c), (a, tmp_path / "hard")], [(0, 10), (0, 10), (9, 1)],
         f"destinations '{b}' (item 0) and '{tmp_path / 'hard'}' (item 2) name the same file and take overlapping "
         "ranges (0, 10) and (9, 1)"),
    ]
    for pairs, ranges, said in cases:
        with pytest.raises(ValueError, match=re.escape(said)):
            gdscp.copy_files(pairs, ranges=ranges, clean=False)
        assert {path: path.read_bytes() for path in files} == files
    # Ranges that touch without overlapping, an empty one inside another, and
    # a source range beside the range written into the same file: all copied.
    job = gdscp.copy_files([(a, b), (c, b), (a, b), (b, c), (b, b)],
                           ranges=[(0, 10), (10, 10), (5, 0), (20, 10), (30, 5)], clean=False)
    assert [r.status for r in job.results()] == ["done"] * 5
    assert b.read_bytes() == b"\xaa" * 10 + b"\xcc" * 10 + b"\xbb" * (n - 20)
    assert c.read_bytes() == b"\xcc" * 20 + b"\xbb" * 10 + b"\xcc" * (n - 30)
    # A character device read by one item and written by another: neither sees the other's bytes.
    job = gdscp.copy_files([(os.devnull, tmp_path / "empty"), (a, os.devnull)])
    assert [r.status for r in job.results()] == ["done", "done"] and (tmp_path / "empty").read_bytes() == b""


@pytest.mark.parametrize("crowd", [0, 20])  # a few names in the directory, or enough that it is read whole
def test_a_destination_reached_through_a_link_to_it_is_refused_before_anything_is_written(tmp_path, crowd):
    """A symbolic link to a file is written through: a job naming the link
    and the file (or two links to one file) would write one file twice, both
    reported done while one's bytes were lost. Refused, naming both, with
    nothing written; as are two names of one FIFO, and two hard links to one
    file written in place. Hard links replaced atomically are two files."""
    d = tmp_path / "d"
    d.mkdir()
    others = [d / f"other-{k:02}" for k in range(crowd)]
    for p in others:
        p.write_bytes(b"other")
    (d / "x").write_bytes(b"old")
    (d / "link").symlink_to("x")
    (tmp_path / "far").symlink_to("d/x")
    src = tmp_path / "src"
    src.write_bytes(b"new")
    before = {p: p.read_bytes() for p in [*others, d / "x"]}
    for a, b in ((d / "x", d / "link"), (d / "link", d / "x"), (d / "link", tmp_path / "far")):
        pair = [*others, a, b]
        said = f"destinations '{a}' \\(item {crowd}\\) and '{b}' \\(item {crowd + 1}\\) name the same file"
        with pytest.raises(ValueError, match=said):
            gdscp.write_files([b"A"] * len(pair), pair)
        with pytest.raises(ValueError, match=said):
            gdscp.copy_files([(src, p) for p in pair])
    os.mkfifo(d / "fifo")
    (d / "to-fifo").symlink_to("fifo")
    with pytest.raises(ValueError, match="'.*/d/to-fifo' \\(item 1\\) name the same file"):
        gdscp.write_files([b"A", b"B"], [d / "fifo", d / "to-fifo"])
    os.link(d / "x", d / "hard")
    with pytest.raises(ValueError, match="'.*/d/hard' \\(item 1\\) name the same file"):
        gdscp.write_files([b"A", b"B"], [d / "x", d / "hard"], atomic=False)
    assert {p: p.read_bytes() for p in before} == before and (d / "hard").read_bytes() == b"old"
    assert sorted(os.listdir(d)) == sorted(["x", "link", "fifo", "to-fifo", "hard", *(p.name for p in others)])
    job = gdscp.write_files([b"A", b"B"], [d / "x", d / "hard"])
    assert [r.status for r in job.results()] == ["done", "done"]
    assert (d / "x").read_bytes() == b"A" and (d / "hard").read_bytes() == b"B"


def test_a_write_to_a_fifo_without_a_reader_ends_as_cancelled(tmp_path):
    """Cancelled while it waits for a reader, a FIFO's write is a file
    cancelled, not one that failed."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    job = gdscp.write_files([b"data"], [fifo])
    assert_cancel_ends(job)
    assert job.failures() == []


def test_progress_totals_meet_the_bytes_done_at_the_end(tmp_path):
    """``bytes_total`` counts each file at the size found once it opens (a
    size given wrong, a file shorter than its buffer), and a file skipped at
    0: a finished job's bytes done meet its total."""
    src = tmp_path / "src"
    src.write_bytes(random_bytes(300_000, 3))
    job = gdscp.copy_files([(src, tmp_path / "dst")], sizes=[100])
    job.wait()
    assert job.progress().bytes_done == job.progress().bytes_total == 300_000
    job = gdscp.read_files([src], [bytearray(MiB)])
    job.wait()
    assert job.progress().bytes_done == job.progress().bytes_total == 300_000
    job = gdscp.copy_files([(src, tmp_path / "dst")], sizes=[300_000], no_clobber=True)
    job.wait()
    assert job.results()[0].status == "skipped"
    assert job.progress().bytes_done == job.progress().bytes_total == 0


@pytest.mark.parametrize("kind", ["read", "copy"])
def test_progress_totals_of_sources_without_a_size_meet_their_bytes(tmp_path, kind):
    """A source with no size to go by (a pipe; a kernel file, whose size
    says nothing) counts in ``bytes_total`` what it gave once read, not the
    buffer's size (a read) or 0 (a copy)."""
    data = random_bytes(50_000, 14)  # within what a pipe holds: written whole before the job starts
    r, w = os.pipe()
    try:
        os.write(w, data)
        os.close(w)
        source = f"/proc/self/fd/{r}"  # the pipe's read end, opened again by name
        buf = bytearray(MiB)
        job = gdscp.read_files([source], [buf]) if kind == "read" else gdscp.copy_files([(source, tmp_path / "out")])
        assert job.wait(60)
    finally:
        os.close(r)
    (result,) = job.results()
    assert (result.status, result.bytes) == ("done", len(data)), result
    assert (buf[: len(data)] if kind == "read" else (tmp_path / "out").read_bytes()) == data
    assert job.progress() == (len(data), len(data), 1, 0, 1, True)
    kernel = gdscp.copy_files([("/proc/self/mountinfo", tmp_path / "mountinfo")])
    assert kernel.wait(60)
    (result,) = kernel.results()
    assert result.status == "done" and result.bytes == len((tmp_path / "mountinfo").read_bytes()) > 0, result
    assert kernel.progress()[:2] == (result.bytes, result.bytes)


@pytest.mark.parametrize("kind", ["copy", "write"])
@pytest.mark.parametrize("case", ["replacing", "new", "new-small"])
def test_a_file_whose_destination_directory_is_moved_is_not_put_there(tmp_path, kind, case):
    """The destination's directory renamed while the file is in flight (the
    job held at its first chunk): the file fails, saying so, and nothing is
    put in the moved directory: an old file there stays as it was, a named
    temporary file (one replacing a file, or a large one, opened again by its
    path) is removed there, and an unnamed one (a small new file) is never
    linked."""
    size = 300_000 if case == "new-small" else 4 * MiB
    data = random_bytes(size, 21)
    src = tmp_path / "src"
    src.write_bytes(data)
    folder, moved_to = tmp_path / "dd", tmp_path / "dd2"
    folder.mkdir()
    if case == "replacing":
        (folder / "d").write_bytes(b"good")
    _core.testing.arm_hold(0)
    try:
        if kind == "copy":
            job = gdscp.copy_files([(src, folder / "d")])
        else:
            job = gdscp.write_files([np.frombuffer(data, np.uint8)], [folder / "d"])
        deadline = time.monotonic() + 60
        while not _core.testing.hold_reached():
            assert time.monotonic() < deadline, "the job never reached the hold"
            time.sleep(0.001)
        in_flight = temporaries(folder)
        folder.rename(moved_to)
    finally:
        _core.testing.disarm_fault()
    (result,) = job.results()
    assert case == "new-small" or len(in_flight) == 1, in_flight
    assert temporaries(tmp_path) == []
    assert os.listdir(moved_to) == (["d"] if case == "replacing" else [])
    if case == "replacing":
        assert (moved_to / "d").read_bytes() == b"good"
    assert result.status == "failed" and result.errno == errno.ENOENT, result
    assert result.error == f"the destination directory '{folder}' was moved or removed during the {kind}"


def test_progress_seen_finished_has_the_final_counts(tmp_path):
    """A job that ends while its progress is being read (the engine's test
    hook lets its held file go on there and waits for its end) is reported
    either not yet finished or finished with every byte and file counted:
    a poller that stops at ``finished`` reports the final counts."""
    data = random_bytes(300_000, 12)
    src = tmp_path / "src"
    src.write_bytes(data)
    _core.testing.arm_hold(0)  # the copy waits at its first chunk, nothing counted yet
    try:
        job = gdscp.copy_files([(src, tmp_path / "dst")])
        deadline = time.monotonic() + 60
        while not _core.testing.hold_reached():
            assert time.monotonic() < deadline, "the copy never reached the hold"
            time.sleep(0.001)
        _core.testing.arm_progress_hold()
        seen = job.progress()
    finally:
        _core.testing.disarm_fault()
    assert job.wait(60)
    final = job.progress()
    assert final == (300_000, 300_000, 1, 0, 1, True)
    assert not seen.finished or seen == final, seen
    assert (tmp_path / "dst").read_bytes() == data


def test_a_range_past_the_end_of_its_file_says_so(tmp_path):
    """A range to read that the file does not have fails saying which bytes
    and how many the file has."""
    src = tmp_path / "f"
    src.write_bytes(b"x" * 1000)
    (result,) = gdscp.bulk.stream_files([src], ranges=[(900, 200)]).results()
    assert result.status == "failed" and "has no bytes [900, 1100) to read (it has 1000)" in result.error


def test_an_empty_range_of_an_empty_file_is_copied(tmp_path):
    """An empty file's range (0, 0) is done, 0 bytes, in a copy as in a read
    and as a copy of the whole file is; a range that wants bytes of it fails
    saying it has 0."""
    src = tmp_path / "empty"
    src.write_bytes(b"")
    fd, tmp = bulk.create_temporary(str(tmp_path / "dst"))
    try:
        os.write(fd, b"kept")
        (r,) = bulk.copy_files([(src, tmp)], ranges=[(0, 0)], clean=False).results()
        assert (r.status, r.bytes, r.error) == ("done", 0, None)
        (r,) = bulk.copy_files([(src, tmp)], ranges=[(0, 4)], clean=False).results()
        assert r.status == "failed" and f"'{src}' has no bytes [0, 4) to copy (it has 0)" in r.error, r.error
        assert Path(tmp).read_bytes() == b"kept"
    finally:
        os.close(fd)
    (r,) = bulk.stream_files([src], ranges=[(0, 0)]).results()
    assert (r.status, r.bytes) == ("done", 0)
    (r,) = bulk.copy_files([(src, tmp_path / "whole")]).results()
    assert r.status == "done" and (tmp_path / "whole").read_bytes() == b""


@pytest.mark.parametrize("size", [0, 1000])
def test_a_range_that_starts_past_the_end_fails_in_reads_and_copies_alike(tmp_path, size):
    """A range that starts past the end of a file fails, read or copied,
    naming the file, the range and the file's size; one that starts at the
    end is empty: done, 0 bytes. A file without a size has no ranges to copy,
    and says so."""
    data = random_bytes(size, 7)
    src = tmp_path / "f"
    src.write_bytes(data)
    past = "the range starts past its end"
    fd, tmp = bulk.create_temporary(str(tmp_path / "dst"))
    try:
        os.write(fd, b"kept")
        cases = [((size, 0), None), ((size + 1, 0), f"[{size + 1}, {size + 1}) to copy: {past} (it has {size})"),
                 ((size + 100, 5), f"[{size + 100}, {size + 105}) to copy: {past} (it has {size})")]
        for part, said in cases:
            (r,) = bulk.copy_files([(src, tmp)], ranges=[part], clean=False).results()
            if said is None:
                assert (r.status, r.bytes) == ("done", 0), (part, r.error)
            else:
                assert r.status == "failed" and f"'{src}' has no bytes {said}" in r.error, (part, r.error)
        assert Path(tmp).read_bytes() == b"kept"
        (r,) = bulk.copy_files([("/dev/zero", tmp)], ranges=[(0, 10)], clean=False).results()
        assert r.status == "failed" and "-1" not in r.error, r.error
        assert "'/dev/zero' has no bytes [0, 10) to copy (it has no size to go by" in r.error, r.error
    finally:
        os.close(fd)
    cases = [((size, 0), None), ((size, None), None),
             ((size + 1, 0), f"[{size + 1}, {size + 1}) to read: {past} (it has {size})"),
             ((size + 1, 5), f"[{size + 1}, {size + 6}) to read: {past} (it has {size})"),
             ((size + 100, None), f"from offset {size + 100} on to read: {past} (it has {size})")]
    for part, said in cases:
        (r,) = bulk.stream_files([src], ranges=[part]).results()
        if said is None:
            assert (r.status, r.bytes) == ("done", 0), (part, r.error)
        else:
            assert r.status == "failed" and f"'{src}' has no bytes {said}" in r.error, (part, r.error)


def test_a_source_named_like_a_temporary_file_is_read_not_removed(tmp_path):
    """A job cleans the directories it writes into of dead runs' temporary
    files, but not of its own sources: one so named (a dead run's leftover
    being rescued, say) is copied."""
    src = tmp_path / ".data.abcdefgh.gdscp-tmp"
    data = random_bytes(5000, 4)
    src.write_bytes(data)
    (result,) = gdscp.copy_files([(src, tmp_path / "rescued")]).results()
    assert result.status == "done", result
    assert src.read_bytes() == data and (tmp_path / "rescued").read_bytes() == data


@pytest.mark.parametrize("spelling", ["relative", "dot", "link", "dot-dot"])
def test_a_source_named_like_a_temporary_file_survives_its_directory_spelled_otherwise(tmp_path, monkeypatch,
                                                                                        spelling):
    """The source and the destination in one directory, their paths spelled
    differently (relative against absolute, "./", through a symbolic link to
    the directory, through ".."): the cleaning of the destination's directory
    still knows the source for one of the job's own, and leaves it."""
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "sub").mkdir()
    os.symlink("folder", tmp_path / "alias")
    src = folder / ".data.abcdefgh.gdscp-tmp"
    data = random_bytes(5000, 5)
    src.write_bytes(data)
    monkeypatch.chdir(tmp_path)
    named = {
        "relative": "folder/.data.abcdefgh.gdscp-tmp",
        "dot": "./folder/./.data.abcdefgh.gdscp-tmp",
        "link": "alias/.data.abcdefgh.gdscp-tmp",
        "dot-dot": "folder/sub/../.data.abcdefgh.gdscp-tmp",
    }[spelling]
    (result,) = gdscp.copy_files([(named, folder / "rescued")]).results()
    assert result.status == "done", result
    assert src.read_bytes() == data and (folder / "rescued").read_bytes() == data


def test_clean_temporaries_leaves_the_files_it_is_told_to_keep(tmp_path):
    """``keep`` names files by path however spelled; the other dead
    temporary files go."""
    kept = tmp_path / ".kept.abcdefgh.gdscp-tmp"
    kept.write_bytes(b"a source")
    dead = tmp_path / ".dead.abcdefgh.gdscp-tmp"
    dead.write_bytes(b"left by a killed run")
    assert bulk.clean_temporaries(tmp_path, [tmp_path / "." / kept.name]) == 1
    assert kept.read_bytes() == b"a source" and not dead.exists()
    assert bulk.clean_temporaries(tmp_path) == 1 and not kept.exists()


def test_a_wait_for_something_other_than_seconds_is_a_type_error():
    job = gdscp.write_files([], [])
    with pytest.raises(TypeError, match="number of seconds"):
        job.wait("1")
    assert job.wait(0)


def test_reads_into_the_same_or_overlapping_memory_are_refused(tmp_path):
    """One buffer given for two files, or views that overlap: each read would
    report done while the memory held a mix of both files. Refused, naming
    the files, before anything moves; views side by side are fine."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"\x01" * 8192)
    b.write_bytes(b"\x02" * 8192)
    buf = np.full(8192, POISON, np.uint8)
    for buffers in ([buf, buf], [buf[:5000], buf[4096:]], [buf[4096:], buf[:4097]], [memoryview(buf), buf[8191:]]):
        with pytest.raises(ValueError, match=r"file 0 \('.*a'\) and file 1 \('.*b'\) would be read into the same "
                                             r"memory"):
            gdscp.read_files([a, b], buffers)
        assert (buf == POISON).all()
    job = gdscp.read_files([a, b, a], [buf[:4096], buf[4096:8191], buf[8191:8191]])
    assert [r.status for r in job.results()] == ["done"] * 3
    assert bytes(buf) == b"\x01" * 4096 + b"\x02" * 4095 + bytes([POISON])


_NO_MEMORY_LEFT = r"""
import errno, resource, sys
import gdscp
from gdscp import _core

src, dst, through_memory = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if through_memory:  # the kernel declines every copy: the bytes go through a staging buffer
    _core.testing.arm_fault("copy_file_range", 0, 1 << 30, errno.EXDEV)
gdscp.defaults.get("num_threads")  # the engine loaded, its workers started
for line in open("/proc/self/status"):
    if line.startswith("VmSize:"):
        size = int(line.split()[1]) * 1024
# A few MiB more of address space: less than a staging buffer.
resource.setrlimit(resource.RLIMIT_AS, (size + (8 << 20),) * 2)
r = gdscp.copy_files([(src, dst)]).results()[0]
print(r.status, r.errno, r.error)
"""


@pytest.mark.skipif(sanitized(), reason="an address-space limit cannot hold a sanitizer's shadow memory")
def test_a_copy_with_no_memory_to_spare_is_made_in_the_kernel_or_says_memory_ran_out(tmp_path):
    """Memory for a staging buffer is taken only when the kernel does not copy
    the file itself; where it cannot be had, the file's result says so with
    ENOMEM (the command line then names the file), not a bare std::bad_alloc."""
    src = tmp_path / "src"
    data = random_bytes(20 * MiB, 8)
    src.write_bytes(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GDSCP_")}
    for through_memory in (False, True):
        dst = tmp_path / f"dst-{through_memory}"
        done = subprocess.run([sys.executable, "-c", _NO_MEMORY_LEFT, str(src), str(dst), str(int(through_memory))],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        if through_memory:
            assert done.stdout.startswith(f"failed {errno.ENOMEM} cannot allocate a staging buffer of "), done.stdout
            assert done.stdout.rstrip().endswith(os.strerror(errno.ENOMEM)), done.stdout
            assert not dst.exists()
        else:
            assert done.stdout.split() == ["done", "None", "None"], done.stdout
            assert dst.read_bytes() == data
        assert not [p for p in tmp_path.iterdir() if bulk.TEMPORARY_SUFFIX in p.name]
