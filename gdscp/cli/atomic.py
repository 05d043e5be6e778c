"""Replacing a destination only when its new contents are complete: a temporary
file beside it, renamed into place, the directory then fsynced.

Every temporary file is recorded the moment it exists (Ctrl-C and SIGTERM are
held off from its creation until it is recorded), so that whatever interrupts
a command, ``remove_pending()`` (run by ``Output.guard`` on the way out) finds
and removes it. A temporary file is held locked while it is recorded
(``gdscp.bulk.create_temporary``), so that another run cleaning the directory
knows it is in use. Bulk jobs (the files of ``gdscp copy``) keep their own
temporary files.

Each one is recorded with a descriptor of the directory it was made in, and
is removed and renamed through it (``unlinkat``, ``renameat``): a directory
moved while the file is written takes the file along, and the file is still
removed there. ``commit()`` refuses to put it in place in a directory that
its destination's path no longer leads to (``DirectoryMoved``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import stat
import threading
from typing import Iterator, NamedTuple, Optional

from .. import _core
from .._interrupts import through_interrupts
from ..bulk import create_temporary

__all__ = [
    "DirectoryMoved",
    "commit",
    "discard",
    "fsync_dir",
    "give_owner",
    "keep_owner",
    "link_into_place",
    "make_temp",
    "make_temp_link",
    "moved",
    "remove_pending",
    "signals_held",
]


class _Pending(NamedTuple):
    lock: Optional[int]  # the descriptor that holds the file's lock (None for a symbolic link)
    folder: int  # a descriptor (O_PATH) of the directory it was made in
    name: str  # its name there


# Temporary files this process made and has neither renamed nor removed yet.
_pending: dict[str, _Pending] = {}
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class DirectoryMoved(FileNotFoundError):
    """The directory a temporary file was made in is no longer where its
    destination's path leads: it was moved or removed meanwhile. The file
    was not put in place."""

    def __init__(self, dst: str):
        self.folder = os.path.dirname(dst) or "."
        super().__init__(errno.ENOENT, f"the destination directory '{self.folder}' was moved or removed", dst)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP back inside: their Python handlers are deferred
    and run on the way out. (Blocking the signals in this thread would not do:
    the kernel hands a process-directed signal to any thread that has it
    unblocked, and Python then runs the handler in the main thread at once.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # Python runs signal handlers in the main thread only
        return
    caught: list[int] = []

    def defer(signum: int, frame: object) -> None:
        caught.append(signum)

    previous = {}
    for sig in _SIGNALS:  # (a signal meanwhile runs the handler already in place: nothing held yet)
        previous[sig] = signal.signal(sig, defer)
    try:
        yield
    finally:
        # Each handler back in place, even where a signal lands between two
        # of them and the one already restored raises: that one then counts
        # as caught.
        interrupt = through_interrupts(lambda: [signal.signal(sig, handler) for sig, handler in previous.items()])
        if interrupt is not None:
            raise interrupt
        for sig in dict.fromkeys(caught):
            handler = previous[sig]
            if callable(handler):
                handler(sig, None)  # KeyboardInterrupt, or the command's SIGTERM handler
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), sig)


def fsync_dir(path: str) -> None:
    """Make a rename in directory ``path`` durable. A directory this process may
    write but not read (a drop box) cannot be opened to be synced: its whole
    filesystem is, as the engine's jobs sync it."""
    try:
        fd = os.open(path or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except PermissionError:
        _sync_filesystem_of(path or ".")
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # some filesystems cannot sync directories
            raise
    finally:
        os.close(fd)


def _sync_filesystem_of(path: str) -> None:
    """syncfs(2) of the filesystem holding directory ``path``, through the
    nearest directory above it on that filesystem that this process may open
    (PermissionError naming ``path`` where there is none)."""
    device = os.stat(path).st_dev
    folder = os.path.abspath(path)
    while folder != os.path.dirname(folder):
        folder = os.path.dirname(folder)
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            continue
        try:
            if os.fstat(fd).st_dev != device:
                continue
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), path)
            return
        finally:
            os.close(fd)
    raise PermissionError(errno.EACCES, "cannot open the directory to sync it", path)


def _drop(tmp: str) -> None:
    held = _pending.pop(tmp, None)
    if held is not None:
        if held.lock is not None:
            os.close(held.lock)
        os.close(held.folder)


def _remove(tmp: str) -> None:
    """Remove ``tmp`` from the directory it was made in, wherever that
    directory is now, and forget it."""
    held = _pending.get(tmp)
    if held is None:
        return
    try:
        os.unlink(held.name, dir_fd=held.folder)
    except OSError:
        pass
    _drop(tmp)


def make_temp(dst: str) -> str:
    """Create an empty, locked temporary file in ``dst``'s directory and return
    its path (``.NAME.XXXXXXXX.gdscp-tmp``), recorded for ``remove_pending()``."""
    with signals_held():
        fd, tmp, folder = create_temporary(os.path.abspath(dst), directory=True)
        _pending[tmp] = _Pending(fd, folder, os.path.basename(tmp))
    return tmp


def make_temp_link(target: str, dst: str) -> str:
    """A symbolic link to ``target`` under a temporary name beside ``dst``, recorded
    for ``remove_pending()``."""
    dst = os.path.abspath(dst)
    folder = os.open(os.path.dirname(dst), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    recorded = False
    try:
        for _ in range(100):
            tmp = _core.temporary_name(dst)  # named as the engine names its temporary files
            name = os.path.basename(tmp)
            with signals_held():
                try:
                    os.symlink(target, name, dir_fd=folder)
                except FileExistsError:
                    continue
                _pending[tmp] = _Pending(None, folder, name)
                recorded = True
            return tmp
        raise FileExistsError(errno.EEXIST, "no free temporary name", os.path.dirname(dst))
    finally:
        if not recorded:
            os.close(folder)


def moved(tmp: str, dst: str) -> bool:
    """Whether the path of ``dst``'s directory no longer leads to the directory
    that ``tmp`` (still recorded) was made in: it was moved or removed
    meanwhile."""
    held = _pending.get(tmp)
    if held is None:
        return False
    try:
        now = os.stat(os.path.dirname(os.path.abspath(dst)))
    except (FileNotFoundError, NotADirectoryError):
        return True
    then = os.fstat(held.folder)
    return (now.st_dev, now.st_ino) != (then.st_dev, then.st_ino)


def commit(tmp: str, dst: str) -> None:
    """Rename ``tmp`` over ``dst``, in the directory it was made in; refused
    (``DirectoryMoved``, ``tmp`` left as it is) where ``dst``'s directory is
    no longer that one: the file would land in the moved directory."""
    held = _pending.get(tmp)
    if held is None:
        os.replace(tmp, dst)
        return
    if moved(tmp, dst):
        raise DirectoryMoved(dst)
    os.replace(held.name, os.path.basename(dst), src_dir_fd=held.folder, dst_dir_fd=held.folder)
    _drop(tmp)


def link_into_place(tmp: str, dst: str) -> None:
    """Link ``tmp`` at ``dst`` only where nothing is there (FileExistsError
    otherwise), then remove ``tmp``; refused as ``commit()`` refuses."""
    held = _pending.get(tmp)
    if held is None:
        os.link(tmp, dst)
    else:
        if moved(tmp, dst):
            raise DirectoryMoved(dst)
        os.link(held.name, os.path.basename(dst), src_dir_fd=held.folder, dst_dir_fd=held.folder)
    discard(tmp)


def discard(tmp: str) -> None:
    """Remove ``tmp``, not yet committed, from the directory it was made in,
    wherever that directory is now (already gone is fine)."""
    with signals_held():
        _remove(tmp)


def remove_pending() -> None:
    """Remove every temporary file still recorded (an interrupted or failed
    command), through a signal that lands as the handlers are held (raised
    once every one is gone)."""

    def remove_all() -> None:
        with signals_held():
            for tmp in list(_pending):
                _remove(tmp)

    interrupt = through_interrupts(remove_all)
    if interrupt is not None:
        raise interrupt


def give_owner(path: "str | int", uid: int, gid: int, mode: int, *, follow_symlinks: bool = True) -> int:
    """Owner ``uid`` and group ``gid`` for ``path`` (a name, or a
    descriptor) where this process may give them (root may; others only a
    group of their own), as cp -p keeps them; returns ``mode`` less the set-user-ID (set-group-ID) bit where the
    owner (group) could not be given, as cp drops it: kept for another owner,
    a user's program would run as root."""
    st = os.stat(path, follow_symlinks=follow_symlinks)
    owner, group = st.st_uid == uid, st.st_gid == gid
    if not (owner and group):
        try:
            os.chown(path, uid, gid, follow_symlinks=follow_symlinks)
            owner = group = True
        except PermissionError:
            try:
                os.chown(path, -1, gid, follow_symlinks=follow_symlinks)
                group = True
            except OSError:
                pass
    if not owner:
        mode &= ~stat.S_ISUID
    if not group:
        mode &= ~stat.S_ISGID
    return mode


def keep_owner(tmp: str, path: str) -> None:
    """As cp, which writes into an existing file: the file that replaces
    ``path`` keeps its owner and group where this process may give them
    (root may; others only a group of their own)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    give_owner(tmp, st.st_uid, st.st_gid, 0)
