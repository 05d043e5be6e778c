"""Jobs over several GPUs, end to end, on the libcuda/libcufile stand-ins with
two or three emulated devices (tests/standin): files and large files' chunks
shared out among the GPUs by bytes, each through its own staging; one file
read once into every GPU (replicate), GPU to GPU where peers reach each other
and from one pinned host chunk where they do not; a GPU failing mid-job; and
pinned staging placed on the NUMA node sysfs names for each GPU.

Each scenario runs in a child process (as in test_cufile_standin.py) and
checks bytes against the files, and the calls the engine made against the
stand-ins' logs. The tests at the end need two real GPUs and skip with fewer.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import standin
from conftest import random_bytes, wait_for_held_workers
from test_cufile_standin import file_bytes, folder, go, mark, new_file, settings, since, standin_build, without_cupy

__all__ = ["folder", "go", "standin_build"]  # fixtures, imported for this module's tests

MiB = 1 << 20
KiB = 1 << 10
CUDA_ERROR_ECC_UNCORRECTABLE = 214
STANDIN_PINNED = 0x2  # on cuMemcpyPeerAsync: peer access was enabled (a direct copy)

# Sizes at the edges: empty, one byte, a page less and more, and files cut
# into chunks (1 MiB staging slots below).
EDGE_SIZES = [0, 1, 4095, 4097, 3 * MiB + 5, 9 * MiB + 1]


# ==========================================================================
# the tests
# ==========================================================================
def test_stream_reads_share_a_large_file_among_gpus_by_bytes(go):
    go(scenario_stream_balanced, devices=3)


def test_reads_into_arrays_spread_over_gpus(go):
    go(scenario_read_files_spread, devices=3)


def test_copies_through_several_gpus_are_byte_exact(go):
    go(scenario_copies_spread, devices=2)


def test_writes_from_several_gpus_are_byte_exact(go):
    go(scenario_writes_spread, devices=3)


@pytest.mark.parametrize("compat", ["on", "off"])
def test_replicate_reads_once_and_copies_gpu_to_gpu(go, compat):
    go(scenario_replicate_peer, devices=3, compat=compat)


def test_replicate_without_peer_access_fans_out_one_host_chunk(go):
    go(scenario_replicate_no_peer, devices=2)


def test_a_gpu_failing_mid_copy_leaves_no_partial_destination(go):
    go(scenario_gpu_fails_mid_copy, devices=2)


def test_fail_fast_ends_a_job_whose_other_gpu_waits(go):
    go(scenario_fail_fast_with_a_waiting_gpu, devices=2)


def test_a_cancelled_job_over_gpus_queued_behind_another_ends_at_once(go):
    go(scenario_cancel_queued_spread, devices=2)


def test_bad_device_lists_are_clear_errors(go):
    go(scenario_device_errors, devices=2)


def test_pinned_staging_goes_to_the_gpus_numa_node(go, tmp_path):
    go(scenario_numa_staging, devices=2, sysfs=str(tmp_path / "sys"))


def test_preparing_two_gpus_stocks_staging_for_both(go, tmp_path):
    go(scenario_prepare_two_gpus, devices=2, sysfs=str(tmp_path / "sys"))


def test_command_line_devices_and_replicate(go):
    go(scenario_command_line, devices=2)


def test_benchmark_devices_files_are_its_own(go, tmp_path):
    go(scenario_benchmark_devices_files, devices=2, outside=str(tmp_path))


def test_benchmark_devices_checks_every_option_before_writing(go):
    go(scenario_benchmark_devices_checks, devices=2)


def test_benchmark_devices_removes_its_files_through_a_second_interrupt(go):
    go(scenario_benchmark_devices_interrupted, devices=2)


# ==========================================================================
# scenarios (child processes)
# ==========================================================================
def _files(folder: str, sizes: list[int], prefix: str = "f") -> tuple[list[str], list[bytes]]:
    paths, datas = [], []
    for i, n in enumerate(sizes):
        data = random_bytes(n, seed=100 + i)
        paths.append(new_file(folder, f"{prefix}{i}.bin", data))
        datas.append(data)
    return paths, datas


def _device_of_ctx(ctx: int, count: int) -> int:
    for d in range(count):
        if standin.cuda.primary_context(d) == ctx:
            return d
    raise AssertionError(f"context {ctx:#x} is no device's primary context")


def scenario_stream_balanced(folder):
    """One 64 MiB file through 1 MiB slots on three GPUs: its 64 chunks are
    cut into three ranges of nearly equal bytes, each moved by its GPU's
    workers into that GPU's staging; every byte lands (and is compared)."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    data = random_bytes(64 * MiB, seed=7)
    path = new_file(folder, "big.bin", data)
    with settings(compat_mode="on", num_threads=6, task_size=MiB):
        m = mark()
        job = gdscp.bulk.stream_files([path], devices=[0, 1, 2], staging_size=2 * MiB, verify=True)
        (r,) = job.results()
    assert r.status == "done" and r.bytes == len(data), r
    per = job.device_bytes()
    assert sorted(per) == [0, 1, 2] and sum(per.values()) == len(data)
    # Contiguous ranges of whole chunks: 22, 21 and 21 of them.
    assert sorted(per.values()) == [21 * MiB, 21 * MiB, 22 * MiB], per
    # Each GPU's bytes went up its own context's streams, into its own staging.
    landed = {0: 0, 1: 0, 2: 0}
    for c in since(m, "cuMemcpyHtoDAsync", lib="cuda"):
        assert c.result == 0
        landed[_device_of_ctx(c.ctx, 3)] += c.size
    assert landed == per, (landed, per)


def scenario_read_files_spread(folder):
    """read_files(devices=...) without buffers: one array per file, on the GPU
    with the fewest bytes so far (largest first), each holding its file."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    sizes = [5 * MiB + 3, 0, 1, 4095, 4097, 2 * MiB, 3 * MiB + 1]
    paths, datas = _files(folder, sizes)
    with settings(task_size=MiB):
        job = gdscp.read_files(paths, devices="all")
        results = job.results()
    assert [r.status for r in results] == ["done"] * len(sizes)
    assert [r.bytes for r in results] == sizes
    want_devices = gdscp.bulk._balanced(sizes, [0, 1, 2])
    assert [a.device for a in job.arrays] == want_devices
    assert set(want_devices) == {0, 1, 2}
    for a, data in zip(job.arrays, datas):
        assert bytes(gdscp.memory.to_host(a)) == data
    # Each file was read by its GPU's workers.
    per = job.device_bytes()
    for d in range(3):
        assert per[d] == sum(n for n, w in zip(sizes, want_devices) if w == d)


def scenario_copies_spread(folder):
    """copy_files(devices=[0, 1]): small files to one GPU or the other, the
    large ones' chunks through both; every destination byte-exact."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    sizes = EDGE_SIZES + [17 * MiB + 9]
    paths, datas = _files(folder, sizes)
    dsts = [os.path.join(folder, f"copy{i}.bin") for i in range(len(sizes))]
    for compat in ("on", "off"):
        for d in dsts:
            if os.path.exists(d):
                os.unlink(d)
        with settings(compat_mode=compat, num_threads=4, task_size=MiB):
            job = gdscp.copy_files(list(zip(paths, dsts)), devices=[0, 1], staging_size=2 * MiB, sizes=sizes)
            results = job.results()
        assert [r.status for r in results] == ["done"] * len(sizes), [r.error for r in results]
        for d, data in zip(dsts, datas):
            assert file_bytes(d) == data
        per = job.device_bytes()
        assert per[0] > 0 and per[1] > 0 and sum(per.values()) == sum(sizes)
        # The 17 MiB file's chunks went through both GPUs: each moved more
        # than all the other files together.
        assert min(per.values()) > sum(sizes[:-1]) - 9 * MiB - 1


def scenario_writes_spread(folder):
    """write_files(devices="all") from buffers on three GPUs: each file
    written by its buffer's GPU's workers, byte-exact."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    sizes = EDGE_SIZES
    datas = [random_bytes(n, seed=300 + i) for i, n in enumerate(sizes)]
    bufs = []
    for i, data in enumerate(datas):
        b = gdscp._core.DeviceBuffer(len(data), i % 3)
        b.copy_from_host(data)
        bufs.append(b)
    dsts = [os.path.join(folder, f"w{i}.bin") for i in range(len(sizes))]
    with settings(num_threads=3, task_size=MiB):
        job = gdscp.write_files(bufs, dsts, devices="all")
        results = job.results()
    assert [r.status for r in results] == ["done"] * len(sizes), [r.error for r in results]
    for d, data in zip(dsts, datas):
        assert file_bytes(d) == data
    per = job.device_bytes()
    for g in range(3):
        assert per[g] == sum(n for i, n in enumerate(sizes) if i % 3 == g)


def scenario_replicate_peer(folder, compat):
    """gdscp.replicate onto three GPUs with peer access: the file crosses
    PCIe once (host-to-GPU bytes equal its size, in chunks landing on every
    GPU in turn), and every GPU gets the rest by direct peer copies."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    with settings(compat_mode=compat, num_threads=4, task_size=MiB):
        for n in (0, 1, 4097, 9 * MiB + 3):
            data = random_bytes(n, seed=n)
            path = new_file(folder, f"rep{n}.bin", data)
            m = mark()
            arrays = gdscp.replicate(path, devices=[0, 1, 2], verify=True)
            assert [a.device for a in arrays] == [0, 1, 2]
            for a in arrays:
                assert len(a) == n and bytes(gdscp.memory.to_host(a)) == data
            peers = since(m, "cuMemcpyPeerAsync", lib="cuda")
            assert all(c.result == 0 and c.flags & STANDIN_PINNED for c in peers)
            # Every byte copied to the two GPUs it did not land on.
            assert sum(c.size for c in peers) == 2 * n
            if n > 2 * MiB:
                assert {_device_of_ctx(c.ctx, 3) for c in peers} == {0, 1, 2}
            if compat == "on":
                h2d = since(m, "cuMemcpyHtoDAsync", lib="cuda")
                assert sum(c.size for c in h2d) == n  # read once
            else:
                reads = [c for c in since(m, "cuFileRead") if c.result > 0]
                assert sum(c.result for c in reads) == n  # read once
    enabled = standin.cuda.calls("cuCtxEnablePeerAccess")
    assert enabled and all(c.result == 0 for c in enabled)
    assert len(enabled) == 6  # each ordered pair once for the process


def scenario_replicate_no_peer(folder):
    """Without peer access between the GPUs: each chunk is read once into
    pinned host memory and that same chunk copied to every GPU."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    standin.cuda.lib.gdscp_cuda_set_peer(0)
    data = random_bytes(5 * MiB + 77, seed=5)
    path = new_file(folder, "nopeer.bin", data)
    with settings(num_threads=4, task_size=MiB):
        m = mark()
        job = gdscp.read_files([path], devices=[1, 0], replicate=True)
        (r,) = job.results()
    assert r.status == "done" and r.bytes == len(data), r
    assert [a.device for a in job.arrays[0]] == [1, 0]
    for a in job.arrays[0]:
        assert bytes(gdscp.memory.to_host(a)) == data
    per = job.device_bytes()  # every GPU's workers took a share of its chunks
    assert per[0] > 0 and per[1] > 0 and per[0] + per[1] == len(data), per
    assert since(m, "cuMemcpyPeerAsync", lib="cuda") == []
    h2d = since(m, "cuMemcpyHtoDAsync", lib="cuda")
    assert sum(c.size for c in h2d) == 2 * len(data)
    assert all(c.flags & STANDIN_PINNED for c in h2d)
    # Each chunk went from one host address to both GPUs.
    by_host: dict[int, set] = {}
    for c in h2d:
        by_host.setdefault((c.host, c.size), set()).add(_device_of_ctx(c.ctx, 2))
    assert all(v == {0, 1} for v in by_host.values())


def scenario_gpu_fails_mid_copy(folder):
    """GPU 1 fails after a few copies: the files it was moving fail naming
    the CUDA error, their destinations never appear (nor any temporary file),
    the old contents of an existing destination stay, and the files GPU 0
    moved are complete."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    sizes = [512 * KiB + 1] * 8 + [12 * MiB + 3]  # whole on one GPU each, and one cut among both
    paths, datas = _files(folder, sizes)
    out = os.path.join(folder, "out")
    os.mkdir(out)
    dsts = [os.path.join(out, f"c{i}.bin") for i in range(len(sizes))]
    old = b"old contents"
    with open(dsts[-1], "wb") as f:
        f.write(old)
    standin.cuda.lib.gdscp_cuda_break_device(1, 3)
    with settings(compat_mode="on", num_threads=4, task_size=MiB):
        job = gdscp.copy_files(list(zip(paths, dsts)), devices=[0, 1], staging_size=2 * MiB, sizes=sizes)
        results = job.results()
    standin.cuda.lib.gdscp_cuda_break_device(1, -1)
    failed = [r for r in results if r.status == "failed"]
    assert failed, "GPU 1 broke, yet nothing failed"
    assert results[-1].status == "failed"  # its chunks went through both GPUs
    for r in failed:
        assert "CUDA_ERROR_ECC_UNCORRECTABLE" in r.error
    for r, d, data in zip(results, dsts, datas):
        if r.status == "done":
            assert file_bytes(d) == data
        elif d == dsts[-1]:
            assert file_bytes(d) == old
        else:
            assert not os.path.exists(d)
    assert any(r.status == "done" for r in results), results
    assert sorted(os.listdir(out)) == sorted(os.path.basename(d) for r, d in zip(results, dsts)
                                             if r.status == "done" or d == dsts[-1])


def scenario_fail_fast_with_a_waiting_gpu(folder):
    """With fail_fast, a file failing on one GPU ends the job while the other
    GPU's worker, out of files of its own, waits for a file of the job to
    split: the job finishes (the rest cancelled), every file done is
    complete, and nothing else is left in the destination."""
    import gdscp
    import gdscp.bulk

    without_cupy()
    sizes = [64 * KiB + 7] * 60
    paths, datas = _files(folder, sizes)
    hints = [sum(sizes)] + sizes[1:]  # the first file alone on one GPU, the others on the other
    for broken in (0, 1):  # whichever GPU holds the many files
        out = os.path.join(folder, f"out{broken}")
        os.mkdir(out)
        dsts = [os.path.join(out, f"c{i}.bin") for i in range(len(sizes))]
        standin.cuda.lib.gdscp_cuda_break_device(broken, 3)
        try:
            with settings(compat_mode="on", num_threads=2, task_size=MiB):
                job = gdscp.copy_files(list(zip(paths, dsts)), devices=[0, 1], staging_size=2 * MiB, sizes=hints,
                                       fail_fast=True)
                ended = job.wait(30)
                if not ended:
                    job.cancel()
                    job.wait(30)
        finally:
            standin.cuda.lib.gdscp_cuda_break_device(broken, -1)
        assert ended, f"GPU {broken} failed a file with fail_fast, and the job did not end"
        results = job.results()
        assert any(r.status == "failed" and "CUDA_ERROR_ECC_UNCORRECTABLE" in r.error for r in results)
        assert {r.status for r in results} <= {"done", "failed", "cancelled"}
        done = [os.path.basename(d) for r, d in zip(results, dsts) if r.status == "done"]
        for r, d, data in zip(results, dsts, datas):
            if r.status == "done":
                assert file_bytes(d) == data
        assert sorted(os.listdir(out)) == sorted(done)


def scenario_cancel_queued_spread(folder):
    """A job over two GPUs none of whose workers has started (all wait
    behind another job's) has ended once cancel() returns, its files
    cancelled and nothing of them written; the job before it goes on
    untouched."""
    import time

    import gdscp
    from gdscp import _core

    without_cupy()
    paths, datas = _files(folder, [300 * KiB + 1] * 2)
    with settings(compat_mode="on", num_threads=2, task_size=MiB):
        _core.testing.arm_hold(0)  # the first job's two workers wait at their first chunks
        try:
            first = gdscp.copy_files([(p, p + ".first") for p in paths])
            wait_for_held_workers(2)
            second = gdscp.copy_files([(p, p + ".second") for p in paths], devices=[0, 1], staging_size=2 * MiB)
            second.cancel()
            ended = second.done()
        finally:
            _core.testing.disarm_fault()
        assert first.wait(60)
    assert ended, "a cancelled job over two GPUs waited for the job before it"
    assert [r.status for r in second.results()] == ["cancelled"] * 2
    assert [r.status for r in first.results()] == ["done"] * 2
    for p, data in zip(paths, datas):
        assert file_bytes(p + ".first") == data
        assert not os.path.exists(p + ".second")


def scenario_device_errors(folder):
    """Device lists that cannot work are refused before anything moves."""
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    path = new_file(folder, "e.bin", b"x" * 100)
    with pytest.raises(ValueError, match="GPU 1 is named twice"):
        gdscp.bulk.stream_files([path], devices=[1, 1])
    with pytest.raises(ValueError, match="GPU 2 does not exist"):
        gdscp.bulk.stream_files([path], devices=[0, 2])
    with pytest.raises(ValueError, match="device or devices, not both"):
        gdscp.read_files([path], device=0, devices=[0, 1])
    with pytest.raises(ValueError, match="replicate needs devices"):
        gdscp.read_files([path], replicate=True)
    with pytest.raises(ValueError, match="'all' or GPU numbers"):
        gdscp.copy_files([(path, path + ".c")], devices="some")
    with pytest.raises(ValueError, match="at least one GPU"):
        gdscp.copy_files([(path, path + ".c")], devices=[])
    with settings(num_threads=1), pytest.raises(ValueError, match="at least as many worker threads"):
        gdscp.bulk.stream_files([path], devices=[0, 1])
    a = gdscp._core.DeviceBuffer(100, 0)
    b = gdscp._core.DeviceBuffer(100, 0)
    with pytest.raises(ValueError, match="distinct GPUs"):
        gdscp.read_files([path], [[a, b]], devices=[0, 1], replicate=True)
    assert not os.path.exists(path + ".c")


def scenario_numa_staging(folder, sysfs):
    """On a machine of two NUMA nodes (a sysfs tree given through
    GDSCP_SYSFS_ROOT) each GPU's pinned staging is mapped on its node and
    registered (cuMemHostRegister), not cuMemHostAlloc'ed, and its workers run
    on the node's CPUs while the job lasts; trim_pools unregisters it."""
    os.makedirs(os.path.join(sysfs, "devices/system/node"))
    with open(os.path.join(sysfs, "devices/system/node/online"), "w") as f:
        f.write("0-1\n")
    cpus = sorted(os.sched_getaffinity(0))
    node_cpus = {0: cpus[-1], 1: cpus[0]}  # one CPU each (the same one on a machine of one)
    for node, cpu in node_cpus.items():
        os.makedirs(os.path.join(sysfs, f"devices/system/node/node{node}"))
        with open(os.path.join(sysfs, f"devices/system/node/node{node}/cpulist"), "w") as f:
            f.write(f"{cpu}\n")
    for d, node in ((0, 1), (1, 0)):
        bus = os.path.join(sysfs, f"bus/pci/devices/0000:{0x10 + d:02x}:00.0")
        os.makedirs(bus)
        with open(os.path.join(bus, "numa_node"), "w") as f:
            f.write(f"{node}\n")
    os.environ["GDSCP_SYSFS_ROOT"] = sysfs
    import gdscp
    import gdscp.bulk
    import gdscp.memory

    without_cupy()
    assert [gdscp._core.gpu_numa_node(d) for d in (0, 1)] == [1, 0]
    sizes = [3 * MiB + 1, 3 * MiB + 2]
    paths, datas = _files(folder, sizes)
    def pinned_threads() -> set:
        """The Cpus_allowed_list of this process's threads that are not on every allowed CPU."""
        out = set()
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out.add(line.split(":", 1)[1].strip())
        return {c for c in out if len(os.sched_getaffinity(0)) > 1 and "-" not in c and "," not in c}

    with settings(compat_mode="on", num_threads=2, task_size=MiB):
        m = mark()
        standin.cuda.gate("cuMemcpyHtoDAsync")
        job = gdscp.read_files(paths, devices=[0, 1])
        assert standin.cuda.gate_wait()
        # A worker stopped mid-copy runs on its GPU's node's CPU only.
        bound = pinned_threads()
        standin.cuda.release()
        assert [r.status for r in job.results()] == ["done", "done"]
    if len(cpus) > 1:
        assert bound and bound <= {str(cpus[0]), str(cpus[-1])}, bound
        assert pinned_threads() == set()  # and back on every CPU once the job ended
    for a, data in zip(job.arrays, datas):
        assert bytes(gdscp.memory.to_host(a)) == data
    assert since(m, "cuMemHostAlloc", lib="cuda") == []
    registered = since(m, "cuMemHostRegister", lib="cuda")
    assert registered and all(c.result == 0 for c in registered)
    del job
    gdscp._core.trim_pools()
    assert len(standin.cuda.calls("cuMemHostUnregister")) == len(registered)


def scenario_prepare_two_gpus(folder, sysfs):
    """Two GPUs on one NUMA node draw their pinned staging from one pool:
    preparing the second adds its workers' buffers to the first's, where it
    once found the first GPU's idle, made none, and left a job over both to
    register half its staging on the clock. Preparing again makes none; a
    read over both GPUs then registers none and lands every byte; trim_pools
    frees the buffers and forgets what was prepared. Two GPUs prepared at
    once from two threads both get their share."""
    os.makedirs(os.path.join(sysfs, "devices/system/node"))
    with open(os.path.join(sysfs, "devices/system/node/online"), "w") as f:
        f.write("0\n")
    os.environ["GDSCP_SYSFS_ROOT"] = sysfs
    import gdscp
    import gdscp.memory
    from gdscp import _core

    without_cupy()
    assert [_core.gpu_numa_node(d) for d in (0, 1)] == [-1, -1]  # one node: one pool
    sizes = [6 * MiB + 5, 6 * MiB + 7]
    paths, datas = _files(folder, sizes)

    def registered(m: tuple[int, int]) -> list:
        calls = since(m, "cuMemHostRegister", lib="cuda")
        assert all(c.result == 0 for c in calls)
        return calls

    _core.trim_pools()
    with settings(compat_mode="on", num_threads=4, bounce_buffer_size=MiB, pipeline_depth=2, task_size=MiB):
        for d in (0, 1):
            m = mark()
            gdscp.prepare(d, workers=2)  # the job below gives each GPU 2 of the 4 workers
            assert len(registered(m)) == 2 * 2, d
        m = mark()
        gdscp.prepare(0, workers=2)
        gdscp.prepare(1, workers=2)
        assert registered(m) == []
        m = mark()
        job = gdscp.read_files(paths, devices=[0, 1])
        assert [r.status for r in job.results()] == ["done", "done"]
        assert registered(m) == [], "the job registered staging that prepare should have made"
        assert sorted(job.device_bytes().values()) == sizes
        for a, data in zip(job.arrays, datas):
            assert bytes(gdscp.memory.to_host(a)) == data
        del job
        _core.trim_pools()
        m = mark()
        gdscp.prepare(1, workers=2)
        assert len(registered(m)) == 2 * 2  # GPU 0's earlier share is forgotten with its buffers
        # Both GPUs prepared at once, from two threads: both shares are made.
        for _ in range(10):
            _core.trim_pools()
            m = mark()
            threads = [threading.Thread(target=gdscp.prepare, args=(d,), kwargs={"workers": 2}) for d in (0, 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(registered(m)) == 2 * 2 * 2
    _core.trim_pools()


def scenario_command_line(folder):
    """gdscp read/copy/write --devices 0,1 and read --replicate, in-process."""
    import contextlib
    import io
    import json

    import gdscp
    import gdscp.memory
    from gdscp.cli.app import run as gdscp_cli

    without_cupy()
    sizes = [9 * MiB + 5, 1, 0, 4097]
    paths, datas = _files(folder, sizes)

    def cli(*args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = gdscp_cli(list(args))
        return code, out.getvalue(), err.getvalue()

    def run(*args):
        code, out, err = cli(*args, "--json")
        assert code == 0, err
        return json.loads(out)

    with settings(num_threads=4, task_size=MiB):
        doc = run("read", *paths, "--devices", "0,1", "--verify")
        assert doc["devices"] == [0, 1] and doc["bytes"] == sum(sizes)
        assert sum(doc["device_bytes"].values()) == sum(sizes) and all(doc["device_bytes"].values())
        doc = run("read", paths[0], "--devices", "all", "--replicate", "--verify")
        assert doc["replicate"] is True and doc["devices"] == [0, 1] and doc["bytes"] == sizes[0]
        dst = os.path.join(folder, "dst")
        os.mkdir(dst)
        doc = run("copy", *paths, dst, "--devices", "0,1")
        for p, data in zip(paths, datas):
            assert file_bytes(os.path.join(dst, os.path.basename(p))) == data
        out = os.path.join(folder, "written.bin")
        doc = run("write", out, "--size", "5M", "--pattern", "random", "--seed", "3", "--devices", "0,1",
                  "--chunk-size", "1M")
        assert doc["devices"] == [0, 1]
        assert np.array_equal(np.fromfile(out, dtype=np.uint8), gdscp.memory.pattern(5 * MiB, "random", 3))
    # The multi-GPU benchmark, small: every workload, the host-side ceiling,
    # and the ratios (the pinned ceilings need CuPy, absent here).
    doc = run("benchmark", "--devices", "0,1", "--size", "3M", "--runs", "3", "--threads", "2,4", "--dir", folder)
    assert doc["benchmark"] == "multi_gpu" and doc["devices"] == [0, 1] and doc["file_size"] == 3 * MiB
    assert set(doc["results"]) == {"2", "4"}
    for r in doc["results"].values():
        assert set(r) == {"one_gpu", "replicate", "distinct", "distinct_one_pool"}
        assert r["distinct"]["bytes"] == 6 * MiB and len(r["distinct"]["seconds"]) == 3
    assert doc["ceilings"]["host_page_cache"]["available"] and doc["ceilings"]["host_page_cache"]["bytes"] == 6 * MiB
    assert not doc["ceilings"]["pinned_h2d_all"]["available"]
    shared = doc["ceilings"]["host_page_cache_while_copying"]
    assert not shared["available"] and "no GPU copies" in shared["reason"], shared
    ratios = doc["ratios"]
    assert ratios["bound_gb_per_s"] == ratios["host_side_gb_per_s"] > 0
    assert ratios["host_side_while_copying_gb_per_s"] is None and ratios["copies_while_reading_gb_per_s"] is None
    assert set(ratios["by_threads"]) == {"2", "4"}
    assert [f for f in os.listdir(folder) if f.startswith(".gdscp-multi")] == []
    code, _, err = cli("read", paths[0], "--devices", "0,0")
    assert code == 2 and "GPU 0 is named twice" in err, err
    code, _, err = cli("read", paths[0], "--devices", "0,1", "--device", "0")
    assert code == 2 and "--device and --devices exclude each other" in err, err
    code, _, err = cli("read", paths[0], "--devices", "0,3")
    assert code == 2 and "GPU 3 does not exist" in err, err
    code, _, err = cli("read", paths[0], "--replicate")
    assert code == 2 and "--replicate needs --devices" in err, err
    code, out, err = cli("read", paths[0], "--devices", "0,1", "--replicate", "--chunk-size", "1M")
    assert (code, out) == (2, ""), err
    assert err.splitlines() == ["gdscp read: error: --replicate copies whole files GPU to GPU, through no buffer of "
                                "--chunk-size; it cannot be used with --chunk-size"], err


# ==========================================================================
# two real GPUs
# ==========================================================================
@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_two_gpus_replicate_and_spread(tmp_path):
    import cupy

    import gdscp

    data = random_bytes(40 * MiB + 3, seed=1)
    path = tmp_path / "two.bin"
    path.write_bytes(data)
    arrays = gdscp.replicate(path, devices=[0, 1], verify=True)
    assert [a.device.id for a in arrays] == [0, 1]
    for a in arrays:
        assert cupy.asnumpy(a).tobytes() == data
    paths = []
    for i in range(4):
        p = tmp_path / f"s{i}.bin"
        p.write_bytes(data[i:])
        paths.append(str(p))
    job = gdscp.read_files(paths, devices=[0, 1], verify=True)
    assert [r.status for r in job.results()] == ["done"] * 4
    assert {a.device.id for a in job.arrays} == {0, 1}
    for i, a in enumerate(job.arrays):
        assert cupy.asnumpy(a).tobytes() == data[i:]
    dsts = [str(tmp_path / f"c{i}.bin") for i in range(4)]
    job = gdscp.copy_files(list(zip(paths, dsts)), devices=[0, 1], verify=True)
    assert [r.status for r in job.results()] == ["done"] * 4
    for i, d in enumerate(dsts):
        assert open(d, "rb").read() == data[i:]
    assert all(job.device_bytes().values())


def _benchmark_cli(*args):
    import contextlib
    import io

    from gdscp.cli.app import run as gdscp_cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gdscp_cli(["benchmark", *args])
    return code, out.getvalue(), err.getvalue()


def scenario_benchmark_devices_files(folder, outside):
    """The multi-GPU benchmark's files are its own: a file and a link at the
    names it once used (.gdscp-multi-PID-N.bin in --dir) are neither
    overwritten, nor followed, nor removed; its figures agree with each other."""
    import json

    from gdscp.bench.stats import GB, spread

    without_cupy()
    victim = os.path.join(folder, f".gdscp-multi-{os.getpid()}-0.bin")
    with open(victim, "wb") as f:
        f.write(b"a user's file")
    target = os.path.join(outside, "target.bin")
    with open(target, "wb") as f:
        f.write(b"where the link points")
    link = os.path.join(folder, f".gdscp-multi-{os.getpid()}-1.bin")
    os.symlink(target, link)
    before = sorted(os.listdir(folder))
    code, out, err = _benchmark_cli("--devices", "0,1", "--size", "1M", "--runs", "3", "--threads", "2",
                                    "--dir", folder, "--json")
    assert code == 0, err
    assert file_bytes(victim) == b"a user's file"
    assert os.path.islink(link) and file_bytes(target) == b"where the link points"
    assert sorted(os.listdir(folder)) == before
    doc = json.loads(out)
    for workloads in doc["results"].values():
        for r in workloads.values():
            assert r["gb_per_s"] == spread(r["bytes"] / s / GB for s in r["seconds"]), r
            assert all(s == round(s, 9) for s in r["seconds"])


def scenario_benchmark_devices_checks(folder):
    """--devices checks every option before it writes anything: exit 2, one
    line naming the option, nothing left in --dir."""
    import json

    without_cupy()
    a_file = new_file(folder, "a-file", b"x")
    cases = [
        (["--size", "0"], "--size: 0 bytes is too small"),
        (["--size", "4095"], "--size: 4095 bytes is too small"),
        (["--size", "1P"], "--size: 1 PiB needs 2 PiB of disk"),
        (["--size", "200T"], "--size: 200 TiB needs 400 TiB of disk"),
        (["--threads", "0"], "--threads: 0 is too small"),
        (["--threads", "2000"], "--threads: 2000 is too large"),
        (["--threads", "4,1"], "--threads: 1 is too small: a job spread over 2 GPUs needs at least 2 worker threads"),
        (["--runs", "2"], "--runs"),
        (["--dir", os.path.join(folder, "missing")], "--dir: " + os.path.join(folder, "missing") + ": no such directory"),
        (["--dir", a_file], f"--dir: {a_file}: not a directory"),
        (["--ranks", "2"], "--ranks cannot be used with --devices"),
        (["--file-size", "1K"], "--file-size cannot be used with --devices"),
    ]
    for args, said in cases:
        full = ["--devices", "0,1", "--size", "1M", "--threads", "2", "--dir", folder, *args, "--json"]
        code, out, err = _benchmark_cli(*full)
        assert code == 2, (args, code, err)
        lines = [line for line in err.splitlines() if "error" in line]
        assert len(lines) == 1 and said in lines[0], (args, err)
        assert json.loads(out)["exit_code"] == 2
        assert "Traceback" not in err
        assert sorted(os.listdir(folder)) == ["a-file"], (args, os.listdir(folder))


def scenario_benchmark_devices_interrupted(folder):
    """Ctrl-C in the runs, and another while the files are removed: nothing is left."""
    import gdscp.bench.multi as multi

    without_cupy()

    def progress(done, total, description):
        if description.startswith("workloads with"):
            raise KeyboardInterrupt

    real = os.unlink
    calls = []

    def unlink(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    os.unlink = unlink
    try:
        multi.run_multi_benchmark(multi.MultiConfig(devices=[0, 1], size=MiB, runs=3, dir=folder, threads=[2]),
                                  progress=progress)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was lost")
    finally:
        os.unlink = real
    assert len(calls) > 1 and os.listdir(folder) == [], (calls, os.listdir(folder))
