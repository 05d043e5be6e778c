"""Buffers for the command line and benchmarks: GPU memory or host memory.

``allocate(n, device)`` gives ``n`` bytes on GPU ``device`` or, with
``device=None``, a C-contiguous ``uint8`` numpy array in page-aligned host
memory. ``fill`` writes a test pattern, ``to_host`` and ``download`` copy back
and ``first_difference`` compares. ``stream_copy`` copies host memory the way
gdscp's mapped reads do.

GPU memory needs nothing beyond gdscp: without CuPy it is a
``gdscp._core.DeviceBuffer``, allocated through the NVIDIA driver that gdscp
loads anyway (a 1-D array of bytes with ``__cuda_array_interface__`` and
DLPack, sliced into views, its patterns made on the host in blocks and copied
up). Where CuPy imports and works it is a CuPy array, whose kernels make and
compare patterns on the GPU. All of this works on a machine without CUDA, on
host memory.

Patterns depend only on the byte's position in the file (``offset``) and on
the seed, and come out the same on the GPU and on the host: a file written in
chunks equals one written at once, and a reader can check any range of it.

- ``zeros``: every byte 0.
- ``seq``: each aligned 8-byte word holds its own byte offset (little endian),
  so a misplaced block is easy to spot.
- ``random``: each aligned 8-byte word is splitmix64 of (seed, word index).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Optional

import numpy as np

# The GPU probe lives apart, without numpy; re-exported here.
from . import _args
from ._gpus import DeviceError, GpuStatus, check_device, device_count, device_memory, gpu_available

__all__ = [
    "PATTERNS",
    "DeviceError",
    "GpuStatus",
    "gpu_available",
    "usable_cupy",
    "device_count",
    "check_device",
    "device_memory",
    "available_bytes",
    "host_memory",
    "allocate",
    "is_device",
    "fill",
    "pattern",
    "to_host",
    "download",
    "copy_from_host",
    "first_difference",
    "equal",
    "stream_copy",
    "PAGE_SIZE",
]

PATTERNS = ("zeros", "random", "seq")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# Bytes generated per step: bounds temporary memory and keeps host work in cache.
_HOST_STEP = 4 << 20
_DEVICE_STEP = 256 << 20

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1


@functools.lru_cache(maxsize=1)
def usable_cupy():
    """CuPy where it imports and sees the GPUs, else None: it is optional."""
    try:
        import cupy  # noqa: PLC0415 - optional dependency, imported on first GPU use

        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # not installed, or built for another CUDA than this driver
        return None
    return cupy


def _cupy():
    cupy = usable_cupy()
    if cupy is None:
        raise RuntimeError("CuPy is not usable here")
    return cupy


def _is_cupy(buf: Any) -> bool:
    return type(buf).__module__.split(".")[0] == "cupy"


# Where host memory is read from (a test points it at a file of its own).
MEMINFO = "/proc/meminfo"


def _meminfo() -> dict[str, int]:
    """/proc/meminfo's byte counts by name ("MemAvailable": ...); empty where it cannot be read."""
    found: dict[str, int] = {}
    try:
        with open(MEMINFO, encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields = rest.split()
                if fields and fields[0].isdigit():
                    found[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    except OSError:
        pass
    return found


def _pages(name: str) -> int:
    try:
        return os.sysconf(name) * PAGE_SIZE
    except (ValueError, OSError, AttributeError):  # not on Linux: a modest guess
        return 1 << 30


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host RAM. Available is the kernel's
    MemAvailable: free memory and the page cache and other memory it can take
    back without swapping; the free pages alone (MemFree) leave out the cached
    data of files just read or written. Where /proc/meminfo does not say
    (a kernel before 3.14, not Linux): the free and total pages sysconf counts."""
    fields = _meminfo()
    available = fields.get("MemAvailable")
    total = fields.get("MemTotal")
    return (_pages("SC_AVPHYS_PAGES") if available is None else available,
            _pages("SC_PHYS_PAGES") if total is None else total)


def available_bytes(device: Optional[int]) -> int:
    """Memory that could hold a buffer now: free GPU memory, or available host
    RAM (``host_memory``'s)."""
    if device is not None:
        return device_memory(device)[0]
    return host_memory()[0]


def _flat(buf: Any, uint8: Any) -> Any:
    """``buf`` (a NumPy or CuPy array) as a 1-D view of its bytes in memory
    order: the order the engine reads and writes them in, for an array in
    Fortran order too. ValueError for an array whose bytes are not one block."""
    flags = buf.flags
    if flags.c_contiguous:
        return buf.reshape(-1).view(uint8)
    if flags.f_contiguous:
        return buf.reshape(-1, order="F").view(uint8)
    raise ValueError("the array is not contiguous: its bytes are not one block of memory")


def _host_bytes(buf: Any) -> np.ndarray:
    """Host memory as a 1-D ``uint8`` view in memory order (arrays, bytearray, memoryview, ...)."""
    if isinstance(buf, np.ndarray):
        return _flat(buf, np.uint8)
    view = memoryview(buf)
    if not view.c_contiguous:
        raise ValueError(f"the {type(buf).__name__} is not C-contiguous: give its bytes as one block of memory")
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def allocate(nbytes: int, device: Optional[int] = None) -> Any:
    """An uninitialised ``uint8`` array of ``nbytes``: on GPU ``device``, or page-aligned
    host memory when ``device`` is None (so O_DIRECT can use it as is)."""
    nbytes = _args.integer(nbytes, "nbytes")
    if nbytes < 0:
        raise ValueError(f"cannot allocate a negative size (nbytes {_args.shown(nbytes)})")
    if device is None:
        raw = np.empty(nbytes + PAGE_SIZE, dtype=np.uint8)
        start = (-raw.ctypes.data) % PAGE_SIZE
        return raw[start : start + nbytes]
    check_device(device)
    cupy = usable_cupy()
    if cupy is None:
        from . import _core  # noqa: PLC0415

        return _core.DeviceBuffer(nbytes, device)
    with cupy.cuda.Device(device):
        return cupy.empty(nbytes, dtype=cupy.uint8)


def is_device(buf: Any) -> bool:
    """True for GPU arrays (anything with ``__cuda_array_interface__``)."""
    try:
        return buf.__cuda_array_interface__ is not None
    except AttributeError:
        return False


def _words(xp, first_word: int, count: int, kind: str, seed: int):
    """``count`` pattern words starting at word index ``first_word``, as uint64."""
    u64 = xp.uint64
    z = xp.arange(first_word, first_word + count, dtype=u64)
    if kind == "seq":
        z *= u64(8)
        return z
    # splitmix64: state_i = seed + (i + 1) * gamma, then the finaliser.
    z *= u64(_GAMMA)
    z += u64((seed + _GAMMA) & _MASK)
    z ^= z >> u64(30)
    z *= u64(_MIX1)
    z ^= z >> u64(27)
    z *= u64(_MIX2)
    z ^= z >> u64(31)
    return z


def _check_pattern(kind: str) -> None:
    if kind not in PATTERNS:
        raise ValueError(f"unknown pattern {kind!r} (choose from {', '.join(PATTERNS)})")


def _gpu(buf: Any) -> Any:
    """``buf`` in a form this module works on, if it is GPU memory: a CuPy
    array or a gdscp DeviceBuffer (other GPU arrays through CuPy); None for
    host memory."""
    if _is_cupy(buf):
        return buf
    if not is_device(buf):
        return None
    from . import _core  # noqa: PLC0415

    if isinstance(buf, _core.DeviceBuffer):
        return buf
    cupy = usable_cupy()
    if cupy is None:
        raise TypeError(f"GPU memory of type {type(buf).__name__} needs CuPy here (memory.allocate() needs none)")
    return cupy.asarray(buf)


def fill(buf: Any, kind: str = "zeros", seed: int = 0, offset: int = 0) -> None:
    """Write pattern ``kind`` into ``buf`` as the bytes that belong at file
    position ``offset``. Returns once the bytes are in place (GPU work is
    synchronised)."""
    _check_pattern(kind)
    seed = _args.integer(seed, "seed")
    offset = _args.integer(offset, "offset")
    if offset < 0:
        raise ValueError(f"offset must not be negative (got {offset})")
    gpu = _gpu(buf)
    if gpu is None:
        _fill(np, buf, kind, seed, offset, _HOST_STEP)
    elif _is_cupy(gpu):
        cupy = _cupy()
        # Kernels must run on the array's own device; wait for them so that the
        # engine, which copies on its own streams, sees the bytes.
        with gpu.device:
            _fill(cupy, gpu, kind, seed, offset, _DEVICE_STEP)
            cupy.cuda.get_current_stream().synchronize()
    elif kind == "zeros":
        gpu.fill(0)
    else:
        # Made on the host a block at a time, then copied up.
        block = np.empty(min(_HOST_STEP, len(gpu)), dtype=np.uint8)
        for done in range(0, len(gpu), _HOST_STEP):
            n = min(_HOST_STEP, len(gpu) - done)
            _fill(np, block[:n], kind, seed, offset + done, _HOST_STEP)
            gpu.copy_from_host(block[:n], done)


def _fill(xp, buf: Any, kind: str, seed: int, offset: int, step: int) -> None:
    flat = _host_bytes(buf) if xp is np else _flat(buf, xp.uint8)
    nbytes = int(flat.size)
    if kind == "zeros":
        flat.fill(0)
        return
    done = 0
    while done < nbytes:
        n = min(step, nbytes - done)
        start = offset + done
        first_word = start // 8
        skip = start - first_word * 8
        words = _words(xp, first_word, (skip + n + 7) // 8, kind, seed)
        flat[done : done + n] = words.view(xp.uint8)[skip : skip + n]
        done += n


def pattern(nbytes: int, kind: str = "zeros", seed: int = 0, offset: int = 0) -> np.ndarray:
    """The ``nbytes`` host bytes of pattern ``kind`` at file position ``offset``."""
    out = np.empty(nbytes, dtype=np.uint8)
    fill(out, kind, seed, offset)
    return out


def copy_from_host(dst: Any, src: Any) -> None:
    """Copy the host bytes ``src`` to the start of ``dst`` (host or GPU memory);
    ValueError where ``dst`` is smaller."""
    data = np.frombuffer(memoryview(src).cast("B"), dtype=np.uint8)
    gpu = _gpu(dst)
    room = _nbytes(dst, gpu)
    if room < data.size:
        raise ValueError(f"dst holds {room} bytes, fewer than the {data.size} bytes of src")
    if gpu is None:
        _host_bytes(dst)[: data.size] = data
    elif _is_cupy(gpu):
        cupy = _cupy()
        with gpu.device:
            _flat(gpu, cupy.uint8)[: data.size].set(data)
            cupy.cuda.get_current_stream().synchronize()
    else:
        gpu.copy_from_host(data, 0)


def _nbytes(buf: Any, gpu: Any) -> int:
    """The bytes of ``buf``, whose GPU form (``_gpu``) is ``gpu``."""
    if gpu is None:
        return int(_host_bytes(buf).size)
    return int(gpu.nbytes) if _is_cupy(gpu) else len(gpu)


def to_host(buf: Any) -> np.ndarray:
    """``buf``'s bytes as a host ``uint8`` array (a copy for GPU arrays, a view otherwise)."""
    gpu = _gpu(buf)
    if gpu is None:
        return _host_bytes(buf)
    if _is_cupy(gpu):
        return _cupy().asnumpy(_flat(gpu, _cupy().uint8))
    out = np.empty(len(gpu), dtype=np.uint8)
    gpu.copy_to_host(out, 0)
    return out


def download(src: Any, out: np.ndarray) -> None:
    """Copy the first ``out.nbytes`` bytes of ``src`` (GPU or host memory) into
    the host array ``out``, without allocating; ValueError where ``src`` is
    smaller."""
    out = out.reshape(-1).view(np.uint8)
    gpu = _gpu(src)
    have = _nbytes(src, gpu)
    if have < out.size:
        raise ValueError(f"src holds {have} bytes, fewer than the {out.size} bytes of out")
    if gpu is None:
        out[:] = to_host(src)[: out.size]
    elif _is_cupy(gpu):
        with gpu.device:
            _flat(gpu, _cupy().uint8)[: out.size].get(out=out)
    else:
        gpu.copy_to_host(out, 0)


def first_difference(a: Any, b: Any) -> Optional[int]:
    """Offset of the first byte where ``a`` and ``b`` differ (the shorter length
    if one is a prefix of the other); None if they are equal. Each may be host
    or GPU memory."""
    x, y = _Blocks(a), _Blocks(b)
    if x.cupy is not None and y.cupy is not None and x.cupy.device == y.cupy.device:
        cupy = _cupy()
        u, v = _flat(x.cupy, cupy.uint8), _flat(y.cupy, cupy.uint8)
        n = min(u.size, v.size)
        if n:
            with x.cupy.device:
                diff = (u[:n] != v[:n]).view(cupy.uint8)
                if bool(diff.any()):
                    return int(diff.argmax())
        return None if u.size == v.size else n
    n = min(x.size, y.size)
    for start in range(0, n, _HOST_STEP):
        end = min(start + _HOST_STEP, n)
        cx, cy = x.get(start, end), y.get(start, end)
        if not np.array_equal(cx, cy):
            return start + int(np.argmax(cx != cy))
    return None if x.size == y.size else n


class _Blocks:
    """A buffer compared a block at a time: host memory in place, a
    DeviceBuffer copied down block by block, a CuPy array (``cupy``) copied
    down whole unless it is compared on its GPU."""

    def __init__(self, buf: Any):
        gpu = _gpu(buf)
        self.cupy = gpu if gpu is not None and _is_cupy(gpu) else None
        self._device = gpu if gpu is not None and self.cupy is None else None
        self._host: Optional[np.ndarray] = None
        if self._device is not None:
            self.size = len(self._device)
            self._scratch = np.empty(min(_HOST_STEP, self.size), dtype=np.uint8)
        else:
            self._source = buf
            self.size = to_host(buf).size if self.cupy is None else int(self.cupy.nbytes)

    def get(self, start: int, end: int) -> np.ndarray:
        if self._device is not None:
            out = self._scratch[: end - start]
            self._device.copy_to_host(out, start)
            return out
        if self._host is None:
            self._host = to_host(self._source)
        return self._host[start:end]


def equal(a: Any, b: Any) -> bool:
    """True if ``a`` and ``b`` hold the same bytes."""
    return first_difference(a, b) is None


def stream_copy(dst: Any, src: Any) -> None:
    """Copy host buffer ``src`` into host buffer ``dst`` (contiguous, the same
    number of bytes, not overlapping: ``ValueError`` otherwise, as for a
    read-only ``dst``) with streaming stores, as gdscp's mapped reads do: the
    destination is not read into the CPU cache first. Releases the GIL."""
    from . import _core  # noqa: PLC0415

    try:
        with memoryview(dst) as view:
            read_only = view.readonly
    except (TypeError, ValueError, BufferError):
        read_only = False  # no buffer to write into at all: the copy says why
    if read_only:
        raise ValueError(f"cannot copy into dst: the {type(dst).__name__} is read-only")
    _core.stream_copy(dst, src)
