"""Experiment: why hot file -> GPU reads measure lower inside `gdscp benchmark`
than in a fresh process. One process, one 4 GiB cached file, rounds of
open-read-close by gdscp (grouped copies at 8 and 16 threads, per-worker at 16)
and KvikIO (16 threads):

  A. rounds with nothing else in between;
  B. rounds that also run the benchmark's naive baselines (readinto a pageable
     4 GiB buffer + CuPy upload; numpy.fromfile + cupy.asarray);
  C. rounds with nothing else again.

Dirty and writeback page counts are logged with every round.

    OUT=dir python3 scripts/probe/bench_gap.py     # on the GPU machine, after building
"""
import json
import os
import statistics
import time

import cupy
import numpy as np

import gdscp
from gdscp.bench import files
from gpu_probe import timed  # this folder, on sys.path when run as a script

try:
    import kvikio
    import kvikio.defaults
except Exception:
    kvikio = None

GiB, MiB = 1 << 30, 1 << 20
PATH, SIZE = "/tmp/gdscp-gap.bin", 4 * GiB
OUT = os.environ.get("OUT", ".")
rows = []


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k in ("Dirty", "Writeback"):
                out[k] = int(v.split()[0]) >> 10  # MiB
    return out


def gd(threads, grouped, dev):
    def run():
        with gdscp.defaults.set({"num_threads": threads, "grouped_copies": grouped}):
            f = gdscp.CuFile(PATH)
            r = timed(lambda: f.pread(dev).get(), SIZE)
            f.close()
        return r
    return run


def kv(threads, dev):
    def run():
        with kvikio.defaults.set("num_threads", threads):
            f = kvikio.CuFile(PATH, "r")
            r = timed(lambda: f.pread(dev).get(), SIZE)
            f.close()
        return r
    return run


def baselines(host, path=PATH, size=SIZE):
    """What the benchmark's naive baselines do: readinto a pageable buffer plus a
    CuPy upload, then numpy.fromfile plus cupy.asarray."""
    with open(path, "rb", buffering=0) as f:
        view = memoryview(host)
        done = 0
        while done < size:
            done += f.readinto(view[done:])
    d = cupy.asarray(host)
    del d
    a = np.fromfile(path, dtype=np.uint8)
    d = cupy.asarray(a)
    del a, d


def main():
    files.make_file(PATH, SIZE)
    files.warm_cache(PATH)
    dev = cupy.empty(SIZE, dtype=cupy.uint8)
    host = np.empty(SIZE, dtype=np.uint8)
    contenders = {
        "gdscp grouped 8": gd(8, True, dev),
        "gdscp grouped 16": gd(16, True, dev),
        "gdscp per-worker 16": gd(16, False, dev),
    }
    if kvikio:
        contenders["kvikio 16"] = kv(16, dev)
    for fn in contenders.values():
        fn()
    t_start = time.time()
    try:
        for phase, rounds, extra in (("A", 6, False), ("B", 5, True), ("C", 6, False)):
            got = {k: [] for k in contenders}
            for rnd in range(rounds):
                for name, fn in contenders.items():
                    got[name].append(fn())
                if extra:
                    baselines(host)
                print(phase, rnd, round(time.time() - t_start, 1), meminfo(),
                      {k: round(v[-1], 2) for k, v in got.items()}, flush=True)
            for name, r in got.items():
                rows.append({"phase": phase, "name": name, "median": statistics.median(r), "rates": r})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        os.unlink(PATH)
        with open(os.path.join(OUT, "bench_gap.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
