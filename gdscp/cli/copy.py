"""``gdscp copy``: copy files through GPU memory with ``cp``'s semantics.

Every file is written to a temporary file in the destination directory,
fsynced, given its mode (and times with --preserve), checked with --verify,
and only then renamed over the destination; the directory is fsynced after
the rename. Whatever goes wrong before the rename (an I/O error, a full disk,
Ctrl-C, SIGTERM) removes the temporary file and leaves an existing
destination as it was.
"""

from __future__ import annotations

import itertools
import os
import stat
import time
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Iterator, Optional

import typer
from rich.table import Table

from .. import CuFile, memory
from . import options
from .atomic import commit, discard, forget, fsync_dir, make_temp, make_temp_link
from .output import EXIT_FAILURE, Failure, Output, describe
from .progress import TransferProgress
from .special import SequentialWriter
from .units import format_bytes, format_rate, format_seconds, gb_per_s
from .write import drop_cache

__all__ = ["copy"]

_VERIFY_BLOCK = 4 << 20
_UNSIZED_CHUNK = 1 << 20  # buffer for files whose size the kernel reports as 0


@dataclass
class _Job:
    kind: str  # "file", "link", "mkdir", "dirmeta" (a directory's mode and times, after its contents)
    src: str
    dst: str
    st: os.stat_result


@dataclass
class _Record:
    source: str
    destination: str
    bytes: int = 0
    status: str = "copied"  # copied, skipped, failed
    error: Optional[str] = None
    read_backend: Optional[str] = None
    write_backend: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _inside(child: str, parent: str) -> bool:
    child, parent = os.path.realpath(child), os.path.realpath(parent)
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


class _Copier:
    def __init__(self, out: Output, *, recursive: bool, no_clobber: bool, preserve: bool, verify: bool):
        self.out = out
        self.recursive = recursive
        self.no_clobber = no_clobber
        self.preserve = preserve
        self.verify = verify
        self.umask = _umask()
        self.records: list[_Record] = []
        self.failed_planning = 0
        self.created_dirs: set[str] = set()
        self.failed_dirs: list[str] = []
        self.device: Optional[int] = None
        self.slots: list[Any] = []

    # -- planning -------------------------------------------------------------------
    def problem(self, message: str, src: str = "", dst: str = "") -> None:
        self.out.error(message)
        self.records.append(_Record(src, dst, status="failed", error=message))

    def plan(self, sources: list[str], dst: str) -> list[_Job]:
        dst_is_dir = os.path.isdir(dst)
        if len(sources) > 1 and not dst_is_dir:
            raise Failure(f"target '{dst}' is not a directory")
        jobs: list[_Job] = []
        for src in sources:
            try:
                st = os.stat(src)
            except OSError as exc:
                self.problem(f"cannot stat '{src}': {exc.strerror}", src)
                continue
            name = os.path.basename(os.path.normpath(src))
            target = os.path.join(dst, name) if dst_is_dir else dst
            if stat.S_ISDIR(st.st_mode):
                if not self.recursive:
                    self.problem(f"-r not given; omitting directory '{src}'", src)
                    continue
                if os.path.lexists(target) and not os.path.isdir(target):
                    self.problem(f"cannot overwrite non-directory '{target}' with directory '{src}'", src, target)
                    continue
                if _inside(target, src):
                    self.problem(f"cannot copy a directory, '{src}', into itself, '{target}'", src, target)
                    continue
                jobs.extend(self._walk(src, target, st))
            elif stat.S_ISREG(st.st_mode):
                if dst.endswith(os.sep) and not dst_is_dir:
                    self.problem(f"cannot create '{dst}': Not a directory", src, dst)
                    continue
                jobs.append(_Job("file", src, target, st))
            else:
                self.problem(f"'{src}' is not a regular file or directory; not copied", src)
        return jobs

    def _walk(self, src: str, dst: str, st: os.stat_result) -> Iterator[_Job]:
        yield _Job("mkdir", src, dst, st)
        try:
            entries = sorted(os.scandir(src), key=lambda e: e.name)
        except OSError as exc:
            self.problem(f"cannot read directory '{src}': {exc.strerror}", src, dst)
            return
        for entry in entries:
            s, d = entry.path, os.path.join(dst, entry.name)
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError as exc:
                self.problem(f"cannot stat '{s}': {exc.strerror}", s, d)
                continue
            if stat.S_ISLNK(est.st_mode):
                yield _Job("link", s, d, est)
            elif stat.S_ISDIR(est.st_mode):
                yield from self._walk(s, d, est)
            elif stat.S_ISREG(est.st_mode):
                yield _Job("file", s, d, est)
            else:
                self.problem(f"'{s}' is not a regular file, directory or symbolic link; not copied", s, d)
        yield _Job("dirmeta", src, dst, st)

    # -- doing --------------------------------------------------------------------------
    def run(self, jobs: list[_Job], progress: TransferProgress) -> None:
        for job in jobs:
            if any(_inside(job.dst, bad) for bad in self.failed_dirs):
                continue  # its directory could not be made; that was reported once
            record = _Record(job.src, job.dst)
            try:
                if job.kind == "mkdir":
                    self._mkdir(job)
                elif job.kind == "dirmeta":
                    self._dirmeta(job)
                elif job.kind == "link":
                    self._link(job, record)
                else:
                    self._file(job, record, progress)
            except Exception as exc:  # noqa: BLE001 - one file's failure must not stop the others
                if job.kind == "file" and not isinstance(exc, Failure):
                    # The engine names the temporary file; say which copy it was.
                    exc = Failure(f"cannot copy '{job.src}' to '{job.dst}': {describe(exc)[0]}")
                record.status, record.error = "failed", describe(exc)[0]
                self.out.error(record.error)
                if job.kind == "mkdir":
                    self.failed_dirs.append(job.dst)
            if job.kind in ("file", "link") or record.status == "failed":
                self.records.append(record)
            if job.kind == "file":
                progress.file_done()

    def _mkdir(self, job: _Job) -> None:
        if os.path.isdir(job.dst):
            return  # merging into an existing directory, as cp does
        try:
            # Writable by us until its contents are in; the real mode comes after.
            os.mkdir(job.dst, 0o700)
        except OSError as exc:
            raise Failure(f"cannot create directory '{job.dst}': {exc.strerror}") from None
        self.created_dirs.add(job.dst)

    def _dirmeta(self, job: _Job) -> None:
        if self.preserve:
            os.chmod(job.dst, stat.S_IMODE(job.st.st_mode))
            os.utime(job.dst, ns=(job.st.st_atime_ns, job.st.st_mtime_ns))
        elif job.dst in self.created_dirs:
            os.chmod(job.dst, stat.S_IMODE(job.st.st_mode) & ~self.umask)

    def _link(self, job: _Job, record: _Record) -> None:
        if os.path.lexists(job.dst):
            if self.no_clobber:
                record.status = "skipped"
                self.out.note(f"not replacing '{job.dst}' (it exists; --no-clobber)")
                return
            if os.path.isdir(job.dst) and not os.path.islink(job.dst):
                raise Failure(f"cannot overwrite directory '{job.dst}' with a symbolic link")
        tmp = make_temp_link(os.readlink(job.src), job.dst)
        try:
            if self.preserve:
                os.utime(tmp, ns=(job.st.st_atime_ns, job.st.st_mtime_ns), follow_symlinks=False)
            commit(tmp, job.dst)
        finally:
            discard_unless_committed(tmp, job.dst)

    def _file(self, job: _Job, record: _Record, progress: TransferProgress) -> None:
        src, dst, st = job.src, job.dst, job.st
        if os.path.islink(dst) and os.path.exists(dst):
            dst = os.path.realpath(dst)  # like cp, write to what the link points at
        try:
            existing: Optional[os.stat_result] = os.stat(dst)
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            raise Failure(f"cannot stat '{dst}': {exc.strerror}") from None
        if existing is not None:
            if self.no_clobber:
                record.status = "skipped"
                self.out.note(f"not replacing '{dst}' (it exists; --no-clobber)")
                progress.advance(st.st_size)
                return
            if stat.S_ISDIR(existing.st_mode):
                raise Failure(f"cannot overwrite directory '{dst}' with non-directory '{src}'")
            if (existing.st_dev, existing.st_ino) == (st.st_dev, st.st_ino):
                raise Failure(f"'{src}' and '{dst}' are the same file")
            if not stat.S_ISREG(existing.st_mode):
                # A device, FIFO or socket is written in place, as cp does; never replaced.
                self._into_special(src, dst, st, existing, record, progress)
                return
        directory = os.path.dirname(os.path.abspath(dst))
        try:
            tmp = make_temp(dst)
        except OSError as exc:
            raise Failure(f"cannot create '{dst}': {exc.strerror}") from None
        try:
            with CuFile(src, "r") as reader, CuFile(tmp, "w") as writer:
                if self.device is None:
                    record.read_backend = record.write_backend = "posix"
                else:
                    record.read_backend, record.write_backend = reader.backend, writer.backend
                copied = self._stream(reader, writer.pwrite, st.st_size, src, progress)
                os.fsync(writer.fileno())
            if self.preserve:
                mode = stat.S_IMODE(st.st_mode)
            elif existing is not None:
                mode = stat.S_IMODE(existing.st_mode)  # cp keeps an overwritten file's mode
            else:
                mode = stat.S_IMODE(st.st_mode) & 0o777 & ~self.umask
            os.chmod(tmp, mode)
            if self.preserve:
                os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            if self.verify:
                _compare(src, tmp, dst)
            if self.no_clobber:
                if not self._link_no_clobber(tmp, dst):
                    record.status = "skipped"
                    self.out.note(f"not replacing '{dst}' (it appeared during the copy; --no-clobber)")
                    return
            else:
                commit(tmp, dst)
            fsync_dir(directory)
            record.bytes = copied
        finally:
            discard_unless_committed(tmp, dst)

    def _into_special(
        self,
        src: str,
        dst: str,
        st: os.stat_result,
        existing: os.stat_result,
        record: _Record,
        progress: TransferProgress,
    ) -> None:
        """Copy into an existing device or FIFO in place: block devices with
        parallel writes, character devices and FIFOs front to back."""
        if self.verify:
            raise Failure(f"cannot verify a copy into '{dst}': it is not a regular file and cannot be read back")
        with SequentialWriter(dst) if not stat.S_ISBLK(existing.st_mode) else CuFile(dst, "r+") as writer:
            with CuFile(src, "r") as reader:
                record.read_backend = "posix" if self.device is None else reader.backend
                record.write_backend = "posix"
                record.bytes = self._stream(reader, writer.pwrite, st.st_size, src, progress)
            if stat.S_ISBLK(existing.st_mode):
                os.fsync(writer.fileno())

    @staticmethod
    def _link_no_clobber(tmp: str, dst: str) -> bool:
        """Put ``tmp`` at ``dst`` only if nothing is there (atomically where hard
        links work); False if ``dst`` exists."""
        try:
            os.link(tmp, dst)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network and FUSE filesystems)
            if os.path.lexists(dst):
                return False
            commit(tmp, dst)
            return True
        discard(tmp)
        return True

    def _stream(
        self,
        reader: CuFile,
        write: Callable[[Any, int, int], Any],
        size: int,
        src: str,
        progress: TransferProgress,
    ) -> int:
        """Copy the source through the buffers in chunks, reading chunk k+1 while
        chunk k is written (``write(buf, n, pos)`` returns a future). A size of 0
        is not trusted (procfs and sysfs report 0 for files with content): such
        a file is read until end of file, as cp does. Returns the bytes copied."""
        chunk = len(self.slots[0])
        known_size = size > 0
        pos = 0
        reading = writing = None
        try:
            for k in itertools.count():
                n = min(chunk, size - pos) if known_size else chunk
                if n == 0:
                    break
                slot = self.slots[k % len(self.slots)][:n]
                reading = reader.pread(slot, n, pos)
                got = reading.get()
                reading = None
                if known_size and got != n:
                    raise Failure(f"'{src}' ended at offset {pos + got} while being copied (was it truncated?)")
                if writing is not None:
                    _wait_write(progress, writing)
                    writing = None
                if got:
                    writing = (write(slot, got, pos), pos, got)
                pos += got
                if got < n:
                    break  # end of a file of unknown size
            if writing is not None:
                _wait_write(progress, writing)
                writing = None
        finally:
            # Failing or interrupted: stop what is in flight before its buffer is reused.
            for future in (reading, writing[0] if writing else None):
                if future is not None:
                    future.cancel()
                    try:
                        future.get()
                    except BaseException:  # noqa: BLE001 - the first error is the one reported
                        pass
        return pos


def discard_unless_committed(tmp: str, dst: str) -> None:
    """Remove ``tmp`` if it still exists under its temporary name (the copy did not land)."""
    if os.path.lexists(tmp):
        discard(tmp)
    else:
        forget(tmp)


def _wait_write(progress: TransferProgress, writing) -> None:
    future, pos, n = writing
    moved = progress.wait(future)
    if moved != n:
        raise OSError(f"short write at offset {pos + moved}")


def _compare(src: str, tmp: str, dst: str) -> None:
    """Raise ``Failure`` unless the copy ``tmp`` (to become ``dst``) equals ``src``,
    reading the copy from storage rather than from the page cache."""
    with open(src, "rb", buffering=0) as a, open(tmp, "rb", buffering=0) as b:
        drop_cache(b.fileno())
        pos = 0
        while True:
            x = a.read(_VERIFY_BLOCK)
            y = b.read(_VERIFY_BLOCK)
            where = memory.first_difference(x, y)
            if where is not None:
                raise Failure(
                    f"verify failed: the copy of '{src}' differs at offset {pos + where}; '{dst}' was not changed"
                )
            if not x:
                return
            pos += len(x)


def copy(
    paths: Annotated[
        list[str],
        typer.Argument(
            metavar="SRC... DST",
            help="Files (or directories, with -r) to copy, then the file to create or the directory to copy into.",
            show_default=False,
        ),
    ],
    recursive: Annotated[
        bool, typer.Option("--recursive", "-r", "-R", help="Copy directories and everything in them.")
    ] = False,
    no_clobber: Annotated[
        bool, typer.Option("--no-clobber", "-n", help="Do not replace existing files (skipped files count as success).")
    ] = False,
    preserve: Annotated[
        bool, typer.Option("--preserve", "-p", help="Keep mode and access/modification times.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Compare each copy with its source (read from storage) before it replaces DST."),
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
    """Copy SRC to DST, or SRCs into the directory DST, through GPU memory (storage -> GPU -> storage).

    cp's semantics: file to file, files into a directory, -r for trees (empty
    files and directories included; symbolic links inside trees are copied as
    links). Files larger than the buffer stream through it in chunks, the next
    chunk read while the previous one is written. Each file goes to a temporary
    file beside DST, is fsynced and renamed into place only when complete, so a
    failed or interrupted copy never leaves a partial file or spoils an existing
    DST. Exit code 0 only if every file was copied (or skipped by -n).

    Example: gdscp copy -r --verify /data/checkpoints /mnt/nvme/
    """
    out = Output("copy", json=json, quiet=quiet, debug=debug)
    with out.guard(), options.settings(threads, task_size, compat_mode):
        srcs, dst = options.sources_and_destination(paths)
        copier = _Copier(out, recursive=recursive, no_clobber=no_clobber, preserve=preserve, verify=verify)
        jobs = copier.plan(srcs, dst)
        files = [j for j in jobs if j.kind == "file"]
        total = sum(j.st.st_size for j in files)
        largest = max((j.st.st_size for j in files), default=0)
        if any(j.st.st_size == 0 for j in files):
            # A size of 0 may hide content (procfs): such files are read until end of file.
            largest = max(largest, _UNSIZED_CHUNK)
        if largest:
            where = options.choose_memory(out, host, device)
            chunk = options.chunk_size(chunk_size, largest, where, 2)
            buffer = memory.allocate(2 * chunk, where)
            copier.slots = [buffer[:chunk], buffer[chunk:]]
            copier.device = where
        else:
            where = None if host else device  # nothing to move through memory
            if device is not None and not host:
                memory.check_device(device)
            copier.device = where
        start = time.perf_counter()
        with TransferProgress(out.stderr, total, len(files), "copy", enabled=out.show_progress) as progress:
            copier.run(jobs, progress)
        seconds = time.perf_counter() - start

        records = copier.records
        copied = [r for r in records if r.status == "copied"]
        skipped = [r for r in records if r.status == "skipped"]
        failed = [r for r in records if r.status == "failed"]
        nbytes = sum(r.bytes for r in copied)
        data = {
            "command": "copy",
            "ok": not failed,
            "memory": "host" if where is None else "gpu",
            "device": where,
            "copied": len(copied),
            "skipped": len(skipped),
            "failed": len(failed),
            "bytes": nbytes,
            "seconds": seconds,
            "gb_per_s": gb_per_s(nbytes, seconds),
            "verified": verify,
            "files": [r.as_dict() for r in records],
        }

        def render() -> Table:
            table = Table(title=f"copy through {options.memory_name(where)}", title_justify="left")
            for name in ("copied", "skipped", "failed", "bytes", "time", "rate"):
                table.add_column(name, justify="right")
            table.add_row(str(len(copied)), str(len(skipped)), str(len(failed)), format_bytes(nbytes),
                          format_seconds(seconds), format_rate(nbytes, seconds))
            if verify and not failed:
                table.caption = "every copy was compared with its source"
            elif verify:
                table.caption = f"the copies made were compared with their sources; {len(failed)} failed"
            return table

        out.result(data, render)
        if failed:
            raise typer.Exit(EXIT_FAILURE)
