"""Experiment: where per-worker staging loses against the copy engine on a hot
file -> GPU read, in one device call.

Measures, on one machine: the copy engine alone (one 1 GiB copy, and 4 / 8 /
16 MiB copies from pinned memory round-robin over 16 streams, as the staging
path issues them), the host copy rate, then engine variants (environment
variables, one process each, two rounds in alternating order; every variant
times each thread count in turn with the file opened for each read, median of
5 after a warm-up, as ``gpu_probe.py``'s hot part does) and KvikIO.

    OUT=dir python3 scripts/probe/staging_probe.py    # on the GPU machine, after building

The fourth session's runs (docs/benchmarks.md) also timed engine variants behind
GDSCP_PROBE_* switches of an uncommitted build: chunk-at-a-time claiming (the
code before commit "claim staging pieces"), no staggered first pieces, waiting
on copies by polling cuEventQuery with pause or sched_yield, a smaller first
piece, and pipeline depth 1. The engine has none of those switches; the
variants above are the ones its settings still reach.
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_probe  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
OUT = os.environ.get("OUT", ".")
results = []


def log(**row):
    results.append(row)
    print(json.dumps(row), flush=True)


def piece_copy_rate(piece, streams=16, total=4 * GiB, slots=32):
    """Pinned -> GPU in `piece`-sized copies over `streams` streams (median of 3 after 1)."""
    import cupy

    rt = cupy.cuda.runtime
    dev = cupy.empty(total, dtype=cupy.uint8)
    host = cupy.cuda.alloc_pinned_memory(slots * piece)
    ss = [cupy.cuda.Stream(non_blocking=False) for _ in range(streams)]
    rates = []
    for _ in range(4):
        rt.deviceSynchronize()
        t0 = time.perf_counter()
        for i in range(total // piece):
            rt.memcpyAsync(dev.data.ptr + i * piece, host.ptr + (i % slots) * piece, piece,
                           rt.memcpyHostToDevice, ss[i % streams].ptr)
        rt.deviceSynchronize()
        rates.append(total / (time.perf_counter() - t0) / 1e9)
    del dev, host
    cupy.get_default_memory_pool().free_all_blocks()
    return statistics.median(rates[1:])


def machine():
    info = {}
    try:
        info["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        pass
    log(kind="machine", **info)
    print(info.get("lscpu", ""))


def ceilings():
    from gdscp.bench import ceilings as c

    log(kind="ceiling", what="pinned h2d 1 GiB", gb_per_s=c.pinned_copy_rate(1 * GiB, 5)["gb_per_s"])
    for piece in (4 * MiB, 8 * MiB, 16 * MiB):
        log(kind="ceiling", what=f"pinned h2d {piece >> 20} MiB copies, 16 streams", gb_per_s=piece_copy_rate(piece))
    log(kind="ceiling", what="host memcpy 16 thr", gb_per_s=c.host_memcpy_rate(4 * GiB, 16, 3)["gb_per_s"])


def bounce(mib):
    return {"GDSCP_BOUNCE_BUFFER_SIZE": str(mib * MiB)}


VARIANTS = {
    "4M (default)": ({}, "12,16"),
    "5M": (bounce(5), "12,16"),
    "6M": (bounce(6), "12,16"),
}


def hot():
    runs = [(name, env, "gdscp", counts) for name, (env, counts) in VARIANTS.items()]
    if importlib.util.find_spec("kvikio"):
        runs.append(("kvikio", {}, "kvikio", "16"))
    table = gpu_probe.run_variants(runs, log)
    print("\nvariant, threads: round medians")
    for (name, t), meds in sorted(table.items(), key=lambda kv: -max(kv[1])):
        print(f"{name:12s} {t:3d}: " + " / ".join(f"{m:.2f}" for m in meds))


def main():
    from gdscp.bench import files

    machine()
    files.make_file(gpu_probe.PATH, gpu_probe.SIZE)
    files.warm_cache(gpu_probe.PATH)
    try:
        ceilings()
        hot()
        from gdscp.bench import ceilings as c
        log(kind="ceiling", what="pinned h2d 1 GiB (end)", gb_per_s=c.pinned_copy_rate(1 * GiB, 5)["gb_per_s"])
    finally:
        os.unlink(gpu_probe.PATH)
        with open(os.path.join(OUT, "staging.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
