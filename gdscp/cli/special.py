"""``gdscp write``'s destinations that are not plain regular files, handled as
dd handles them (``gdscp copy`` and ``read`` leave theirs to the bulk engine),
and a name of one of the process's own descriptors, for ``write`` and ``copy``.

A destination that exists and is a device or FIFO is written in place, front
to back, never replaced by a regular file. One that names a descriptor of
this process (/dev/stdout, /dev/fd/N) is written through that descriptor,
from where it stands (its end, where it was opened for appending), as
``cat >> FILE`` writes, whatever it refers to: a regular file there is the
shell's, not one to replace. A write that could never fit where it is going
(free space, the process's file-size limit, the filesystem's largest file, a
block device's length) is refused before any byte moves.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import resource
import select
import stat
import struct
from typing import Any, Callable, Optional

from ..info import free_space
from ..page_cache import drop_file_page_cache
from .output import Failure
from .units import format_bytes

__all__ = [
    "Finished",
    "SequentialWriter",
    "check_descriptor_room",
    "check_room",
    "copy_through",
    "own_descriptor",
    "read_back",
    "writes_in_place",
]

# A descriptor's own name in procfs, once every link before it is followed
# (/proc/self and /proc/thread-self are links to the process's and the
# thread's directories).
_DESCRIPTOR_LINK = re.compile(r"/proc/([0-9]+)(?:/task/[0-9]+)?/fd/([0-9]+)")
_LINKS_AT_MOST = 40  # as the kernel follows at most 40 links in one name (ELOOP)
_BLKGETSIZE64 = 0x80081272  # ioctl: a block device's length in bytes
_VERIFY_BLOCK = 4 << 20


def own_descriptor(path: str) -> Optional[int]:
    """The descriptor of this process that ``path`` names (/dev/stdout,
    /dev/stderr, /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N,
    /proc/PID/fd/N, or a link to one), unless it refers to a directory; None
    for any other name. The name's links are followed one at a time, as
    open(2) follows them, up to the descriptor's own link, which is not: what
    it refers to may have no name (a pipe) or be a file that the shell opened
    for appending, to be written through it, never replaced."""
    try:
        me = os.readlink("/proc/self")
        resolved = "" if path.startswith("/") else os.getcwd().rstrip("/")
    except OSError:
        return None  # no procfs (no such names), or no working directory to start from
    pending = path.split("/")[::-1]  # the components still to walk, the next one last
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = resolved.rpartition("/")[0]
            continue
        candidate = f"{resolved}/{name}"
        found = _DESCRIPTOR_LINK.fullmatch(candidate) if not pending else None
        if found and found.group(1) == me:
            fd = int(found.group(2))
            try:
                return None if stat.S_ISDIR(os.fstat(fd).st_mode) else fd
            except OSError:
                return None
        try:
            target = os.readlink(candidate)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                return None  # not there, or not to be looked at: not one of this process's descriptors
            resolved = candidate  # no link
            continue
        links += 1
        if links > _LINKS_AT_MOST:
            return None
        if target.startswith("/"):
            resolved = ""
        pending.extend(target.split("/")[::-1])
    return None


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
    or through ``descriptor`` (a copy of it, sharing its offset and its
    O_APPEND) from where it stands, from host memory (GPU buffers are copied
    out first)."""

    def __init__(self, path: str, descriptor: Optional[int] = None):
        self.path = path
        self.fd = -1
        if descriptor is not None:
            if fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
                raise Failure(f"cannot write to '{path}': descriptor {descriptor} is open for reading only")
            self.fd = os.dup(descriptor)
            return
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise Failure(f"cannot open '{path}' for writing: {exc.strerror}") from None

    def fileno(self) -> int:
        return self.fd

    def pwrite(self, buf: Any, n: int, pos: int) -> Finished:
        from .. import memory  # noqa: PLC0415  (numpy: copy imports this module, and most copies need none)
        view = memoryview(memory.to_host(buf[:n])).cast("B")
        done = 0
        while done < n:
            try:
                done += os.write(self.fd, view[done:])
            except InterruptedError:
                continue
            except BlockingIOError:
                # A descriptor another process made non-blocking (its flags
                # are shared, not ours to change): wait for room.
                room = select.poll()
                room.register(self.fd, select.POLLOUT)
                room.poll()
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


def check_descriptor_room(path: str, fd: int, size: int) -> None:
    """``check_room`` for ``size`` bytes written through descriptor ``fd``
    (named ``path``) from where it stands: a regular file grows by what does
    not overwrite its bytes, on the filesystem that holds it (not that of
    /dev or /proc, where its name is); a block device holds what lies past
    the offset. Anything else takes any amount."""
    st = os.fstat(fd)
    if stat.S_ISBLK(st.st_mode):
        try:
            length = struct.unpack("Q", fcntl.ioctl(fd, _BLKGETSIZE64, bytes(8)))[0]
            pos = os.lseek(fd, 0, os.SEEK_CUR)
        except OSError:
            return  # the write itself will say what is wrong
        if pos + size > length:
            raise Failure(f"'{path}' holds {format_bytes(max(0, length - pos))} past its offset {pos}; "
                          f"{format_bytes(size)} does not fit")
        return
    if not stat.S_ISREG(st.st_mode):
        return
    appending = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
    end = (st.st_size if appending else os.lseek(fd, 0, os.SEEK_CUR)) + size
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and end > limit:
        raise Failure(
            f"'{path}' would end at {format_bytes(end)}, more than this process may write to one file "
            f"({format_bytes(limit)}, the file-size limit set by ulimit -f)"
        )
    try:
        bits = os.fpathconf(fd, "PC_FILESIZEBITS")
    except (OSError, ValueError):
        bits = -1
    if 32 < bits < 64 and end > (1 << (bits - 1)) - 1:  # (32: see check_room)
        raise Failure(f"'{path}' would end at {format_bytes(end)}, past the largest file its filesystem holds")
    try:
        fs = os.fstatvfs(fd)
    except OSError:
        return
    growth = max(0, end - st.st_size)
    free = fs.f_bavail * fs.f_frsize
    if fs.f_blocks and growth > free:  # (no blocks: free space unknown, see check_room)
        raise Failure(f"not enough space for '{path}': {format_bytes(growth)} needed, {format_bytes(free)} free")


def read_back(path: str, descriptor: int, size: int, expected: Callable[[int, int], Any], what: str) -> None:
    """--verify of the ``size`` bytes just written through ``descriptor`` (a
    regular file or block device, named ``path``), which end where it stands
    now: read back past the page cache, through a descriptor of their own, and
    compared with ``expected(pos, n)``, the ``n`` bytes meant for position
    ``pos`` of them (``what`` they are); ``Failure`` at the first difference,
    named by its offset in the file."""
    from .. import memory  # noqa: PLC0415  (numpy: copy imports this module, and most copies need none)
    start = os.lseek(descriptor, 0, os.SEEK_CUR) - size
    try:
        fd = os.open(f"/proc/self/fd/{descriptor}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Failure(f"--verify cannot read '{path}' back: {exc.strerror}") from None
    try:
        drop_file_page_cache(fd)
        block = bytearray(min(_VERIFY_BLOCK, max(size, 1)))
        pos = 0
        while pos < size:
            n = min(len(block), size - pos)
            view = memoryview(block)[:n]
            got = os.preadv(fd, [view], start + pos)
            if got != n:
                raise Failure(f"verify failed: '{path}' ended at offset {start + pos + got}")
            where = memory.first_difference(view, expected(pos, n))
            if where is not None:
                raise Failure(f"verify failed: '{path}' differs from {what} at offset {start + pos + where}")
            pos += n
    finally:
        os.close(fd)


def copy_through(src: str, writer: SequentialWriter, buffer: Any, progress: Any, verify: bool) -> int:
    """Copy ``src`` front to back into ``writer`` (a descriptor's) through
    ``buffer`` (host or GPU memory), as cat copies; made durable where that
    means anything (a regular file, a block device) and, with ``verify``,
    read back and compared with ``src``, read again. The bytes copied. A
    source that is the very file written would be read as it grows, without
    end: refused, as cp refuses it."""
    from .. import memory  # noqa: PLC0415  (numpy: copy imports this module, and most copies need none)
    try:
        fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Failure(f"cannot open '{src}' for reading: {exc.strerror}") from None
    try:
        st, out = os.fstat(fd), os.fstat(writer.fileno())
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
            raise Failure(f"'{src}' and '{writer.path}' are the same file")
        durable = stat.S_ISREG(out.st_mode) or stat.S_ISBLK(out.st_mode)
        if verify and not durable:
            raise Failure(f"cannot verify a copy into '{writer.path}': it is not a regular file or block device, "
                          "to be read back")
        if verify and not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise Failure(f"cannot verify what was read from '{src}': a FIFO or character device cannot be read "
                          "again")
        on_device = memory.is_device(buffer)
        view = memoryview(bytearray(len(buffer)) if on_device else memory.to_host(buffer)).cast("B")
        done = 0
        while True:
            try:
                got = os.readv(fd, [view])
            except OSError as exc:
                raise Failure(f"cannot read '{src}' at offset {done}: {exc.strerror}") from None
            if got == 0:
                break
            if on_device:
                memory.copy_from_host(buffer, view[:got])
            writer.pwrite(buffer if on_device else view, got, done)
            done += got
            progress.advance(got)
        if durable:
            try:
                os.fsync(writer.fileno())
            except OSError as exc:
                raise Failure(f"cannot fsync '{writer.path}': {exc.strerror}") from None
        if verify:

            def again(pos: int, n: int) -> bytes:
                data = os.pread(fd, n, pos)
                if len(data) != n:
                    raise Failure(f"verify failed: '{src}' ended at offset {pos + len(data)} as it was read again")
                return data

            read_back(writer.path, writer.fileno(), done, again, f"'{src}'")
        return done
    finally:
        os.close(fd)
