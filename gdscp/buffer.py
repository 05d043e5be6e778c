"""Buffers and cuFile, with KvikIO's functions: ``memory_register``,
``memory_deregister`` and ``bounce_buffer_free``; and gdscp's ``prepare``,
which makes a GPU's staging before the first transfer needs it.

gdscp does not register memory with cuFile: ``memory_register`` and
``memory_deregister`` check that their argument is a buffer (``TypeError``
otherwise, as in KvikIO) and change nothing, whatever the compat mode. The
bytes moved are the same: cuFile moves unregistered device memory through
its own GPU bounce buffers (one more copy, on the GPU), where a registered
buffer would take the DMA directly, which pays off for a buffer used for many
transfers. With gdscp's POSIX path (compat mode, or no GPUDirect Storage)
registration has no meaning, as in KvikIO.
"""

from __future__ import annotations

from typing import Any, Optional

from . import _args, _core, _gpus

__all__ = ["bounce_buffer_free", "memory_deregister", "memory_register", "prepare"]


def _check_buffer(buf: Any) -> None:
    """``buf`` is memory, in any layout (KvikIO registers a strided array's
    first byte): device memory through ``__cuda_array_interface__`` or DLPack,
    host memory through the buffer protocol. TypeError otherwise, or the
    error that names what a malformed interface lacks, as a transfer gives."""
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        _core.cuda_array_layout(cai)  # raises for an interface that describes no array
        return
    try:
        memoryview(buf).release()
        return
    except TypeError:
        pass
    dlpack = getattr(buf, "__dlpack__", None)
    if callable(dlpack) and callable(getattr(buf, "__dlpack_device__", None)):
        return
    if dlpack is not None:
        raise TypeError(f"{type(buf).__name__} has __dlpack__ but is no DLPack tensor (a tensor's __dlpack__ and "
                        "__dlpack_device__ are methods)")
    raise TypeError(
        f"expected a buffer (buffer protocol, __cuda_array_interface__ or __dlpack__), got {type(buf).__name__}"
    )


def memory_register(buf: Any) -> None:
    """Accepts any buffer and registers nothing (see the module's note)."""
    _check_buffer(buf)


def memory_deregister(buf: Any) -> None:
    """The counterpart of :func:`memory_register`: checks ``buf``, changes nothing."""
    _check_buffer(buf)


def bounce_buffer_free() -> int:
    """Free the idle staging buffers (pinned for device memory, page-aligned
    for O_DIRECT); the number of bytes freed. Buffers in use by transfers in
    flight stay, and later transfers allocate anew."""
    return _core.trim_pools()


def prepare(device: int = 0, workers: Optional[int] = None) -> None:
    """Make now what the first transfer to or from GPU ``device`` through
    gdscp's POSIX path would otherwise make inside it: the GPU's primary
    context, each worker's CUDA stream, and a pipeline's worth of pinned
    staging per worker (``bounce_buffer_size`` x ``pipeline_depth``, on the
    NUMA node nearest the GPU), made by the workers side by side. In a new
    process that is tens of milliseconds a first large read no longer spends.
    ``workers``: how many workers' staging (default, and at most:
    ``num_threads``), for a job that gives each of several GPUs its share of
    them, or a small job that needs only a few. Preparing several GPUs adds
    up: each gets its workers' staging, also where GPUs on one NUMA node
    draw on one pool. The buffers stay idle in the pool until a transfer
    takes them, or :func:`bounce_buffer_free` frees them (and what was
    prepared is forgotten). Raises ``TypeError`` for a ``device`` or
    ``workers`` that is not an integer and ``ValueError`` for ``workers``
    below 1, whether or not the GPU exists, then ``gdscp.memory.DeviceError``
    (a ``ValueError``) for a GPU that cannot be used."""
    from . import defaults  # noqa: PLC0415

    device = _args.integer(device, "device")
    if workers is not None:
        workers = _args.integer(workers, "workers")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {_args.shown(workers)}")
    _gpus.check_device(device)
    # No more than the pool's workers are prepared, however many are asked for.
    _core.prepare_device(device, defaults._settings, 0 if workers is None else min(workers, _args.MAX_SIZE))
