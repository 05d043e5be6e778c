"""The page cache: how much of a file it holds, and dropping a file's pages
or the whole system's, with KvikIO's functions (``get_page_cache_info``,
``drop_file_page_cache``, ``drop_system_page_cache`` and the older
``clear_page_cache``).

This is gdscp's one place that drops cached pages: the command line's
verification and the benchmark's cold runs call these functions too.

A file argument may be a path (str, bytes or ``os.PathLike``), an open file
descriptor or a file object. OS failures raise the matching ``OSError``
subclass that is also a ``RuntimeError`` (KvikIO raises ``RuntimeError``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import subprocess
import warnings
from typing import Any, Iterator, Optional

from . import _args, _core
from ._errors import from_os_error, os_error

__all__ = ["clear_page_cache", "drop_file_page_cache", "drop_system_page_cache", "get_page_cache_info"]


def _has_pages(mode: int) -> bool:
    """Whether files of this type keep pages in the page cache: regular files,
    block devices and directories. FIFOs, sockets and character devices do not."""
    return stat.S_ISREG(mode) or stat.S_ISBLK(mode) or stat.S_ISDIR(mode)


@contextlib.contextmanager
def _opened(file: Any) -> Iterator[tuple[Optional[int], str, int]]:
    """(descriptor, name for messages, ``st_mode``) of a file argument. A path
    is looked at before it is opened, and a file without cached pages is not
    opened at all (the descriptor is None): opening a FIFO hands a waiting
    writer a reader that goes away at once, which loses what it writes or
    kills it with SIGPIPE, and opening a device may make it act. A descriptor
    opened here is closed afterwards. OS failures become gdscp's OS errors."""
    named = isinstance(file, (str, bytes, os.PathLike))
    if named:
        name = _args.path(file)
        try:
            mode = os.stat(name).st_mode  # following a link, as open() does
        except OSError as exc:
            raise from_os_error(exc) from None
        if not _has_pages(mode):
            yield None, name, mode
            return
    try:
        fd, opened = _args.file_descriptor(file)
    except OSError as exc:
        raise from_os_error(exc) from None
    if not named:
        name = str(getattr(file, "name", f"file descriptor {fd}"))
    try:
        try:
            # Again for a path: what was opened may not be what was looked at.
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            raise os_error(exc.errno, "cannot stat", name) from None
        yield fd, name, mode
    except OSError as exc:
        raise from_os_error(exc) from None
    finally:
        if opened:
            os.close(fd)


def get_page_cache_info(file: Any, offset: int = 0, length: int = 0) -> tuple[int, int]:
    """``(cached_pages, total_pages)`` for ``length`` bytes of ``file`` from
    ``offset`` (length 0: to the end of the file).

    The range is clamped to the file and widened to whole pages; from past
    the end of the file the answer is ``(0, 0)``. Linux reports residency only
    for files the caller owns or may write: for others no page counts as
    cached. A directory is an ``IsADirectoryError``; files without a page
    cache (pipes, sockets, character devices) have ``(0, 0)``, and are not
    opened when named by a path.
    """
    offset = _args.offset(offset, "offset")
    length = _args.size(length, "length")
    with _opened(file) as (fd, name, mode):
        if stat.S_ISDIR(mode):
            # Whatever the filesystem: mapping one fails on most, and on
            # procfs (size 0) would give (0, 0).
            raise os_error(errno.EISDIR, "cannot count the cached pages of", name)
        if not _has_pages(mode):
            return 0, 0
        return _core.page_cache_info(fd, offset, length, name)


def drop_file_page_cache(file: Any, offset: int = 0, length: int = 0, sync_first: bool = True) -> None:
    """Evict ``file``'s cached pages in ``length`` bytes from ``offset``
    (length 0: to the end of the file) with ``posix_fadvise(POSIX_FADV_DONTNEED)``.

    The kernel drops only clean pages, and only whole pages inside the range;
    ``sync_first`` writes dirty ones back first (``fdatasync``). No privileges
    needed, and other files keep their pages. Files without a page cache
    (pipes, sockets, character devices) are left as they are, and are not
    opened when named by a path.
    """
    offset = _args.offset(offset, "offset")
    length = _args.size(length, "length")
    with _opened(file) as (fd, name, mode):
        if not _has_pages(mode):
            return
        if sync_first:
            try:
                os.fdatasync(fd)
            except OSError as exc:
                # Nothing to write back: the filesystem has no sync for it.
                if exc.errno not in (errno.EINVAL, errno.EROFS):
                    raise os_error(exc.errno, "cannot sync", name) from None
        if length > _args.MAX_OFFSET - offset:  # past any file's end: to the end
            length = 0
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            raise os_error(exc.errno, "cannot drop the cached pages of", name) from None


def drop_system_page_cache(reclaim_dentries_and_inodes: bool = True, sync_first: bool = True) -> bool:
    """Drop the whole system's clean page cache (``vm.drop_caches``): 1, or 3
    with ``reclaim_dentries_and_inodes`` (dentries and inodes too). True if
    the kernel took it.

    ``sync_first`` runs ``sync`` first so that dirty pages become droppable.
    Every process on the machine loses its cached data; prefer
    :func:`drop_file_page_cache`. Needs root: as root the value is written to
    ``/proc/sys/vm/drop_caches``; otherwise ``sudo -n sysctl`` is tried, which
    never prompts for a password and works only where sudo allows it.
    """
    if sync_first:
        os.sync()
    return _set_drop_caches("3" if reclaim_dentries_and_inodes else "1")


def _set_drop_caches(level: str) -> bool:
    """Write ``level`` to ``vm.drop_caches``: directly as root, else through
    ``sudo -n sysctl``. True if the kernel took it."""
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write(level)
            return True
        except OSError:
            return False  # containers often mount /proc/sys read-only
    sudo = shutil.which("sudo")
    sysctl = shutil.which("sysctl") or "/sbin/sysctl"
    if sudo is None or not os.path.exists(sysctl):
        return False
    try:
        done = subprocess.run(
            [sudo, "-n", sysctl, f"vm.drop_caches={level}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def clear_page_cache(reclaim_dentries_and_inodes: bool = True, clear_dirty_pages: bool = True) -> bool:
    """KvikIO's older name for :func:`drop_system_page_cache` (``clear_dirty_pages``
    is its ``sync_first``); warns with a ``FutureWarning``, as KvikIO does."""
    warnings.warn(
        "clear_page_cache() is deprecated: use drop_system_page_cache()", FutureWarning, stacklevel=2
    )
    return drop_system_page_cache(reclaim_dentries_and_inodes, clear_dirty_pages)
