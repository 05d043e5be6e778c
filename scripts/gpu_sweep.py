"""Settings sweep on a GPU machine: hot file -> GPU over a grid of gdscp's
settings, hot reads into host memory with and without mapped_reads, random-read
latency, cold reads buffered and O_DIRECT, and writes with fsync, each beside
KvikIO (when importable) and the machine's own rates, in one run.

This is how the defaults were chosen (docs/performance.md). Prints each figure
as it goes and writes them all as JSON to OUT.

    python scripts/gpu_sweep.py OUT.json [--dir DIR] [--size-gib 4]
        [--threads 12,16,20,24] [--task-size 4M,16M] [--bounce 2M,4M,8M] [--depth 2,3]

Unlike `gdscp benchmark`, reads here reuse one open handle (no open per read).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import cupy
import numpy as np

import gdscp
from gdscp.bench import ceilings, files
from gdscp.cli.units import parse_size

GiB = 1 << 30
MiB = 1 << 20


def median_rate(fn, nbytes: int, runs: int) -> dict:
    times = []
    for _ in range(runs):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        fn()
        cupy.cuda.runtime.deviceSynchronize()
        times.append(time.perf_counter() - t0)
    rates = [nbytes / t / 1e9 for t in times]
    return {"gbps": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": runs}


def latencies(read_one, path_size: int, io: int, samples: int = 300) -> dict:
    rng = np.random.default_rng(1)
    offs = rng.integers(0, (path_size - io) // 4096, size=samples) * 4096
    out = []
    for off in offs:
        t0 = time.perf_counter()
        read_one(int(off))
        out.append((time.perf_counter() - t0) * 1e6)
    out.sort()
    return {"p50_us": out[len(out) // 2], "p99_us": out[int(len(out) * 0.99)], "samples": samples}


def int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def size_list(text: str) -> list[int]:
    return [parse_size(v) for v in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--dir", default=".")
    ap.add_argument("--size-gib", type=float, default=4)
    ap.add_argument("--threads", type=int_list, default="12,16,20,24", help="num_threads values")
    ap.add_argument("--task-size", type=size_list, default="4M,16M", help="task_size values")
    ap.add_argument("--bounce", type=size_list, default="2M,4M,8M", help="bounce_buffer_size values")
    ap.add_argument("--depth", type=int_list, default="2,3", help="pipeline_depth values")
    args = ap.parse_args()

    try:
        import kvikio
        import kvikio.defaults
    except Exception as e:  # noqa: BLE001
        kvikio = None
        print("kvikio not importable:", e, file=sys.stderr)

    size = int(args.size_gib * GiB)
    path = os.path.join(args.dir, "gdscp-sweep.bin")
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "size": size,
                     "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                     "cpus": os.cpu_count(), "gdscp": gdscp.__version__,
                     "kvikio": getattr(kvikio, "__version__", None)}
    runs = 3
    t_start = time.perf_counter()
    files.make_file(path, size)
    results["ceiling_pinned_h2d"] = ceilings.pinned_copy_rate(1 * GiB, 5)
    print("pinned h2d", results["ceiling_pinned_h2d"], flush=True)

    dev = cupy.empty(size, dtype=cupy.uint8)
    host = np.empty(size, dtype=np.uint8)
    files.warm_cache(path)
    ref = np.fromfile(path, dtype=np.uint8, count=64 * MiB)

    # --- hot file -> GPU over the settings grid
    sweep = []
    configs = [
        dict(num_threads=t, task_size=task, bounce_buffer_size=b, pipeline_depth=d)
        for t in args.threads for task in args.task_size for b in args.bounce for d in args.depth
    ]
    for cfg in configs:
        try:
            with gdscp.defaults.set(cfg):
                with gdscp.CuFile(path) as f:
                    f.read(dev)  # warm-up (pools, streams)
                    r = median_rate(lambda: f.read(dev), size, runs)
        except Exception as e:  # noqa: BLE001
            r = {"error": str(e)}
        sweep.append({**cfg, **r})
        print("gdscp hot->gpu", cfg, r, flush=True)
    assert (dev[: 64 * MiB].get() == ref).all(), "gdscp read wrong bytes"
    results["gdscp_hot_gpu_sweep"] = sweep

    # defaults as shipped
    with gdscp.CuFile(path) as f:
        f.read(dev)
        results["gdscp_hot_gpu_default"] = median_rate(lambda: f.read(dev), size, runs)
    print("gdscp default hot->gpu", results["gdscp_hot_gpu_default"], flush=True)

    # --- hot file -> host, through the mapping (the default) and through pread
    hs = []
    for mapped in (True, False):
        for threads in (16, 24):
            for task in (4 * MiB, 16 * MiB):
                cfg = {"num_threads": threads, "task_size": task, "mapped_reads": mapped}
                with gdscp.defaults.set(cfg), gdscp.CuFile(path) as f:
                    f.read(host)
                    hs.append({**cfg, **median_rate(lambda: f.read(host), size, runs)})
                print("gdscp hot->host", hs[-1], flush=True)
    results["gdscp_hot_host"] = hs

    if kvikio is not None:
        kv = []
        for threads in (8, 16, 32):
            kvikio.defaults.set("num_threads", threads)
            with kvikio.CuFile(path, "r") as f:
                f.read(dev)
                kv.append({"num_threads": threads, **median_rate(lambda: f.read(dev), size, runs)})
            print("kvikio hot->gpu", kv[-1], flush=True)
        results["kvikio_hot_gpu"] = kv
        kh = []
        for threads in (16, 32):
            kvikio.defaults.set("num_threads", threads)
            with kvikio.CuFile(path, "r") as f:
                f.read(host)
                kh.append({"num_threads": threads, **median_rate(lambda: f.read(host), size, runs)})
            print("kvikio hot->host", kh[-1], flush=True)
        results["kvikio_hot_host"] = kh
        kvikio.defaults.set("num_threads", 16)

    # --- latency of single random reads, hot
    lat = {}
    for io in (4096, 64 * 1024, MiB):
        buf = cupy.empty(io, dtype=cupy.uint8)
        with gdscp.CuFile(path) as f:
            for _ in range(20):
                f.read(buf, io, 0)
            lat[f"gdscp_{io}"] = latencies(lambda off: f.read(buf, io, off), size, io)
        if kvikio is not None:
            with kvikio.CuFile(path, "r") as f:
                for _ in range(20):
                    f.read(buf, io, 0)
                lat[f"kvikio_{io}"] = latencies(lambda off: f.read(buf, io, off), size, io)
        print("latency", io, {k: v for k, v in lat.items() if k.endswith(f"_{io}")}, flush=True)
    results["latency"] = lat

    # --- cold reads (2 GiB prefix) through the page cache and O_DIRECT, and the disk's own rates
    cold = min(size, 2 * GiB)
    cdev = dev[:cold]
    results["disk_odirect"] = {t: ceilings.direct_read_rate(path, cold, t, 1) for t in (4, 16)}
    results["disk_buffered"] = ceilings.buffered_read_rate(path, cold, 1)
    print("disk", results["disk_odirect"], results["disk_buffered"], flush=True)
    cg = []
    for direct in ("off", "on"):
        for threads in (16, 32):
            with gdscp.defaults.set({"num_threads": threads, "direct_io": direct}), gdscp.CuFile(path) as f:
                files.drop_cache(path, use_drop_caches=False)
                t0 = time.perf_counter()
                f.read(cdev)
                cg.append({"direct_io": direct, "num_threads": threads,
                           "gbps": cold / (time.perf_counter() - t0) / 1e9})
            print("gdscp cold->gpu", cg[-1], flush=True)
    results["gdscp_cold_gpu"] = cg
    if kvikio is not None:
        with kvikio.CuFile(path, "r") as f:
            files.drop_cache(path, use_drop_caches=False)
            t0 = time.perf_counter()
            f.read(cdev)
            results["kvikio_cold_gpu"] = cold / (time.perf_counter() - t0) / 1e9
        print("kvikio cold->gpu", results["kvikio_cold_gpu"], flush=True)

    # --- GPU -> file with fsync
    wpath = os.path.join(args.dir, "gdscp-sweep-w.bin")
    wr = []
    results["disk_write_odirect"] = {t: ceilings.direct_write_rate(wpath, cold, t, 1) for t in (1, 4)}
    os.unlink(wpath)
    print("disk write (O_DIRECT + fsync)", results["disk_write_odirect"], flush=True)
    for cfg in ({}, {"direct_io": "off"}, {"num_threads": 8}):
        with gdscp.defaults.set(cfg) if cfg else contextlib.nullcontext():
            t0 = time.perf_counter()
            with gdscp.CuFile(wpath, "w") as f:
                f.write(cdev)
                os.fsync(f.fileno())
            wr.append({**cfg, "gbps": cold / (time.perf_counter() - t0) / 1e9})
        print("gdscp gpu->file", wr[-1], flush=True)
        os.unlink(wpath)
    results["gdscp_write"] = wr
    if kvikio is not None:
        t0 = time.perf_counter()
        with kvikio.CuFile(wpath, "w") as f:
            f.write(cdev)
            os.fsync(f.fileno())
        results["kvikio_write"] = cold / (time.perf_counter() - t0) / 1e9
        print("kvikio gpu->file", results["kvikio_write"], flush=True)
    os.unlink(wpath)
    os.unlink(path)
    results["seconds"] = time.perf_counter() - t_start
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    best = max((s for s in sweep if "gbps" in s), key=lambda s: s["gbps"])
    print("BEST hot->gpu", best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
