"""``gdscp benchmark --devices 0,1``: hot files into several GPUs at once,
against the machine's host-side and PCIe ceilings, in one run.

Workloads, each timed ``runs`` times after one untimed warm-up, interleaved
run by run, at each thread count asked for:

* ``one_gpu``: one hot file into the first GPU (the baseline for replicate);
* ``replicate``: the same file into every GPU, read once
  (``read_files(..., replicate=True)``);
* ``distinct``: one hot file per GPU, the job spread over the GPUs
  (``devices=``: a worker group, staging and streams per GPU);
* ``distinct_one_pool``: the same files into the same buffers as one job
  without ``devices`` (one pool of workers for all GPUs).

Ceilings measured in the same run: ``host_page_cache`` (every core preads the
hot files into page-locked buffers, no GPU copy), ``host_memcpy``,
``pinned_h2d`` on each GPU and ``pinned_h2d_all`` (every GPU at once).

Ratios against the targets: ``distinct`` over min(host_page_cache,
pinned_h2d_all) (target >= 0.9) and ``replicate`` time over ``one_gpu`` time
(target <= 1.15).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .. import defaults, memory
from ..bulk import read_files
from .ceilings import host_memcpy_rate, multi_pinned_copy_rate, page_cache_rate, pinned_copy_rate
from .config import BenchConfigError, check_dir, check_room, check_runs, check_size, check_threads, human
from .files import available_memory, free_disk, make_file, scratch_dir, warm_cache
from .machine import describe_machine, now_iso
from .measure import BenchError
from .stats import rated

__all__ = ["MultiConfig", "run_multi_benchmark", "DISTINCT_TARGET", "REPLICATE_TARGET"]

DISTINCT_TARGET = 0.9  # distinct files: at least this share of min(host side, aggregate PCIe)
REPLICATE_TARGET = 1.15  # replicate: at most this many times one GPU's time
_DEFAULT_SIZE = 4 << 30
_CHECK = 1 << 20  # bytes compared at each end of every buffer after the runs


@dataclass
class MultiConfig:
    devices: list[int]
    size: Optional[int] = None
    runs: int = 3
    dir: str = "."
    threads: Optional[list[int]] = None
    notes: list[str] = field(default_factory=list)


def _size(config: MultiConfig) -> int:
    """The size asked for, if the machine has room for it (else
    ``BenchConfigError`` naming ``size``), else 4 GiB, less where host memory
    (the files must stay cached), disk or any GPU's free memory is short."""
    n = len(config.devices)
    if config.size is not None:
        size = check_size(config.size)
        copy = min(size, 1 << 30)  # the host_memcpy and pinned_h2d ceilings' buffers
        config.notes.extend(check_room(
            size, config.dir, disk=n * size, disk_why=f"a file for each of {n} GPUs",
            host=n * size + 2 * copy, host_why="the files, kept in the page cache, and host_memcpy's buffers",
            devices=config.devices, gpu=size + copy, gpu_why="the buffer and pinned_h2d's",
        ))
        return size
    size = min(_DEFAULT_SIZE, available_memory() // (2 * n + 2))
    free = free_disk(config.dir)
    if free is not None:
        size = min(size, free // (n + 1))
    for d in config.devices:
        size = min(size, memory.available_bytes(d) // 4)
    size -= size % (1 << 20)
    if size < _DEFAULT_SIZE:
        config.notes.append(f"files of {size >> 20} MiB: too little memory or disk for 4 GiB")
    return max(size, 1 << 20)


def _threads(config: MultiConfig) -> list[int]:
    """The thread counts to measure: those given, each once (a job spread
    over N GPUs needs at least N workers: a smaller count is refused), else
    gdscp's default and twice the cores (at most 64), at least N each."""
    gpus = len(config.devices)
    if config.threads is not None:
        counts = sorted(check_threads(config.threads))
        if counts[0] < gpus:
            raise BenchConfigError("threads", f"{counts[0]} is too small: a job spread over {gpus} GPUs needs at "
                                              f"least {gpus} worker threads")
        return counts
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    base = max(int(defaults.get("num_threads")), gpus)
    return sorted({base, max(base, min(64, 2 * cpus))})


def _time(job_of: Callable[[], Any]) -> float:
    start = time.perf_counter()
    job = job_of()
    results = job.results()
    seconds = time.perf_counter() - start
    bad = [r for r in results if r.status != "done"]
    if bad:
        raise BenchError(f"'{bad[0].source}': {bad[0].error or bad[0].status}")
    return seconds


def _check(buf: Any, path: str, size: int) -> None:
    """The first and last MiB of ``buf`` against the file: the runs moved real bytes."""
    with open(path, "rb") as f:
        for off in {0, max(0, size - _CHECK)}:
            n = min(_CHECK, size - off)
            f.seek(off)
            want = np.frombuffer(f.read(n), dtype=np.uint8)
            got = memory.to_host(buf[off : off + n])
            if not np.array_equal(got, want):
                raise BenchError(f"the bytes loaded from '{path}' differ from the file near offset {off}")


def _median(entry: Optional[dict]) -> Optional[float]:
    if not entry or not entry.get("available", True) or "gb_per_s" not in entry:
        return None
    return entry["gb_per_s"]["median"]


def _ceilings(config: MultiConfig, paths: list[str], size: int, runs: int, step: Callable[[str], None]) -> dict:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out: dict = {}
    step("host side: page cache -> pinned, every core")
    out["host_page_cache"] = page_cache_rate(paths, cpus, runs)
    step("host side while every GPU copies")
    out["host_page_cache_while_copying"] = page_cache_rate(paths, cpus, runs, while_copying=config.devices)
    step("host memory bandwidth")
    out["host_memcpy"] = host_memcpy_rate(min(size, 1 << 30), cpus, runs)
    copy = min(size, 1 << 30)
    for d in config.devices:
        step(f"pinned host -> GPU {d}")
        out[f"pinned_h2d_gpu{d}"] = pinned_copy_rate(copy, runs, "h2d", d)
    step("pinned host -> every GPU at once")
    out["pinned_h2d_all"] = multi_pinned_copy_rate(copy, runs, config.devices)
    return out


def run_multi_benchmark(config: MultiConfig, progress: Optional[Callable[[int, int, str], None]] = None,
                        warn: Optional[Callable[[str], None]] = None) -> dict:
    devs = config.devices
    if len(devs) < 2:
        raise ValueError("the multi-GPU benchmark needs at least two GPUs (--devices 0,1)")
    # Every setting checked, and the room for the files, before anything is written.
    runs = check_runs(config.runs)
    config.dir = check_dir(config.dir)
    thread_counts = _threads(config)
    size = _size(config)
    steps_total = len(thread_counts) + len(devs) + 5
    done = [0]

    def step(text: str) -> None:
        if progress:
            progress(done[0], steps_total, text)
        done[0] += 1

    # The files in a directory of this run's own: nothing of anybody's is
    # overwritten or removed, and no link in --dir leads them elsewhere.
    with scratch_dir(config.dir, ".gdscp-multi-") as scratch:
        paths = [os.path.join(scratch, f"gpu{i}.bin") for i in range(len(devs))]
        step(f"writing {len(paths)} files of {human(size)}")
        for i, p in enumerate(paths):
            make_file(p, size, seed=i)
            warm_cache(p)
        bufs = [memory.allocate(size, d) for d in devs]
        workloads: dict[str, Callable[[], Any]] = {
            "one_gpu": lambda: read_files(paths[:1], bufs[:1]),
            "replicate": lambda: read_files(paths[:1], [bufs], devices=devs, replicate=True),
            "distinct": lambda: read_files(paths, bufs, devices=devs),
            "distinct_one_pool": lambda: read_files(paths, bufs),
        }
        nbytes = {"one_gpu": size, "replicate": size, "distinct": size * len(devs),
                  "distinct_one_pool": size * len(devs)}
        results: dict = {}
        for threads in thread_counts:
            step(f"workloads with {threads} threads")
            with defaults.set({"num_threads": threads}):
                seconds: dict[str, list[float]] = {name: [] for name in workloads}
                for name, job in workloads.items():
                    _time(job)  # warm-up: staging allocated, peers enabled
                for _ in range(runs):
                    for name, job in workloads.items():
                        seconds[name].append(_time(job))
            results[str(threads)] = {name: _figures(nbytes[name], secs) for name, secs in seconds.items()}
        # Every buffer holds its file (distinct ran last) and, run before it,
        # replicate put file 0 into all of them: check the distinct bytes.
        for buf, p in zip(bufs, paths):
            _check(buf, p, size)
        _time(workloads["replicate"])
        for buf in bufs:
            _check(buf, paths[0], size)
        del bufs
        ceilings = _ceilings(config, paths, size, runs, step)
    step("done")
    return {
        "benchmark": "multi_gpu",
        "when": now_iso(),
        "devices": devs,
        "file_size": size,
        "runs": runs,
        "threads": thread_counts,
        "notes": config.notes,
        "machine": describe_machine(config.dir, devs[0]),
        "ceilings": ceilings,
        "results": results,
        "ratios": _ratios(ceilings, results),
    }


def _figures(nbytes: int, seconds: list[float]) -> dict:
    rounded, rate = rated(nbytes, seconds)
    return {"bytes": nbytes, "seconds": rounded, "gb_per_s": rate}


def _ratios(ceilings: dict, results: dict) -> dict:
    """Per thread count, the figures the targets are stated in."""
    host = _median(ceilings.get("host_page_cache"))
    pcie = _median(ceilings.get("pinned_h2d_all"))
    if pcie is None:
        singles = [_median(v) for k, v in ceilings.items() if k.startswith("pinned_h2d_gpu")]
        pcie = sum(singles) if singles and all(s is not None for s in singles) else None
    bounds = [b for b in (host, pcie) if b is not None]
    bound = min(bounds) if bounds else None
    # Both halves at once: what the reads and the copies each kept while the
    # other ran flat out. Not a bound (a load needs the two at one rate, and
    # then each leaves the other more), but where the host's memory runs out.
    shared = ceilings.get("host_page_cache_while_copying") or {}
    reads_shared = _median(shared)
    copies_shared = shared["copies_gb_per_s"]["median"] if reads_shared is not None else None
    out: dict = {
        "host_side_gb_per_s": host,
        "aggregate_pcie_gb_per_s": pcie,
        "bound_gb_per_s": bound,
        "host_side_while_copying_gb_per_s": reads_shared,
        "copies_while_reading_gb_per_s": copies_shared,
        "distinct_target": DISTINCT_TARGET,
        "replicate_target": REPLICATE_TARGET,
        "by_threads": {},
    }
    for threads, r in results.items():
        distinct = r["distinct"]["gb_per_s"]["median"]
        one = float(np.median(r["one_gpu"]["seconds"]))
        rep = float(np.median(r["replicate"]["seconds"]))
        share = distinct / bound if bound else None
        out["by_threads"][threads] = {
            "distinct_gb_per_s": distinct,
            "distinct_share_of_bound": share,
            "distinct_meets_target": None if share is None else share >= DISTINCT_TARGET,
            "distinct_over_one_pool": distinct / r["distinct_one_pool"]["gb_per_s"]["median"],
            "replicate_over_one_gpu": rep / one,
            "replicate_meets_target": rep / one <= REPLICATE_TARGET,
        }
    return out
