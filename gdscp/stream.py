"""CUDA streams and cuFile, with KvikIO's functions: ``stream_register`` and
``stream_deregister``.

gdscp does not register streams with cuFile. ``CuFile.raw_read_async`` and
``raw_write_async`` hand their stream to ``cuFileReadAsync`` /
``cuFileWriteAsync``, which take unregistered streams; registering one only
lets cuFile skip checks that the flags promise are unneeded. So these
functions check their arguments as KvikIO's binding converts them (a
``TypeError`` for what is not an integer, an ``OverflowError`` for a
negative or too large one) and change nothing.
"""

from __future__ import annotations

from . import _args

__all__ = ["stream_deregister", "stream_register"]


def stream_register(raw_stream: int, flags: int) -> None:
    """Accepts a raw ``CUstream`` (an int, 0 to 2**64-1) and cuFile stream
    flags (0 to 2**32-1); registers nothing."""
    _args.size(raw_stream, "raw_stream")
    _args.uint32(flags, "flags")  # cuFile's flags are an unsigned int


def stream_deregister(raw_stream: int) -> None:
    """The counterpart of :func:`stream_register`: checks ``raw_stream``, changes nothing."""
    _args.size(raw_stream, "raw_stream")
