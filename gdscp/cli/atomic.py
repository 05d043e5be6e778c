"""Replacing a destination only when its new contents are complete: a temporary
file beside it, renamed into place, the directory then fsynced."""

from __future__ import annotations

import errno
import os
import signal
import tempfile

__all__ = ["TEMP_SUFFIX", "fsync_dir", "make_temp"]

TEMP_SUFFIX = ".gdscp-tmp"


def fsync_dir(path: str) -> None:
    """Make a rename in directory ``path`` durable."""
    fd = os.open(path or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # some filesystems cannot sync directories
            raise
    finally:
        os.close(fd)


def make_temp(dst: str) -> str:
    """Create an empty temporary file in ``dst``'s directory and return its path.

    Ctrl-C or SIGTERM between creating the file and returning its name would
    leave it behind where no cleanup can find it, so both are held off until
    the name is known (they are delivered on return)."""
    directory = os.path.dirname(os.path.abspath(dst))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=TEMP_SUFFIX, dir=directory)
        os.close(fd)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return tmp
