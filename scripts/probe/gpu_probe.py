"""Experiment: where does hot file -> GPU lose against the pinned ceiling?

Measures the copy engine alone with the piece sizes a staging pipeline issues
(16 streams, two pinned buffers each), then gdscp's hot read over bounce
buffer and task sizes. Results: docs/benchmarks.md ("Where the last 5% go").

    python scripts/probe/gpu_probe.py      # on the GPU machine, after building
"""
import os, statistics, time
import cupy, numpy as np
import gdscp
from gdscp.bench import ceilings, files

GiB, MiB = 1 << 30, 1 << 20
size = 4 * GiB
path = "/tmp/gdscp-probe.bin"
files.make_file(path, size)
files.warm_cache(path)
dev = cupy.empty(size, dtype=cupy.uint8)
print("pinned h2d 1 GiB", ceilings.pinned_copy_rate(1 * GiB, 5)["gb_per_s"], flush=True)

# Copy engine with our piece size: 16 streams, each copying 4 MiB pieces from its own 2 pinned buffers.
def pieces_rate(piece, nstreams, depth=2):
    bufs = [cupy.cuda.alloc_pinned_memory(piece) for _ in range(nstreams * depth)]
    streams = [cupy.cuda.Stream(non_blocking=False) for _ in range(nstreams)]
    n = size // piece
    rates = []
    for _ in range(3):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for i in range(n):
            s = streams[i % nstreams]
            b = bufs[(i % nstreams) * depth + (i // nstreams) % depth]
            cupy.cuda.runtime.memcpyAsync(dev.data.ptr + i * piece, b.ptr, piece, 1, s.ptr)
        cupy.cuda.runtime.deviceSynchronize()
        rates.append(size / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)

for piece in (4 * MiB, 16 * MiB):
    for nstreams in (16,):
        print(f"pinned pieces {piece >> 20} MiB x {nstreams} streams: {pieces_rate(piece, nstreams):.2f}", flush=True)

def rate(cfg, runs=5, grouped=False):
    with gdscp.defaults.set({**cfg, "grouped_copies": grouped}), gdscp.CuFile(path) as f:
        f.read(dev)
        rs = []
        for _ in range(runs):
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            f.read(dev)
            cupy.cuda.runtime.deviceSynchronize()
            rs.append(size / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rs), max(rs)

ref = np.fromfile(path, dtype=np.uint8, count=64 * MiB)
for rnd in range(2):
    for threads in (12, 16):
        for grouped in (False, True):
            cfg = dict(num_threads=threads)
            dev[: 64 * MiB].fill(0)
            med, best = rate(cfg, grouped=grouped)
            assert (dev[: 64 * MiB].get() == ref).all()
            print(f"gdscp thr={threads} grouped_copies={grouped}: median {med:.2f} best {best:.2f}", flush=True)
ref = np.fromfile(path, dtype=np.uint8, count=64 * MiB)
assert (dev[:64 * MiB].get() == ref).all()
os.unlink(path)
