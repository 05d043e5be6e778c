"""Experiment: hot file -> GPU with grouped copies against per-worker staging,
and cold file -> GPU against the disk, in one device call.

Hot part (4 GiB file in the page cache): each engine variant (set through
GDSCP_* environment variables, so each runs in its own process) is measured the
way a side-by-side check would: for every run, every thread count
in turn, the file opened for each read. Variants run twice, in alternating
order; KvikIO runs the same loop in its own process. Cold part (2 GiB, cache
dropped before every read): the disk's own readers and gdscp variants,
interleaved round by round. Results: docs/benchmarks.md (third session). The
06:29 run there also measured engine variants behind GDSCP_PROBE_* knobs (a
reader cap of 8 or 12, blocking-sync events, cold chunks prefetched or read
O_DIRECT), which existed at commit f49dc89 only.

    OUT=dir python3 scripts/probe/gpu_probe.py     # on the GPU machine, after building
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

GiB, MiB = 1 << 30, 1 << 20
RUNS = 5
PATH = "/tmp/gdscp-probe.bin"
SIZE = 4 * GiB
OUT = os.environ.get("OUT", ".")
results = []


def log(**row):
    results.append(row)
    print(json.dumps(row), flush=True)


def timed(read, nbytes):
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    read()
    cupy.cuda.runtime.deviceSynchronize()
    return nbytes / (time.perf_counter() - t0) / 1e9


def in_rounds(variants, rounds, json_path):
    """Call each of `variants` ({name: function returning GB/s}) once per round,
    the order reversed every other round; write {name: [GB/s per round]} to
    `json_path` (also when interrupted), print each name's median, and return it."""
    res = {k: [] for k in variants}
    names = list(variants)
    try:
        for rnd in range(rounds):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                try:
                    res[name].append(variants[name]())
                except Exception as e:  # noqa: BLE001 - a probe reports and goes on
                    print(name, "failed:", repr(e), flush=True)
                print(rnd, name, f"{res[name][-1]:.3f}" if res[name] else "-", flush=True)
    finally:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1)
    print()
    for name, v in res.items():
        if v:
            print(f"{name:18s} median {statistics.median(v):.3f}  ({' / '.join(f'{x:.3f}' for x in v)})")
    return res


def check(dev, path, size):
    for start in (0, size // 2, size - 64 * MiB):
        want = np.fromfile(path, dtype=np.uint8, count=64 * MiB, offset=start)
        if not (dev[start:start + 64 * MiB].get() == want).all():
            raise SystemExit(f"wrong bytes at {start}")


def hot_child(tool, counts):
    """One process: every run, every thread count, open-read-close; prints JSON."""
    import cupy

    dev = cupy.empty(SIZE, dtype=cupy.uint8)
    if tool == "kvikio":
        import kvikio
        import kvikio.defaults

        def setting(t):
            return kvikio.defaults.set("num_threads", t)

        def opener():
            return kvikio.CuFile(PATH, "r")
    else:
        import gdscp

        def setting(t):
            return gdscp.defaults.set("num_threads", t)

        def opener():
            return gdscp.CuFile(PATH, "r")

    rates = {t: [] for t in counts}
    for run in range(RUNS + 1):  # run 0 warms up
        for t in counts:
            with setting(t):
                f = opener()
                r = timed(lambda: f.pread(dev).get(), SIZE)
                f.close()
            if run:
                rates[t].append(r)
    check(dev, PATH, SIZE)
    print(json.dumps({str(t): r for t, r in rates.items()}))


def run_variants(runs, log):
    """Each (name, environment, tool, thread counts) in its own hot_child process,
    two rounds in opposite order; logs every median and returns
    {(name, threads): [median of round 1, median of round 2]}."""
    table = {}
    for rnd in range(2):
        for name, env, tool, counts in (runs if rnd == 0 else runs[::-1]):
            proc = subprocess.run(
                [sys.executable, __file__, "--hot-child", tool, counts],
                env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
            )
            if proc.returncode != 0:
                log(kind="hot", round=rnd, name=name, error=proc.stderr[-2000:])
                continue
            rates = json.loads(proc.stdout.strip().splitlines()[-1])
            for t, r in rates.items():
                log(kind="hot", round=rnd, name=name, threads=int(t), median=statistics.median(r), rates=r)
                table.setdefault((name, int(t)), []).append(statistics.median(r))
    return table


def hot():
    from gdscp.bench import ceilings

    log(kind="ceiling", what="pinned h2d 1 GiB", gb_per_s=ceilings.pinned_copy_rate(1 * GiB, 5)["gb_per_s"])
    variants = {
        "per-worker": {"GDSCP_GROUPED_COPIES": "0"},
        "grouped": {"GDSCP_GROUPED_COPIES": "1"},
    }
    runs = [(name, env, "gdscp", "8,12,16,32") for name, env in variants.items()]
    if importlib.util.find_spec("kvikio"):
        runs.append(("kvikio", {}, "kvikio", "8,16,32"))
    run_variants(runs, log)
    log(kind="ceiling", what="pinned h2d 1 GiB (end)", gb_per_s=ceilings.pinned_copy_rate(1 * GiB, 5)["gb_per_s"])


def cold(size):
    import cupy

    import gdscp
    from gdscp.bench import ceilings, files

    dev = cupy.empty(size, dtype=cupy.uint8)

    def sync():
        cupy.cuda.runtime.deviceSynchronize()

    def gd(settings, advice=None):
        def run():
            files.drop_cache(PATH)
            with gdscp.defaults.set(settings), gdscp.CuFile(PATH) as f:
                if advice is not None:
                    os.posix_fadvise(f.fileno(), 0, 0, advice)
                sync()
                t0 = time.perf_counter()
                n = f.pread(dev).get()
                sync()
                dt = time.perf_counter() - t0
            assert n == size
            return size / dt / 1e9
        return run

    def kv(t):
        def run():
            import kvikio
            import kvikio.defaults

            files.drop_cache(PATH)
            with kvikio.defaults.set("num_threads", t), kvikio.CuFile(PATH, "r") as f:
                sync()
                t0 = time.perf_counter()
                f.pread(dev).get()
                sync()
                return size / (time.perf_counter() - t0) / 1e9
        return run

    variants = {
        "disk O_DIRECT 16 thr": lambda: ceilings.direct_read_rate(PATH, size, 16, 1)["gb_per_s"]["median"],
        "disk buffered 1 thr": lambda: ceilings.buffered_read_rate(PATH, size, 1)["gb_per_s"]["median"],
        "gdscp defaults": gd({}),
        "gdscp FADV_SEQUENTIAL": gd({}, os.POSIX_FADV_SEQUENTIAL),
        "gdscp direct_io=on": gd({"direct_io": "on"}),
        "gdscp grouped": gd({"grouped_copies": True}),
    }
    if importlib.util.find_spec("kvikio"):
        variants["kvikio 16 thr"] = kv(16)
    rates = {k: [] for k in variants}
    for rnd in range(4):
        for name, fn in variants.items():
            rates[name].append(fn())
            print(f"cold round {rnd} {name}: {rates[name][-1]:.3f}", flush=True)
    for name, r in rates.items():
        log(kind="cold", name=name, median=statistics.median(r), rates=r)


def main():
    from gdscp.bench import files

    info = {}
    p = "/sys/devices/system/cpu/cpu0/cache/index3/size"
    if os.path.exists(p):
        info["llc"] = open(p).read().strip()
    log(kind="machine", **info)
    files.make_file(PATH, SIZE)
    files.warm_cache(PATH)
    try:
        hot()
        cold(2 * GiB)
    finally:
        os.unlink(PATH)
        with open(os.path.join(OUT, "probe.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--hot-child":
        hot_child(sys.argv[2], [int(t) for t in sys.argv[3].split(",")])
    else:
        main()
