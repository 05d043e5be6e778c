"""Buffer normalisation: any array or buffer -> (address, size, device or host).

Device memory comes through ``__cuda_array_interface__`` (CuPy, Numba,
PyTorch) or ``__dlpack__`` on a CUDA device (JAX, PyTorch, ...); host memory
through the buffer protocol (numpy, bytearray, memoryview, mmap) or a CPU
DLPack tensor. The engine learns nothing else about the object.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _core

__all__ = ["Buffer", "resolve"]

# DLPack device types
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
# Stream values of the CUDA array interface that need no synchronisation here:
# none given, and the legacy default stream, which the engine's blocking
# streams wait for (and its cuFile path synchronises). The per-thread default
# stream (2) is waited for here, on the caller's thread, whose stream it is:
# it does not synchronise with other streams.
_NO_SYNC_STREAMS = (None, 1)


class Buffer(NamedTuple):
    ptr: int
    nbytes: int
    device: bool
    keep: Any  # what must stay alive while the engine uses the memory


def _check_address(ptr: int, nbytes: int, what: str) -> None:
    # Address 0 means "no buffer" to the engine (a bulk read then streams the
    # file through staging and keeps nothing): bytes there would go nowhere.
    if ptr == 0 and nbytes > 0:
        raise ValueError(f"the {what} of {nbytes} bytes has no memory (its data pointer is 0)")


def _from_cai(obj: Any, cai: dict, writable: bool) -> Buffer:
    ptr, nbytes, readonly, contiguous, stream = _core.cuda_array_layout(cai)
    _check_address(ptr, nbytes, "device array")
    if not contiguous:
        raise ValueError("buffer must be contiguous (got a strided device array)")
    if writable and readonly:
        raise ValueError("cannot read into a read-only device array")
    if stream not in _NO_SYNC_STREAMS:
        _core.stream_synchronize(stream, ptr)  # the producer's pending work on its own stream
    return Buffer(ptr, nbytes, True, obj)


def _dlpack_capsule(obj: Any) -> Any:
    """A versioned capsule (DLPack 1.0), whose flags say whether the memory
    may be written, from a producer that makes one; an unversioned one from
    an older producer, whose ``__dlpack__`` takes no ``max_version``. (Through
    an unversioned capsule numpy does not share a read-only array at all.)"""
    try:
        return obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        return obj.__dlpack__()


def _from_dlpack(obj: Any, writable: bool) -> Buffer:
    # A producer says where its tensor lies before it is asked for one: an
    # object that cannot is no DLPack tensor, and the error says why.
    name = type(obj).__name__
    try:
        device = obj.__dlpack_device__
    except AttributeError as exc:
        raise TypeError(f"{name} has __dlpack__ but no __dlpack_device__: a DLPack tensor has both") from exc
    try:
        _dev_type, _dev_id = device()
    except Exception as exc:
        raise TypeError(f"{name} is not a DLPack tensor gdscp can use: its __dlpack_device__() failed "
                        f"({type(exc).__name__}: {exc})") from exc
    capsule = _dlpack_capsule(obj)
    ptr, nbytes, dev_type, _dev_id, contiguous, read_only = _core.dlpack_info(capsule)
    _check_address(ptr, nbytes, "DLPack tensor")
    if not contiguous:
        raise ValueError("buffer must be contiguous (got a strided DLPack tensor)")
    if writable and read_only:
        raise ValueError("cannot read into a read-only DLPack tensor")
    if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        return Buffer(ptr, nbytes, True, (obj, capsule))
    if dev_type in (_DL_CPU, _DL_CUDA_HOST):
        return Buffer(ptr, nbytes, False, (obj, capsule))
    raise TypeError(f"unsupported DLPack device type {dev_type} (gdscp handles CPU and CUDA memory)")


def resolve(obj: Any, *, writable: bool) -> Buffer:
    """Describe ``obj``'s memory. ``writable``: the engine will write into it (a read)."""
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:  # also raised by torch for CPU tensors
        cai = None
    if cai is not None:
        return _from_cai(obj, cai, writable)

    try:
        view = memoryview(obj)
    except TypeError:
        view = None
    if view is not None:
        if writable and view.readonly:
            raise ValueError(f"cannot read into a read-only buffer ({type(obj).__name__})")
        if not view.contiguous:
            raise ValueError(f"buffer must be contiguous ({type(obj).__name__} is not)")
        ptr, nbytes = _core.host_buffer(view, writable)
        # The view pins the export: a bytearray cannot be resized under the engine.
        return Buffer(ptr, nbytes, False, (obj, view))

    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, writable)
    raise TypeError(
        f"expected a buffer (buffer protocol, __cuda_array_interface__ or __dlpack__), "
        f"got {type(obj).__name__}"
    )
