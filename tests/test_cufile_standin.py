"""The engine's cuFile backend and device-memory paths, end to end, over the
stand-ins for libcuda and libcufile (tests/standin): on every machine, GPU or
not.

Each test runs one scenario (a ``scenario_*`` function below) in a child
process that loads the stand-ins before gdscp touches CUDA, so that the
engine's dlopen() finds them (tests/standin/__init__.py says how). A scenario
checks bytes against what the OS reads and writes, and the calls the engine
made against the stand-ins' logs; afterwards ``standin.check_clean`` checks
that nothing the real libraries would refuse happened, that no stream work
was left unrun, that every cuFile handle was deregistered and that every
staging buffer went back to its pool.

On a GPU machine the stand-ins replace the real libraries in the child
processes just the same; what checks the real libcuda and libcufile there is
tests/test_gpu.py.
"""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np
import pytest

import standin
from conftest import POISON, DLPackOnly, env_flag, random_bytes

MiB = 1 << 20
KiB = 1 << 10

# CUfileOpError values (cufile.h) and CUresult values (cuda.h) used below.
CU_FILE_DRIVER_NOT_INITIALIZED = 5001
CU_FILE_IO_NOT_SUPPORTED = 5008
CU_FILE_CUDA_DRIVER_ERROR = 5011
CU_FILE_INVALID_VALUE = 5022
CU_FILE_ASYNC_NOT_SUPPORTED = 5038
CU_FILE_IO_ERROR = 5044
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_ILLEGAL_ADDRESS = 700


# ==========================================================================
# the tests (this process): build the stand-ins, run each scenario in a child
# ==========================================================================
def _required() -> bool:
    return env_flag("GDSCP_REQUIRE_STANDIN")


@pytest.fixture(scope="session")
def standin_build(tmp_path_factory):
    """``get(variant)``: the stand-ins, built once per variant. Skipped without
    a C compiler or the CUDA headers, unless GDSCP_REQUIRE_STANDIN=1."""
    built: dict[str, standin.Build] = {}
    root = tmp_path_factory.mktemp("standin")

    def get(variant: str = "default") -> standin.Build:
        if variant not in built:
            try:
                built[variant] = standin.build(root, variant)
            except standin.Unavailable as exc:
                if _required():
                    pytest.fail(f"GDSCP_REQUIRE_STANDIN=1 but the stand-ins cannot be built: {exc}", pytrace=False)
                pytest.skip(f"cannot build the libcuda/libcufile stand-ins: {exc}")
        return built[variant]

    yield get
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def folder(tmp_path):
    """A fresh folder on a filesystem that takes O_DIRECT, removed afterwards."""
    try:
        path = standin.o_direct_folder([str(tmp_path), os.path.expanduser("~"), str(standin.TESTS.parent)])
    except standin.Unavailable as exc:
        pytest.skip(str(exc))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tmpfs_folder():
    """A fresh folder on tmpfs (which refuses O_DIRECT), or None."""
    if not (os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)) or standin.o_direct_works("/dev/shm"):
        yield None
        return
    path = tempfile.mkdtemp(prefix="gdscp-standin-", dir="/dev/shm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def go(standin_build, folder):
    """``go(scenario, variant="default", devices=1, **kwargs)``: runs it in a child."""

    def run(scenario, variant: str = "default", devices: int = 1, **kwargs):
        return standin.run(standin_build(variant), scenario, devices=devices, folder=folder, **kwargs)

    return run


def test_the_engine_loads_the_stand_ins(go):
    go(scenario_loading)


def test_off_reads_are_byte_exact(go):
    go(scenario_off_reads)


def test_off_writes_are_byte_exact(go):
    go(scenario_off_writes)


def test_gds_threshold_decides_where_transfers_run(go):
    go(scenario_threshold)


def test_requests_split_across_tasks(go):
    go(scenario_split)


def test_alignment_of_cufile_transfers(go):
    go(scenario_alignment)


def test_every_cufile_op_error_is_a_clear_exception(go):
    go(scenario_op_errors)


def test_negative_errno_results_are_os_errors(go):
    go(scenario_errno_results)


def test_handles_are_deregistered(go):
    go(scenario_deregistration)


def test_backend_selection(go, tmpfs_folder):
    go(scenario_selection, tmpfs=tmpfs_folder)


def test_registration_failure_auto_falls_back_off_raises(go):
    go(scenario_registration_failure)


def test_failed_open_leaves_the_file(go):
    go(scenario_failed_open_leaves_the_file)


def test_driver_open_failure(go):
    go(scenario_driver_open_failure)


def test_library_without_cufilewrite(go):
    go(scenario_missing_entry_point, variant="no_write")


@pytest.mark.parametrize("how", ["cuInit", "lookup"])
def test_cuda_unusable(go, how):
    go(scenario_cuda_unusable, how=how)


def test_posix_device_path_pipeline(go):
    go(scenario_posix_device_path)


def test_partly_cached_reads_are_byte_exact(go):
    go(scenario_partly_cached)


def test_posix_device_path_cuda_failures(go):
    go(scenario_posix_device_failures)


def test_raw_io_through_cufile(go):
    go(scenario_raw_sync)


def test_raw_async_through_cufile_streams(go):
    go(scenario_raw_async_cufile)


def test_raw_async_without_cufile_stream_api(go):
    go(scenario_raw_async_fallback, variant="no_async", compat="off")


def test_raw_async_on_posix(go):
    go(scenario_raw_async_fallback, compat="on")


@pytest.mark.parametrize("compat", ["on", "off"])
def test_small_sizes_through_device_memory(go, compat):
    go(scenario_small_sizes, compat=compat)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_small_synchronous_calls_into_device_memory(go, compat):
    go(scenario_small_synchronous, compat=compat)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_device_preads_report_the_file_from_the_future(go, compat):
    go(scenario_device_futures_report_the_file, compat=compat)


def test_mmap_into_device_memory(go):
    go(scenario_mmap)


def test_a_cancelled_mmap_read_counts_what_it_moved(go):
    go(scenario_mmap_cancel)


@pytest.mark.parametrize("compat", [None, "on", "off"])
def test_kvikio_program_on_device_memory(standin_build, page_cache_folder, compat):
    # The program drops the page cache of its files: not on tmpfs, which keeps them.
    standin.run(standin_build(), scenario_kvikio_program, folder=str(page_cache_folder), compat=compat)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_work_queued_on_the_default_streams_comes_first(go, compat):
    go(scenario_default_streams, devices=2, compat=compat)


def test_pointer_kinds_and_contexts(go):
    go(scenario_pointer_kinds, devices=2)


def test_a_short_device_read_ends_the_count(go):
    go(scenario_short_read_count)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_device_appends_from_many_handles_never_overlap(go, compat):
    go(scenario_device_appends, compat=compat)


def test_a_failed_device_append_leaves_the_file_as_it_was(go):
    go(scenario_failed_device_appends)


@pytest.mark.parametrize("first", ["earlier", "later"])
@pytest.mark.parametrize("how", ["fails", "short"])
def test_queued_appends_that_fail_in_turn_leave_the_file_as_it_was(go, first, how):
    go(scenario_queued_appends_fail_in_turn, first=first, how=how)


@pytest.mark.parametrize("op", ["read", "write"])
def test_a_stream_future_on_the_per_thread_stream_is_waited_for_from_any_thread(go, op):
    go(scenario_per_thread_stream_future, op=op)


def test_a_failed_stream_append_waited_for_twice_at_once_settles_once(go):
    go(scenario_stream_append_settled_once)


@pytest.mark.parametrize("op", ["read", "write"])
def test_a_stream_transfer_queued_at_exit_ends_before_its_buffer_goes(go, folder, op):
    """A script that ends holding a queued raw_read_async/raw_write_async: the
    exit waits for the stream before the buffer's finaliser frees it."""
    go(scenario_stream_transfer_at_exit, op=op)
    data = random_bytes(MiB, 5)
    with open(os.path.join(folder, "freed")) as report:
        pending, held = report.read().split()
    assert pending == "0", "the buffer was freed with its transfer still queued"
    if op == "read":
        assert held == hashlib.sha256(data).hexdigest(), "the buffer does not hold the file"
    else:
        assert file_bytes(os.path.join(folder, "x.bin")) == data


@pytest.mark.parametrize("compat", ["on", "off"])
@pytest.mark.parametrize("op", ["pread", "pwrite"])
def test_a_transfer_in_flight_at_exit_ends_before_its_buffer_goes(go, folder, op, compat):
    """A script that ends, holding the future of a pread/pwrite of device
    memory still running: the interpreter's exit waits for the transfer
    before the buffer is freed (by its finaliser), and every byte moves."""
    go(scenario_transfer_in_flight_at_exit, op=op, compat=compat)
    data = random_bytes(8 * MiB, 5)
    with open(os.path.join(folder, "freed")) as report:
        done, held = report.read().split()
    assert done == "True", "the buffer was freed while its transfer ran"
    if op == "pread":
        assert held == hashlib.sha256(data).hexdigest(), "the buffer does not hold the file"
    else:
        assert file_bytes(os.path.join(folder, "x.bin")) == data


@pytest.mark.parametrize("compat", ["on", "off"])
def test_an_empty_view_at_the_end_of_an_allocation_moves_nothing(go, compat):
    go(scenario_empty_view_at_the_end, compat=compat)


def test_device_buffer_without_cupy(go):
    go(scenario_device_buffer, devices=2)


def test_memory_module_without_cupy(go):
    go(scenario_memory_without_cupy)


def test_command_line_on_the_gpu_without_cupy(go):
    go(scenario_cli_without_cupy)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_parts_through_device_staging(go, compat):
    go(scenario_parts_through_device_staging, compat=compat)


def test_pinned_staging_is_mapped_then_registered(go):
    go(scenario_pinned_staging_registered)


def test_prepare_makes_the_first_transfers_staging(go):
    go(scenario_prepare)


@pytest.mark.parametrize("depth", [2, 3])
def test_bulk_reads_into_device_memory_overlap_across_files(go, depth):
    go(scenario_bulk_reads_queued, depth=depth)


def test_a_failed_copy_of_any_piece_fails_its_queued_file(go):
    go(scenario_bulk_copy_failure_mid_file)


def test_a_bounce_buffer_larger_than_memory_is_a_clear_memory_error(go):
    go(scenario_bounce_buffer_too_large)


def test_pinned_staging_past_the_memory_available_is_refused_before_it_is_mapped(go):
    go(scenario_pinned_staging_past_the_memory_available)


def test_masked_device_arrays_are_refused(go):
    go(scenario_masked_device_array)


def test_a_handle_answers_while_its_close_is_under_way(go):
    go(scenario_slow_close)


def test_threads_that_end_pass_their_staging_streams_on(go):
    go(scenario_thread_streams_reused)


# ==========================================================================
# helpers for the scenarios (child process)
# ==========================================================================
def new_file(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def file_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def mark() -> tuple[int, int]:
    """Where the two logs stand now (for ``since``)."""
    return len(standin.cuda.calls()), len(standin.cufile.calls())


def since(m: tuple[int, int], *entries: str, lib: str = "cufile") -> list:
    calls = (standin.cufile if lib == "cufile" else standin.cuda).calls()[m[1] if lib == "cufile" else m[0]:]
    return [c for c in calls if c.entry in entries] if entries else calls


def assert_tiles(calls, start: int, length: int, what: str) -> None:
    """The calls' [file_offset, file_offset + result) ranges cover
    [start, start + length) exactly once."""
    spans = sorted((c.file_offset, c.result) for c in calls if c.result > 0)
    at = start
    for offset, n in spans:
        assert offset == at, f"{what}: a gap or overlap at {at} (next call at {offset}): {spans}"
        at += n
    assert at == start + length, f"{what}: calls cover [{start}, {at}), not [{start}, {start + length})"


def read_and_write_back(path: str, data: bytes, out: str) -> None:
    """``path`` (holding ``data``) read into device memory with CuFile, then
    written to ``out``: both exact to the byte."""
    import gdscp

    buf = poisoned(len(data))
    with gdscp.CuFile(path, "r") as f:
        assert f.read(buf) == len(data)
    assert buf.bytes() == data
    with gdscp.CuFile(out, "w") as f:
        assert f.write(buf) == len(data)
    assert file_bytes(out) == data


def poisoned(nbytes: int, device: int = 0, **kw) -> standin.DeviceBuffer:
    return standin.cuda.alloc(nbytes, device, **kw).fill(POISON)


def settings(**values):
    import gdscp

    return gdscp.defaults.set(values)


# ==========================================================================
# scenarios (each runs in a child process over the stand-ins)
# ==========================================================================
def scenario_loading(folder):
    from gdscp import _core

    info = _core.cuda_info()
    assert info["available"], info["error"]
    assert info["library"] == standin.cuda.path
    assert [g["name"] for g in info["gpus"]] == ["gdscp stand-in GPU"]
    cf = _core.cufile_info("")
    assert cf["available"], cf["error"]
    assert cf["library"] == standin.cufile.path and cf["version"] == 1150
    # Every entry point resolved, at the API level whose ABI cuda.h's prototypes have.
    lookups = standin.cuda.calls("cuGetProcAddress_v2")
    assert lookups and all(c.result == 0 for c in lookups), lookups
    assert all(12000 <= c.version < 13000 for c in lookups), [(c.arg, c.version) for c in lookups]
    assert {"cuInit", "cuPointerGetAttributes", "cuMemcpyHtoDAsync"} <= {c.arg for c in lookups}
    # No real libcuda or libcufile is mapped into the process.
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "libcuda.so" in line or "libcufile" in line}
    assert mapped == {standin.cuda.path, standin.cufile.path}, mapped


def scenario_off_reads(folder):
    import gdscp

    data = random_bytes(3 * MiB + 5000, seed=1)
    path = new_file(folder, "r.bin", data)
    sizes = [0, 1, 4095, 4096, 4097, MiB - 1, 3 * MiB + 5]
    offsets = [0, 1, 4095, 4097]
    with settings(compat_mode="off", num_threads=4, task_size=MiB):
        m = mark()
        f = gdscp.CuFile(path, "r+")
        assert f.backend == "cufile", f.backend_reason
        assert f.backend_reason == "compat_mode is OFF: cuFile (no nvidia-fs, so libcufile runs in its own compatibility mode)"
        (reg,) = since(m, "cuFileHandleRegister")
        assert reg.result == 0 and reg.host != f.fileno()  # the O_DIRECT descriptor, not the buffered one
        for size in sizes:
            for offset in offsets:
                for start in (0, 3):
                    buf = poisoned(start + size + 64)
                    view = buf[start : start + size]
                    m = mark()
                    expect = data[offset : offset + size]
                    assert f.read(view, size, offset) == len(expect), (size, offset, start)
                    got = buf.bytes()
                    assert got[start : start + len(expect)] == expect, (size, offset, start)
                    assert got[:start] == bytes([POISON]) * start
                    assert got[start + len(expect) :] == bytes([POISON]) * (len(got) - start - len(expect))
                    reads = since(m, "cuFileRead")
                    assert (len(reads) == 0) == (size == 0)
                    for c in reads:  # the caller's pointer, each chunk at its offset in it
                        assert c.ptr == view.ptr and c.buf_offset == c.file_offset - offset, c
                    assert_tiles(reads, offset, len(expect), f"read {size} at {offset}")
        # Past the end of the file: short, the rest untouched; at and beyond it: nothing.
        for offset, size in ((len(data) - 100, MiB), (len(data), 4096), (len(data) + 5000, 10)):
            buf = poisoned(size)
            n = max(0, min(size, len(data) - offset))
            assert f.read(buf, size, offset) == n
            assert buf.bytes() == data[offset : offset + n] + bytes([POISON]) * (size - n)
        # Split across workers, most chunks past the end of the file.
        with settings(gds_threshold=0, task_size=256 * KiB):
            buf = poisoned(4 * MiB)
            m = mark()
            assert f.read(buf, 4 * MiB, len(data) - 300_000) == 300_000
            assert buf.bytes() == data[-300_000:] + bytes([POISON]) * (4 * MiB - 300_000)
            assert len(since(m, "cuFileRead")) > 2
        # The whole file, split across the workers (more than one task).
        buf = poisoned(len(data))
        m = mark()
        assert f.pread(buf).get() == len(data)
        assert buf.bytes() == data
        assert len(since(m, "cuFileRead")) > 1
        m = mark()
        f.close()
        (dereg,) = since(m, "cuFileHandleDeregister")
        assert dereg.handle == reg.handle and dereg.flags & standin.FD_OPEN
    # An empty file.
    empty = new_file(folder, "empty.bin", b"")
    with settings(compat_mode="off"), gdscp.CuFile(empty) as f:
        buf = poisoned(4096)
        assert f.read(buf) == 0 and buf.bytes() == bytes([POISON]) * 4096


def scenario_off_writes(folder):
    import gdscp

    data = random_bytes(2 * MiB + 77, seed=2)
    path = new_file(folder, "w.bin", data)
    model = bytearray(data)
    with settings(compat_mode="off", num_threads=4, task_size=MiB):
        with gdscp.CuFile(path, "r+") as f:
            assert f.backend == "cufile"
            cases = [(1, 0), (4095, 1), (4096, 4096), (4097, 4095), (MiB + 3, 12345), (3 * MiB + 5, 4097)]
            for i, (size, offset) in enumerate(cases):
                for start in (0, 5):
                    new = random_bytes(size, seed=100 + 2 * i + start)
                    buf = standin.cuda.alloc(start + size).set(bytes(start) + new)
                    m = mark()
                    assert f.write(buf[start:], size, offset) == size
                    writes = since(m, "cuFileWrite")
                    assert all(c.ptr == buf.ptr + start for c in writes)
                    assert_tiles(writes, offset, size, f"write {size} at {offset}")
                    end = offset + size
                    if end > len(model):
                        model.extend(bytes(end - len(model)))
                    model[offset:end] = new
                    assert file_bytes(path) == bytes(model), (size, offset, start)
            # Beyond the end of the file: a hole of zeros, then the bytes.
            far = len(model) + 10_000
            buf = standin.cuda.alloc(100).set(b"z" * 100)
            assert f.write(buf, 100, far) == 100
            model.extend(bytes(far - len(model)))
            model.extend(b"z" * 100)
            assert file_bytes(path) == bytes(model)
            assert f.write(buf, 0, 0) == 0  # nothing to write: no call
    # "w", "x" and "a" through cuFile too.
    fresh = os.path.join(folder, "new.bin")
    one = random_bytes(MiB + 1, seed=7)
    with settings(compat_mode="off"):
        with gdscp.CuFile(fresh, "x") as f:
            assert f.backend == "cufile"
            assert f.write(standin.cuda.alloc(len(one)).set(one)) == len(one)
        assert file_bytes(fresh) == one
        with gdscp.CuFile(fresh, "w") as f:
            assert f.write(standin.cuda.alloc(10).set(b"0123456789")) == 10
        assert file_bytes(fresh) == b"0123456789"
        with gdscp.CuFile(fresh, "a") as f:
            assert f.backend == "cufile"
            assert f.write(standin.cuda.alloc(3).set(b"abc"), file_offset=0) == 3  # lands at the end
            assert f.write(standin.cuda.alloc(3).set(b"def")) == 3
        assert file_bytes(fresh) == b"0123456789abcdef"


def scenario_threshold(folder):
    """Requests below gds_threshold (or with one worker) run on the calling
    thread; the others on the pool's workers."""
    import gdscp

    data = random_bytes(4 * MiB, seed=3)
    path = new_file(folder, "t.bin", data)
    me = threading.get_native_id()
    cases = [  # (threads, threshold, size, on the calling thread)
        (4, MiB, 512 * KiB, True),
        (4, MiB, 4 * MiB, False),
        (4, 0, 512 * KiB, False),
        (4, 64 * MiB, 4 * MiB, True),
        (1, 0, 4 * MiB, True),
    ]
    for threads, threshold, size, inline in cases:
        with settings(compat_mode="off", num_threads=threads, task_size=256 * KiB, gds_threshold=threshold):
            with gdscp.CuFile(path, "r+") as f:
                for write in (False, True):
                    buf = poisoned(size) if not write else standin.cuda.alloc(size).set(data[:size])
                    m = mark()
                    n = f.write(buf) if write else f.read(buf)
                    assert n == size
                    if not write:
                        assert buf.bytes() == data[:size]
                    calls = since(m, "cuFileWrite" if write else "cuFileRead")
                    assert len(calls) == size // (256 * KiB), calls
                    where = {c.tid == me for c in calls}
                    assert where == {inline}, (threads, threshold, size, write, [c.tid for c in calls], me)
    assert file_bytes(path) == data


def scenario_split(folder):
    """A request larger than task_size: several cuFile calls, each at most
    task_size, that tile the request, the pointer and offsets consistent."""
    import gdscp

    data = random_bytes(5 * MiB + 333, seed=4)
    path = new_file(folder, "s.bin", data)
    for threads in (1, 2, 4):
        for task_size in (64 * KiB, 64 * KiB + 3, 1 * MiB):
            for offset, size in ((0, len(data)), (4097, 3 * MiB + 1)):
                with settings(compat_mode="off", num_threads=threads, task_size=task_size, gds_threshold=0):
                    with gdscp.CuFile(path, "r+") as f:
                        buf = poisoned(size)
                        m = mark()
                        assert f.read(buf, size, offset) == size
                        assert buf.bytes() == data[offset : offset + size]
                        reads = since(m, "cuFileRead")
                        assert len(reads) >= -(-size // task_size)
                        assert all(c.size <= task_size and c.result == c.size for c in reads)
                        assert all(c.ptr == buf.ptr and c.buf_offset == c.file_offset - offset for c in reads)
                        ordered = sorted(reads, key=lambda c: c.file_offset)
                        assert len({c.size for c in ordered[:-1]}) <= 1, "chunks of one size but the last"
                        assert_tiles(reads, offset, size, f"{threads} threads, task_size {task_size}")
                        if threads > 1:
                            assert threading.get_native_id() not in {c.tid for c in reads}
                        m = mark()
                        assert f.write(buf, size, offset) == size
                        assert_tiles(since(m, "cuFileWrite"), offset, size, "write")
    assert file_bytes(path) == data
    # Short transfers: each call moves at most 10000 bytes; the engine goes on
    # from where each one stopped.
    standin.cufile.limit("cuFileRead", 10_000)
    standin.cufile.limit("cuFileWrite", 10_000)
    with settings(compat_mode="off", num_threads=4, task_size=256 * KiB, gds_threshold=0):
        with gdscp.CuFile(path, "r+") as f:
            buf = poisoned(MiB + 7)
            m = mark()
            assert f.read(buf, MiB + 7, 99) == MiB + 7
            assert buf.bytes() == data[99 : 99 + MiB + 7]
            reads = since(m, "cuFileRead")
            assert all(c.result <= 10_000 for c in reads) and len(reads) > (MiB + 7) // 10_000
            assert_tiles(reads, 99, MiB + 7, "short reads")
            new = random_bytes(MiB + 7, seed=44)
            m = mark()
            assert f.write(standin.cuda.alloc(MiB + 7).set(new), file_offset=99) == MiB + 7
            assert_tiles(since(m, "cuFileWrite"), 99, MiB + 7, "short writes")
    assert file_bytes(path) == data[:99] + new + data[99 + MiB + 7 :]
    standin.cufile.limit("cuFileRead", 0)
    standin.cufile.limit("cuFileWrite", 0)


def scenario_alignment(folder):
    """Aligned requests reach cuFile aligned (file offset, size and device
    address on 4 KiB boundaries, so GPUDirect Storage can DMA them); other
    requests reach it as they are, byte-exact."""
    import gdscp

    data = random_bytes(4 * MiB, seed=5)
    path = new_file(folder, "a.bin", data)
    with settings(compat_mode="off", num_threads=4, task_size=256 * KiB, gds_threshold=0):
        with gdscp.CuFile(path, "r+") as f:
            buf = poisoned(2 * MiB)
            m = mark()
            assert f.read(buf, 2 * MiB, 8192) == 2 * MiB
            assert buf.bytes() == data[8192 : 8192 + 2 * MiB]
            for c in since(m, "cuFileRead"):
                assert c.file_offset % 4096 == 0 and c.size % 4096 == 0 and (c.ptr + c.buf_offset) % 4096 == 0, c
                assert c.flags & standin.DIRECT, c
            m = mark()
            assert f.write(buf, 2 * MiB, 8192) == 2 * MiB
            assert all(c.flags & standin.DIRECT for c in since(m, "cuFileWrite"))
            m = mark()
            assert f.raw_read(buf, 4096, 4096 * 3, 4096) == 4096
            (raw,) = since(m, "cuFileRead")
            assert raw.flags & standin.DIRECT and raw.buf_offset == 4096
            # Unaligned file offset, device address or size: the same bytes.
            for offset, start, size in ((4097, 0, MiB), (4096, 3, MiB), (0, 0, MiB + 1), (1, 1, 3)):
                buf = poisoned(start + size)
                assert f.read(buf[start:], size, offset) == size
                assert buf.bytes()[start:] == data[offset : offset + size]
                src = standin.cuda.alloc(start + size).set(bytes(start) + data[offset : offset + size])
                assert f.write(src[start:], size, offset) == size
    assert file_bytes(path) == data


def scenario_op_errors(folder):
    """Every CUfileOpError from cuFileRead/cuFileWrite: a gdscp.CuFileError
    (also a RuntimeError) with that code, naming the call, file, offset and
    cuFile's own text; the file stays usable."""
    import gdscp

    data = random_bytes(2 * MiB, seed=6)
    path = new_file(folder, "e.bin", data)
    codes = standin.cufile.error_codes()
    assert len(codes) > 40 and (CU_FILE_IO_ERROR, "CU_FILE_IO_ERROR", "cufile io error") in codes
    with settings(compat_mode="off", num_threads=4, task_size=256 * KiB), gdscp.CuFile(path, "r+") as f:
        buf = poisoned(2 * MiB)
        for code, name, text in codes:
            for entry in ("cuFileRead", "cuFileWrite"):
                standin.cufile.fail(entry, -code)
                with pytest.raises(gdscp.CuFileError) as info:
                    if entry == "cuFileRead":
                        f.read(buf, 8192, 4096)
                    else:
                        f.write(buf, 8192, 4096)
                exc = info.value
                assert isinstance(exc, RuntimeError) and exc.code == code, (name, exc.code)
                assert str(exc) == f"{entry} '{path}' at offset 4096: {text} (CUfileOpError {code})", str(exc)
        # In the middle of a request split across workers: the offset of the call that failed.
        for entry in ("cuFileRead", "cuFileWrite"):
            buf.set(data)  # what a write that fails half-way leaves in the file: the same bytes
            with settings(gds_threshold=0):
                standin.cufile.fail(entry, -CU_FILE_IO_ERROR, skip=3)
                m = mark()
                with pytest.raises(gdscp.CuFileError) as info:
                    (f.read if entry == "cuFileRead" else f.write)(buf)
                (failed,) = [c for c in since(m, entry) if c.flags & standin.INJECTED]
                assert f"at offset {failed.file_offset}:" in str(info.value), (str(info.value), failed)
        # Still usable afterwards.
        buf.fill(POISON)
        assert f.read(buf) == 2 * MiB and buf.bytes() == data


def scenario_errno_results(folder):
    """A negative errno (or -1 with errno set) from cuFileRead/cuFileWrite:
    the matching OSError subclass, also a RuntimeError, naming file and offset."""
    import gdscp

    data = random_bytes(MiB, seed=7)
    path = new_file(folder, "n.bin", data)
    cases = [  # (result, errno set with it, exception, errno)
        (-errno.EIO, 0, OSError, errno.EIO),
        (-errno.ENOSPC, 0, OSError, errno.ENOSPC),
        (-errno.EACCES, 0, PermissionError, errno.EACCES),
        (-errno.ENOENT, 0, FileNotFoundError, errno.ENOENT),
        (-errno.EINVAL, 0, OSError, errno.EINVAL),
        (-1, errno.EIO, OSError, errno.EIO),  # -1: errno says why (-EPERM cannot be told from it)
        (-1, errno.EDQUOT, OSError, errno.EDQUOT),
        (-1, 0, OSError, errno.EIO),  # -1 without an errno: an I/O error, not "Success"
    ]
    with settings(compat_mode="off"), gdscp.CuFile(path, "r+") as f:
        buf = poisoned(MiB)
        for result, err, cls, expect in cases:
            for entry in ("cuFileRead", "cuFileWrite"):
                standin.cufile.fail(entry, result, err)
                with pytest.raises(cls) as info:
                    (f.read if entry == "cuFileRead" else f.write)(buf, 4096, 8192)
                exc = info.value
                assert isinstance(exc, RuntimeError) and exc.errno == expect, (entry, result, exc)
                assert f"{entry} '{path}' at offset 8192: {os.strerror(expect)} (errno {expect})" == str(exc)
        # cuFileWrite moving nothing is an error; cuFileRead moving nothing is the end of the file.
        standin.cufile.fail("cuFileWrite", 0)
        with pytest.raises(OSError) as info:
            f.write(buf, 4096, 0)
        assert info.value.errno == errno.EIO and "wrote nothing" in str(info.value)
        standin.cufile.fail("cuFileRead", 0)
        buf.fill(POISON)
        assert f.read(buf, 4096, 0) == 0 and buf.bytes() == bytes([POISON]) * MiB
        assert f.read(buf) == MiB and buf.bytes() == data


def scenario_deregistration(folder):
    """Handles are deregistered, once, while their descriptor is still open:
    on close, when a with block ends in an error, when the CuFile is dropped,
    and after the last transfer when closed during one; never when
    registration failed."""
    import gdscp

    data = random_bytes(4 * MiB, seed=8)
    path = new_file(folder, "d.bin", data)

    def deregistered(m):
        calls = since(m, "cuFileHandleDeregister")
        assert all(c.flags & standin.FD_OPEN for c in calls), calls
        return len(calls)

    with settings(compat_mode="off", num_threads=4, task_size=256 * KiB, gds_threshold=0):
        # close()
        m = mark()
        f = gdscp.CuFile(path, "r+")
        assert standin.cufile.live_handles() == 1
        f.close()
        f.close()
        assert deregistered(m) == 1 and standin.cufile.live_handles() == 0
        # A failed transfer ends the with block.
        m = mark()
        with pytest.raises(gdscp.CuFileError):
            with gdscp.CuFile(path, "r+") as f:
                standin.cufile.fail("cuFileRead", -CU_FILE_IO_ERROR, skip=2)
                f.read(poisoned(4 * MiB))
        assert deregistered(m) == 1 and standin.cufile.live_handles() == 0
        # Dropped without close().
        m = mark()
        f = gdscp.CuFile(path, "r+")
        assert f.read(poisoned(4096)) == 4096
        del f
        gc.collect()
        assert deregistered(m) == 1
        # Closed while a transfer runs: the handle lives until its last call.
        m = mark()
        f = gdscp.CuFile(path, "r+")
        buf = poisoned(4 * MiB)
        standin.cufile.gate("cuFileRead", skip=1)
        future = f.pread(buf)
        assert standin.cufile.gate_wait(30), "no cuFileRead reached the gate"
        f.close()
        assert deregistered(m) == 0 and standin.cufile.live_handles() == 1
        standin.cufile.release()
        assert future.get() == 4 * MiB and buf.bytes() == data
        calls = since(m)
        last_read = max(i for i, c in enumerate(calls) if c.entry == "cuFileRead")
        (dereg,) = [i for i, c in enumerate(calls) if c.entry == "cuFileHandleDeregister"]
        assert dereg > last_read
        # Registration refused: no handle to deregister, no descriptor left open.
        fds = len(os.listdir("/proc/self/fd"))
        m = mark()
        standin.cufile.fail("cuFileHandleRegister", CU_FILE_IO_NOT_SUPPORTED)
        with pytest.raises(gdscp.CuFileError):
            gdscp.CuFile(path, "r+")
        assert deregistered(m) == 0 and len(os.listdir("/proc/self/fd")) == fds


def scenario_selection(folder, tmpfs):
    """compat_mode ON never touches cuFile; AUTO uses it only where nvidia-fs
    is loaded (the test hook points the engine at a file standing for it) and
    the file registers; OFF uses it or raises."""
    import gdscp
    from gdscp import _core

    data = random_bytes(2 * MiB + 1, seed=9)
    path = new_file(folder, "c.bin", data)

    def device_round_trip(f):
        buf = poisoned(len(data))
        assert f.read(buf) == len(data) and buf.bytes() == data
        assert f.write(buf) == len(data)

    m = mark()
    with settings(compat_mode="on"), gdscp.CuFile(path, "r+") as f:
        assert f.backend == "posix" and f.backend_reason.startswith("compat_mode is ON: gdscp's POSIX path")
        device_round_trip(f)
    with settings(compat_mode="auto"), gdscp.CuFile(path, "r+") as f:
        assert f.backend == "posix"
        assert f.backend_reason.startswith("nvidia-fs kernel module not loaded"), f.backend_reason
        device_round_trip(f)
    assert standin.cufile.calls() == [] and standin.cufile.driver_opens() == 0, "cuFile was used"
    assert len(since(m, "cuMemcpyHtoDAsync", lib="cuda")) > 0  # device memory went through staging

    nvidia_fs = new_file(folder, "nvidia-fs-version", b"version: 2.99\n")
    _core.testing.set_nvidia_fs_version_path(nvidia_fs)
    try:
        assert _core.cufile_info("")["nvidia_fs"] and _core.cufile_info("")["nvidia_fs_version"] == "version: 2.99"
        with settings(compat_mode="auto"), gdscp.CuFile(path, "r+") as f:
            assert f.backend == "cufile"
            assert f.backend_reason == "GPUDirect Storage: nvidia-fs is loaded and cuFile registered the file"
            m = mark()
            device_round_trip(f)
            assert since(m, "cuFileRead") and since(m, "cuFileWrite")
        with settings(compat_mode="off"), gdscp.CuFile(path, "r+") as f:
            assert f.backend_reason == "compat_mode is OFF: cuFile with GPUDirect Storage"
        # Host memory never goes through cuFile.
        with settings(compat_mode="off"), gdscp.CuFile(path, "r+") as f:
            m = mark()
            host = bytearray(len(data))
            assert f.read(host) == len(data) and bytes(host) == data
            assert since(m, "cuFileRead") == []
        if tmpfs:  # a filesystem that refuses O_DIRECT
            shm = new_file(tmpfs, "c.bin", data)
            with settings(compat_mode="auto"), gdscp.CuFile(shm, "r+") as f:
                assert f.backend == "posix" and f.backend_reason.startswith("the filesystem refuses O_DIRECT")
                device_round_trip(f)
            with settings(compat_mode="off"), pytest.raises(RuntimeError) as info:
                gdscp.CuFile(shm, "r+")
            assert str(info.value) == ("compat_mode is OFF, which requires cuFile, but cuFile needs O_DIRECT, "
                                       f"which the filesystem of '{shm}' refuses")
    finally:
        _core.testing.set_nvidia_fs_version_path("")
    assert not _core.cufile_info("")["nvidia_fs"]
    with settings(compat_mode="auto"), gdscp.CuFile(path) as f:
        assert f.backend == "posix"


def scenario_registration_failure(folder):
    """cuFileHandleRegister refusing the file: AUTO falls back to the POSIX
    path and says why; OFF raises a CuFileError with cuFile's reason."""
    import gdscp
    from gdscp import _core

    data = random_bytes(MiB + 1, seed=10)
    path = new_file(folder, "g.bin", data)
    _core.testing.set_nvidia_fs_version_path(new_file(folder, "nvidia-fs", b"1"))
    for code, name, text in standin.cufile.error_codes():
        cu = CUDA_ERROR_OUT_OF_MEMORY if code == CU_FILE_CUDA_DRIVER_ERROR else 0
        reason = f"cuFileHandleRegister '{path}': {text} (CUfileOpError {code})"
        if cu:
            reason += ": CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        standin.cufile.fail("cuFileHandleRegister", code, cu)
        with settings(compat_mode="auto"), gdscp.CuFile(path, "r+") as f:
            assert f.backend == "posix", name
            assert f.backend_reason == f"cuFile refused the file ({reason}): gdscp's POSIX path (pread/pwrite " \
                                       "through pinned staging buffers)", f.backend_reason
            buf = poisoned(len(data))
            m = mark()
            assert f.read(buf) == len(data) and buf.bytes() == data
            assert since(m, "cuFileRead") == [] and since(m, "cuMemcpyHtoDAsync", lib="cuda")
        standin.cufile.fail("cuFileHandleRegister", code, cu)
        with settings(compat_mode="off"), pytest.raises(gdscp.CuFileError) as info:
            gdscp.CuFile(path, "r+")
        assert info.value.code == code
        assert str(info.value) == f"compat_mode is OFF, which requires cuFile, but {reason}", str(info.value)
    _core.testing.set_nvidia_fs_version_path("")


def scenario_failed_open_leaves_the_file(folder):
    """An open that fails because cuFile refuses the file (compat_mode OFF)
    neither truncates the file ("w", "w+") nor leaves one it created ("w",
    "a", "x"): "w" had already emptied a 1 MiB file, and "x" left an empty
    file that made the next "x" open a FileExistsError."""
    import gdscp

    data = random_bytes(MiB + 1, seed=12)
    path = new_file(folder, "keep.bin", data)
    fresh = os.path.join(folder, "fresh.bin")
    for flags in ("w", "w+", "a", "a+", "x", "x+", "r+"):
        for where in {"x": [fresh], "r": [path]}.get(flags[0], [path, fresh]):
            standin.cufile.fail("cuFileHandleRegister", CU_FILE_INVALID_VALUE)
            with settings(compat_mode="off"), pytest.raises(gdscp.CuFileError):
                gdscp.CuFile(where, flags)
            assert file_bytes(path) == data, flags
            assert not os.path.exists(fresh), (flags, where)
    # Once cuFile takes the file, "w" truncates as before, and "x" creates.
    with settings(compat_mode="off"), gdscp.CuFile(path, "w") as f:
        assert os.path.getsize(path) == 0 and f.write(b"new") == 3
    assert file_bytes(path) == b"new"
    with settings(compat_mode="off"), gdscp.CuFile(fresh, "x") as f:
        assert f.write(b"made") == 4
    assert file_bytes(fresh) == b"made"


def scenario_driver_open_failure(folder):
    import gdscp
    from gdscp import _core

    path = new_file(folder, "o.bin", b"x" * 5000)
    _core.testing.set_nvidia_fs_version_path(new_file(folder, "nvidia-fs", b"1"))
    standin.cufile.fail("cuFileDriverOpen", CU_FILE_DRIVER_NOT_INITIALIZED, times=-1)
    why = ("cuFileDriverOpen failed: nvidia-fs driver is not loaded. Set allow_compat_mode to true in cufile.json "
           "file to enable compatible mode (CUfileOpError 5001)")
    with settings(compat_mode="auto"), gdscp.CuFile(path) as f:
        assert f.backend == "posix" and f.backend_reason.startswith(why + ": gdscp's POSIX path"), f.backend_reason
        buf = poisoned(5000)
        assert f.read(buf) == 5000 and buf.bytes() == b"x" * 5000
    with settings(compat_mode="off"), pytest.raises(RuntimeError) as info:
        gdscp.CuFile(path)
    assert str(info.value) == f"compat_mode is OFF, which requires cuFile, but {why}"
    assert _core.cufile_info("")["error"] == why
    assert standin.cufile.count("cuFileDriverOpen") == 1  # tried once per process
    _core.testing.set_nvidia_fs_version_path("")


def scenario_missing_entry_point(folder):
    import gdscp
    from gdscp import _core

    path = new_file(folder, "m.bin", b"y" * 100)
    with settings(compat_mode="off"), pytest.raises(RuntimeError) as info:
        gdscp.CuFile(path)
    assert str(info.value) == "compat_mode is OFF, which requires cuFile, but libcufile.so.0 lacks cuFileWrite"
    _core.testing.set_nvidia_fs_version_path(new_file(folder, "nvidia-fs", b"1"))
    with settings(compat_mode="auto"), gdscp.CuFile(path) as f:
        assert f.backend == "posix" and f.backend_reason.startswith("libcufile.so.0 lacks cuFileWrite: ")
    _core.testing.set_nvidia_fs_version_path("")
    assert standin.cufile.calls() == []  # the driver was never opened


def scenario_cuda_unusable(folder, how):
    """Without a usable CUDA driver: OFF refuses with the reason, AUTO and ON
    still serve host memory, device memory is a clear error."""
    import gdscp
    from gdscp import _core

    if how == "cuInit":
        standin.cuda.fail("cuInit", CUDA_ERROR_NO_DEVICE, times=-1)
        why = "cuInit failed (no usable GPU?): CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)"
    else:
        standin.cuda.fail("lookup:cuEventSynchronize", 1, times=-1)
        why = "libcuda.so.1 lacks cuEventSynchronize (a driver for CUDA 12 or later is needed)"
    data = random_bytes(10_000, seed=11)
    path = new_file(folder, "u.bin", data)
    _core.testing.set_nvidia_fs_version_path(new_file(folder, "nvidia-fs", b"1"))
    assert _core.cuda_info() == {"available": False, "error": why, "library": "", "driver_version": 0, "gpus": []}
    with settings(compat_mode="off"), pytest.raises(RuntimeError) as info:
        gdscp.CuFile(path)
    assert str(info.value) == f"compat_mode is OFF, which requires cuFile, but cuFile needs CUDA: {why}"
    for compat in ("auto", "on"):
        with settings(compat_mode=compat), gdscp.CuFile(path) as f:
            assert f.backend == "posix"
            host = bytearray(len(data))
            assert f.read(host) == len(data) and bytes(host) == data
            with pytest.raises(RuntimeError) as info:
                f.read(standin.cuda.alloc(100))
            assert str(info.value) == f"CUDA is not available: {why}"
    _core.testing.set_nvidia_fs_version_path("")


def scenario_posix_device_path(folder):
    """compat_mode ON, device memory: staged through pinned buffers and
    cuMemcpyHtoDAsync/DtoHAsync, byte-exact at every pipeline depth and
    staging size; every copy from pinned memory, inside the buffer, each piece
    copied once."""
    import gdscp
    from gdscp import _core

    data = random_bytes(2 * MiB + 4097, seed=12)
    path = new_file(folder, "p.bin", data)
    size, offset, start = 2 * MiB + 1, 3, 5
    for depth in (2, 3, 8):
        for bounce in (4096, 64 * KiB, MiB):
            for threads in (1, 4):
                values = dict(compat_mode="on", pipeline_depth=depth, bounce_buffer_size=bounce,
                              num_threads=threads, gds_threshold=0)
                with settings(**values), gdscp.CuFile(path, "r+") as f:
                    case = f"depth={depth} bounce={bounce} threads={threads}"
                    buf = poisoned(start + size + 7)
                    m = mark()
                    assert f.read(buf[start : start + size], size, offset) == size, case
                    got = buf.bytes()
                    assert got[start : start + size] == data[offset : offset + size], case
                    assert got[:start] + got[start + size :] == bytes([POISON]) * (start + 7), case
                    copies = since(m, "cuMemcpyHtoDAsync", lib="cuda")
                    assert copies and all(c.flags & standin.PINNED_HOST for c in copies), case
                    spans = sorted((c.ptr - buf.ptr - start, c.size) for c in copies)
                    at = 0
                    for dst, n in spans:
                        assert dst == at, (case, spans)
                        at += n
                    assert at == size, case
                    assert all(c.size <= bounce for c in copies), case
                    # Past the end of the file: only what is there is copied.
                    tail = poisoned(MiB)
                    n = len(data) - (2 * MiB + 100)
                    assert f.read(tail, MiB, 2 * MiB + 100) == n, case
                    assert tail.bytes() == data[-n:] + bytes([POISON]) * (MiB - n), case
                    # Writes: copied back through pinned buffers, written at the right place.
                    new = random_bytes(size, seed=depth * bounce + threads)
                    src = standin.cuda.alloc(start + size).set(bytes(start) + new)
                    m = mark()
                    assert f.write(src[start:], size, offset) == size, case
                    back = since(m, "cuMemcpyDtoHAsync", lib="cuda")
                    assert back and all(c.flags & standin.PINNED_HOST for c in back), case
                    assert sum(c.size for c in back) == size, case
                    assert file_bytes(path) == data[:offset] + new + data[offset + size :], case
                    with open(path, "r+b") as raw:
                        raw.write(data)
    assert standin.cufile.calls() == []


def scenario_partly_cached(folder):
    """A file only partly in the page cache, read into device memory through
    the staging buffers and into host memory by pread (mapped reads off):
    what is cached is read first without waiting for the disk, the rest asked
    of it ahead and then read. Byte-exact, from unaligned offsets, in one task
    and several, past the end of the file too; nothing outside the range is
    touched."""
    import gdscp

    data = random_bytes(9 * MiB + 4097, seed=31)
    path = new_file(folder, "partly.bin", data)
    cases = [(len(data), 0), (3 * MiB + 5, 4093), (2 * MiB, len(data) - 5), (MiB + 1, 6 * MiB - 1)]
    for size, offset in cases:
        for threads in (1, 3):
            for memory in ("device", "host"):
                case = f"size={size} offset={offset} threads={threads} {memory}"
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.pread(fd, MiB, 2 * MiB + 7)  # cached: the middle of a piece, and one page
                    os.pread(fd, 1, 6 * MiB + 100)
                finally:
                    os.close(fd)
                values = dict(compat_mode="on", num_threads=threads, gds_threshold=0, mapped_reads=False,
                              bounce_buffer_size=MiB, task_size=4 * MiB)
                want = data[offset : offset + size]
                with settings(**values), gdscp.CuFile(path, "r") as f:
                    if memory == "device":
                        buf = poisoned(size + 10)
                        assert f.read(buf[3 : 3 + size], size, offset) == len(want), case
                        got = buf.bytes()
                    else:
                        host = np.full(size + 10, POISON, np.uint8)
                        assert f.read(host[3 : 3 + size], size, offset) == len(want), case
                        got = host.tobytes()
                assert got[3 : 3 + len(want)] == want, case
                assert got[:3] + got[3 + len(want) :] == bytes([POISON]) * (size + 10 - len(want)), case


def scenario_posix_device_failures(folder):
    """CUDA failures on the POSIX device path: a CudaError naming the call
    and the driver's error; the pipeline drained (no pinned buffer freed or
    reused under a queued copy) and the next transfer right."""
    import gdscp
    from gdscp import _core

    data = random_bytes(3 * MiB, seed=13)
    path = new_file(folder, "f.bin", data)
    cases = [
        ("cuMemcpyHtoDAsync", CUDA_ERROR_ILLEGAL_ADDRESS, "read",
         "cuMemcpyHtoDAsync: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)"),
        ("cuEventSynchronize", CUDA_ERROR_ILLEGAL_ADDRESS, "read",
         "cuEventSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)"),
        ("cuMemcpyDtoHAsync", CUDA_ERROR_ILLEGAL_ADDRESS, "write",
         "cuMemcpyDtoHAsync: CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)"),
        ("cuMemHostRegister", CUDA_ERROR_OUT_OF_MEMORY, "read",
         "cuMemHostRegister (pinned staging buffer): CUDA_ERROR_OUT_OF_MEMORY (out of memory)"),
        ("cuMemHostRegister", CUDA_ERROR_OUT_OF_MEMORY, "write",
         "cuMemHostRegister (pinned staging buffer): CUDA_ERROR_OUT_OF_MEMORY (out of memory)"),
    ]
    with settings(compat_mode="on", num_threads=4, bounce_buffer_size=64 * KiB, task_size=MiB, gds_threshold=0):
        with gdscp.CuFile(path, "r+") as f:
            for entry, code, op, message in cases:
                _core.trim_pools()  # so that staging buffers are allocated anew
                # (The first allocation: one worker may take every chunk and allocate only `depth` buffers.)
                standin.cuda.fail(entry, code, skip=0 if entry == "cuMemHostRegister" else 2)
                buf = standin.cuda.alloc(len(data)).set(data) if op == "write" else poisoned(len(data))
                with pytest.raises(gdscp.CudaError) as info:
                    (f.write if op == "write" else f.read)(buf)
                assert info.value.code == code and str(info.value) == message, (entry, str(info.value))
                assert standin.cuda.pending() == 0, f"{entry}: copies left queued after the failure"
                buf = poisoned(len(data))
                assert f.read(buf) == len(data) and buf.bytes() == data, entry
            # A failing pread mid-way through a device read.
            _core.testing.arm_fault("pread", 3, 1, errno.EIO)
            try:
                with pytest.raises(OSError) as info:
                    f.read(poisoned(len(data)))
                assert info.value.errno == errno.EIO
            finally:
                _core.testing.disarm_fault()
            assert standin.cuda.pending() == 0
            buf = poisoned(len(data))
            assert f.read(buf) == len(data) and buf.bytes() == data


def scenario_raw_sync(folder):
    """raw_read/raw_write: one cuFile call on the calling thread at dev_offset."""
    import gdscp

    data = random_bytes(MiB + 3, seed=14)
    path = new_file(folder, "raw.bin", data)
    me = threading.get_native_id()
    with settings(compat_mode="off", num_threads=4), gdscp.CuFile(path, "r+") as f:
        for dev_offset in (0, 1, 4096):
            buf = poisoned(dev_offset + 300_000)
            m = mark()
            assert f.raw_read(buf, 300_000, 4097, dev_offset) == 300_000
            (call,) = since(m, "cuFileRead")
            assert call.tid == me and call.ptr == buf.ptr and call.buf_offset == dev_offset
            assert call.file_offset == 4097 and call.size == 300_000
            got = buf.bytes()
            assert got[dev_offset:] == data[4097 : 4097 + 300_000] and got[:dev_offset] == bytes([POISON]) * dev_offset
            m = mark()
            assert f.raw_write(buf, 300_000, 4097, dev_offset) == 300_000
            (call,) = since(m, "cuFileWrite")
            assert call.tid == me and call.buf_offset == dev_offset
        buf = poisoned(MiB)
        assert f.raw_read(buf, file_offset=len(data) - 10) == 10 and buf.bytes()[:10] == data[-10:]
        assert f.raw_read(buf, file_offset=len(data)) == 0
        assert f.raw_read(buf, 0) == 0
        # An empty GPU array has no address (CuPy's data pointer is 0): 0 bytes,
        # as read() gives, where its address had been refused as not CUDA's.
        empty = EmptyDeviceArray()
        stream = standin.cuda.stream()
        assert f.raw_read(empty) == 0 and f.raw_write(empty) == 0
        assert f.raw_read_async(empty, stream).check_bytes_done() == 0
        assert f.raw_write_async(empty, stream).check_bytes_done() == 0
        # A stream handle is a pointer: a negative or too large one, a float, or
        # text that int() would read as a number, is refused.
        for bad, error in ((-1, OverflowError), (2**64, OverflowError), (1.5, TypeError), ("0", TypeError),
                           (b"7", TypeError), (np.float64(2.0), TypeError)):
            with pytest.raises(error, match="stream"):
                f.raw_read_async(buf, bad, 10)
        assert f.raw_read_async(buf, np.uint64(0), 10).check_bytes_done() == 10
    assert file_bytes(path) == data


class EmptyDeviceArray:
    __cuda_array_interface__ = {"shape": (0,), "typestr": "|u1", "data": (0, False), "version": 3}


def scenario_raw_async_cufile(folder):
    """raw_read_async/raw_write_async with cuFile's stream API: queued on the
    caller's stream, in order with the stream's other work; failures of the
    queued I/O raised by check_bytes_done; refusal falls back to a transfer
    ordered after the stream's work."""
    import gdscp

    data = random_bytes(2 * MiB, seed=15)
    path = new_file(folder, "as.bin", data)
    stream = standin.cuda.stream()
    with settings(compat_mode="off"), gdscp.CuFile(path, "r+") as f:
        buf = poisoned(MiB + 10)
        m = mark()
        future = f.raw_read_async(buf, stream, MiB, 4096, 10)
        (submit,) = since(m, "cuFileReadAsync")
        assert submit.size == MiB and submit.file_offset == 4096 and submit.buf_offset == 10 and submit.host == stream
        assert future.check_bytes_done() == MiB
        assert buf.bytes()[10:] == data[4096 : 4096 + MiB]
        assert len(since(m, "cuFileReadAsync:io")) == 1
        # Ordered on the stream: a fill queued after the read lands after it.
        future = f.raw_read_async(buf, stream, MiB, 0, 0)
        standin.cuda.fill_async(stream, buf[:10], 0x11)
        assert future.check_bytes_done() == MiB
        assert buf.bytes()[:10] == b"\x11" * 10 and buf.bytes()[10:MiB] == data[10:MiB]
        # ... and a write after a fill queued before it writes the filled bytes.
        src = standin.cuda.alloc(8192).set(data[:8192])
        standin.cuda.fill_async(stream, src, 0x5A)
        assert f.raw_write_async(src, stream, 8192, 12288).check_bytes_done() == 8192
        model = bytearray(data)
        model[12288 : 12288 + 8192] = b"\x5a" * 8192
        assert file_bytes(path) == bytes(model)
        # Past the end of the file; nothing to read.
        tail = poisoned(MiB)
        assert f.raw_read_async(tail, stream, MiB, len(data) - 5).check_bytes_done() == 5
        assert tail.bytes()[:5] == bytes(model[-5:]) and tail.bytes()[5:] == bytes([POISON]) * (MiB - 5)
        assert f.raw_read_async(tail, stream, 0).check_bytes_done() == 0
        # Dropped before check_bytes_done: the stream still gets synchronised.
        tail.fill(POISON)
        future = f.raw_read_async(tail, stream, 100, 0)
        del future
        gc.collect()
        assert standin.cuda.pending() == 0 and tail.bytes()[:100] == bytes(model[:100])
        # Failures of the queued I/O itself, raised when the stream has run it.
        standin.cufile.fail("cuFileReadAsync:io", -CU_FILE_IO_ERROR)
        future = f.raw_read_async(tail, stream, 4096, 8192)
        with pytest.raises(gdscp.CuFileError) as info:
            future.check_bytes_done()
        assert info.value.code == CU_FILE_IO_ERROR
        assert str(info.value) == f"cuFile stream I/O on '{path}' at offset 8192: cufile io error (CUfileOpError 5044)"
        standin.cufile.fail("cuFileWriteAsync:io", -errno.ENOSPC)
        with pytest.raises(OSError) as info:
            f.raw_write_async(tail, stream, 4096, 8192).check_bytes_done()
        assert info.value.errno == errno.ENOSPC and f"'{path}' at offset 8192" in str(info.value)
        # -1: the errno that goes with it belongs to whichever thread ran the I/O,
        # not to the one that synchronises the stream; an EIO that says so.
        for entry in ("cuFileReadAsync:io", "cuFileWriteAsync:io"):
            standin.cufile.fail(entry, -1, errno.ENOSPC)
            with pytest.raises(OSError) as info:
                (f.raw_read_async if "Read" in entry else f.raw_write_async)(tail, stream, 4096, 8192).check_bytes_done()
            assert info.value.errno == errno.EIO, str(info.value)
            assert str(info.value) == (f"cuFile stream I/O (failed; its errno is lost on the stream) on '{path}' "
                                       "at offset 8192: Input/output error (errno 5)")
        # Refused when queued: an error, or for "not supported here" a transfer
        # ordered after the stream's earlier work.
        standin.cufile.fail("cuFileReadAsync", CU_FILE_INVALID_VALUE)
        with pytest.raises(gdscp.CuFileError) as info:
            f.raw_read_async(tail, stream, 4096, 0)
        assert info.value.code == CU_FILE_INVALID_VALUE and f"cuFileReadAsync '{path}'" in str(info.value)
        for refusal in (CU_FILE_ASYNC_NOT_SUPPORTED, CU_FILE_IO_NOT_SUPPORTED):
            standin.cufile.fail("cuFileWriteAsync", refusal)
            src = standin.cuda.alloc(4096).set(b"q" * 4096)
            standin.cuda.fill_async(stream, src, 0x77)
            m = mark()
            future = f.raw_write_async(src, stream, 4096, 0)
            assert since(m, "cuFileWrite")  # moved by the time the call returned
            assert future.check_bytes_done() == 4096
            assert file_bytes(path)[:4096] == b"\x77" * 4096
        # A producer stream named in __cuda_array_interface__ is waited for.
        src = standin.cuda.alloc(4096).set(b"r" * 4096)
        producer = standin.cuda.stream(non_blocking=True)
        standin.cuda.fill_async(producer, src, 0x33)
        assert f.write(src.with_stream(producer), 4096, 0) == 4096
        assert file_bytes(path)[:4096] == b"\x33" * 4096
    # Closed with stream I/O still queued: the handle stays registered until
    # the future lets go of the file, after the stream has run the I/O.
    expect = file_bytes(path)[:MiB]
    del future
    gc.collect()
    m = mark()
    with settings(compat_mode="off"):
        f = gdscp.CuFile(path, "r+")
    (reg,) = since(m, "cuFileHandleRegister")
    buf = poisoned(MiB)
    future = f.raw_read_async(buf, stream, MiB, 0)
    f.close()
    assert standin.cufile.live_handles() == 1 and since(m, "cuFileHandleDeregister") == []
    assert future.check_bytes_done() == MiB and buf.bytes() == expect
    del future
    gc.collect()
    (dereg,) = since(m, "cuFileHandleDeregister")
    assert dereg.handle == reg.handle and dereg.flags & standin.FD_OPEN and standin.cufile.live_handles() == 0


def scenario_raw_async_fallback(folder, compat):
    """raw_*_async where cuFile's stream API is absent (OFF over a libcufile
    without it) or cuFile is not used (ON): the stream is synchronised first,
    the bytes are in place when the call returns."""
    import gdscp

    data = random_bytes(MiB, seed=16)
    path = new_file(folder, "fb.bin", data)
    stream = standin.cuda.stream()
    with settings(compat_mode=compat), gdscp.CuFile(path, "r+") as f:
        assert f.backend == ("cufile" if compat == "off" else "posix")
        buf = poisoned(MiB)
        m = mark()
        future = f.raw_read_async(buf, stream, 500_000, 7, 3)
        assert buf.bytes()[3 : 3 + 500_000] == data[7 : 7 + 500_000]  # already there
        assert future.check_bytes_done() == 500_000
        assert since(m, "cuFileReadAsync") == []
        assert bool(since(m, "cuFileRead")) == (compat == "off")
        src = standin.cuda.alloc(65536).set(data[:65536])
        standin.cuda.fill_async(stream, src, 0x42)
        assert f.raw_write_async(src, stream, 65536, 4096).check_bytes_done() == 65536
        assert file_bytes(path) == data[:4096] + b"\x42" * 65536 + data[4096 + 65536 :]
        assert f.raw_read_async(buf, None, 10, 0).check_bytes_done() == 10  # the default stream


def scenario_pointer_kinds(folder):
    """What the engine makes of memory: pinned host memory offered as device
    memory is host memory; unknown memory is refused; device memory without a
    context attribute uses its device's primary context; memory of the second
    device is moved under that device's context."""
    import gdscp

    data = random_bytes(MiB + 5, seed=17)
    path = new_file(folder, "k.bin", data)
    with settings(compat_mode="off", num_threads=4, gds_threshold=0, task_size=256 * KiB):
        with gdscp.CuFile(path, "r+") as f:
            pinned = standin.cuda.pinned(len(data)).fill(POISON)
            m = mark()
            assert f.read(pinned) == len(data) and pinned.bytes() == data
            assert since(m, "cuFileRead") == [] and since(m, "cuMemcpyHtoDAsync", lib="cuda") == []

            plain = np.zeros(100, dtype=np.uint8)
            unknown = standin.DeviceBuffer(plain.ctypes.data, 100)
            with pytest.raises(ValueError) as info:
                f.read(unknown)
            assert "is not memory CUDA knows" in str(info.value)

            for device, context in ((0, False), (1, True), (1, False)):
                retains = standin.cuda.retains(device)
                buf = poisoned(len(data), device, context=context)
                m = mark()
                assert f.read(buf) == len(data) and buf.bytes() == data, (device, context)
                reads = since(m, "cuFileRead")
                assert reads and {c.ctx for c in reads} == {device}, (device, context, reads)
                if not context:
                    assert standin.cuda.retains(device) >= max(retains, 1)
                m = mark()
                assert f.write(buf) == len(data)
                assert {c.ctx for c in since(m, "cuFileWrite")} == {device}
    with settings(compat_mode="on", num_threads=4, gds_threshold=0), gdscp.CuFile(path, "r+") as f:
        buf = poisoned(len(data), 1)
        m = mark()
        assert f.read(buf) == len(data) and buf.bytes() == data
        ctx1 = standin.cuda.primary_context(1)
        assert {c.ctx for c in since(m, "cuMemcpyHtoDAsync", lib="cuda")} == {ctx1}
    assert file_bytes(path) == data


def scenario_short_read_count(folder):
    """One transfer of a parallel read into device memory comes up short (a
    cuFileRead, or the pread of one staging piece, returns 0 as at end of
    file) while the ones after it complete: the count ends where the short one
    starts, the bytes it covers are exact and the short part is untouched.
    The same for raw_read, cut into staging pieces on the calling thread."""
    import gdscp
    from gdscp import _core

    data = random_bytes(8 * MiB, seed=21)
    path = new_file(folder, "gap.bin", data)

    def check(n: int, buf, step: int, what: str) -> None:
        got = buf.bytes()
        assert n < len(data), f"{what}: nothing came up short"
        assert n % step == 0, f"{what}: the count {n} ends inside a transfer of {step} bytes"
        assert got[:n] == data[:n], f"{what}: the count covers bytes that were never read"
        assert got[n : n + step] == bytes([POISON]) * step, f"{what}: the short transfer moved bytes after all"

    task = 256 * KiB
    with settings(compat_mode="off", num_threads=4, gds_threshold=0), gdscp.CuFile(path, "r") as f:
        assert f.backend == "cufile", f.backend_reason
        for skip in (0, 5, 13):
            buf = poisoned(len(data))
            standin.cufile.fail("cuFileRead", 0, skip=skip)
            check(f.read(buf, task_size=task), buf, task, f"cuFile, skip {skip}")
    piece = 64 * KiB
    with settings(compat_mode="on", num_threads=4, gds_threshold=0, bounce_buffer_size=piece), \
            gdscp.CuFile(path, "r") as f:
        for skip in (0, 9, 40):
            buf = poisoned(len(data))
            _core.testing.arm_fault("pread", skip, 1, 0)
            try:
                check(f.read(buf, task_size=task), buf, piece, f"staged, skip {skip}")
                buf = poisoned(len(data))
                _core.testing.arm_fault("pread", skip, 1, 0)
                check(f.raw_read(buf, len(data)), buf, piece, f"raw, skip {skip}")
            finally:
                _core.testing.disarm_fault()


def scenario_failed_device_appends(folder):
    """Appends from device memory that fail part-way (a pwrite, or a copy off
    the GPU) through every way in: split over the workers, on the calling
    thread, raw and stream-ordered. Each leaves the file as it was, and the
    next append lands at the old end."""
    import gdscp
    from gdscp import _core

    path = os.path.join(folder, "log.bin")
    before = random_bytes(MiB + 5, 1)
    with open(path, "wb") as out:
        out.write(before)
    big, small = random_bytes(4 * MiB + 3, 2), random_bytes(300 * KiB, 3)
    stream = standin.cuda.stream()
    calls = {
        "write": lambda f, src, n: f.write(src, task_size=MiB),
        "pwrite": lambda f, src, n: f.pwrite(src, task_size=MiB).get(),
        "raw_write": lambda f, src, n: f.raw_write(src, n),
        "raw_write_async": lambda f, src, n: f.raw_write_async(src, stream, n).check_bytes_done(),
    }
    with settings(compat_mode="on", num_threads=4, bounce_buffer_size=64 * KiB):
        for name, call in calls.items():
            for data in (big, small):
                # Past the first piece where the call has several (big, split).
                skip = 2 if name in ("write", "pwrite") and data is big else 0
                for fault in ("pwrite", "cuMemcpyDtoHAsync"):
                    src = standin.cuda.alloc(len(data)).set(data)
                    with gdscp.CuFile(path, "a") as f:
                        if fault == "pwrite":
                            _core.testing.arm_fault("pwrite", skip, 1, errno.EIO)
                            expected = OSError
                        else:
                            standin.cuda.fail(fault, CUDA_ERROR_ILLEGAL_ADDRESS, skip=skip)
                            expected = gdscp.CudaError
                        try:
                            with pytest.raises(expected):
                                call(f, src, len(data))
                        finally:
                            _core.testing.disarm_fault()
                    assert standin.cuda.pending() == 0
                    with open(path, "rb") as got:
                        assert got.read() == before, (name, len(data), fault)
    # Queued on the stream through cuFile: the range is given back once the
    # outcome is known, by check_bytes_done() or, never asked, as the future
    # goes. A short write is all or nothing too: 0 bytes, the file as it was.
    with settings(compat_mode="off"):
        for how in ("fails", "short", "dropped"):
            src = standin.cuda.alloc(len(small)).set(small)
            with gdscp.CuFile(path, "a") as f:
                assert f.backend == "cufile"
                if how == "short":
                    standin.cufile.limit("cuFileWrite", 100 * KiB)
                else:
                    standin.cufile.fail("cuFileWriteAsync:io", -CU_FILE_IO_ERROR)
                try:
                    future = f.raw_write_async(src, stream, len(small))
                    if how == "fails":
                        with pytest.raises(gdscp.CuFileError, match="log.bin"):
                            future.check_bytes_done()
                    elif how == "short":
                        assert future.check_bytes_done() == 0
                    del future
                finally:
                    standin.cufile.limit("cuFileWrite", 0)
            assert standin.cuda.pending() == 0
            with open(path, "rb") as got:
                assert got.read() == before, how
    with settings(compat_mode="on"):
        src = standin.cuda.alloc(len(big)).set(big)
        with gdscp.CuFile(path, "a") as f:
            assert f.write(src, task_size=MiB) == len(big)
    with open(path, "rb") as got:
        assert got.read() == before + big


def scenario_queued_appends_fail_in_turn(folder, first, how):
    """Two appends queued on a stream through cuFile, both failing (or
    writing short): whichever is settled first, the file ends as it was."""
    import gdscp

    before = random_bytes(10_000, 3)
    path = new_file(folder, "log.bin", before)
    stream = standin.cuda.stream()
    a = standin.cuda.alloc(8192).set(b"A" * 8192)
    b = standin.cuda.alloc(4096).set(b"B" * 4096)
    with settings(compat_mode="off"), gdscp.CuFile(path, "a") as f:
        assert f.backend == "cufile"
        if how == "fails":
            standin.cufile.fail("cuFileWriteAsync:io", -CU_FILE_IO_ERROR, times=2)
        else:
            standin.cufile.limit("cuFileWrite", 1000)
        try:
            futures = [f.raw_write_async(a, stream, 8192), f.raw_write_async(b, stream, 4096)]
            assert os.path.getsize(path) == len(before) + 8192 + 4096  # both ranges held
            for future in futures if first == "earlier" else futures[::-1]:
                if how == "fails":
                    with pytest.raises(gdscp.CuFileError):
                        future.check_bytes_done()
                else:
                    assert future.check_bytes_done() == 0
        finally:
            standin.cufile.limit("cuFileWrite", 0)
        assert file_bytes(path) == before
        # The next append lands at the old end.
        assert f.raw_write_async(b, stream, 4096).check_bytes_done() == 4096
    assert file_bytes(path) == before + b"B" * 4096


def scenario_per_thread_stream_future(folder, op):
    """A raw_*_async through cuFile on the per-thread default stream (2),
    which names the calling thread's own stream: its future, asked from
    another thread, waits for that transfer and no other; dropped on another
    thread after the file is closed, it still lets the transfer end before
    the handle goes."""
    import gdscp

    data = random_bytes(64 * KiB, 2)
    path = new_file(folder, "p.bin", data)
    per_thread = 2
    src = standin.cuda.alloc(8192).set(random_bytes(8192, 4))
    with settings(compat_mode="off"):
        f = gdscp.CuFile(path, "r+")
        assert f.backend == "cufile"
        buf = poisoned(8192)
        future = f.raw_read_async(buf, per_thread, 8192, 4096) if op == "read" else \
            f.raw_write_async(src, per_thread, 8192, 4096)
        got: dict = {}

        def other() -> None:
            standin.cuda.make_current(0)
            try:
                got["n"] = future.check_bytes_done()
            except BaseException as exc:  # noqa: BLE001 - reported below
                got["n"] = exc

        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert got["n"] == 8192, got
        assert standin.cuda.pending() == 0
        if op == "read":
            assert buf.bytes() == data[4096 : 4096 + 8192]
        else:
            assert file_bytes(path) == data[:4096] + src.bytes() + data[4096 + 8192 :]
        # Where the event cannot be recorded, the submitting thread waits for
        # the transfer itself: asked from another thread, the count is its.
        expect = file_bytes(path)[4096 : 4096 + 8192]
        buf.fill(POISON)
        standin.cuda.fail("cuEventRecord", 2)
        future = f.raw_read_async(buf, per_thread, 8192, 4096)
        assert standin.cuda.pending() == 0
        t = threading.Thread(target=other)
        t.start()
        t.join(30)
        assert got["n"] == 8192, got
        assert buf.bytes() == expect
        # Dropped on another thread, the file closed meanwhile.
        expect = file_bytes(path)[:8192]
        buf.fill(POISON)
        future = f.raw_read_async(buf, per_thread, 8192, 0)
        f.close()
        held = [future]
        del future

        def drop() -> None:
            standin.cuda.make_current(0)
            held.clear()
            gc.collect()

        t = threading.Thread(target=drop)
        t.start()
        t.join(30)
        assert standin.cuda.pending() == 0 and standin.cufile.live_handles() == 0
        assert buf.bytes() == expect
    standin.check_clean()


def scenario_stream_append_settled_once(folder):
    """check_bytes_done() of one failed stream append from two threads at
    once: its range is given back once, and an append that lands meanwhile
    keeps its bytes."""
    import gdscp

    before = random_bytes(10_000, 3)
    path = new_file(folder, "log.bin", before)
    stream = standin.cuda.stream()
    a = standin.cuda.alloc(8192).set(b"A" * 8192)
    c = standin.cuda.alloc(8192).set(b"C" * 8192)
    with settings(compat_mode="off"), gdscp.CuFile(path, "a") as f:
        standin.cufile.fail("cuFileWriteAsync:io", -CU_FILE_IO_ERROR, times=1)
        future = f.raw_write_async(a, stream, 8192)
        standin.cuda.gate("cuStreamSynchronize")
        errors = []

        def first() -> None:
            standin.cuda.make_current(0)
            try:
                future.check_bytes_done()
            except gdscp.CuFileError as exc:
                errors.append(exc)

        t = threading.Thread(target=first)
        t.start()
        assert standin.cuda.gate_wait(10)  # the first waiter holds the future, waiting for the stream
        second: dict = {}

        def again() -> None:
            standin.cuda.make_current(0)
            try:
                future.check_bytes_done()
            except gdscp.CuFileError as exc:
                second["error"] = exc

        t2 = threading.Thread(target=again)
        t2.start()
        time.sleep(0.2)
        standin.cuda.release()
        t.join(30)
        t2.join(30)
        assert len(errors) == 1 and isinstance(second.get("error"), gdscp.CuFileError), (errors, second)
        assert file_bytes(path) == before
        assert f.raw_write(c, 8192) == 8192
        with pytest.raises(gdscp.CuFileError):
            future.check_bytes_done()  # asked again: the same failure, nothing given back twice
    assert file_bytes(path) == before + b"C" * 8192


class _QueuedReport(standin.DeviceBuffer):
    """Device memory that, as its finaliser frees it, writes to ``report``
    how many stream operations were still queued and a digest of what it held."""

    report: tuple = ("", None)  # (the report's path, the stand-in's count of queued operations)

    def __del__(self, _open=open, _digest=hashlib.sha256, _free=standin.DeviceBuffer.__del__):
        path, pending = self.report
        with _open(path, "w") as out:
            out.write(f"{pending()} {_digest(self.host.tobytes()).hexdigest()}")
        _free(self)


def scenario_stream_transfer_at_exit(folder, op):
    """The script ends holding a raw_*_async future (a module global) whose
    transfer is still queued on its stream, and the buffer only through it."""
    import gdscp

    data = random_bytes(MiB, 5)
    path = new_file(folder, "x.bin", data if op == "read" else bytes(len(data)))
    gdscp.defaults.set({"compat_mode": "off"})
    f = gdscp.CuFile(path, "r+")
    stream = standin.cuda.stream()
    ptr = standin.cuda.lib.gdscp_cuda_alloc(len(data), 0, 0)
    buf = _QueuedReport(ptr, len(data), free=lambda: standin.cuda.lib.gdscp_cuda_free(ptr))
    buf.set(data if op == "write" else bytes(len(data)))
    _QueuedReport.report = (os.path.join(folder, "freed"), standin.cuda.lib.gdscp_cuda_pending)
    future = (f.raw_read_async if op == "read" else f.raw_write_async)(buf, stream)
    assert standin.cuda.pending() == 1
    _HELD_AT_EXIT.append((f, future))
    del buf
    raise SystemExit(0)  # the end of the script, the transfer queued (no check_clean: it would wait)


def scenario_empty_view_at_the_end(folder, compat):
    """A view of no bytes whose address is the end of its allocation (what
    ``buf[len(buf):]`` gives, which no allocation covers): every call moves
    nothing and says 0, and a bulk read of files into slices of one buffer
    whose last file is empty reads them all."""
    import gdscp

    data = random_bytes(8192, 1)
    path = new_file(folder, "e.bin", data)
    empty_file = new_file(folder, "empty.bin", b"")
    stream = standin.cuda.stream()
    with settings(compat_mode=compat), gdscp.CuFile(path, "r+") as f:
        buf = standin.cuda.alloc(4096).set(b"\x07" * 4096)
        empty = buf[4096:]
        calls = {
            "read": lambda: f.read(empty), "pread": lambda: f.pread(empty).get(), "write": lambda: f.write(empty),
            "raw_read": lambda: f.raw_read(empty), "raw_write": lambda: f.raw_write(empty),
            "raw_read_async": lambda: f.raw_read_async(empty, stream).check_bytes_done(),
            "raw_write_async": lambda: f.raw_write_async(empty, stream).check_bytes_done(),
        }
        for name, call in calls.items():
            assert call() == 0, name
        with gdscp.CuFile(path, "a") as appending:
            assert appending.raw_write(empty) == 0
            assert appending.raw_write_async(empty, stream).check_bytes_done() == 0
    assert file_bytes(path) == data
    whole = standin.cuda.alloc(4096)
    results = gdscp.read_files([path, empty_file], [whole[:4096], whole[4096:]]).results()
    assert [(r.status, r.bytes) for r in results] == [("done", 4096), ("done", 0)]
    assert whole.bytes() == data[:4096]
    assert standin.cuda.pending() == 0


class _ReportedBuffer(standin.DeviceBuffer):
    """Stand-in device memory that, as its finaliser frees it, writes to
    ``report`` whether the future's transfer had ended and a digest of what
    the memory held."""

    report: Any = None  # (path, future)

    # (What it calls is bound here: at the interpreter's exit the module's
    # names may be gone by the time it runs.)
    def __del__(self, _open=open, _digest=hashlib.sha256, _free=standin.DeviceBuffer.__del__) -> None:
        path, future = self.report
        with _open(path, "w") as out:
            out.write(f"{future.done()} {_digest(self.host.tobytes()).hexdigest()}")
        _free(self)


def scenario_transfer_in_flight_at_exit(folder, op, compat):
    """A pread or pwrite of 8 MiB of device memory, held at its third piece;
    the script ends holding the future (a module global) and the buffer only
    through it, and a thread that runs no Python lets the transfer go on a
    second later, while the interpreter exits."""
    import gdscp

    data = random_bytes(8 * MiB, 5)
    path = os.path.join(folder, "x.bin")
    with open(path, "wb") as out:
        out.write(data if op == "pread" else bytes(len(data)))
    gdscp.defaults.set({"compat_mode": compat, "num_threads": 2, "bounce_buffer_size": 64 * KiB,
                        "task_size": MiB, "gds_threshold": 0})
    f = gdscp.CuFile(path, "r+")
    ptr = standin.cuda.lib.gdscp_cuda_alloc(len(data), 0, 0)
    buf = _ReportedBuffer(ptr, len(data), free=lambda: standin.cuda.lib.gdscp_cuda_free(ptr))
    buf.set(data if op == "pwrite" else bytes(len(data)))
    lib = standin.cuda if compat == "on" else standin.cufile
    lib.gate({("pwrite", "on"): "cuMemcpyDtoHAsync", ("pread", "on"): "cuMemcpyHtoDAsync",
              ("pwrite", "off"): "cuFileWrite", ("pread", "off"): "cuFileRead"}[op, compat], 2)
    future = (f.pwrite if op == "pwrite" else f.pread)(buf)
    _ReportedBuffer.report = (os.path.join(folder, "freed"), future)
    _HELD_AT_EXIT.append((f, future))
    del buf
    assert lib.gate_wait(30)
    lib.release_after(1.0)
    raise SystemExit(0)  # the end of the script, the transfer in flight (no check_clean: it would wait)


_HELD_AT_EXIT: list = []


def scenario_device_appends(folder, compat):
    """Threads, each with its own CuFile(path, "a"), append records from
    device memory at once (through cuFile, or staged through pinned buffers):
    every record lands whole and once; raw and stream-ordered appends too."""
    import gdscp
    from test_concurrency import append_sizes, check_records, record

    path = os.path.join(folder, "log.bin")
    writers, count = 4, 16
    expected = {(w, s): n for w in range(writers) for s, n in enumerate(append_sizes(w, count))}
    errors = []
    start = threading.Barrier(writers)

    def work(w: int) -> None:
        try:
            with gdscp.CuFile(path, "a") as f:
                assert f.backend == ("cufile" if compat == "off" else "posix"), f.backend_reason
                start.wait(30)
                for seq, size in enumerate(append_sizes(w, count)):
                    src = standin.cuda.alloc(size).set(record(w, seq, size).tobytes())
                    if seq % 3 == 1:
                        assert f.raw_write(src, size) == size
                    else:
                        assert f.write(src, task_size=256 * KiB) == size
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with settings(compat_mode=compat, num_threads=4, gds_threshold=0, bounce_buffer_size=64 * KiB):
        threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "an appending thread never finished"
        if errors:
            raise errors[0]
        check_records(path, expected)
        # Stream-ordered appends land once, at the end, in stream order.
        stream = standin.cuda.stream()
        tail = [record(9, seq, 4096 * (seq + 1)) for seq in range(3)]
        with gdscp.CuFile(path, "a") as f:
            for seq, r in enumerate(tail):
                src = standin.cuda.alloc(r.nbytes).set(r.tobytes())
                assert f.raw_write_async(src, stream, r.nbytes).check_bytes_done() == r.nbytes
                expected[(9, seq)] = r.nbytes
        check_records(path, expected)


# -- GPU memory without CuPy: gdscp's own DeviceBuffer --------------------------------
def without_cupy() -> None:
    """Makes ``import cupy`` fail in this process, as where CuPy is not installed."""
    import sys

    sys.modules["cupy"] = None  # type: ignore[assignment]


def scenario_device_buffer(folder):
    """_core.DeviceBuffer: memory from cuMemAlloc on the GPU asked for, views
    by slicing that share it, synchronous fills and copies at offsets, clear
    errors, __cuda_array_interface__ and DLPack that gdscp's own I/O accepts,
    and cuMemFree once the last view is gone."""
    import gdscp
    from gdscp import _core

    without_cupy()
    m = mark()
    buf = _core.DeviceBuffer(3 * MiB, 1)
    (alloc,) = since(m, "cuMemAlloc", lib="cuda")
    assert alloc.result == 0 and alloc.size == 3 * MiB and alloc.ctx == standin.cuda.primary_context(1)
    assert buf.ptr == alloc.ptr and buf.nbytes == len(buf) == 3 * MiB and buf.device == 1
    assert buf.__cuda_array_interface__ == {"shape": (3 * MiB,), "typestr": "|u1", "data": (buf.ptr, False),
                                            "strides": None, "version": 3}
    assert buf.__dlpack_device__() == (2, 1)
    assert _core.dlpack_info(buf[5:105].__dlpack__()) == (buf.ptr + 5, 100, 2, 1, True, False)
    # Views share the memory; fills and copies land where they say.
    data = random_bytes(3 * MiB, seed=31)
    buf.copy_from_host(data)
    view = buf[MiB : 2 * MiB + 7]
    assert (view.ptr, len(view), view.device) == (buf.ptr + MiB, MiB + 7, 1)
    assert len(buf[10:5]) == 0 and len(buf[-3:]) == 3 and buf[-3:].ptr == buf.ptr + 3 * MiB - 3
    view[100:200].fill(0x5A)
    view.copy_from_host(b"hello", 3)
    back = bytearray(3 * MiB)
    buf.copy_to_host(back)
    want = bytearray(data)
    want[MiB + 100 : MiB + 200] = b"\x5a" * 100
    want[MiB + 3 : MiB + 8] = b"hello"
    assert bytes(back) == bytes(want)
    part = bytearray(1000)
    view.copy_to_host(part, 50)
    assert bytes(part) == bytes(want[MiB + 50 : MiB + 1050])
    # What does not fit, and slices that are not contiguous, are refused.
    for call in (lambda: view.copy_from_host(bytes(MiB + 8)), lambda: view.copy_to_host(bytearray(10), MiB),
                 lambda: buf[::2]):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ValueError, match="GPU 2 does not exist"):
        _core.DeviceBuffer(10, 2)
    standin.cuda.fail("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY)
    with pytest.raises(gdscp.CudaError, match="cuMemAlloc .*CUDA_ERROR_OUT_OF_MEMORY"):
        _core.DeviceBuffer(10, 0)
    empty = _core.DeviceBuffer(0, 0)
    assert empty.ptr == 0 and len(empty) == 0
    empty.fill(1)
    empty.copy_to_host(bytearray(0))
    # gdscp's I/O takes it through both interfaces, on both backends.
    path = new_file(folder, "d.bin", data)
    for compat in ("on", "off"):
        with settings(compat_mode=compat, gds_threshold=0, task_size=256 * KiB), gdscp.CuFile(path, "r+") as f:
            out = _core.DeviceBuffer(len(data), 1)
            out.fill(POISON)
            assert f.read(out) == len(data)
            assert bytes(to_bytes(out)) == data, compat
            half = _core.DeviceBuffer(MiB, 1)
            half.fill(0x11)
            assert f.write(DLPackOnly(half), file_offset=MiB) == MiB
            assert file_bytes(path)[MiB : 2 * MiB] == b"\x11" * MiB
            assert f.write(out[MiB : 2 * MiB], file_offset=MiB) == MiB
    assert file_bytes(path) == data
    # Freed with the last view (and capsule) of it.
    capsule = view.__dlpack__()
    del buf, out, half
    gc.collect()
    assert standin.cuda.driver_allocations()[0] == 1  # the one the view and its capsule share
    m = mark()
    del view, capsule
    gc.collect()
    (free,) = since(m, "cuMemFree", lib="cuda")
    assert free.ptr == alloc.ptr and free.ctx == standin.cuda.primary_context(1)
    del empty
    gc.collect()
    assert standin.cuda.driver_allocations()[0] == 0


def to_bytes(buf) -> bytearray:
    out = bytearray(len(buf))
    buf.copy_to_host(out)
    return out


def scenario_memory_without_cupy(folder):
    """gdscp.memory with the stand-in GPU and no CuPy: a GPU is available,
    allocate gives a DeviceBuffer, and fill, pattern, to_host, download,
    copy_from_host and first_difference agree byte for byte with the same
    operations on host memory, across the blocks they work in."""
    without_cupy()
    from gdscp import _core, memory

    status = memory.gpu_available()
    assert status and status.count == 1, status
    assert memory.usable_cupy() is None
    free, total = memory.device_memory(0)
    assert total == 16 << 30 and free == total
    size = 9 * MiB + 4097  # more than two of the 4 MiB blocks patterns are made in
    buf = memory.allocate(size, 0)
    assert isinstance(buf, _core.DeviceBuffer) and memory.is_device(buf) and len(buf) == size
    assert memory.device_memory(0)[0] == total - size
    with pytest.raises(memory.DeviceError):
        memory.allocate(10, 1)
    for kind, seed, offset in (("random", 7, 0), ("seq", 0, 12345), ("random", 3, 8 * MiB + 5), ("zeros", 0, 0)):
        m = mark()
        memory.fill(buf, kind, seed, offset)
        want = memory.pattern(size, kind, seed, offset)
        assert np.array_equal(memory.to_host(buf), want), (kind, seed, offset)
        copies = since(m, "cuMemcpyHtoD", lib="cuda")
        sets = since(m, "cuMemsetD8", lib="cuda")
        assert (len(sets), len(copies)) == ((1, 0) if kind == "zeros" else (0, 3)), (kind, len(sets), len(copies))
    memory.fill(buf[MiB:], "random", 5, MiB)
    host = memory.pattern(size, "random", 5, 0)
    host[:MiB] = 0
    assert memory.first_difference(buf, host) is None and memory.equal(host, buf)
    out = np.empty(2 * MiB, np.uint8)
    memory.download(buf[3 * MiB :], out)
    assert np.array_equal(out, host[3 * MiB : 5 * MiB])
    # Differences found where they are, in any block, device against device too.
    for where in (0, 4 * MiB - 1, 4 * MiB, 9 * MiB + 4096):
        other = memory.allocate(size, 0)
        memory.copy_from_host(other, host)
        memory.copy_from_host(other[where:], bytes([host[where] ^ 0xFF]))
        assert memory.first_difference(buf, other) == where
        assert memory.first_difference(host, other) == where
    assert memory.first_difference(buf[:100], host) == 100
    del buf, other


def scenario_cli_without_cupy(folder):
    """gdscp write, read, copy and benchmark with the stand-in GPU and without
    CuPy: each runs in GPU memory (gdscp's own, from cuMemAlloc, its bytes
    staged through pinned buffers), and every byte checks out."""
    import contextlib
    import io
    import json

    without_cupy()
    from gdscp import memory
    from gdscp.cli.app import run

    def gdscp(*args: str) -> dict:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run([*args, "--json"])
        assert code == 0, f"gdscp {' '.join(args)}: exit {code}\n{err.getvalue()}"
        assert "host memory instead" not in err.getvalue(), err.getvalue()
        return json.loads(out.getvalue())

    size = 9 * MiB + 12345
    path = os.path.join(folder, "w.bin")
    m = mark()
    doc = gdscp("write", path, "--size", str(size), "--pattern", "random", "--seed", "7", "--chunk-size", "4M",
                "--verify")
    assert doc["memory"] == "gpu" and doc["device"] == 0, doc
    assert file_bytes(path) == memory.pattern(size, "random", 7).tobytes()
    assert since(m, "cuMemAlloc", lib="cuda") and since(m, "cuMemcpyDtoHAsync", lib="cuda")

    m = mark()
    doc = gdscp("read", path, "--chunk-size", "2M", "--verify")
    assert doc["memory"] == "gpu" and doc["bytes"] == size and doc["verified"], doc
    assert sum(c.size for c in since(m, "cuMemcpyHtoDAsync", lib="cuda")) == size

    dst = os.path.join(folder, "copy.bin")
    doc = gdscp("copy", path, dst, "--device", "0", "--chunk-size", "1M", "--verify")
    assert doc["memory"] == "gpu" and doc["ok"], doc
    assert file_bytes(dst) == file_bytes(path)
    # Without --device a copy uses no GPU: inside the kernel, as cp copies.
    m = mark()
    plain = os.path.join(folder, "plain.bin")
    doc = gdscp("copy", path, plain, "--verify")
    assert doc["memory"] == "host" and doc["device"] is None and doc["ok"], doc
    assert file_bytes(plain) == file_bytes(path)
    assert not since(m, "cuMemcpyHtoDAsync", lib="cuda") and not since(m, "cuMemcpyDtoHAsync", lib="cuda")
    # The many-files benchmark times gdscp copy as it runs: without a GPU, though one is usable.
    doc = gdscp("benchmark", "--files", "12", "--file-size", "1K-8K", "--mode", "copy", "--runs", "3", "--dir", folder)
    (work,) = doc["workloads"]
    assert work["memory"] == "host" and work["results"][0]["what"].startswith("gdscp copy -r SRC"), work

    doc = gdscp("benchmark", "--size", "4M", "--threads", "1,2", "--io-size", "64K", "--ops", "100", "--runs", "3",
                "--dir", folder)
    assert doc["ok"] and doc["config"]["memory"] == "gpu", doc["config"]
    assert doc["baselines"]["numpy_cupy"] == {"available": False, "reason": "not measured: CuPy is not installed"}
    # The Python baseline's copy to and from the GPU is the driver's, as its calls say.
    assert doc["baselines"]["python"]["what"] == {
        "read": "open(path, 'rb', buffering=0).readinto(host) into a preallocated buffer then cuMemcpyHtoD into the "
                "device buffer",
        "write": "cuMemcpyDtoH into host then open(path, 'wb', buffering=0).write(host) then os.fsync",
        "randread": "f.seek(offset); f.readinto(view) then cuMemcpyHtoD into the device buffer, one call at a time",
    }
    assert doc["machine"]["gpu"]["available"] and doc["machine"]["gpu"]["cupy"] is None
    assert [g["name"] for g in doc["machine"]["gpu"]["devices"]] == ["gdscp stand-in GPU"]
    assert any(r["tool"] == "gdscp" for r in doc["results"])


def scenario_parts_through_device_staging(folder, compat):
    """Ranges of a file copied through GPU staging (the POSIX path, or cuFile)
    into an existing temporary file at their offsets, as MPI ranks share a
    large file: every byte lands, nothing is renamed."""
    import gdscp.bulk

    data = random_bytes(3 * MiB + 4097, seed=5)
    src = new_file(folder, "parts-src.bin", data)
    fd, tmp = gdscp.bulk.create_temporary(os.path.join(folder, "parts-dst.bin"))
    try:
        os.ftruncate(fd, len(data))
        cuts = [0, 1, 4096, MiB + 1, len(data)]
        ranges = [(a, b - a) for a, b in zip(cuts, cuts[1:])]
        with settings(compat_mode=compat, gds_threshold=0, num_threads=4):
            job = gdscp.bulk.copy_files([(src, tmp)] * len(ranges), device=0, ranges=ranges, verify=True,
                                        clean=False, staging_size=4 * MiB)
            results = job.results()
        assert [r.status for r in results] == ["done"] * len(ranges), [r.error for r in results]
        assert file_bytes(tmp) == data
        assert not os.path.exists(os.path.join(folder, "parts-dst.bin"))
        if compat == "off":
            assert {r.write_backend for r in results} == {"cufile"}, results
    finally:
        os.close(fd)


def scenario_pinned_staging_registered(folder):
    """Pinned staging buffers are the process's own pages, registered with
    cuMemHostRegister (never cuMemHostAlloc, which the driver serialises across
    threads); one of 2 MiB or more starts on a 2 MiB boundary, so that huge
    pages can back it. A read and a write through them move every byte, and
    trim_pools unregisters each buffer once."""
    import gdscp
    import gdscp.memory
    from gdscp import _core

    without_cupy()
    data = random_bytes(13 * MiB + 5, seed=21)
    path = new_file(folder, "s.bin", data)
    for staging in (4 * MiB, 64 * KiB + 4096):
        _core.trim_pools()
        m = mark()
        with settings(compat_mode="on", num_threads=4, bounce_buffer_size=staging, task_size=2 * MiB):
            read_and_write_back(path, data, os.path.join(folder, "s.out"))
        assert since(m, "cuMemHostAlloc", lib="cuda") == []
        registered = [c for c in since(m, "cuMemHostRegister", lib="cuda") if c.result == 0]
        assert registered and all(c.size >= staging and c.host % 4096 == 0 for c in registered), staging
        if staging >= 2 * MiB:
            assert all(c.host % (2 * MiB) == 0 for c in registered), [hex(c.host) for c in registered]
        m = mark()
        _core.trim_pools()
        unregistered = sorted(c.host for c in since(m, "cuMemHostUnregister", lib="cuda") if c.result == 0)
        assert unregistered == sorted(c.host for c in registered)


def scenario_prepare(folder):
    """gdscp.prepare makes a pipeline's worth of pinned staging per worker
    (num_threads x pipeline_depth of bounce_buffer_size), registered once
    each, on the workers; the reads and writes after it take those buffers
    and register none, moving every byte; preparing again makes none, and
    trim_pools frees them. A GPU that does not exist, or no workers, is an
    error that makes nothing."""
    import gdscp
    import gdscp.memory
    from gdscp import _core

    without_cupy()
    data = random_bytes(9 * MiB + 3, seed=23)
    path = new_file(folder, "p.bin", data)
    _core.trim_pools()
    with settings(compat_mode="on", num_threads=4, bounce_buffer_size=MiB, pipeline_depth=3, task_size=MiB):
        m = mark()
        gdscp.prepare(0)
        made = [c for c in since(m, "cuMemHostRegister", lib="cuda") if c.result == 0]
        assert len(made) == 4 * 3 and all(c.size >= MiB for c in made), [(hex(c.host), c.size) for c in made]
        assert len({c.host for c in made}) == 12
        assert since(m, "cuStreamCreate", lib="cuda"), "no worker made its stream"
        m = mark()
        gdscp.prepare(0)
        gdscp.prepare(0, workers=2)
        read_and_write_back(path, data, os.path.join(folder, "p.out"))
        assert [c for c in since(m, "cuMemHostRegister", lib="cuda") if c.result == 0] == []
        m = mark()
        gdscp.prepare(0, workers=10**6)  # no more than the pool's 4 workers: all made already
        assert since(m, "cuMemHostRegister", lib="cuda") == []
        m = mark()
        for bad, error in ((5, gdscp.memory.DeviceError), (-1, gdscp.memory.DeviceError)):
            with pytest.raises(error):
                gdscp.prepare(bad)
        with pytest.raises(ValueError, match="workers"):
            gdscp.prepare(0, workers=0)
        # Not integers: refused, not truncated (0.5 was GPU 0) nor compared with one.
        for kwargs, name in (({"device": 0.5}, "device"), ({"device": "0"}, "device"), ({"device": None}, "device"),
                             ({"device": 0, "workers": 1.5}, "workers"), ({"device": 0, "workers": "2"}, "workers")):
            with pytest.raises(TypeError, match=name):
                gdscp.prepare(**kwargs)
        gdscp.prepare(np.int64(0), workers=2**70)  # all 4 made already
        assert since(m, "cuMemHostRegister", lib="cuda") == []
        # The driver refusing a buffer: prepare raises its error, and the next
        # prepare makes what is missing.
        _core.trim_pools()
        standin.cuda.fail("cuMemHostRegister", CUDA_ERROR_OUT_OF_MEMORY, skip=5)
        with pytest.raises(gdscp.CudaError, match="cuMemHostRegister"):
            gdscp.prepare(0)
        m = mark()
        gdscp.prepare(0)
        made_again = [c for c in since(m, "cuMemHostRegister", lib="cuda") if c.result == 0]
        assert len(made_again) == 1, made_again  # 11 of the 12 were made the first time
        made = [c for c in since((0, 0), "cuMemHostRegister", lib="cuda") if c.result == 0][-12:]
    m = mark()
    _core.trim_pools()
    freed = sorted(c.host for c in since(m, "cuMemHostUnregister", lib="cuda") if c.result == 0)
    assert freed == sorted(c.host for c in made)


def scenario_bulk_reads_queued(folder, depth):
    """Many files read into slices of one device buffer and through device
    staging: each worker reads its next file while the copies of the ones
    before run (no stream drain per file), and every byte lands, whatever the
    sizes (pieces of a 64 KiB staging buffer, so files of several pieces wrap
    the ring). A file that cannot be read, or ends before its range, fails
    alone and never counts bytes that did not land."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    sizes = [0, 1, 4095, 4096, 4097, 64 * KiB - 1, 64 * KiB + 1, 200 * KiB + 7, MiB + 3] * 12
    datas = [random_bytes(n, seed=100 + i) for i, n in enumerate(sizes)]
    paths = [new_file(folder, f"q{i:03d}.bin", d) for i, d in enumerate(datas)]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    total = sum(sizes)
    values = {"compat_mode": "on", "num_threads": 4, "bounce_buffer_size": 64 * KiB, "pipeline_depth": depth}
    with settings(**values):
        buf = gdscp.memory.allocate(total + 1, 0)
        views = [buf[o : o + n] for o, n in zip(offsets, sizes)]
        m = mark()
        job = gdscp.read_files(paths, views)
        results = job.results()
        syncs = len(since(m, "cuStreamSynchronize", lib="cuda"))
    assert [r.status for r in results] == ["done"] * len(sizes), [r.error for r in results if r.error]
    assert [r.bytes for r in results] == sizes
    assert bytes(gdscp.memory.to_host(buf[:total])) == b"".join(datas)
    # Drained when a worker runs out of files (and when one cannot be read),
    # not once per file: 108 files on 4 workers.
    assert syncs <= 3 * 4, syncs
    assert job.progress().bytes_done == total

    # Through device staging, the bytes dropped once landed: every file counted whole.
    with settings(**values):
        job = gdscp.bulk.stream_files(paths, device=0, staging_size=4 * 128 * KiB)
        results = job.results()
    assert [r.bytes for r in results] == sizes and {r.status for r in results} == {"done"}

    # Failures among queued reads: a directory, a vanished file, and a range
    # past the end of its file; the others land whole.
    os.mkdir(os.path.join(folder, "adir"))
    bad = list(paths)
    bad[5] = os.path.join(folder, "adir")
    bad[17] = os.path.join(folder, "gone.bin")
    ranges = [(0, None)] * len(paths)
    ranges[30] = (0, sizes[30] + 1)  # ends one byte early
    with settings(**values):
        buf = gdscp.memory.allocate(total + 1, 0)
        views = [buf[o : o + n] for o, n in zip(offsets, sizes)]
        job = gdscp.read_files(bad, views)
        results = job.results()
        streamed = gdscp.bulk.stream_files(paths, device=0, ranges=ranges).results()
    failed = [i for i, r in enumerate(results) if r.status != "done"]
    assert failed == [5, 17], [(i, r.error) for i, r in enumerate(results) if r.error]
    landed = gdscp.memory.to_host(buf[:total])
    for i, (o, n) in enumerate(zip(offsets, sizes)):
        if i not in failed:
            assert results[i].bytes == n and bytes(landed[o : o + n]) == datas[i], i
    assert [i for i, r in enumerate(streamed) if r.status != "done"] == [30]
    assert "has no bytes [0, " in streamed[30].error, streamed[30].error


def scenario_bulk_copy_failure_mid_file(folder):
    """A copy that fails on a piece before a file's last one, found while the
    worker already reads the next file, fails the file it belongs to (naming
    the driver's error), not the next one, and is not lost: each file's
    pieces wrap a ring of two staging buffers, so the failing wait is for a
    piece in the middle of the first file."""
    import gdscp
    import gdscp.memory

    without_cupy()
    piece = 64 * KiB
    datas = [random_bytes(5 * piece, seed=200 + i) for i in range(2)]
    paths = [new_file(folder, f"m{i}.bin", d) for i, d in enumerate(datas)]
    values = {"compat_mode": "on", "num_threads": 1, "bounce_buffer_size": piece, "pipeline_depth": 2}
    with settings(**values):
        buf = gdscp.memory.allocate(len(datas[0]) + len(datas[1]), 0)
        # The first file's pieces go round slots 0, 1, 0, 1, 0: its first three
        # are waited for while it is read, its fourth (slot 1) once the second
        # file's first piece needs that slot, and its last after that.
        standin.cuda.fail("cuEventSynchronize", CUDA_ERROR_ILLEGAL_ADDRESS, skip=3)
        m = mark()
        results = gdscp.read_files(paths, [buf[: len(datas[0])], buf[len(datas[0]) :]]).results()
        waits = since(m, "cuEventSynchronize", lib="cuda")
    assert [c.result for c in waits[:5]] == [0, 0, 0, CUDA_ERROR_ILLEGAL_ADDRESS, 0], [c.result for c in waits]
    assert [r.status for r in results] == ["failed", "done"], [r.error for r in results]
    assert "cuEventSynchronize: CUDA_ERROR_ILLEGAL_ADDRESS" in results[0].error, results[0].error
    assert results[0].bytes == 0
    assert results[1].bytes == len(datas[1])
    assert bytes(gdscp.memory.to_host(buf[len(datas[0]) :])) == datas[1]


def scenario_slow_close(folder):
    """While close() is still letting go of the file (its cuFile handle's
    deregistration held at a gate, as a slow close(2) on a network filesystem
    would hold it), the handle answers at once, though those calls hold the
    GIL: closed, fileno() -1, no O_DIRECT, I/O a ClosedFileError. The
    descriptor stays open until the deregistration is done."""
    import gdscp

    data = random_bytes(8192, seed=61)
    path = new_file(folder, "c.bin", data)
    with settings(compat_mode="off"):
        f = gdscp.CuFile(path, "r+")
    assert f.backend == "cufile", f.backend_reason
    fd = f.fileno()
    m = mark()
    standin.cufile.gate("cuFileHandleDeregister")
    closing = threading.Thread(target=f.close)
    closing.start()
    try:
        assert standin.cufile.gate_wait(30), "close() never reached cuFileHandleDeregister"
        assert f.closed and f.fileno() == -1 and not f.is_direct_io_supported()
        assert "closed" in repr(f)
        with pytest.raises(gdscp.ClosedFileError):
            f.read(poisoned(100))
        assert os.path.samefile(f"/proc/self/fd/{fd}", path)
    finally:
        standin.cufile.release()
        closing.join()
    (dereg,) = since(m, "cuFileHandleDeregister")
    assert dereg.flags & standin.FD_OPEN
    assert standin.cufile.live_handles() == 0


def scenario_thread_streams_reused(folder):
    """Small reads and writes of device memory, and raw ones, run on the
    calling thread with a CUDA stream and events of that thread's own. A
    program that starts a thread per request must not leave a stream behind
    for every thread that has ended: the next thread takes it over, so a
    hundred threads one after another make one stream, not a hundred."""
    import gdscp

    data = random_bytes(64 * KiB + 5, seed=41)
    path = new_file(folder, "threads.bin", data)
    with settings(compat_mode="on"), gdscp.CuFile(path, "r+") as f:
        def work(i: int) -> None:
            buf = poisoned(len(data) + 2)
            size, offset = len(data) - i, i
            assert f.read(buf[2:], size, offset) == size
            got = buf.bytes()
            assert got[2 : 2 + size] == data[offset:] and got[:2] == bytes([POISON]) * 2
            assert f.raw_read(buf, size, offset, 1) == size and buf.bytes()[1 : 1 + size] == data[offset:]
            src = standin.cuda.alloc(len(data)).set(data)
            assert f.write(src, size, offset) == size and f.raw_write(src, size, offset, offset) == size

        m = mark()
        for i in range(100):
            t = threading.Thread(target=work, args=(i,))
            t.start()
            t.join()
            # join() returns once the thread's Python code is done; its C++
            # thread-local state is let go of as the thread itself ends after.
            while os.path.exists(f"/proc/self/task/{t.native_id}"):
                time.sleep(0.001)
        made = len(since(m, "cuStreamCreate", lib="cuda"))
        assert made == 1, f"{made} CUDA streams made by 100 threads that ran one after another"
    assert file_bytes(path) == data


class _Masked:
    """Device memory whose __cuda_array_interface__ carries a mask (itself an
    object with the interface, as Numba's masked arrays give)."""

    def __init__(self, buf: standin.DeviceBuffer, mask):
        self.buf = buf
        self.mask = mask

    @property
    def __cuda_array_interface__(self) -> dict:
        return {**self.buf.__cuda_array_interface__, "mask": self.mask}


def scenario_masked_device_array(folder):
    """A __cuda_array_interface__ with a mask is a NotImplementedError, as
    KvikIO raises, wherever a buffer is taken (CuFile calls, futures, bulk
    jobs), before any byte moves: its invalid elements are only marked in the
    mask, and moving the data bytes alone would treat them as valid. A mask of
    None is no mask."""
    import gdscp

    data = random_bytes(64 * KiB + 3, seed=51)
    path = new_file(folder, "m.bin", data)
    out = os.path.join(folder, "out.bin")
    mask = standin.cuda.alloc(len(data)).fill(1)
    with settings(compat_mode="on", gds_threshold=0):
        with gdscp.CuFile(path, "r+") as f:
            target = poisoned(len(data))
            source = standin.cuda.alloc(len(data)).set(bytes(reversed(data)))
            for call in (lambda: f.read(_Masked(target, mask)), lambda: f.pread(_Masked(target, mask)).get(),
                         lambda: f.raw_read(_Masked(target, mask)), lambda: f.write(_Masked(source, mask)),
                         lambda: f.pwrite(_Masked(source, mask)).get(),
                         lambda: gdscp.read_files([path], [_Masked(target, mask)]).results(),
                         lambda: gdscp.write_files([_Masked(source, mask)], [out]).results()):
                with pytest.raises(NotImplementedError, match="__cuda_array_interface__ has a mask"):
                    call()
            assert target.bytes() == bytes([POISON]) * len(data)
            assert file_bytes(path) == data and not os.path.exists(out)
            assert f.read(_Masked(target, None)) == len(data) and target.bytes() == data


def scenario_bounce_buffer_too_large(folder):
    """bounce_buffer_size takes any size KvikIO takes, up to 2**64-1; staging
    buffers of a size no machine can map fail a device transfer with a
    MemoryError that names the buffer, its size, the setting and the OS's
    reason (not a bare "std::bad_alloc"), and the next transfer at a sane size
    moves exact bytes."""
    import gdscp

    data = random_bytes(MiB + 77, seed=41)
    path = new_file(folder, "b.bin", data)
    base = {"compat_mode": "on", "gds_threshold": 0}
    for size, shown in ((1 << 50, 1 << 50), (2**64 - 1, 2**64 - 1)):
        with settings(**base, bounce_buffer_size=size), gdscp.CuFile(path, "r+") as f:
            for op in ("read", "write"):
                buf = poisoned(len(data)) if op == "read" else standin.cuda.alloc(len(data)).set(data)
                with pytest.raises(MemoryError) as info:
                    (f.read if op == "read" else f.write)(buf)
                message = str(info.value)
                assert message.startswith(f"cannot allocate a pinned staging buffer of {shown} bytes "), message
                assert "bounce_buffer_size" in message and "Cannot allocate memory" in message, message
                if op == "read":
                    assert buf.bytes() == bytes([POISON]) * len(data)
            [r] = gdscp.read_files([path], [poisoned(len(data))]).results()
            assert r.status == "failed" and "bounce_buffer_size" in r.error, (r.status, r.error)
        assert file_bytes(path) == data
        assert standin.cuda.pending() == 0
        with settings(**base, bounce_buffer_size=64 * KiB), gdscp.CuFile(path, "r") as f:
            buf = poisoned(len(data))
            assert f.read(buf) == len(data) and buf.bytes() == data


def scenario_pinned_staging_past_the_memory_available(folder):
    """Pinned staging is populated whole and can be neither swapped nor
    reclaimed, and the kernel may map more than there is (overcommit): a
    buffer past the memory available would be populated until the OOM killer
    ended the process. Against the memory available (the figure
    /proc/meminfo gives, made small here), a staging buffer past it fails
    the transfer, or gdscp.prepare, with a MemoryError that names the
    buffer, the setting and what is available, before anything is mapped or
    moved; buffers that fit move exact bytes."""
    import gdscp
    from gdscp import _core

    data = random_bytes(MiB + 77, seed=43)
    path = new_file(folder, "m.bin", data)
    base = {"compat_mode": "on", "gds_threshold": 0, "num_threads": 2}
    said = ("cannot allocate a pinned staging buffer of 16777216 bytes (bounce_buffer_size sets its size): Cannot "
            "allocate memory (8388608 bytes of memory are available)")
    _core.testing.arm_memory_available(8 * MiB)
    try:
        m = mark()
        with settings(**base, bounce_buffer_size=16 * MiB), gdscp.CuFile(path, "r+") as f:
            for op in ("read", "write"):
                buf = poisoned(len(data)) if op == "read" else standin.cuda.alloc(len(data)).set(data)
                with pytest.raises(MemoryError) as info:
                    (f.read if op == "read" else f.write)(buf)
                assert str(info.value) == said
                if op == "read":
                    assert buf.bytes() == bytes([POISON]) * len(data)
            with pytest.raises(MemoryError) as info:
                gdscp.prepare(0)
            assert str(info.value) == said
        assert since(m, "cuMemHostRegister", lib="cuda") == []
        assert file_bytes(path) == data
        with settings(**base, bounce_buffer_size=MiB), gdscp.CuFile(path, "r") as f:
            buf = poisoned(len(data))
            assert f.read(buf) == len(data) and buf.bytes() == data
    finally:
        _core.testing.disarm_fault()


def scenario_default_streams(folder, compat):
    """An array whose ``__cuda_array_interface__`` names the legacy default
    stream (1) or the per-thread one (2) may still have work queued there, a
    kernel filling it: a read lands after that work and a write takes its
    result, on the POSIX path and through cuFile (whose I/O is not ordered on
    any stream), for a synchronous small call and one split into tasks.
    Stream 0, which the interface disallows as ambiguous, is taken (as
    KvikIO takes any stream) for CUDA's handle 0, the legacy default stream."""
    import gdscp

    CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
    data = random_bytes(2 * MiB, seed=41)
    path = new_file(folder, "streams.bin", data)
    standin.cuda.make_current(0)  # as CuPy leaves the thread that queued the work
    with settings(compat_mode=compat, num_threads=4, task_size=MiB), gdscp.CuFile(path, "r+") as f:
        for stream in (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD):
            for size in (4096, 2 * MiB):
                case = f"stream={stream} size={size} compat={compat}"
                buf = poisoned(size)
                standin.cuda.fill_async(stream, buf, 0x11)
                assert f.read(buf.with_stream(stream), size, 0) == size, case
                assert standin.cuda.pending() == 0, case  # the fill ran before the read, not after it
                assert buf.bytes() == data[:size], case
                src = standin.cuda.alloc(size).set(data[:size])
                standin.cuda.fill_async(stream, src, 0x5A)
                assert f.write(src.with_stream(stream), size, 0) == size, case
                assert file_bytes(path)[:size] == b"\x5a" * size, case
                with open(path, "r+b") as raw:
                    raw.write(data)
        # The per-thread default stream is the caller's own in the memory's
        # context, waited for even where the caller's thread has no current
        # context left (or another device's).
        for current in (-1, 1):
            buf = poisoned(4096)
            standin.cuda.make_current(0)
            standin.cuda.fill_async(CU_STREAM_PER_THREAD, buf, 0x22)
            standin.cuda.make_current(current)
            assert f.read(buf.with_stream(CU_STREAM_PER_THREAD), 4096, 0) == 4096, current
            assert standin.cuda.pending() == 0 and buf.bytes() == data[:4096], current


def scenario_small_sizes(folder, compat):
    """Staging buffers and tasks of any positive size, KvikIO's values below a
    page among them, move exactly the bytes asked for into and out of device
    memory; the engine stages at least a page at a time all the same."""
    import gdscp

    data = random_bytes(MiB + 4097, seed=21)
    path = new_file(folder, "small.bin", data)
    for setting, value in (("bounce_buffer_size", 1), ("bounce_buffer_size", 3), ("bounce_buffer_size", 4095),
                           ("task_size", 1), ("task_size", 100), ("task_size", 4095)):
        case = f"{setting}={value} compat={compat}"
        values = {setting: value, "compat_mode": compat, "num_threads": 4, "gds_threshold": 0}
        with settings(**values), gdscp.CuFile(path, "r+") as f:
            assert gdscp.defaults.get(setting) == value
            buf = poisoned(len(data) + 3)
            m = mark()
            assert f.read(buf[1:], len(data) - 5, 5) == len(data) - 5, case
            got = buf.bytes()
            assert got[1 : len(data) - 4] == data[5:], case
            assert got[:1] + got[len(data) - 4 :] == bytes([POISON]) * 8, case
            moved = since(m, "cuMemcpyHtoDAsync", lib="cuda") if compat == "on" else since(m, "cuFileRead")
            pieces = len(moved)
            assert pieces and pieces <= len(data) // 4096 + 8, (case, pieces)  # a page or more each
            future = f.pread(buf, 1000, 77, task_size=value if setting == "task_size" else None)
            assert future.get() == 1000 and buf.bytes()[:1000] == data[77:1077], case
            new = random_bytes(300_001, seed=value)
            src = standin.cuda.alloc(300_001).set(new)
            assert f.write(src, file_offset=12_345) == 300_001, case
            assert file_bytes(path) == data[:12_345] + new + data[12_345 + 300_001 :], case
            assert f.write(standin.cuda.alloc(300_001).set(data[12_345 : 12_345 + 300_001]),
                           file_offset=12_345) == 300_001
    assert file_bytes(path) == data


def scenario_small_synchronous(folder, compat):
    """CuFile.read/write below gds_threshold run on the calling thread without a
    future: byte-exact at page edges, unaligned offsets and past the end of the
    file; through the POSIX path each read is one copy out of a pinned staging
    buffer, with no event recorded (nothing waits for it but the stream's end)."""
    import gdscp

    data = random_bytes(3 * 4096 + 77, seed=33)
    path = new_file(folder, "s.bin", data)
    with settings(compat_mode=compat), gdscp.CuFile(path, "r+") as f:
        for size in (0, 1, 4095, 4096, 4097, 64 * KiB):
            for offset in (0, 3, 4097, len(data) - 10, len(data), len(data) + 4096):
                case = f"size={size} offset={offset} compat={compat}"
                buf = poisoned(size + 8)
                m = mark()
                n = f.read(buf[3 : 3 + size], size, offset)
                want = data[offset : offset + size]
                assert n == len(want), case
                got = buf.bytes()
                assert got[3 : 3 + n] == want, case
                assert got[:3] + got[3 + n :] == bytes([POISON]) * (size + 8 - n), case
                if compat == "on":
                    copies = since(m, "cuMemcpyHtoDAsync", lib="cuda")
                    assert len(copies) == (1 if n else 0), case
                    assert all(c.flags & standin.PINNED_HOST and c.size == n for c in copies), case
                    assert since(m, "cuEventRecord", lib="cuda") == [], case
        for size in (1, 4095, 4097):
            for offset in (0, 5, 8191):
                new = random_bytes(size, seed=size * 7 + offset)
                src = standin.cuda.alloc(size + 2).set(b"xy" + new)
                assert f.write(src[2:], size, offset) == size
                expect = data[:offset] + new + data[offset + size :]
                assert file_bytes(path) == expect, (size, offset)
                with open(path, "r+b") as raw:
                    raw.write(data)


def scenario_device_futures_report_the_file(folder, compat):
    """pread/pwrite of device memory on a file not open for them, or closed,
    return a future whose get() raises, as on host memory and in KvikIO:
    small requests and ones split among the workers alike. Nothing moves: no
    cuFile transfer and no copy to or from the GPU."""
    import gdscp

    data = random_bytes(MiB + 5, seed=71)
    path = new_file(folder, "f.bin", data)
    written = os.path.join(folder, "w.bin")
    for size, task_size in ((100, None), (MiB, 64 * KiB)):
        dst = poisoned(size)
        src = standin.cuda.alloc(size).fill(7)
        with settings(compat_mode=compat):
            r = gdscp.CuFile(path, "r")
            w = gdscp.CuFile(written, "w")
        m = mark()
        futures = [r.pwrite(src, None, 0, task_size), w.pread(dst, None, 0, task_size)]
        r.close()
        w.close()
        futures += [r.pread(dst, None, 0, task_size), w.pwrite(src, None, 0, task_size)]
        for future, kind in zip(futures, (OSError, OSError, gdscp.ClosedFileError, gdscp.ClosedFileError)):
            assert isinstance(future, gdscp.IOFuture) and future.done()
            with pytest.raises(kind) as info:
                future.get()
            assert isinstance(info.value, RuntimeError)
            if kind is OSError:
                assert info.value.errno == errno.EBADF
        assert since(m, "cuFileRead", "cuFileWrite") == []
        assert since(m, "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyHtoD", "cuMemcpyDtoH", lib="cuda") == []
        assert dst.bytes() == bytes([POISON]) * size
    assert file_bytes(path) == data and file_bytes(written) == b""


def scenario_mmap(folder):
    """Mmap reads into device memory: out of the mapping into pinned staging
    buffers, then copied to the GPU; any range, any staging size, in parallel
    or not; the region's bounds and a closed mapping raise as KvikIO's do."""
    import gdscp

    data = random_bytes(3 * MiB + 333, seed=22)
    path = new_file(folder, "mapped.bin", data)
    for bounce in (1, 4096, 64 * KiB, MiB):
        for threads in (1, 4):
            with settings(bounce_buffer_size=bounce, num_threads=threads, gds_threshold=0), gdscp.Mmap(path) as m:
                case = f"bounce={bounce} threads={threads}"
                buf = poisoned(len(data))
                cm = mark()
                assert m.read(buf) == len(data), case
                assert buf.bytes() == data, case
                copies = since(cm, "cuMemcpyHtoDAsync", lib="cuda")
                assert copies and all(c.flags & standin.PINNED_HOST for c in copies), case
                assert all(c.size <= max(bounce, 4096) for c in copies), case
                assert sum(c.size for c in copies) == len(data), case
                for offset, size in ((1, 4096), (4095, 2), (MiB - 3, MiB + 7), (len(data) - 1, 1)):
                    part = poisoned(size + 2)
                    assert m.pread(part[1 : size + 1], size, offset, task_size=64 * KiB).get() == size, case
                    got = part.bytes()
                    assert got[1 : size + 1] == data[offset : offset + size], (case, offset, size)
                    assert got[:1] + got[size + 1 :] == bytes([POISON]) * 2, case
    with gdscp.Mmap(path, "r", MiB, 5000) as m:
        buf = poisoned(MiB)
        assert m.read(buf, MiB, 5000) == MiB and buf.bytes() == data[5000 : 5000 + MiB]
        with pytest.raises(IndexError):
            m.read(buf, 10, 4999)
        with pytest.raises(ValueError):
            m.read(buf[:10], 11, 5000)
    with pytest.raises(RuntimeError, match="closed"):
        m.read(buf, 10, 5000)
    # An empty GPU array has no address (CuPy's data pointer is 0): nothing to
    # copy, 0 bytes, from pread as from read.
    with gdscp.Mmap(path) as m:
        empty = EmptyDeviceArray()
        for offset in (0, 5000, len(data)):
            assert m.read(empty, 0, offset) == 0 and m.pread(empty, 0, offset).get() == 0
        assert m.pread(empty, None, len(data)).get() == 0
    # A CUDA failure on the way: an exception naming the call, the pipeline drained.
    standin.cuda.fail("cuMemcpyHtoDAsync", CUDA_ERROR_ILLEGAL_ADDRESS, skip=1)
    with settings(bounce_buffer_size=MiB), gdscp.Mmap(path) as m:
        with pytest.raises(gdscp.CudaError, match="cuMemcpyHtoDAsync") as info:
            m.read(poisoned(len(data)))
        assert info.value.code == CUDA_ERROR_ILLEGAL_ADDRESS
        buf = poisoned(len(data))
        assert m.read(buf) == len(data) and buf.bytes() == data  # and the next read works


def scenario_mmap_cancel(folder):
    """A pread into device memory cancelled while one of its copies to the GPU
    waits (the other workers' pieces run on past it): get() counts only the
    bytes moved without a gap from the start, every one of them right, and
    cancelled() is True, for an Mmap as for a CuFile staged the same way."""
    import gdscp

    size = 32 * MiB
    data = np.random.default_rng(23).integers(0, 255, size, dtype=np.uint8)
    data[data == POISON] = 0xFF  # no byte of the file is the poison: where the copy stopped shows
    path = new_file(folder, "cancel.bin", data.tobytes())
    with settings(compat_mode="on", bounce_buffer_size=64 * KiB, num_threads=4, gds_threshold=0):
        for kind in ("Mmap", "CuFile"):
            with getattr(gdscp, kind)(path) as f:
                buf = poisoned(size)
                standin.cuda.gate("cuMemcpyHtoDAsync", skip=40)
                try:
                    fut = f.pread(buf, size, 0, task_size=4 * MiB)
                    assert standin.cuda.gate_wait(30), f"{kind}: no copy reached the gate"
                    fut.cancel()
                finally:
                    standin.cuda.release()
                n = fut.get()
                got = buf.host
                assert n < size, (kind, n)
                assert np.array_equal(got[:n], data[:n]), (kind, n)
                assert got[n] == POISON, (kind, n)  # the first byte not moved is where the count ends
                assert fut.cancelled(), kind
            with getattr(gdscp, kind)(path) as f:  # and the next read is whole
                buf = poisoned(size)
                fut = f.pread(buf, size, 0, task_size=4 * MiB)
                assert fut.get() == size and not fut.cancelled() and buf.bytes() == data.tobytes(), kind


def scenario_kvikio_program(folder, compat):
    """tests/kvikio_program.py on the stand-ins' device memory."""
    import gdscp as kvikio
    import kvikio_program

    class StandinMemory:
        device = True

        def empty(self, nbytes):
            return poisoned(nbytes)

        def from_bytes(self, data):
            return standin.cuda.alloc(len(data)).set(data)

        def to_bytes(self, array):
            return array.bytes()

        def stream(self):
            return standin.cuda.stream()

    mode = None if compat is None else kvikio.CompatMode.ON if compat == "on" else kvikio.CompatMode.OFF
    kvikio_program.run(kvikio, StandinMemory(), folder, mode)
