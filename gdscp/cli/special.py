"""``gdscp write``'s destinations that are not plain regular files, handled as
dd handles them (``gdscp copy`` and ``read`` leave theirs to the bulk engine).

A destination that exists and is a device or FIFO is written in place, front
to back, never replaced by a regular file. A write that could never fit where
it is going (free space, the process's file-size limit, the filesystem's
largest file, a block device's length) is refused before any byte moves.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
from typing import Any, Optional

from .. import memory
from ..info import free_space
from .output import Failure
from .units import format_bytes

__all__ = ["Finished", "SequentialWriter", "check_room", "writes_in_place"]


def writes_in_place(path: str) -> Optional[os.stat_result]:
    """The stat of ``path`` if it exists and is written in place (a device, FIFO
    or socket); None for a regular file or a name that does not exist yet."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Failure(f"cannot stat '{path}': {exc.strerror}") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return None
    return st


class Finished:
    """A transfer that is already over, shaped like an ``IOFuture``."""

    __slots__ = ("_nbytes",)

    def __init__(self, nbytes: int):
        self._nbytes = nbytes

    def get(self) -> int:
        return self._nbytes

    def done(self) -> bool:
        return True

    def progress(self) -> int:
        return self._nbytes

    def cancel(self) -> None:
        pass


class SequentialWriter:
    """Writes to a character device or FIFO front to back (they cannot seek),
    from host memory (GPU buffers are copied out first)."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise Failure(f"cannot open '{path}' for writing: {exc.strerror}") from None

    def pwrite(self, buf: Any, n: int, pos: int) -> Finished:
        view = memoryview(memory.to_host(buf[:n])).cast("B")
        done = 0
        while done < n:
            try:
                done += os.write(self.fd, view[done:])
            except InterruptedError:
                continue
            except OSError as exc:
                raise Failure(f"cannot write to '{self.path}' at offset {pos + done}: {exc.strerror}") from None
        return Finished(n)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "SequentialWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_room(path: str, size: int, existing: Optional[os.stat_result] = None) -> None:
    """Raise ``Failure`` if ``size`` bytes can never be written to ``path``: a new
    file beside it needs that much free space (the old file stays until the
    rename), no more than the file-size limit and the filesystem's largest file;
    a block device holds only its length. Character devices and FIFOs take any
    amount."""
    if existing is not None:
        if stat.S_ISBLK(existing.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                length = os.lseek(fd, 0, os.SEEK_END)
            finally:
                os.close(fd)
            if size > length:
                raise Failure(f"'{path}' holds {format_bytes(length)}; {format_bytes(size)} does not fit")
        return
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and size > limit:
        raise Failure(
            f"{format_bytes(size)} is more than this process may write to one file "
            f"({format_bytes(limit)}, the file-size limit set by ulimit -f)"
        )
    directory = os.path.dirname(os.path.abspath(path))
    try:
        bits = os.pathconf(directory, "PC_FILESIZEBITS")
    except (OSError, ValueError):
        bits = -1
    # 32 is also glibc's answer for a filesystem it does not know (tmpfs,
    # Lustre, GPFS...), which may hold far larger files: there, the write
    # itself says EFBIG if it must.
    if 32 < bits < 64 and size > (1 << (bits - 1)) - 1:
        raise Failure(f"{format_bytes(size)} is larger than the largest file the filesystem of '{directory}' holds")
    try:
        free = free_space(directory)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise Failure(f"cannot create '{path}': No such file or directory") from None
        return  # the write itself will say what is wrong
    if free is None:
        return  # unknown: a full disk is said by the write itself
    if size > free:
        raise Failure(
            f"not enough space for '{path}': {format_bytes(size)} needed, {format_bytes(free)} free in '{directory}'"
        )
