"""CUDA stream objects of any library -> the raw ``CUstream`` handle as an int."""

from __future__ import annotations

from typing import Any

__all__ = ["stream_handle"]


def _as_int(value: Any) -> int:
    value = getattr(value, "value", value)  # ctypes.c_void_p (Numba)
    return int(value or 0)


def stream_handle(stream: Any) -> int:
    """Accepts an int, ``None`` (the default stream), anything with
    ``__cuda_stream__`` (cuda.core, recent CuPy), ``.ptr`` (CuPy),
    ``.cuda_stream`` (PyTorch) or ``.handle`` (cuda.core, Numba)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return _as_int(proto()[1])
    for attr in ("ptr", "cuda_stream", "handle"):
        if hasattr(stream, attr):
            return _as_int(getattr(stream, attr))
    try:
        return int(stream)  # cuda.bindings CUstream
    except (TypeError, ValueError):
        raise TypeError(f"not a CUDA stream: {type(stream).__name__}") from None
