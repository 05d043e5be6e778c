"""Experiment: which read pattern gets a cold 2 GiB file off the GPU machine's
virtio disk fastest, beside gdscp and KvikIO reading it into GPU memory.

Host-memory readers (Python threads, pread releases the GIL), each with the
file's cache dropped just before:

* ``buf-1``: one thread, 16 MiB reads in order (the benchmark's buffered ceiling)
* ``buf-1-seq``: the same after posix_fadvise(SEQUENTIAL) (a larger readahead window)
* ``buf-N``: N threads claim 16 MiB chunks in order and read each in 4 MiB
  pieces (gdscp's pattern)
* ``direct-N``: O_DIRECT, 16 MiB requests, N threads

Rounds alternate the order. The block queue's settings are printed first.

    OUT=dir python3 scripts/probe/cold_probe.py    # on the GPU machine, after building
"""
import glob
import importlib.util
import json
import mmap
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import in_file_order, in_rounds  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
SIZE, CHUNK, PIECE = 2 * GiB, 16 * MiB, 4 * MiB
PATH = "/tmp/gdscp-cold-probe.bin"
OUT = os.environ.get("OUT", ".")
ROUNDS = 3


def drop():
    from gdscp.bench import files

    files.drop_cache(PATH)


def host_read(buf, threads, direct=False, seq=False, piece=PIECE):
    drop()
    fd = os.open(PATH, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        if seq:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        view = memoryview(buf)

        def get(off, n):
            end = off + n
            while off < end:
                got = os.preadv(fd, [view[off:min(off + piece, end)]], off)
                if got <= 0:
                    raise OSError("short read")
                off += got

        t0 = time.perf_counter()
        in_file_order(threads, SIZE, CHUNK, get)
        return SIZE / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)


def queue_settings():
    out = {}
    for dev in glob.glob("/sys/block/vd*") + glob.glob("/sys/block/nvme*"):
        for k in ("read_ahead_kb", "max_sectors_kb", "max_hw_sectors_kb", "nr_requests", "max_segments",
                  "scheduler", "rotational"):
            try:
                out[f"{os.path.basename(dev)}/{k}"] = open(f"{dev}/queue/{k}").read().strip()
            except OSError:
                pass
    return out


def main():
    import cupy

    from gdscp.bench import files

    print(json.dumps(queue_settings()), flush=True)
    files.make_file(PATH, SIZE, seed=3)
    buf = mmap.mmap(-1, SIZE)
    dev = cupy.empty(SIZE, cupy.uint8)
    import gdscp

    variants = {
        "buf-1": lambda: host_read(buf, 1, piece=CHUNK),
        "buf-1-seq": lambda: host_read(buf, 1, seq=True, piece=CHUNK),
        "buf-4": lambda: host_read(buf, 4),
        "buf-16": lambda: host_read(buf, 16),
        "buf-16-seq": lambda: host_read(buf, 16, seq=True),
        "direct-4": lambda: host_read(buf, 4, direct=True, piece=CHUNK),
        "direct-16": lambda: host_read(buf, 16, direct=True, piece=CHUNK),
    }

    def dev_read(mod, threads):
        mod.defaults.set("num_threads", threads)
        drop()
        f = mod.CuFile(PATH, "r")
        try:
            t0 = time.perf_counter()
            n = f.read(dev)
            assert n == SIZE
            return SIZE / (time.perf_counter() - t0) / 1e9
        finally:
            f.close()

    for t in (4, 8, 16):
        variants[f"gdscp-{t}"] = lambda t=t: dev_read(gdscp, t)
    if importlib.util.find_spec("kvikio"):
        import kvikio
        import kvikio.defaults

        variants["kvikio-16"] = lambda: dev_read(kvikio, 16)

    try:
        in_rounds(variants, ROUNDS, os.path.join(OUT, "cold.json"))
    finally:
        os.unlink(PATH)


if __name__ == "__main__":
    main()
