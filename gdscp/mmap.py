"""``Mmap``: a file read through a memory mapping into host or device memory,
with the interface of KvikIO's ``Mmap``."""

import mmap as _mmap
import os
import stat
from typing import Any, Optional

from . import _args, _buffers, _core, defaults
from ._errors import ArgumentError
from .cufile import IOFuture, _request_size, _settings

__all__ = ["Mmap"]


# Flags that would map something other than the file, or at an address of the
# caller's choosing (over memory in use, or at 0).
_FOREIGN_MAP_FLAGS = (getattr(_mmap, "MAP_ANONYMOUS", 0x20) | getattr(_mmap, "MAP_FIXED", 0x10)
                      | getattr(_mmap, "MAP_FIXED_NOREPLACE", 0x100000))
_SHARING = (_mmap.MAP_SHARED, _mmap.MAP_PRIVATE, getattr(_mmap, "MAP_SHARED_VALIDATE", 0x03))


def _checked_map_flags(flags: int) -> int:
    """``map_flags`` that map the file itself: one of MAP_SHARED, MAP_PRIVATE
    and MAP_SHARED_VALIDATE, and none of MAP_ANONYMOUS, MAP_FIXED and
    MAP_FIXED_NOREPLACE (ValueError); mmap(2) takes them as an int
    (OverflowError past it)."""
    _args.c_int(flags, "map_flags", "mmap(2) takes an int")
    if flags & 0x03 not in _SHARING or flags & _FOREIGN_MAP_FLAGS:
        raise ValueError(f"map_flags {flags:#x} must map the file itself: MAP_SHARED or MAP_PRIVATE (with "
                         "modifiers such as MAP_POPULATE), not MAP_ANONYMOUS, MAP_FIXED or MAP_FIXED_NOREPLACE")
    return flags


class Mmap:
    """A file opened for reading, a region of it mapped into memory once.

    ``read``/``pread`` copy out of the mapping: straight into host memory, or
    into device memory through pinned staging buffers. The file must exist;
    ``flags`` is "r" or "r+" (KvikIO does not write through a mapping either).
    ``initial_map_size`` bytes from ``initial_map_offset`` are mapped (None:
    to the end of the file), with ``map_flags`` for mmap(2) (None:
    ``MAP_PRIVATE``, as KvikIO; the mapping is read-only, so a private one
    never copies a page and reads the file's bytes as a shared one would);
    ``mode`` is accepted for KvikIO's signature and unused, since no file is
    created.

    A region outside the file, and a read outside the region, raise
    ``IndexError``; an empty region (size 0) ``ValueError``; use after
    ``close()`` ``RuntimeError``. A missing file raises ``FileNotFoundError``,
    which is also a ``RuntimeError``. Usable as a context manager (which
    KvikIO's is not).
    """

    def __init__(
        self,
        file_path: os.PathLike,
        flags: str = "r",
        initial_map_size: Optional[int] = None,
        initial_map_offset: int = 0,
        mode: int = stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH,
        map_flags: Optional[int] = None,
    ):
        if not isinstance(flags, str):
            raise ArgumentError(f"flags must be 'r' or 'r+', not {type(flags).__name__}")
        path = _args.path(file_path)
        size = None if initial_map_size is None else _args.size(initial_map_size, "initial_map_size")
        offset = _args.offset(initial_map_offset, "initial_map_offset")
        _args.integer(mode, "mode")
        flags_for_mmap = _mmap.MAP_PRIVATE if map_flags is None else _args.integer(map_flags, "map_flags")
        flags_for_mmap = _checked_map_flags(flags_for_mmap)
        self._handle = _core.MappedFile(path, flags, size, offset, flags_for_mmap)
        # As KvikIO: a read of size None goes to the end of the file as it was
        # when mapped (a file grown since is read up to there).
        self._size_at_open = self._handle.file_size()

    def initial_map_size(self) -> int:
        """The size of the mapped region (0 once closed)."""
        return self._handle.map_size()

    def initial_map_offset(self) -> int:
        """The file offset of the mapped region (0 once closed)."""
        return self._handle.map_offset()

    def file_size(self) -> int:
        """The file's size now (0 once closed)."""
        return self._handle.file_size()

    def close(self) -> None:
        """Unmap and close; reads in flight finish first. Closing twice is fine."""
        self._handle.close()

    def closed(self) -> bool:
        """Whether ``close()`` was called (a method, as in KvikIO)."""
        return self._handle.closed()

    def __enter__(self) -> "Mmap":
        return self

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed():
            return f"<gdscp.Mmap {self._handle.path()!r} closed>"
        return (f"<gdscp.Mmap {self._handle.path()!r} {self.initial_map_size()} bytes "
                f"at offset {self.initial_map_offset()}>")

    def __reduce_ex__(self, protocol: object) -> Any:
        # As CuFile: a mapping of a file belongs to the process that made it.
        # Without this, pickle names the engine's internal class instead.
        raise TypeError(f"cannot pickle '{type(self).__name__}' object: a mapped file belongs to the process that "
                        "mapped it (pickle its name, and map that again)")

    def _request(self, buf: Any, size: Optional[int], offset: int) -> tuple:
        b = _buffers.resolve(buf, writable=True)
        offset = _args.offset(offset, "offset")
        if size is None:
            size = max(self._size_at_open - offset, 0)  # to the end the file had; past it, the engine says so
        else:
            size = _args.size(size)
        # Outside the region is an IndexError before a too small buffer is a
        # ValueError, as in KvikIO.
        self._handle.check(size, offset)
        size = _request_size(size, b.nbytes, "buffer")
        return b, size, offset

    def read(self, buf: Any, size: Optional[int] = None, offset: int = 0) -> int:
        """Copy ``size`` bytes (None: up to the end of the file) at file
        ``offset`` into ``buf``, host or device memory, on this thread; the
        bytes read."""
        b, size, offset = self._request(buf, size, offset)
        return self._handle.read(b.ptr, b.device, size, offset, defaults._settings)

    def pread(
        self,
        buf: Any,
        size: Optional[int] = None,
        offset: int = 0,
        task_size: Optional[int] = None,
    ) -> IOFuture:
        """Start copying, in parallel tasks of ``task_size`` bytes (None: the
        ``task_size`` setting); the future's ``get()`` gives the bytes read."""
        b, size, offset = self._request(buf, size, offset)
        future = self._handle.pread(b.ptr, b.device, size, offset, _settings(task_size, zero_is_default=False))
        return IOFuture(future, (b.keep, self))


# Written as a string above (the class did not exist yet); the class itself,
# so that help() and inspect show the type rather than a quoted name.
Mmap.__enter__.__annotations__["return"] = Mmap
