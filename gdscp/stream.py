"""CUDA streams and cuFile, with KvikIO's functions: ``stream_register`` and
``stream_deregister``.

gdscp does not register streams with cuFile. ``CuFile.raw_read_async`` and
``raw_write_async`` hand their stream to ``cuFileReadAsync`` /
``cuFileWriteAsync``, which take unregistered streams; registering one only
lets cuFile skip checks that the flags promise are unneeded. So these
functions check their arguments (integers, as in KvikIO: ``TypeError``
otherwise) and change nothing.
"""

from __future__ import annotations

from . import _args

__all__ = ["stream_deregister", "stream_register"]


def stream_register(raw_stream: int, flags: int) -> None:
    """Accepts a raw ``CUstream`` (an int) and cuFile stream flags; registers nothing."""
    _args.integer(raw_stream, "raw_stream")
    _args.integer(flags, "flags")


def stream_deregister(raw_stream: int) -> None:
    """The counterpart of :func:`stream_register`: checks ``raw_stream``, changes nothing."""
    _args.integer(raw_stream, "raw_stream")
