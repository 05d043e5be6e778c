"""Experiment: hot file -> GPU with grouped copies against per-worker staging,
and cold file -> GPU against the disk, in one device call.

Hot part (4 GiB file in the page cache): every configuration is read on an
open handle (one warm-up, then RUNS timed reads), twice in alternating order;
then a benchmark-like pass opens the file for every read and interleaves the
contenders run by run, KvikIO included when importable. Cold part (2 GiB file,
cache dropped before every read): the disk's own readers and gdscp variants,
interleaved round by round. Results: docs/benchmarks.md.

    OUT=dir python3 scripts/probe/gpu_probe.py     # on the GPU machine, after building
"""
import json
import os
import statistics
import threading
import time

import cupy
import numpy as np

import gdscp
from gdscp.bench import ceilings, files

try:
    import kvikio
    import kvikio.defaults
except Exception:  # KvikIO is optional
    kvikio = None

GiB, MiB = 1 << 30, 1 << 20
RUNS = 5
OUT = os.environ.get("OUT", ".")
results = []


def log(**row):
    results.append(row)
    print(json.dumps(row), flush=True)


def sync():
    cupy.cuda.runtime.deviceSynchronize()


def timed(read, nbytes):
    sync()
    t0 = time.perf_counter()
    read()
    sync()
    return nbytes / (time.perf_counter() - t0) / 1e9


def machine():
    info = {}
    for key in ("index2", "index3"):
        p = f"/sys/devices/system/cpu/cpu0/cache/{key}/size"
        if os.path.exists(p):
            info[key] = open(p).read().strip()
    with open("/proc/cpuinfo") as f:
        info["model"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    log(kind="machine", **info)


def config(threads, grouped, piece=4 * MiB, task=16 * MiB, slots=None):
    name = f"{'grouped' if grouped else 'per-worker'} thr={threads} piece={piece >> 20}M task={task >> 20}M"
    if slots:
        name += f" slots={slots}"
    cfg = dict(num_threads=threads, grouped_copies=grouped, bounce_buffer_size=piece, task_size=task)
    return name, cfg, slots


class Slots:
    """The probe-only slot-count override read by the engine at each grouped request."""

    def __init__(self, n):
        self.n = n

    def __enter__(self):
        if self.n:
            os.environ["GDSCP_PROBE_GROUPED_SLOTS"] = str(self.n)

    def __exit__(self, *exc):
        os.environ.pop("GDSCP_PROBE_GROUPED_SLOTS", None)


def check(dev, path, size):
    for start in (0, size // 2, size - 64 * MiB):
        want = np.fromfile(path, dtype=np.uint8, count=64 * MiB, offset=start)
        if not (dev[start:start + 64 * MiB].get() == want).all():
            raise SystemExit(f"wrong bytes at {start}")


def hot(path, size, dev):
    log(kind="ceiling", what="pinned h2d 1 GiB", gb_per_s=ceilings.pinned_copy_rate(1 * GiB, 5)["gb_per_s"])
    configs = [config(t, False) for t in (12, 16)]
    configs += [config(t, True) for t in (8, 12, 16, 24, 32)]
    configs += [config(t, True, piece=2 * MiB) for t in (12, 16, 24, 32)]
    configs += [config(t, True, task=32 * MiB) for t in (12, 16, 24)]
    configs += [config(16, True, piece=2 * MiB, task=32 * MiB), config(16, True, piece=1 * MiB)]
    configs += [config(16, True, slots=n) for n in (4, 5, 6, 8, 10)]
    configs += [config(12, True, slots=n) for n in (5, 8)]
    for rnd in range(2):
        for name, cfg, slots in (configs if rnd == 0 else configs[::-1]):
            with gdscp.defaults.set(cfg), Slots(slots), gdscp.CuFile(path) as f:
                f.read(dev)
                rates = [timed(lambda: f.read(dev), size) for _ in range(RUNS)]
            dev[: 64 * MiB].fill(0)
            log(kind="hot-open-handle", round=rnd, name=name, median=statistics.median(rates), rates=rates)
        check_after = configs[0]
        with gdscp.defaults.set(check_after[1]):
            gdscp.CuFile(path).read(dev)
        check(dev, path, size)

    # Benchmark-like: open for every read, contenders interleaved run by run.
    contenders = [config(t, False) for t in (12, 16)]
    contenders += [config(t, True) for t in (12, 16, 24)]
    contenders += [config(16, True, piece=2 * MiB), config(16, True, task=32 * MiB)]
    contenders.append(("gdscp defaults", {}, None))
    kv = [16, 32] if kvikio else []
    rates = {name: [] for name, _, _ in contenders}
    rates.update({f"kvikio thr={t}": [] for t in kv})
    for name, cfg, slots in contenders:  # warm-up
        with gdscp.defaults.set(cfg), Slots(slots), gdscp.CuFile(path) as f:
            f.read(dev)
    for t in kv:
        with kvikio.defaults.set("num_threads", t), kvikio.CuFile(path, "r") as f:
            f.read(dev)
    for run in range(RUNS):
        for name, cfg, slots in contenders:
            with gdscp.defaults.set(cfg), Slots(slots):
                f = gdscp.CuFile(path)
                rates[name].append(timed(lambda: f.pread(dev).get(), size))
                f.close()
        for t in kv:
            with kvikio.defaults.set("num_threads", t):
                f = kvikio.CuFile(path, "r")
                rates[f"kvikio thr={t}"].append(timed(lambda: f.pread(dev).get(), size))
                f.close()
    for name, r in rates.items():
        log(kind="hot-open-per-run", name=name, median=statistics.median(r), rates=r)
    check(dev, path, size)
    log(kind="ceiling", what="pinned h2d 1 GiB (end)", gb_per_s=ceilings.pinned_copy_rate(1 * GiB, 5)["gb_per_s"])


def cold(path, size, dev):
    view = dev[:size]

    def gd(cfg=None, advice=None, willneed=False):
        def run():
            files.drop_cache(path)
            with gdscp.defaults.set(cfg or {}), gdscp.CuFile(path) as f:
                if advice is not None:
                    os.posix_fadvise(f.fileno(), 0, 0, advice)
                stop = threading.Event()
                helper = None
                if willneed:
                    # Ask the kernel for the range ahead of the workers, 64 MiB at a time.
                    def ahead():
                        for off in range(0, size, 64 * MiB):
                            if stop.is_set():
                                return
                            os.posix_fadvise(f.fileno(), off, 64 * MiB, os.POSIX_FADV_WILLNEED)
                    helper = threading.Thread(target=ahead)
                t0 = time.perf_counter()
                if helper:
                    helper.start()
                n = f.pread(view).get()
                sync()
                dt = time.perf_counter() - t0
                stop.set()
                if helper:
                    helper.join()
            assert n == size
            return size / dt / 1e9
        return run

    def kv(t):
        def run():
            files.drop_cache(path)
            with kvikio.defaults.set("num_threads", t), kvikio.CuFile(path, "r") as f:
                t0 = time.perf_counter()
                f.pread(view).get()
                sync()
                return size / (time.perf_counter() - t0) / 1e9
        return run

    variants = {
        "disk O_DIRECT 16 thr": lambda: ceilings.direct_read_rate(path, size, 16, 1)["gb_per_s"]["median"],
        "disk buffered 1 thr": lambda: ceilings.buffered_read_rate(path, size, 1)["gb_per_s"]["median"],
        "gdscp defaults": gd(),
        "gdscp 4 thr": gd({"num_threads": 4}),
        "gdscp 8 thr": gd({"num_threads": 8}),
        "gdscp FADV_SEQUENTIAL": gd(advice=os.POSIX_FADV_SEQUENTIAL),
        "gdscp + WILLNEED ahead": gd(willneed=True),
        "gdscp direct_io=on": gd({"direct_io": "on"}),
    }
    if kvikio:
        variants["kvikio 16 thr"] = kv(16)
    rates = {k: [] for k in variants}
    for rnd in range(4):
        for name, fn in variants.items():
            rates[name].append(fn())
            print(f"cold round {rnd} {name}: {rates[name][-1]:.3f}", flush=True)
    for name, r in rates.items():
        log(kind="cold", name=name, median=statistics.median(r), rates=r)


def main():
    machine()
    path = "/tmp/gdscp-probe.bin"
    size = 4 * GiB
    files.make_file(path, size)
    files.warm_cache(path)
    dev = cupy.empty(size, dtype=cupy.uint8)
    try:
        hot(path, size, dev)
        cold(path, 2 * GiB, dev)
    finally:
        os.unlink(path)
        with open(os.path.join(OUT, "probe.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
