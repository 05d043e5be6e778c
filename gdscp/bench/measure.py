"""Timed runs: one sequential read, one sequential write, one batch of random reads.

Each function times exactly the calls a user makes to get the data (opening
the file is outside the clock, ``fsync`` inside it for writes). For GPU memory
the device is synchronised before the clock starts and before it is read, so
a copy still in flight is never counted as done.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Sequence

import numpy as np

from .. import memory
from .files import drop_cache, expected_bytes
from .tools import Tool

__all__ = ["BenchError", "time_seq_read", "time_seq_write", "time_random_reads", "random_offsets", "check_read",
           "clear_windows"]


class BenchError(RuntimeError):
    """A measurement went wrong (short read, wrong bytes): its figure would be meaningless."""


def time_seq_read(
    tool: Tool,
    path: str,
    buf: Any,
    size: int,
    *,
    task_size: Optional[int] = None,
    cold: bool = False,
) -> float:
    """Seconds to read ``size`` bytes of ``path`` from offset 0 into ``buf``.
    ``cold``: drop the file's cached pages first."""
    if cold:
        drop_cache(path)
    handle = tool.open(path, "r")
    try:
        tool.target.sync()
        start = time.perf_counter()
        n = tool.read(handle, buf, size, 0, task_size)
        tool.target.sync()
        seconds = time.perf_counter() - start
    finally:
        tool.close(handle)
    if n != size:
        raise BenchError(f"{tool.label} read {n} of {size} bytes from {path}")
    return seconds


def time_seq_write(tool: Tool, path: str, buf: Any, size: int, *, task_size: Optional[int] = None) -> float:
    """Seconds to write ``size`` bytes of ``buf`` to ``path`` (truncated on open,
    outside the clock) including ``fsync``."""
    handle = tool.open(path, "w")
    try:
        tool.target.sync()
        start = time.perf_counter()
        n = tool.write(handle, buf, size, task_size)
        seconds = time.perf_counter() - start
    finally:
        tool.close(handle)
    if n != size:
        raise BenchError(f"{tool.label} wrote {n} of {size} bytes to {path}")
    return seconds


def random_offsets(file_size: int, io_size: int, count: int, seed: int) -> np.ndarray:
    """``count`` offsets aligned to ``io_size`` (as ``gdsio -I 2`` does), uniform over the file."""
    slots = max(1, file_size // io_size)
    return np.random.default_rng(seed).integers(0, slots, count, dtype=np.int64) * io_size


def time_random_reads(
    tool: Tool,
    path: str,
    buf: Any,
    io_size: int,
    offsets: Sequence[int],
    *,
    task_size: Optional[int] = None,
    cold: bool = False,
) -> list[float]:
    """Latency in seconds of each ``io_size`` read at ``offsets``, issued one at a
    time into the start of ``buf`` (one view of it, the same for every read). Each latency ends when the bytes are in
    ``buf`` (device synchronised), so the sum is the run's busy time.

    ``cold``: the file's cached pages are dropped before every read (outside
    the clock), so no read finds its block, or a neighbour's readahead, cached.
    """
    if cold:
        drop_cache(path)
    handle = tool.open(path, "r")
    latencies = []
    sync = tool.target.sync
    clock = time.perf_counter
    dropper = os.open(path, os.O_RDONLY) if cold else -1
    # One view of io_size bytes for every read and every tool, made outside the clock.
    view = buf if len(buf) == io_size else buf[:io_size]
    read = tool.read
    try:
        sync()
        for offset in offsets:
            if cold:
                os.posix_fadvise(dropper, 0, 0, os.POSIX_FADV_DONTNEED)
            offset = int(offset)
            start = clock()
            n = read(handle, view, io_size, offset, task_size)
            sync()
            latencies.append(clock() - start)
            if n != io_size:
                raise BenchError(f"{tool.label} read {n} of {io_size} bytes at offset {offset} of {path}")
    finally:
        tool.close(handle)
        if dropper >= 0:
            os.close(dropper)
    return latencies


def _windows(size: int, window: int) -> list[int]:
    window = min(window, size)
    return sorted({0, max(0, size // 2 - window // 2), size - window})


def clear_windows(buf: Any, size: int, window: int = 64 << 10) -> None:
    """Zeros in the windows check_read compares (the data files are random),
    before the read it checks: the buffer holds the file's bytes from an
    earlier tool, and a tool that delivered nothing would pass."""
    for start in _windows(size, window):
        memory.fill(buf[start : start + min(window, size)], "zeros")


def check_read(tool: Tool, path: str, buf: Any, size: int, window: int = 64 << 10) -> None:
    """Compare three windows of ``buf`` (start, middle, end) with the file after a
    full read, so a tool that returned early or scrambled data cannot post a figure."""
    if not tool.fills_buffer:
        return
    window = min(window, size)
    for start in _windows(size, window):
        got = tool.target.to_numpy(buf, start, start + window).tobytes()
        if got != expected_bytes(path, start, window):
            raise BenchError(f"{tool.label} delivered wrong bytes at offsets {start}..{start + window} of {path}")
