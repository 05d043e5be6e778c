"""CUDA stream objects of any library -> the raw ``CUstream`` handle as an int."""

from __future__ import annotations

import numbers
from typing import Any

from . import _args

__all__ = ["stream_handle"]


def _checked(value: Any) -> int:
    # A handle is a pointer: 0 to 2**64-1 (an OverflowError outside it, a
    # TypeError for a float), as KvikIO's uintptr_t argument takes it.
    return _args.size(value, "stream")


def _as_int(value: Any) -> int:
    value = getattr(value, "value", value)  # ctypes.c_void_p (Numba)
    return _checked(value or 0)


def stream_handle(stream: Any) -> int:
    """Accepts an int, ``None`` (the default stream), anything with
    ``__cuda_stream__`` (cuda.core, recent CuPy), ``.ptr`` (CuPy),
    ``.cuda_stream`` (PyTorch) or ``.handle`` (cuda.core, Numba)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return _checked(stream)
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        # A method in cuda.core and CuPy; a property in cuda.core's first releases.
        version_and_handle = proto() if callable(proto) else proto
        try:
            _version, handle = version_and_handle
        except (TypeError, ValueError):
            raise TypeError(f"{type(stream).__name__}.__cuda_stream__ gave {version_and_handle!r}, "
                            "not a (version, handle) pair") from None
        return _as_int(handle)
    for attr in ("ptr", "cuda_stream", "handle"):
        if hasattr(stream, attr):
            return _as_int(getattr(stream, attr))
    if isinstance(stream, numbers.Integral):  # numpy's integers
        return _checked(stream)
    # int() would take "5" or 2.5 for a handle.
    if isinstance(stream, (str, bytes, bytearray, numbers.Number)):
        raise TypeError(f"stream must be an integer or a CUDA stream object, not {type(stream).__name__}")
    try:
        return _checked(int(stream))  # cuda.bindings CUstream
    except (TypeError, ValueError):
        raise TypeError(f"not a CUDA stream: {type(stream).__name__}") from None
