"""Experiment: how writes of a new 2 GiB file (truncated, fsync included) reach
ext4 on the GPU machine's virtio disk fastest.

ext4 takes the inode lock exclusively for an O_DIRECT write that extends the
file or allocates blocks, and holds it until the write completes, so parallel
O_DIRECT writes to a fresh file may run one at a time. Writes into blocks
already allocated (fallocate) may run in parallel. This probe times, from host
memory, with workers claiming 16 MiB pieces in file order:

* ``direct-N``: O_DIRECT pwrite, N threads, fsync (``ceilings.direct_write_rate``)
* ``falloc-direct-N``: fallocate(whole range) first, then the same
* ``buffered-N``: buffered pwrite then fsync
* ``buffered-sfr-N``: buffered pwrite, each piece followed by sync_file_range(WRITE)

beside gdscp and KvikIO writing from GPU memory, interleaved over rounds.

    OUT=dir python3 scripts/probe/write_probe.py    # on the GPU machine, after building
"""
import ctypes
import importlib.util
import mmap
import os
import platform
import sys
import time

import numpy as np

from gdscp.bench import ceilings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import in_rounds  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
SIZE, PIECE = 2 * GiB, 16 * MiB
PATH = "/tmp/gdscp-write-probe.bin"
OUT = os.environ.get("OUT", ".")
ROUNDS = 3

libc = ctypes.CDLL(None, use_errno=True)
libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
SYNC_FILE_RANGE_WRITE = 2


def host_write(buf, threads, direct, falloc=False, sfr=False):
    fd = os.open(PATH, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o600)
    try:
        os.sync()
        view = memoryview(buf)

        def put(off, _thread_buffer, n):
            done = 0
            while done < n:
                done += os.pwrite(fd, view[off + done:off + n], off + done)
            if sfr:
                libc.sync_file_range(fd, off, n, SYNC_FILE_RANGE_WRITE)
            return n

        t0 = time.perf_counter()
        if falloc:
            os.posix_fallocate(fd, 0, SIZE)
        ceilings.parallel_chunks(SIZE, PIECE, [view] * threads, put)
        os.fsync(fd)
        return SIZE / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)


def main():
    import cupy

    print(platform.uname().release, flush=True)
    buf = mmap.mmap(-1, SIZE)
    src = os.urandom(64 * MiB)
    for off in range(0, SIZE, len(src)):
        buf[off:off + len(src)] = src
    dev = cupy.asarray(np.frombuffer(buf, dtype=np.uint8))

    import gdscp

    variants = {}
    for t in (1, 4, 16):
        variants[f"direct-{t}"] = lambda t=t: ceilings.direct_write_rate(PATH, SIZE, t, 1)["gb_per_s"]["median"]
    for t in (4, 16):
        variants[f"falloc-direct-{t}"] = lambda t=t: host_write(buf, t, True, falloc=True)
    variants["buffered-16"] = lambda: host_write(buf, 16, False)
    variants["buffered-sfr-16"] = lambda: host_write(buf, 16, False, sfr=True)

    def dev_write(mod, threads):
        mod.defaults.set("num_threads", threads)
        f = mod.CuFile(PATH, "w")
        try:
            os.sync()
            t0 = time.perf_counter()
            n = f.write(dev)
            os.fsync(f.fileno())
            assert n == SIZE
            return SIZE / (time.perf_counter() - t0) / 1e9
        finally:
            f.close()

    for t in (4, 16):
        variants[f"gdscp-{t}"] = lambda t=t: dev_write(gdscp, t)
    if importlib.util.find_spec("kvikio"):
        import kvikio
        import kvikio.defaults

        for t in (4, 16):
            variants[f"kvikio-{t}"] = lambda t=t: dev_write(kvikio, t)

    try:
        in_rounds(variants, ROUNDS, os.path.join(OUT, "write.json"))
    finally:
        if os.path.exists(PATH):
            os.unlink(PATH)


if __name__ == "__main__":
    main()
