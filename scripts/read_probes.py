"""Where short and fresh-buffer reads lose time, on a GPU machine: the checks
behind the "start cost" and "fresh host buffers" sections of docs/performance.md.

- Short hot reads (256 MiB and 1 GiB) into GPU memory, 16 threads, median of
  15: one handle reused, a new handle for every read (its open timed too), the
  pread path (mapped_reads off), 2 and 8 MiB staging buffers; beside the pinned
  host-to-GPU copy rate of the same size.
- A hot 4 GiB file read into host memory, median of 5: a fresh numpy.empty each
  time, a fresh anonymous mapping with MADV_HUGEPAGE, a touched buffer; with
  the transparent huge page settings and how much of each fresh buffer the
  kernel backed with huge pages (AnonHugePages).
- DMA straight from the page cache, with no staging copy: a hot 1 GiB file
  mapped read-only, the mapping registered with the driver
  (cudaHostRegisterReadOnly), one copy to the GPU, unregistered; each step
  timed, median of 5.

    python scripts/read_probes.py OUT.json [--dir DIR] [--only dma]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time

import cupy
import numpy as np

import gdscp
from gdscp import defaults
from gdscp.bench import ceilings, files

THREADS = 16


def thp_settings() -> dict:
    found = {}
    for name in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
                found[name] = f.read().strip()
        except OSError as exc:
            found[name] = f"unreadable: {exc.strerror}"
    return found


def anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def gpu_seconds(fn) -> float:
    cupy.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()
    fn()
    cupy.cuda.runtime.deviceSynchronize()
    return time.perf_counter() - start


def rate(size: int, seconds: list[float]) -> float:
    return round(size / statistics.median(seconds) / 1e9, 2)


def short_reads(path: str, size: int, runs: int = 15) -> dict:
    buf = cupy.empty(size, dtype=cupy.uint8)
    found = {}
    with defaults.set("num_threads", THREADS):
        f = gdscp.CuFile(path, "r")
        f.read(buf)
        found["one_handle"] = rate(size, [gpu_seconds(lambda: f.read(buf)) for _ in range(runs)])

        def new_handle() -> None:
            g = gdscp.CuFile(path, "r")
            g.read(buf)
            g.close()

        found["new_handle_with_open"] = rate(size, [gpu_seconds(new_handle) for _ in range(runs)])
        with defaults.set("mapped_reads", False):
            found["pread_path"] = rate(size, [gpu_seconds(lambda: f.read(buf)) for _ in range(runs)])
        for staging in (2 << 20, 8 << 20):
            with defaults.set("bounce_buffer_size", staging):
                f.read(buf)
                found[f"staging_{staging >> 20}M"] = rate(size, [gpu_seconds(lambda: f.read(buf)) for _ in range(runs)])
        f.close()
    ceiling = ceilings.pinned_copy_rate(size, 7)
    found["pinned_ceiling"] = ceiling["gb_per_s"]["median"]
    found["one_handle_share_of_ceiling"] = round(found["one_handle"] / found["pinned_ceiling"], 3)
    return found


def fresh_host_reads(path: str, size: int, runs: int = 5) -> dict:
    found: dict = {"thp": thp_settings()}
    with defaults.set("num_threads", THREADS):
        f = gdscp.CuFile(path, "r")

        def timed(make) -> tuple[list[float], list[int]]:
            seconds, huge = [], []
            for _ in range(runs):
                buf, keep = make()
                before = anon_huge_kib()
                start = time.perf_counter()
                f.read(buf)
                seconds.append(time.perf_counter() - start)
                huge.append(anon_huge_kib() - before)
                del buf
                if keep is not None:
                    keep.close()
            return seconds, huge

        def mapping():
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            m.madvise(mmap.MADV_HUGEPAGE)
            return np.frombuffer(m, dtype=np.uint8), m

        seconds, huge = timed(lambda: (np.empty(size, dtype=np.uint8), None))
        found["fresh_numpy_empty"] = rate(size, seconds)
        found["fresh_numpy_empty_huge_kib"] = huge
        seconds, huge = timed(mapping)
        found["fresh_mapping_madv_hugepage"] = rate(size, seconds)
        found["fresh_mapping_huge_kib"] = huge
        touched = np.ones(size, dtype=np.uint8)
        f.read(touched)
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            f.read(touched)
            seconds.append(time.perf_counter() - start)
        found["touched"] = rate(size, seconds)
        f.close()
    return found


def page_cache_dma(path: str, size: int, runs: int = 5) -> dict:
    buf = cupy.empty(size, dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    steps: dict[str, list[float]] = {"register": [], "copy": [], "unregister": []}
    read_only = 8  # cudaHostRegisterReadOnly: the driver pins the file's cached pages without writing them
    with open(path, "rb") as f:
        for _ in range(runs):
            m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
            view = np.frombuffer(m, dtype=np.uint8)
            ptr = view.ctypes.data
            t0 = time.perf_counter()
            cupy.cuda.runtime.hostRegister(ptr, size, read_only)
            t1 = time.perf_counter()
            cupy.cuda.runtime.memcpyAsync(buf.data.ptr, ptr, size, cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
            stream.synchronize()
            t2 = time.perf_counter()
            cupy.cuda.runtime.hostUnregister(ptr)
            t3 = time.perf_counter()
            for name, seconds in zip(steps, (t1 - t0, t2 - t1, t3 - t2)):
                steps[name].append(seconds)
            same = bool((buf[-4096:].get() == view[-4096:]).all())
            del view
            m.close()
            if not same:
                raise SystemExit("page_cache_dma: the GPU's copy differs from the file")
    found = {f"{name}_ms": round(statistics.median(seconds) * 1e3, 2) for name, seconds in steps.items()}
    found["copy_gb_per_s"] = rate(size, steps["copy"])
    found["all_three_gb_per_s"] = round(size / sum(statistics.median(s) for s in steps.values()) / 1e9, 2)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where the JSON goes")
    parser.add_argument("--dir", default="/tmp", help="where the test files go (default /tmp)")
    parser.add_argument("--only", choices=("dma",), help="run only this probe")
    args = parser.parse_args()
    result: dict = {"gdscp": gdscp.__version__, "threads": THREADS}
    made = []
    probes = (("1G", 1 << 30, "dma"),)
    if args.only is None:
        probes = (("256M", 256 << 20, "gpu"), ("1G", 1 << 30, "gpu"), ("4G", 4 << 30, "host")) + probes
    try:
        for label, size, kind in probes:
            path = os.path.join(args.dir, f"read-probe-{label}.bin")
            if path not in made:
                files.make_file(path, size)
                made.append(path)
            files.warm_cache(path)
            if kind == "host":
                key, found = "host_4G", fresh_host_reads(path, size)
            elif kind == "gpu":
                key, found = f"gpu_{label}", short_reads(path, size)
            else:
                key, found = f"page_cache_dma_{label}", page_cache_dma(path, size)
            result[key] = found
            print(json.dumps({key: found}), flush=True)
    finally:
        for path in made:
            os.unlink(path)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
