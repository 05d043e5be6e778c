"""The machine's own limits, measured without gdscp: what no file reader can beat.

* ``pinned_h2d`` / ``pinned_d2h``: copies between pinned host memory and the
  GPU (CuPy, timed with CUDA events): the ceiling for any file <-> GPU
  transfer that passes through host memory.
* ``host_memcpy``: copying host memory with several threads, the better of
  ``numpy.copyto`` and gdscp's streaming-store copy (the one its mapped reads
  use, which skips reading the destination first).
* ``page_cache_read``: a cached file's pages copied into a host buffer by
  plain means, several threads: the better of ``preadv`` and a mapping of the
  file copied with streaming stores. With ``host_memcpy`` it bounds hot reads
  into host memory: the page cache may be held in larger pages than anonymous
  memory, so copying out of it can beat copying between two host buffers.
* ``host_page_cache`` (``page_cache_rate``): hot files read with pread into
  page-locked buffers by every core at once, no GPU copy: the host side's
  ceiling for any hot read into GPUs through staging, however many GPUs.
* ``host_page_cache_while_copying`` (``page_cache_rate`` with
  ``while_copying``): the same reads while every GPU named takes pinned host
  -> GPU copies of other buffers without pause; the rates both halves keep
  when they share the host's memory, as a load through staging makes them.
* ``pinned_h2d_all`` (``multi_pinned_copy_rate``): pinned host -> GPU copies
  on every GPU named at once: the aggregate PCIe ceiling.
* ``disk_direct_read`` / ``disk_buffered_read``: the disk itself, cold, with
  ``O_DIRECT`` (our own reader: aligned mmap buffers, 16 MiB requests (less
  on small files, so every thread has work), several threads) and through the
  page cache with readahead (one thread).
* ``disk_direct_write`` / ``disk_buffered_write``: the same for writes, ``fsync``
  included.

Each function returns a JSON-ready dict: ``available`` and, if not, ``reason``;
otherwise ``what``, ``bytes``, ``threads``, ``seconds`` (one per run) and
``gb_per_s`` (median/min/max). A filesystem that refuses ``O_DIRECT`` (tmpfs,
some FUSE and network filesystems) gives ``available: false`` with the reason.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import numpy as np

from .. import _core
from .files import drop_cache
from .stats import GB, spread, threads_text

__all__ = [
    "CEILING_NAMES",
    "unavailable",
    "pinned_copy_rate",
    "host_memcpy_rate",
    "page_cache_read_rate",
    "page_cache_rate",
    "multi_pinned_copy_rate",
    "direct_read_rate",
    "buffered_read_rate",
    "direct_write_rate",
    "buffered_write_rate",
    "parallel_chunks",
]

CEILING_NAMES = (
    "pinned_h2d",
    "pinned_d2h",
    "host_memcpy",
    "page_cache_read",
    "disk_direct_read",
    "disk_buffered_read",
    "disk_direct_write",
    "disk_buffered_write",
)

REQUEST = 16 << 20
_MIN_REQUEST = 1 << 20
_ALIGN = 4096


def request_size(size: int, threads: int) -> int:
    """16 MiB requests, as disk benchmarks use, but small enough that every
    thread gets several of them on a small file (at least 1 MiB)."""
    share = size // (4 * threads) // _ALIGN * _ALIGN
    return max(_MIN_REQUEST, min(REQUEST, share))


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n >> 10} KiB"


def unavailable(reason: str, what: str = "") -> dict:
    entry = {"available": False, "reason": reason}
    if what:
        entry["what"] = what
    return entry


def _figure(what: str, nbytes: int, seconds: Sequence[float], threads: Optional[int], **extra) -> dict:
    entry = {
        "available": True,
        "what": what,
        "bytes": int(nbytes),
        "threads": threads,
        "runs": len(seconds),
        "seconds": [round(s, 9) for s in seconds],
        "gb_per_s": spread(nbytes / s / GB for s in seconds),
    }
    entry.update(extra)
    return entry


def pinned_copy_rate(nbytes: int, runs: int, direction: str = "h2d", device: int = 0) -> dict:
    """Pinned host <-> GPU copy rate: one ``cudaMemcpyAsync`` of ``nbytes`` per run
    on a non-blocking stream, timed with CUDA events (after one untimed copy)."""
    what = (
        f"cudaMemcpyAsync {'pinned host -> GPU' if direction == 'h2d' else 'GPU -> pinned host'}, "
        "CuPy, timed with CUDA events"
    )
    try:
        import cupy
        import cupyx
    except Exception as exc:
        return unavailable(f"cupy is not importable ({type(exc).__name__}: {exc})", what)
    runtime = cupy.cuda.runtime
    try:
        with cupy.cuda.Device(device):
            host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
            host.fill(1)
            dev = cupy.empty(nbytes, dtype=cupy.uint8)
            stream = cupy.cuda.Stream(non_blocking=True)
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            if direction == "h2d":
                dst, src, kind = dev.data.ptr, host.ctypes.data, runtime.memcpyHostToDevice
            else:
                dst, src, kind = host.ctypes.data, dev.data.ptr, runtime.memcpyDeviceToHost
            seconds = []
            for i in range(runs + 1):
                start.record(stream)
                runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
                end.record(stream)
                end.synchronize()
                if i:
                    seconds.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
            del dev, host
            # Hand the 2 x nbytes back, so the measurements that follow have the memory.
            cupy.get_default_memory_pool().free_all_blocks()
            cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception as exc:
        return unavailable(f"CUDA copy failed ({type(exc).__name__}: {exc})", what)
    return _figure(what, nbytes, seconds, None)


def _host_buffers(count: int, nbytes: int) -> tuple[list, str]:
    """``count`` page-locked buffers (CuPy's pinned memory) where CuPy works,
    else page-aligned host memory touched beforehand (the same copy for the
    CPU: pinning only keeps the pages in place); and which it was."""
    try:
        import cupyx

        bufs = [cupyx.empty_pinned((nbytes,), dtype=np.uint8) for _ in range(count)]
        kind = "pinned buffers"
    except Exception:  # noqa: BLE001 - no CuPy or no GPU: plain memory
        bufs = [np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.uint8) for _ in range(count)]
        kind = "pre-faulted host buffers (no CuPy to pin them)"
    for b in bufs:
        b.fill(0)
    return bufs, kind


class _CopiesRunning:
    """Pinned host -> GPU copies on every GPU of ``devices``, one after another
    without pause from start() to stop(), each GPU its own pinned source and
    stream, two copies of ``piece`` bytes in flight; ``moved()`` is the bytes
    whose copies have ended so far."""

    def __init__(self, devices: Sequence[int], piece: int = 32 << 20, pieces: int = 8) -> None:
        import cupy
        import cupyx

        self._cupy = cupy
        self._piece = piece
        self._sides = []
        for d in devices:
            with cupy.cuda.Device(d):
                host = cupyx.empty_pinned((piece * pieces,), dtype=np.uint8)
                host.fill(1)
                self._sides.append((d, host, cupy.empty(piece * pieces, dtype=cupy.uint8)))
        self._done = [0] * len(self._sides)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(self._sides))]
        self._errors: list[BaseException] = []

    def _run(self, i: int) -> None:
        cupy = self._cupy
        d, host, dev = self._sides[i]
        count = host.nbytes // self._piece
        try:
            with cupy.cuda.Device(d):
                stream = cupy.cuda.Stream(non_blocking=True)
                events: list = []
                k = 0
                while not self._stop.is_set():
                    off = (k % count) * self._piece
                    cupy.cuda.runtime.memcpyAsync(dev.data.ptr + off, host.ctypes.data + off, self._piece,
                                                  cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
                    events.append(stream.record())
                    k += 1
                    if len(events) > 2:
                        events.pop(0).synchronize()
                        self._done[i] += self._piece
                stream.synchronize()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._errors.append(exc)

    def start(self) -> None:
        for t in self._threads:
            t.start()
        time.sleep(0.05)  # every copy engine busy before anything is timed

    def moved(self) -> int:
        return sum(self._done)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self._sides.clear()
        if self._errors:
            raise self._errors[0]


def page_cache_rate(paths: Sequence[str], threads: int, runs: int, request: int = 4 << 20,
                    while_copying: Sequence[int] = ()) -> dict:
    """Hot files (read once first) copied out of the page cache by ``threads``
    threads at once (plain C++ threads: no Python between the reads), each with
    its own ``request``-byte page-locked buffer, reused as staging is: pread
    only, no GPU copy. The bytes of all files per run; pieces handed out across
    the files from one counter.

    With ``while_copying`` (GPU ordinals), those GPUs take pinned host -> GPU
    copies of other buffers throughout (``_CopiesRunning``), and the entry adds
    ``copies_gb_per_s``: the rate the copies kept during each timed run."""
    what = f"pread of hot files into {{kind}}, {_mib(request)} requests, {threads_text(threads)}"
    if while_copying:
        what += f", while GPUs {', '.join(map(str, while_copying))} copy from other pinned buffers"
    sizes = [os.path.getsize(p) for p in paths]
    total = sum(sizes)
    if total == 0:
        return unavailable("the files are empty", what.format(kind="page-locked buffers"))
    for p in paths:
        from .files import warm_cache

        warm_cache(p)
    pieces = [(i, off, min(request, n - off)) for i, n in enumerate(sizes) for off in range(0, n, request)]
    bufs, kind = _host_buffers(threads, request)
    copies = None
    if while_copying:
        try:
            copies = _CopiesRunning(while_copying)
        except Exception as exc:  # noqa: BLE001 - no CuPy or no GPU
            return unavailable(f"no GPU copies ({type(exc).__name__}: {exc})", what.format(kind=kind))
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    addresses = [b.ctypes.data for b in bufs]
    copy_rates = []
    try:
        seconds = []
        if copies:
            copies.start()
        for i in range(runs + 1):
            copied = copies.moved() if copies else 0
            # Plain C++ threads, no Python between the reads: Python's own
            # threads take the interpreter's lock around every read, which
            # can hold 32 of them below what the host can do.
            elapsed, moved, error = _core.timed_preads(fds, pieces, addresses)
            if i:
                seconds.append(elapsed)
                if copies:
                    copy_rates.append((copies.moved() - copied) / elapsed / GB)
            if error:
                return unavailable(f"pread failed: {os.strerror(error)}", what.format(kind=kind))
            if moved != total:
                return unavailable(f"read {moved} of {total} bytes: the files changed", what.format(kind=kind))
    finally:
        if copies:
            copies.stop()
        for fd in fds:
            os.close(fd)
    extra = {"copies_gb_per_s": spread(copy_rates), "copy_devices": list(while_copying)} if copies else {}
    return _figure(what.format(kind=kind), total, seconds, threads, files=len(paths), **extra)


def multi_pinned_copy_rate(nbytes: int, runs: int, devices: Sequence[int]) -> dict:
    """Pinned host -> GPU copies of ``nbytes`` on every GPU of ``devices`` at
    once (one pinned buffer and stream per GPU, allocated with that GPU
    current), timed from the first issue to the last copy's end on the host:
    the aggregate rate, all bytes over the wall time."""
    what = f"cudaMemcpyAsync pinned host -> GPU on GPUs {', '.join(map(str, devices))} at once, CuPy"
    try:
        import cupy
        import cupyx
    except Exception as exc:
        return unavailable(f"cupy is not importable ({type(exc).__name__}: {exc})", what)
    runtime = cupy.cuda.runtime
    try:
        sides = []
        for d in devices:
            with cupy.cuda.Device(d):
                host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
                host.fill(1)
                sides.append((d, host, cupy.empty(nbytes, dtype=cupy.uint8), cupy.cuda.Stream(non_blocking=True)))
        seconds = []
        for i in range(runs + 1):
            start = time.perf_counter()
            for d, host, dev, stream in sides:
                with cupy.cuda.Device(d):
                    runtime.memcpyAsync(dev.data.ptr, host.ctypes.data, nbytes, runtime.memcpyHostToDevice, stream.ptr)
            for d, _host, _dev, stream in sides:
                with cupy.cuda.Device(d):
                    stream.synchronize()
            if i:
                seconds.append(time.perf_counter() - start)
        del sides
        for d in devices:
            with cupy.cuda.Device(d):
                cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception as exc:
        return unavailable(f"CUDA copy failed ({type(exc).__name__}: {exc})", what)
    return _figure(what, nbytes * len(devices), seconds, None, devices=list(devices))


def host_memcpy_rate(nbytes: int, threads: int, runs: int) -> dict:
    """Host memory copy rate with ``threads`` threads, each copying its own
    slice of at least 1 MiB (both copies release the GIL; see ``_split`` and
    ``_timed_copies``): the better of ``numpy.copyto`` and gdscp's streaming
    copy, each timed ``runs`` times after one warm-up."""
    figures = [_copy_rate(nbytes, threads, runs, streaming) for streaming in (False, True)]
    usable = [f for f in figures if f.get("available")]
    if not usable:
        return figures[0]
    return max(usable, key=lambda f: f["gb_per_s"]["median"])


def _copy_rate(nbytes: int, threads: int, runs: int, streaming: bool) -> dict:
    how = "gdscp's streaming-store copy" if streaming else "numpy.copyto"
    slices = _split(nbytes, threads)
    what = f"{how} between two host buffers, {_threads_used(threads, slices)}"
    try:
        src = np.empty(nbytes, dtype=np.uint8)
        dst = np.empty(nbytes, dtype=np.uint8)
        src.fill(1)
        dst.fill(0)
    except MemoryError:
        return unavailable(f"not enough host memory for two {nbytes}-byte buffers", what)

    if streaming:
        from ..memory import stream_copy

        def copy(part: slice) -> None:
            stream_copy(dst[part], src[part])

    else:

        def copy(part: slice) -> None:
            np.copyto(dst[part], src[part])

    return _figure(what, nbytes, _timed_copies(copy, slices, runs), threads)


def _split(nbytes: int, threads: int) -> list[slice]:
    """``nbytes`` in one slice per thread on 4 KiB boundaries, the last taking
    the rest, but none below 1 MiB: a smaller one takes less time to copy
    than to hand to another thread, and no program that copies fast splits
    its work that fine (gdscp reads a request below 1 MiB on the calling
    thread). A small size is split among fewer threads, or not at all."""
    count = max(1, min(threads, nbytes // _MIN_REQUEST))
    bounds = np.linspace(0, nbytes, count + 1, dtype=np.int64) // _ALIGN * _ALIGN
    bounds[-1] = nbytes
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _threads_used(threads: int, slices: Sequence[slice]) -> str:
    """"4 threads", and how many of them copied where ``_split`` gave fewer slices."""
    if not slices or len(slices) >= threads:
        return threads_text(threads)
    used = "the calling thread alone" if len(slices) == 1 else f"{len(slices)} of them"
    return f"{threads_text(threads)} ({used}: slices of at least {_mib(_MIN_REQUEST)})"


def _timed_copies(copy: Callable[[slice], None], slices: Sequence[slice], runs: int) -> list[float]:
    """The seconds of each of ``runs`` runs of ``copy`` over every slice, after
    one untimed run.

    One slice is copied on the calling thread, as gdscp reads a small request
    on the thread that asks: handing it to a pool and waiting for the result
    costs tens of microseconds, more than copying a few KiB, and would be
    charged to the ceiling alone. Several are copied one per worker, every
    worker started before the first run, and a run is timed inside the
    workers, from the first copy's start to the last copy's end: the handoff
    and the wait for the results, which Python's pool makes far slower than
    gdscp's, are left out here too. On large slices both come to the same as
    a clock around the whole run."""
    seconds: list[float] = []
    if len(slices) == 1:
        (part,) = slices
        for i in range(runs + 1):
            start = time.perf_counter()
            copy(part)
            if i:
                seconds.append(time.perf_counter() - start)
        return seconds

    def timed(part: slice) -> tuple[float, float]:
        start = time.perf_counter()
        copy(part)
        return start, time.perf_counter()

    # Each worker waits until all have started, so the pool starts one
    # thread per slice now, not while a run is timed.
    started = threading.Barrier(len(slices))
    with ThreadPoolExecutor(max_workers=len(slices)) as pool:
        try:
            list(pool.map(lambda _: started.wait(), slices))
        except BaseException:
            started.abort()  # a thread that could not start: the others stop waiting
            raise
        for i in range(runs + 1):
            spans = list(pool.map(timed, slices))
            if i:
                seconds.append(max(end for _, end in spans) - min(start for start, _ in spans))
    return seconds


def page_cache_read_rate(path: str, size: int, dst: np.ndarray, threads: int, runs: int) -> dict:
    """A hot file read into ``dst`` (host memory, at least ``size`` bytes,
    already touched) by ``threads`` threads, each with its own slice of at
    least 1 MiB (as ``host_memcpy_rate``): the better of ``preadv`` and a
    read-only mapping of the file copied with streaming stores. The file
    must be in the page cache; each method is timed ``runs`` times after
    one warm-up."""
    figures = [_page_cache_rate(path, size, dst, threads, runs, mapped) for mapped in (False, True)]
    usable = [f for f in figures if f.get("available")]
    if not usable:
        return figures[0]
    return max(usable, key=lambda f: f["gb_per_s"]["median"])


def _page_cache_rate(path: str, size: int, dst: np.ndarray, threads: int, runs: int, mapped: bool) -> dict:
    how = "mmap of the file + gdscp's streaming-store copy" if mapped else "preadv"
    slices = _split(size, threads)
    what = f"{how} into host memory, {_threads_used(threads, slices)}, file in the page cache"
    if size == 0:
        return unavailable("the file is empty", what)
    out = memoryview(dst).cast("B")
    fd = os.open(path, os.O_RDONLY)
    try:
        if mapped:
            from ..memory import stream_copy

            source = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            src = np.frombuffer(source, dtype=np.uint8, count=size)

            def copy(part: slice) -> None:
                stream_copy(dst[part], src[part])

        else:

            def copy(part: slice) -> None:
                done = part.start
                while done < part.stop:
                    n = os.preadv(fd, [out[done : part.stop]], done)
                    if n <= 0:
                        raise OSError(errno.EIO, f"{path} ended at byte {done} of {size}")
                    done += n

        try:
            seconds = _timed_copies(copy, slices, runs)
        finally:
            if mapped:
                del src
                source.close()
    finally:
        os.close(fd)
    return _figure(what, size, seconds, threads)


class _Buffers:
    """One page-aligned (private anonymous mmap, as O_DIRECT needs) request
    buffer per thread, touched before any clock starts. Private, not shared:
    a shared anonymous mapping is shmem, which measured slower as an O_DIRECT
    buffer than the private memory a user's array lives in."""

    def __init__(self, count: int, request: int, fill: bool = False):
        self.request = request
        self._maps = [mmap.mmap(-1, request, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) for _ in range(count)]
        self.views = [memoryview(m) for m in self._maps]
        for view in self.views:
            array = np.frombuffer(view, dtype=np.uint8)
            if fill:
                array[:] = np.random.default_rng(len(self.views)).integers(0, 256, len(array), dtype=np.uint8)
            else:
                array.fill(0)
            del array

    def close(self) -> None:
        for view in self.views:
            view.release()
        for m in self._maps:
            m.close()

    def __enter__(self) -> "_Buffers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parallel_chunks(
    nbytes: int, request: int, buffers: Sequence[memoryview], work: Callable[[int, memoryview, int], int]
) -> int:
    """Run ``work(offset, buffer, length)`` over ``request``-sized chunks of
    ``nbytes``, one thread per buffer; the bytes moved. Chunks are handed out in
    order from a shared counter, as a thread pool would."""
    lock = threading.Lock()
    next_chunk = [0]
    chunks = (nbytes + request - 1) // request
    failure: list[BaseException] = []

    def worker(view: memoryview) -> int:
        moved = 0
        try:
            while not failure:
                with lock:
                    index = next_chunk[0]
                    next_chunk[0] += 1
                if index >= chunks:
                    break
                offset = index * request
                moved += work(offset, view, min(request, nbytes - offset))
        except BaseException as exc:
            failure.append(exc)
        return moved

    with ThreadPoolExecutor(max_workers=len(buffers)) as pool:
        futures = [pool.submit(worker, view) for view in buffers]
        try:
            total = sum(f.result() for f in futures)
        except BaseException as exc:
            failure.append(exc)  # Ctrl-C: the workers stop at their next chunk
            raise
    if failure:
        raise failure[0]
    return total


def _open_direct(path: str, flags: int) -> int:
    if not hasattr(os, "O_DIRECT"):
        raise OSError(errno.EINVAL, "O_DIRECT is not supported on this platform")
    return os.open(path, flags | os.O_DIRECT, 0o600)


def _direct_refused(exc: OSError) -> bool:
    return exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)


def direct_read_rate(path: str, size: int, threads: int, runs: int, system_drop: bool = False) -> dict:
    """The disk's cold read rate with O_DIRECT: ``threads`` threads, 16 MiB
    requests, the file's cached pages dropped before each run (and, with
    ``system_drop``, as root, the machine's: what --drop-cache asks for)."""
    request = request_size(size, threads)
    what = f"O_DIRECT pread, {_mib(request)} requests, {threads_text(threads)}, cold"
    try:
        os.close(_open_direct(path, os.O_RDONLY))
    except OSError as exc:
        if _direct_refused(exc):
            return unavailable(f"the filesystem refuses O_DIRECT ({exc.strerror})", what)
        raise

    def run(fd: int, buffers: _Buffers) -> int:
        def work(offset: int, view: memoryview, length: int) -> int:
            # O_DIRECT lengths must be whole blocks; the kernel stops at end of file.
            want = (length + _ALIGN - 1) // _ALIGN * _ALIGN
            return min(os.preadv(fd, [view[:want]], offset), length)

        return parallel_chunks(size, request, buffers.views, work)

    seconds = []
    with _Buffers(threads, request) as buffers:
        for _ in range(runs):
            drop_cache(path, use_drop_caches=system_drop)  # the machine's cache only with --drop-cache
            fd = _open_direct(path, os.O_RDONLY)
            try:
                start = time.perf_counter()
                moved = run(fd, buffers)
                seconds.append(time.perf_counter() - start)
            except OSError as exc:
                if _direct_refused(exc):
                    return unavailable(f"O_DIRECT reads fail here ({exc.strerror})", what)
                raise
            finally:
                os.close(fd)
            if moved != size:
                return unavailable(f"the O_DIRECT reader got {moved} of {size} bytes", what)
    return _figure(what, size, seconds, threads)


def buffered_read_rate(path: str, size: int, runs: int, system_drop: bool = False) -> dict:
    """The disk's cold read rate through the page cache (kernel readahead), one
    thread reading 16 MiB at a time (``system_drop``: as direct_read_rate)."""
    request = request_size(size, 1)
    what = f"buffered read(), {_mib(request)} requests, 1 thread, cold (kernel readahead)"
    seconds = []
    with _Buffers(1, request) as buffers:
        view = buffers.views[0]
        for _ in range(runs):
            drop_cache(path, use_drop_caches=system_drop)  # the machine's cache only with --drop-cache
            fd = os.open(path, os.O_RDONLY)
            try:
                start = time.perf_counter()
                moved = 0
                while moved < size:
                    n = os.readv(fd, [view[: min(request, size - moved)]])
                    if not n:
                        break
                    moved += n
                seconds.append(time.perf_counter() - start)
            finally:
                os.close(fd)
            if moved != size:
                return unavailable(f"the buffered reader got {moved} of {size} bytes", what)
    return _figure(what, size, seconds, 1)


def direct_write_rate(path: str, size: int, threads: int, runs: int, data: Optional[np.ndarray] = None) -> dict:
    """The disk's write rate with O_DIRECT, ``threads`` threads, 16 MiB requests,
    then ``fsync`` (inside the clock). The size is rounded down to whole 4 KiB
    blocks, as O_DIRECT needs.

    Every request writes its own part of one page-aligned source as large as
    the file: ``data`` itself (the buffer the tools write) when it is aligned,
    else a copy of it, else pseudo-random blocks. Writing one small shared
    mapping over and over measured slower than the tools' writes from their
    own buffer, which made tools look faster than the disk."""
    nbytes = size // _ALIGN * _ALIGN
    request = request_size(nbytes, threads)
    what = f"O_DIRECT pwrite, {_mib(request)} requests, {threads_text(threads)}, then fsync"
    if nbytes == 0:
        return unavailable("the file is smaller than one 4 KiB block", what)
    flat = None if data is None else data.reshape(-1).view(np.uint8)
    if flat is not None and flat.nbytes >= nbytes and flat.ctypes.data % _ALIGN == 0:
        source = flat[:nbytes]  # the tools' own buffer, already aligned for O_DIRECT
    else:
        from ..memory import allocate

        try:
            source = allocate(nbytes)
        except MemoryError:
            return unavailable(f"not enough host memory for a {nbytes}-byte source buffer", what)
        if flat is not None and flat.nbytes >= nbytes:
            np.copyto(source, flat[:nbytes])
        else:
            _fill_blocks(source)
    whole = memoryview(source)
    try:
        return _timed_direct_writes(path, nbytes, request, threads, runs, whole, what)
    finally:
        whole.release()


def _fill_blocks(array: np.ndarray) -> None:
    """Pseudo-random bytes, one 1 MiB block repeated with its first 8 bytes set
    to the block number (no two blocks equal)."""
    block = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    for start in range(0, len(array), len(block)):
        part = array[start : start + len(block)]
        part[:] = block[: len(part)]
        part[: min(8, len(part))] = np.frombuffer((start // len(block)).to_bytes(8, "little"), np.uint8)[: len(part)]


def _timed_direct_writes(
    path: str, nbytes: int, request: int, threads: int, runs: int, whole: memoryview, what: str
) -> dict:
    seconds = []
    slots = [whole] * threads  # parallel_chunks runs one thread per entry
    for _ in range(runs):
        try:
            fd = _open_direct(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            if _direct_refused(exc):
                return unavailable(f"the filesystem refuses O_DIRECT ({exc.strerror})", what)
            raise

        def work(offset: int, view: memoryview, length: int) -> int:
            done = 0
            while done < length:
                done += os.pwritev(fd, [view[offset + done : offset + length]], offset + done)
            return done

        try:
            start = time.perf_counter()
            parallel_chunks(nbytes, request, slots, work)
            os.fsync(fd)
            seconds.append(time.perf_counter() - start)
        except OSError as exc:
            if _direct_refused(exc):
                return unavailable(f"O_DIRECT writes fail here ({exc.strerror})", what)
            raise
        finally:
            os.close(fd)
    return _figure(what, nbytes, seconds, threads)


def buffered_write_rate(path: str, size: int, runs: int) -> dict:
    """The disk's write rate through the page cache, one thread, 16 MiB
    requests, ``fsync`` inside the clock."""
    request = request_size(size, 1)
    what = f"buffered write(), {_mib(request)} requests, 1 thread, then fsync"
    seconds = []
    with _Buffers(1, request, fill=True) as buffers:
        view = buffers.views[0]
        for _ in range(runs):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                start = time.perf_counter()
                done = 0
                while done < size:
                    done += os.write(fd, view[: min(request, size - done)])
                os.fsync(fd)
                seconds.append(time.perf_counter() - start)
            finally:
                os.close(fd)
    return _figure(what, size, seconds, 1)
