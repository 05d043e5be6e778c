"""Buffers and cuFile, with KvikIO's functions: ``memory_register``,
``memory_deregister`` and ``bounce_buffer_free``.

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

from typing import Any

from . import _buffers, _core

__all__ = ["bounce_buffer_free", "memory_deregister", "memory_register"]


def memory_register(buf: Any) -> None:
    """Accepts any buffer gdscp reads or writes and registers nothing (see the module's note)."""
    _buffers.resolve(buf, writable=False)


def memory_deregister(buf: Any) -> None:
    """The counterpart of :func:`memory_register`: checks ``buf``, changes nothing."""
    _buffers.resolve(buf, writable=False)


def bounce_buffer_free() -> int:
    """Free the idle staging buffers (pinned for device memory, page-aligned
    for O_DIRECT); the number of bytes freed. Buffers in use by transfers in
    flight stay, and later transfers allocate anew."""
    return _core.trim_pools()
