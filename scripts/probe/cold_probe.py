"""Experiment: which read pattern gets a cold 2 GiB file off the GPU machine's
virtio disk fastest, beside gdscp and KvikIO reading it into GPU memory.

Host-memory readers (Python threads, pread releases the GIL), each with the
file's cache dropped just before:

* ``buf-1``: one thread, 16 MiB reads in order (the benchmark's buffered
  ceiling, ``ceilings.buffered_read_rate``)
* ``buf-1-seq``: the same after posix_fadvise(SEQUENTIAL) (a larger readahead window)
* ``buf-N``: N threads claim 16 MiB chunks in order and read each in 4 MiB
  pieces (gdscp's pattern)
* ``direct-N``: O_DIRECT, 16 MiB requests, N threads (``ceilings.direct_read_rate``)

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

from gdscp.bench import ceilings, files

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import in_rounds  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
SIZE, CHUNK, PIECE = 2 * GiB, 16 * MiB, 4 * MiB
PATH = "/tmp/gdscp-cold-probe.bin"
OUT = os.environ.get("OUT", ".")
ROUNDS = 3


def buffered_read(buf, threads, seq=False, piece=PIECE):
    """Cold buffered read of the whole file into `buf`, threads claiming chunks
    in file order and reading each in `piece`-sized preads; GB/s."""
    files.drop_cache(PATH)
    fd = os.open(PATH, os.O_RDONLY)
    try:
        if seq:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        view = memoryview(buf)

        def get(off, _thread_buffer, n):
            end = off + n
            while off < end:
                got = os.preadv(fd, [view[off:min(off + piece, end)]], off)
                if got <= 0:
                    raise OSError("short read")
                off += got
            return n

        t0 = time.perf_counter()
        ceilings.parallel_chunks(SIZE, CHUNK, [view] * threads, get)
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

    print(json.dumps(queue_settings()), flush=True)
    files.make_file(PATH, SIZE, seed=3)
    buf = mmap.mmap(-1, SIZE)
    dev = cupy.empty(SIZE, cupy.uint8)
    import gdscp

    variants = {
        "buf-1": lambda: ceilings.buffered_read_rate(PATH, SIZE, 1)["gb_per_s"]["median"],
        "buf-1-seq": lambda: buffered_read(buf, 1, seq=True, piece=CHUNK),
        "buf-4": lambda: buffered_read(buf, 4),
        "buf-16": lambda: buffered_read(buf, 16),
        "buf-16-seq": lambda: buffered_read(buf, 16, seq=True),
        "direct-4": lambda: ceilings.direct_read_rate(PATH, SIZE, 4, 1)["gb_per_s"]["median"],
        "direct-16": lambda: ceilings.direct_read_rate(PATH, SIZE, 16, 1)["gb_per_s"]["median"],
    }

    def dev_read(mod, threads):
        mod.defaults.set("num_threads", threads)
        files.drop_cache(PATH)
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
