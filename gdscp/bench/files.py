"""The benchmark's files: creating them, warming and dropping their cached
pages, and removing them whatever happens."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from typing import Iterator, Optional

import numpy as np
# numpy imports numpy.random lazily; a Ctrl-C that lands inside that import is
# swallowed by its extension modules, so import it now, before any work starts.
import numpy.random  # noqa: F401, E402

from .. import memory
from .._interrupts import through_interrupts
from ..info import free_space, mount_of
from ..page_cache import drop_file_page_cache, drop_system_page_cache

__all__ = [
    "BenchFiles",
    "scratch_dir",
    "make_file",
    "drop_cache",
    "memory_filesystem",
    "warm_cache",
    "free_disk",
    "allocation_unit",
    "available_memory",
    "total_memory",
]

_BLOCK = 16 << 20


def make_file(path: str, size: int, seed: int = 0) -> None:
    """Write ``size`` bytes of pseudo-random data to ``path`` and fsync it.

    One random 16 MiB block is reused with its first 8 bytes replaced by the
    block number, so no two blocks are equal (dedup and compression cannot
    flatter the disk) without generating gigabytes of random numbers.
    """
    block = np.frombuffer(np.random.default_rng(seed).bytes(min(size, _BLOCK) or 1), dtype=np.uint8).copy()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        offset = 0
        index = 0
        while offset < size:
            n = min(len(block), size - offset)
            if n >= 8:
                block[:8] = np.frombuffer(index.to_bytes(8, "little"), dtype=np.uint8)
            view = memoryview(block)[:n]
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
            index += 1
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def scratch_dir(directory: str, prefix: str) -> Iterator[str]:
    """A new directory of this process's own inside ``directory`` (a random
    name, created with mode 0700 where no such name existed): what a workload
    makes in it overwrites nothing of anybody's, and no link in ``directory``
    leads it elsewhere. On the way out it is removed with all it holds,
    through any Ctrl-C or SIGTERM that lands meanwhile (the removal starts
    again where it was cut); the first of those is raised, unless an
    exception is already on its way."""
    path = tempfile.mkdtemp(prefix=prefix, dir=os.path.abspath(directory))

    def remove() -> Optional[BaseException]:
        return through_interrupts(lambda: shutil.rmtree(path, ignore_errors=True))

    try:
        yield path
    except BaseException:
        remove()
        raise
    interrupt = remove()
    if interrupt is not None:
        raise interrupt


def expected_bytes(path: str, offset: int, nbytes: int) -> bytes:
    """The file's bytes at ``offset`` (what a correct read must have delivered)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def drop_cache(path: str, use_drop_caches: bool = True) -> str:
    """Evict ``path``'s pages from the page cache; returns how.

    Dirty pages are written first (``fsync``), since ``POSIX_FADV_DONTNEED``
    only drops clean ones. As root, ``/proc/sys/vm/drop_caches`` is written
    as well (clean page cache, the whole machine's), where the kernel allows it.
    """
    drop_file_page_cache(path)
    method = "posix_fadvise(POSIX_FADV_DONTNEED)"
    if use_drop_caches and os.geteuid() == 0 and drop_system_page_cache(reclaim_dentries_and_inodes=False):
        method += " + /proc/sys/vm/drop_caches"
    return method


# Filesystems whose files live in memory only: their pages are the data, so
# dropping cached pages drops nothing and no read from them is cold.
_IN_MEMORY = frozenset({"tmpfs", "ramfs", "devtmpfs"})


def memory_filesystem(directory: str) -> Optional[str]:
    """The type of the filesystem holding ``directory`` where it keeps its
    files in memory only (tmpfs, ramfs); None for any other."""
    kind = mount_of(directory)["filesystem"]
    return kind if kind in _IN_MEMORY else None


def warm_cache(path: str, size: Optional[int] = None) -> None:
    """Read the file once so that its pages are in the page cache."""
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        remaining = size if size is not None else os.fstat(f.fileno()).st_size
        while remaining > 0:
            n = f.readinto(view[: min(len(view), remaining)])
            if not n:
                break
            remaining -= n


def free_disk(directory: str) -> Optional[int]:
    """Bytes an unprivileged user may still write in ``directory``'s filesystem;
    None where the filesystem does not say (``gdscp.info.free_space``): the
    benchmark then runs, and a full disk is said by its writes."""
    return free_space(directory)


def allocation_unit(directory: str) -> int:
    """The bytes a file of ``directory``'s filesystem takes at least, and in
    steps of: its fragment size (``f_frsize``), the unit ``free_disk`` counts
    free space in. Not ``st_blksize``, the size the filesystem prefers for
    I/O, which can be far larger (NFS gives its write size, XFS a stripe's
    width). 4096 where the filesystem reports none."""
    fs = os.statvfs(directory)
    return fs.f_frsize or fs.f_bsize or 4096


def available_memory() -> int:
    """Host memory available without swapping (``MemAvailable``)."""
    return memory.host_memory()[0]


def total_memory() -> int:
    return memory.host_memory()[1]


class BenchFiles:
    """The data file and the write target, created in ``directory`` and removed
    on exit, also when the run is interrupted (Ctrl-C raises KeyboardInterrupt,
    which passes through ``__exit__``)."""

    def __init__(self, directory: str, size: int, seed: int = 0):
        self.directory = directory
        self.size = size
        self.seed = seed
        self.data_path = ""
        self.write_path = ""
        self._paths: list[str] = []

    def _reserve(self, suffix: str) -> str:
        # Recorded before it exists, so that Ctrl-C landing the moment the file
        # appears still finds it (remove() passes over a name never made).
        while True:
            path = os.path.join(self.directory, f".gdscp-bench-{secrets.token_hex(4)}{suffix}")
            self._paths.append(path)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                self._paths.pop()
                continue
            os.close(fd)
            return path

    def __enter__(self) -> "BenchFiles":
        try:
            self.data_path = self._reserve(".data")
            self.write_path = self._reserve(".write")
            make_file(self.data_path, self.size, self.seed)
        except BaseException:
            self.remove()  # what interrupts the removal is dropped: this exception is on its way
            raise
        return self

    def remove(self) -> Optional[BaseException]:
        """Every file made removed, through any Ctrl-C or SIGTERM that lands
        meanwhile; the first of those (None if none)."""

        def unlink_all() -> None:
            while self._paths:
                try:
                    os.unlink(self._paths[-1])
                except FileNotFoundError:
                    pass
                self._paths.pop()

        return through_interrupts(unlink_all)

    def __exit__(self, exc_type: object, *exc: object) -> None:
        interrupt = self.remove()
        if interrupt is not None and exc_type is None:
            raise interrupt
