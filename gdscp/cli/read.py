"""``gdscp read``: load files into GPU (or host) memory and report the speed."""

from __future__ import annotations

import collections
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from .. import CuFile, memory
from . import options
from .output import Failure, Output, UsageError
from .progress import TransferProgress
from .units import format_bytes, format_rate, format_seconds, gb_per_s, size_option

__all__ = ["read", "file_size"]

# Transfers in flight at once: enough to keep many small files moving; each
# transfer is also split among the worker threads.
_SLOTS = 4
_STREAM_CHUNK = 1 << 20  # buffer for files read front to back


def file_size(path: str) -> Optional[int]:
    """Bytes in ``path``: a regular file's size, or a block device's length; None
    for what is read front to back until its end (character devices, FIFOs, and
    files whose size the kernel reports as 0, which in procfs and sysfs still
    have content). Raises ``Failure`` naming the path when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise Failure(f"cannot read '{path}': {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise Failure(f"cannot read '{path}': Is a directory")
    if stat.S_ISSOCK(st.st_mode):
        raise Failure(f"cannot read '{path}': it is a socket")
    if stat.S_ISREG(st.st_mode):
        if not os.access(path, os.R_OK):
            raise Failure(f"cannot read '{path}': Permission denied")
        return st.st_size or None
    if not stat.S_ISBLK(st.st_mode):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Failure(f"cannot read '{path}': {exc.strerror}") from None
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


@dataclass
class _File:
    path: str
    offset: int
    length: Optional[int]  # None: until the end of a file read front to back
    stream: bool = False  # read front to back with read(2), not in parallel
    cufile: Optional[CuFile] = None
    pending: int = 0
    started: float = 0.0
    finished: float = 0.0
    bytes: int = 0
    backend: str = ""
    backend_reason: str = ""
    plain: Optional[int] = field(default=None, repr=False)  # descriptor for --verify

    def open(self, device: Optional[int]) -> CuFile:
        if self.cufile is None:
            self.cufile = CuFile(self.path, "r")
            if device is None:
                self.backend, self.backend_reason = "posix", "host memory always takes the POSIX path"
            else:
                self.backend, self.backend_reason = self.cufile.backend, self.cufile.backend_reason
            self.started = time.perf_counter()
        return self.cufile

    def close(self) -> None:
        if self.cufile is not None:
            self.cufile.close()
        if self.plain is not None:
            os.close(self.plain)
            self.plain = None

    def result(self, verified: bool) -> dict[str, Any]:
        seconds = max(self.finished - self.started, 0.0)
        return {
            "path": self.path,
            "offset": self.offset,
            "bytes": self.bytes,
            "seconds": seconds,
            "gb_per_s": gb_per_s(self.bytes, seconds),
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "verified": verified,
        }


def _plan(paths: list[str], offset: int, length: Optional[int], verify: bool) -> list[_File]:
    files = []
    for p in paths:
        path = options.check_path(p, "FILE")
        size = file_size(path)
        if size is None:
            if offset:
                raise UsageError(f"--offset needs a regular file or block device; '{path}' is read front to back")
            if verify and not stat.S_ISREG(os.stat(path).st_mode):
                raise UsageError(f"--verify needs a regular file or block device; '{path}' cannot be read twice")
            files.append(_File(path, 0, length, stream=True))
            continue
        if offset > size:
            raise Failure(f"--offset {offset} is past the end of '{path}' ({size} bytes)")
        want = size - offset if length is None else length
        if offset + want > size:
            raise Failure(
                f"'{path}' has {size - offset} bytes from offset {offset}; --length asks for {want}"
            )
        files.append(_File(path, offset, want))
    return files


def _read_stream(f: _File, slot: Any, progress: TransferProgress, verify: bool) -> None:
    """Read ``f`` front to back through ``slot`` until its end or ``f.length`` bytes."""
    f.backend, f.backend_reason = "posix", "read front to back with read(2): it has no size to split"
    chunk = len(slot)
    bounce = slot if not memory.is_device(slot) else memory.allocate(chunk, None)
    view = memoryview(bounce).cast("B")
    f.started = time.perf_counter()
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Failure(f"cannot read '{f.path}': {exc.strerror}") from None
    try:
        while f.length is None or f.bytes < f.length:
            want = chunk if f.length is None else min(chunk, f.length - f.bytes)
            try:
                got = os.readv(fd, [view[:want]])
            except InterruptedError:
                continue
            except OSError as exc:
                raise Failure(f"cannot read '{f.path}' at offset {f.bytes}: {exc.strerror}") from None
            if got == 0:
                break
            if bounce is not slot:
                memory.copy_from_host(slot, bounce[:got])
            if verify:
                _verify(f, slot[:got], f.bytes, got)
            f.bytes += got
            progress.advance(got)
    finally:
        os.close(fd)
    if f.length is not None and f.bytes < f.length:
        raise Failure(f"'{f.path}' ended after {f.bytes} bytes; --length asks for {f.length}")
    f.finished = time.perf_counter()
    progress.file_done()


def _verify(f: _File, slot: Any, offset: int, n: int) -> None:
    if f.plain is None:
        f.plain = os.open(f.path, os.O_RDONLY)
    expected = memoryview(bytearray(n))
    got = 0
    while got < n:
        k = os.preadv(f.plain, [expected[got:]], offset + got)
        if k == 0:
            raise Failure(f"verify: '{f.path}' ended at offset {offset + got} during the check")
        got += k
    where = memory.first_difference(slot, expected)
    if where is not None:
        raise Failure(f"verify failed: the bytes read from '{f.path}' differ at offset {offset + where}")


def read(
    files: Annotated[
        list[str],
        typer.Argument(
            metavar="FILE...",
            help="Files (or devices) to read; devices, FIFOs and procfs files are read front to back.",
            show_default=False,
        ),
    ],
    offset: Annotated[
        Optional[int],
        typer.Option("--offset", parser=size_option, metavar="SIZE", help="Start this far into each file."),
    ] = None,
    length: Annotated[
        Optional[int],
        typer.Option(
            "--length",
            parser=size_option,
            metavar="SIZE",
            help="Read this many bytes of each file (default: to the end).",
        ),
    ] = None,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compare the bytes loaded with a plain read of each file.")
    ] = False,
    device: options.Device = None,
    host: options.Host = False,
    chunk_size: options.ChunkSize = None,
    threads: options.Threads = None,
    task_size: options.TaskSize = None,
    compat_mode: options.CompatModeOpt = None,
    json: options.Json = False,
    quiet: options.Quiet = False,
    debug: options.Debug = False,
) -> None:
    """Load FILEs (or a range of each) into GPU memory and report bytes, seconds, GB/s and the backend.

    All files share one pipeline (several transfers in flight) and one progress
    bar. Files larger than the buffer stream through it in chunks. Without a
    GPU, or with --host, the files are read into host memory instead.

    Example: gdscp read /data/shard-*.bin --device 1 --verify
    """
    out = Output("read", json=json, quiet=quiet, debug=debug)
    with out.guard(), options.settings(threads, task_size, compat_mode):
        plan = _plan(files, offset or 0, length, verify)
        streams = [f for f in plan if f.stream]
        sized = [f for f in plan if not f.stream]
        where = options.choose_memory(out, host, device)
        largest = max((f.length or _STREAM_CHUNK for f in plan), default=0)
        chunk = options.chunk_size(chunk_size, largest, where, _SLOTS)
        pieces = [
            (f, pos, min(chunk, f.offset + f.length - pos))
            for f in sized
            for pos in range(f.offset, f.offset + f.length, chunk)
        ]
        nslots = max(1, min(_SLOTS, len(pieces)))
        buffer = memory.allocate(chunk * nslots if pieces or streams else 0, where)
        slots = [buffer[i * chunk : (i + 1) * chunk] for i in range(nslots)]
        for f, _pos, _n in pieces:
            f.pending += 1

        total = sum(f.length or 0 for f in plan)
        free = list(range(nslots))
        inflight: collections.deque = collections.deque()

        with TransferProgress(out.stderr, total, len(plan), "read", enabled=out.show_progress) as progress:

            def complete() -> None:
                f, pos, n, slot, future = inflight.popleft()
                got = progress.wait(future)
                if got != n:
                    raise Failure(f"'{f.path}' ended at offset {pos + got} while being read (was it truncated?)")
                if verify:
                    _verify(f, slots[slot][:n], pos, n)
                f.bytes += n
                f.pending -= 1
                free.append(slot)
                if f.pending == 0:
                    f.finished = time.perf_counter()
                    f.close()
                    progress.file_done()

            start = time.perf_counter()
            try:
                for f in sized:
                    if f.length == 0:  # nothing to move, but report the backend
                        f.open(where)
                        f.finished = f.started
                        f.close()
                        progress.file_done()
                for f, pos, n in pieces:
                    if not free:
                        complete()
                    slot = free.pop()
                    future = f.open(where).pread(slots[slot][:n], n, pos)
                    inflight.append((f, pos, n, slot, future))
                while inflight:
                    complete()
                for f in streams:
                    _read_stream(f, slots[0], progress, verify)
            finally:
                for _f, _pos, _n, _slot, future in inflight:
                    future.cancel()
                for _f, _pos, _n, _slot, future in inflight:
                    try:
                        future.get()
                    except BaseException:  # noqa: BLE001 - already failing; the first error is reported
                        pass
                for f in plan:
                    f.close()
            seconds = time.perf_counter() - start

        nbytes = sum(f.bytes for f in plan)
        data = {
            "command": "read",
            "ok": True,
            "memory": "host" if where is None else "gpu",
            "device": where,
            "files": [f.result(verify) for f in plan],
            "bytes": nbytes,
            "seconds": seconds,
            "gb_per_s": gb_per_s(nbytes, seconds),
            "verified": verify,
        }

        def render() -> Table:
            table = Table(title=f"read into {options.memory_name(where)}", title_justify="left")
            for name in ("file", "bytes", "time", "rate", "backend"):
                table.add_column(name, justify="right" if name in ("bytes", "time", "rate") else "left")
            for f in data["files"]:
                table.add_row(f["path"], format_bytes(f["bytes"]), format_seconds(f["seconds"]),
                              format_rate(f["bytes"], f["seconds"]), f["backend"])
            if len(plan) > 1:
                table.add_row("total", format_bytes(nbytes), format_seconds(seconds), format_rate(nbytes, seconds), "",
                              style="bold")
            if verify:
                table.caption = "verified: every byte matches a plain read"
            return table

        out.result(data, render)
