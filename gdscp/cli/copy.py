"""``gdscp copy``: copy files with ``cp``'s semantics, through GPU memory when asked.

The files go in one bulk job (gdscp.bulk.copy_files): many in flight at once
over the engine's workers, large ones split among them. Every file is written
to a locked temporary file in its destination directory, made durable, given
its mode (and times with --preserve), checked with --verify, and only then
renamed over the destination; the directory is fsynced after the renames
(docs/durability.md). Whatever goes wrong before the rename (an I/O error, a
full disk, Ctrl-C, SIGTERM) removes the temporary file and leaves an existing
destination as it was. Directories and symbolic links are made here, around
the job: directories first (writable by us, not yet by the group or others),
their final modes after their contents, also where the copy fails or is
interrupted, and wherever they went with the destination directory, moved or
renamed during the copy.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterator, Optional

import typer

from .. import _core
from .._interrupts import through_interrupts
from ..bulk import BulkJob, FileResult, clean_temporaries, copy_files, stop_running_jobs
from . import options, ranks
from .atomic import DirectoryMoved, commit, discard, fsync_dir, give_owner, make_temp_link, moved
from .jobs import run_job
from .output import EXIT_FAILURE, Failure, Output, describe, signals_held
from .progress import TransferProgress
from .special import SequentialWriter, copy_through, own_descriptor, writes_in_place
from .units import format_bytes, format_rate, format_seconds, gb_per_s

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["copy"]

# What a file that --fail-fast kept from being copied says.
FAIL_FAST_CANCELLED = "not copied: an earlier file failed (--fail-fast)"

_THROUGH_CHUNK = 4 << 20  # a copy through a descriptor: bytes per read and write


@dataclass(slots=True)
class _Job:
    kind: str  # "file", "link", "mkdir", "dirmeta" (a directory's mode and times, after its contents)
    src: str
    dst: str
    st: os.stat_result


@dataclass(slots=True)
class _Record:
    source: str
    destination: str
    # What the copy left at the destination: all of it once copied, and
    # nothing where the copy was not put in place (its temporary file is
    # removed); written through a descriptor (``_copy_through``), what went
    # through, also where it stopped part-way.
    bytes: int = 0
    # copied, skipped, failed, cancelled (not copied: after a failure with
    # --fail-fast, or the command interrupted first)
    status: str = "copied"
    error: Optional[str] = None
    read_backend: Optional[str] = None
    write_backend: Optional[str] = None
    seconds: float = 0.0  # the file's own transfer time
    ranks: Optional[list] = None  # under MPI, a file shared among ranks: the ranks that wrote it

    def as_dict(self) -> dict[str, Any]:
        d = {"source": self.source, "destination": self.destination, "bytes": self.bytes, "status": self.status,
             "error": self.error, "read_backend": self.read_backend, "write_backend": self.write_backend,
             "seconds": self.seconds}
        if self.ranks is not None:
            d["ranks"] = self.ranks
        return d


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _proc_device() -> Optional[int]:
    """The device of /proc (None without one): its files are not held to the
    walk's identity (``_source_ids``)."""
    try:
        return os.stat("/proc").st_dev
    except OSError:
        return None


def _inside(child: str, parent: str) -> bool:
    """Whether ``child`` is the directory ``parent`` or lies below it. By
    name, for a path not made yet; and, as cp decides, by identity: where
    ``child`` or one of its directories up to the root is ``parent``'s
    (device, inode), reached through another name (a bind mount) whose real
    path is not below ``parent``'s."""
    child, parent = os.path.realpath(child), os.path.realpath(parent)
    if child == parent or child.startswith(parent.rstrip(os.sep) + os.sep):
        return True
    try:
        st = os.stat(parent)
    except OSError:
        return False
    while True:
        try:
            here = os.stat(child)
        except OSError:  # not made yet: its directory may be
            pass
        else:
            if (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino):
                return True
        up = os.path.dirname(child)
        if up == child:
            return False
        child = up


class _Copier:
    def __init__(
        self, out: Output, *, recursive: bool, no_clobber: bool, preserve: bool, verify: bool, fail_fast: bool
    ):
        self.out = out
        self.recursive = recursive
        self.no_clobber = no_clobber
        self.preserve = preserve
        self.verify = verify
        self.fail_fast = fail_fast
        self.umask = _umask()
        self.records: list[_Record] = []
        self.pending: list[_Record] = []  # the files' records, in records, until the job gives their outcomes
        self.created_dirs: set[str] = set()
        self.made: dict[str, tuple[int, int]] = {}  # each directory made: its (device, inode), to find it moved
        self.home = "."  # the directory every destination lies in: DST, or the one DST is made in
        self.home_fd: Optional[int] = None  # a descriptor of it, held from the first directory made to finish()
        self.top = ""  # DST, where this copy made it
        self.top_fd: Optional[int] = None  # a descriptor of it, held from its making to finish()
        self.failed_dirs: list[str] = []
        self.named_dst = ""  # DST as the command line names it: the one symbolic link followed
        self.link_dirs: set[str] = set()  # where links were put in place
        self.device: Optional[int] = None
        self.devices: Optional[list[int]] = None
        self.device_bytes: dict[int, int] = {}
        self.staging_size: Optional[int] = None

    # -- planning -------------------------------------------------------------------
    def stopped(self, jobs: list[_Job]) -> bool:
        """Whether --fail-fast stops the copy before it starts, a source having
        failed in the walk: then every file and link of ``jobs`` is recorded
        as not copied, and nothing is made."""
        if not (self.fail_fast and self.records):  # (the walk records only its failures)
            return False
        self.records += [_Record(j.src, j.dst, status="cancelled", error=FAIL_FAST_CANCELLED) for j in jobs
                         if j.kind in ("file", "link")]
        return True

    def problem(self, message: str, src: str = "", dst: str = "") -> None:
        self.out.error(message)
        self.records.append(_Record(src, dst, status="failed", error=message))

    def plan(self, sources: list[str], dst: str) -> list[_Job]:
        self.named_dst = dst
        dst_is_dir = os.path.isdir(dst)
        self.home = dst if dst_is_dir else os.path.dirname(os.path.normpath(dst)) or "."
        if len(sources) > 1 and not dst_is_dir:
            raise Failure(f"target '{dst}' is not a directory")
        jobs: list[_Job] = []
        named: set[tuple[int, int, str]] = set()  # (source file, its destination) of each source so far
        for src in sources:
            name = os.path.basename(os.path.normpath(src))
            target = os.path.join(dst, name) if dst_is_dir else dst
            if os.path.basename(src.rstrip(os.sep)) == ".":
                target = dst  # as cp: DIR/. into an existing DST merges DIR's contents into it
            try:
                # As cp: with -r a symbolic link is copied as a link, here as
                # inside a tree (LINK/, through the link, names what it
                # points at); without -r it is followed.
                st = os.lstat(src) if self.recursive else os.stat(src)
            except OSError as exc:
                self.problem(f"cannot stat '{src}': {exc.strerror}", src, target)
                continue
            once = (st.st_dev, st.st_ino, os.path.normpath(os.path.abspath(target)))
            if once in named:
                # As cp: the same source for the same destination again is
                # copied once, with a warning (a glob that overlaps a name).
                what = "directory" if stat.S_ISDIR(st.st_mode) else "file"
                self.out.warn(f"source {what} '{src}' specified more than once")
                continue
            named.add(once)
            if stat.S_ISLNK(st.st_mode):
                jobs.append(_Job("link", src, target, st))
            elif stat.S_ISDIR(st.st_mode):
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
            elif stat.S_ISSOCK(st.st_mode):
                self.problem(f"'{src}' is a socket; not copied", src)
            elif self.recursive and not stat.S_ISREG(st.st_mode):
                # As inside a tree: cp -r makes a FIFO or device anew (only
                # --copy-contents reads it), and gdscp makes none. Read, a
                # FIFO would wait for a writer, a disk be copied whole.
                self.problem(f"'{src}' is not a regular file, directory or symbolic link; not copied", src)
            else:
                # A regular file; or, named on the command line without -r, a
                # FIFO or a device (a process substitution, /dev/stdin), read
                # front to back as cp reads it.
                if dst.endswith(os.sep) and not dst_is_dir:
                    self.problem(f"cannot create '{dst}': Not a directory", src, dst)
                    continue
                jobs.append(_Job("file", src, target, st))
        return self._once_each(jobs)

    def _once_each(self, jobs: list[_Job]) -> list[_Job]:
        """As cp: a destination that an earlier source of this command already
        makes is not overwritten by a later one; the later one fails. So does
        a file whose destination is, through a symbolic link already in the
        destination tree, where an earlier file lands: the two would be copied
        at once, and one of them lost. And a file (or link) whose source
        another file or link of this command replaces, where it would be
        lost, fails, as does the one replacing it."""
        placed = [job for job in jobs if job.kind in ("file", "link")]
        clashes = _core.same_destinations([job.dst for job in placed], [job.kind == "file" for job in placed], False)
        dropped = set()
        for a, b in clashes:
            first, job = placed[a], placed[b]
            message = f"will not overwrite just-created '{first.dst}' with '{job.src}'"
            if os.path.normpath(os.path.abspath(first.dst)) != os.path.normpath(os.path.abspath(job.dst)):
                message += f" through '{job.dst}'"
            self.problem(message, job.src, job.dst)
            dropped.add(id(job))
        # A file whose source another file of this command replaces (named
        # through a symbolic link to it, or inside a tree copied over it):
        # the one job would read it before or after the replacement took its
        # name, as it happened. Both fail: the replacement alone would
        # destroy a source that was never copied anywhere. So do a file and
        # a link put in place over it: the links are made before any file
        # is read. A link is replaced itself, never what it points at; and
        # read as it is made, before any file replaces it, it is lost only
        # to a link made before it.
        items = [job for job in placed if id(job) not in dropped]
        n = len(items)
        follow = [job.kind == "file" for job in items]
        names = [job.dst for job in items] + [job.src for job in items]
        for a, b in _core.same_destinations(names, follow + follow, False):
            if a < n <= b and a != b - n:
                first, job = items[a], items[b - n]
                if job.kind == "link" and (first.kind == "file" or a > b - n):
                    continue  # the link is copied before it is replaced
                if id(job) not in dropped:
                    self.problem(f"will not copy '{job.src}': this copy replaces it with '{first.src}'", job.src,
                                 job.dst)
                    dropped.add(id(job))
                if id(first) not in dropped:
                    self.problem(f"will not copy '{first.src}' to '{first.dst}': it would replace '{job.src}', "
                                 "which this copy reads", first.src, first.dst)
                    dropped.add(id(first))
        if not dropped:
            return jobs
        return [job for job in jobs if id(job) not in dropped]

    def _walk(self, src: str, dst: str, st: os.stat_result) -> Iterator[_Job]:
        """The jobs of the tree ``src``, depth first: a directory's "mkdir",
        its entries in name order (a directory's own jobs in its place), its
        "dirmeta". The directories being walked are a stack of this walk's
        own, not calls: a tree deeper than Python's recursion limit (a path
        within PATH_MAX may have 2,000 levels) is walked as any other."""
        yield _Job("mkdir", src, dst, st)
        stack = [(src, dst, st, self._entries(src, dst))]
        while stack:
            folder, target, folder_st, entries = stack[-1]
            inside = target if target.endswith(os.sep) else target + os.sep
            for entry in entries:
                s, d = entry.path, inside + entry.name
                try:
                    est = entry.stat(follow_symlinks=False)
                except OSError as exc:
                    self.problem(f"cannot stat '{s}': {exc.strerror}", s, d)
                    continue
                if stat.S_ISLNK(est.st_mode):
                    yield _Job("link", s, d, est)
                elif stat.S_ISDIR(est.st_mode):
                    yield _Job("mkdir", s, d, est)
                    stack.append((s, d, est, self._entries(s, d)))
                    break  # its entries first; this directory's rest after them
                elif stat.S_ISREG(est.st_mode):
                    yield _Job("file", s, d, est)
                else:
                    self.problem(f"'{s}' is not a regular file, directory or symbolic link; not copied", s, d)
            else:
                stack.pop()
                # (One that could not be read is made all the same: it gets its mode.)
                yield _Job("dirmeta", folder, target, folder_st)

    def _entries(self, src: str, dst: str) -> Iterator[os.DirEntry]:
        """The entries of directory ``src`` in name order; none where it
        cannot be read (said once)."""
        try:
            return iter(sorted(os.scandir(src), key=lambda e: e.name))
        except OSError as exc:
            self.problem(f"cannot read directory '{src}': {exc.strerror}", src, dst)
            return iter(())

    # -- doing --------------------------------------------------------------------------
    def run(self, jobs: list[_Job], progress: TransferProgress) -> None:
        """Directories and links in order, then every file in one bulk job, then
        the directories' modes and times (those too when the job is interrupted
        or fails, the destination moved meanwhile: no directory is left at the
        mode it was made with), then
        their names and the links' made durable (those too when interrupted:
        what was put in place is then complete and durable, as each file the
        job renamed is)."""
        try:
            try:
                files, _ = self.prepare(jobs)
                if files:
                    self._copy_files(files, progress)
            except BaseException:
                # An interrupt before the command waited on its job (which would
                # have cancelled it): the job stops, its temporary files removed,
                # before the directories get their modes (a read-only one would
                # keep its files from being removed).
                stop_running_jobs()
                raise
            finally:
                self.finish(jobs)
        except BaseException:
            # The exception on its way is the one reported: a directory that
            # cannot be synced, or a signal meanwhile, does not replace it.
            through_interrupts(lambda: self.sync_names(strict=False))
            raise
        self.sync_names()

    def sync_names(self, strict: bool = True) -> None:
        """The names of the directories made and the links put in place made
        durable, as the files' are by their job: each directory that holds
        one, fsynced once (not ``strict``: past those that cannot be). One
        no longer there was moved or removed during the copy: where files
        failed, they said so (their temporary files went with it, and were
        removed there), and it is passed over; else the copy fails for it."""
        holders = {os.path.dirname(os.path.abspath(d)) for d in self.created_dirs} | self.link_dirs
        failed = any(r.status == "failed" for r in self.records)
        for folder in sorted(holders):
            try:
                fsync_dir(folder)
            except FileNotFoundError:
                if strict and not failed:
                    raise Failure(f"cannot make the names in '{folder}' durable: the directory was moved or removed "
                                  "during the copy") from None
            except OSError:
                if strict:
                    raise

    def prepare(self, jobs: list[_Job]) -> tuple[list[tuple[_Job, _Record]], list[_Job]]:
        """Makes the directories and links, in order; returns the files to copy
        (each with its record, already in ``records``) and the directories whose
        modes and times come after their contents."""
        files: list[tuple[_Job, _Record]] = []
        after: list[_Job] = []
        for k, job in enumerate(jobs):
            if self._below_failed_dir(job):
                continue  # its directory could not be made; that was reported once
            if job.kind == "dirmeta":
                after.append(job)
                continue
            record = _Record(job.src, job.dst)
            if job.kind == "file":
                self.pending.append(record)  # first: an interrupt in between leaves no record saying copied
                self.records.append(record)
                files.append((job, record))
                continue
            # A link's record is there once it is in place, or not: an
            # interrupt waits for the step's end.
            with signals_held():
                self._step(job, record)
            if self.fail_fast and record.status == "failed":
                # --fail-fast: a directory or link that failed stops the copy
                # as a file that failed would; the directories made so far
                # still get their modes.
                for _, pending in files:
                    pending.status, pending.error = "cancelled", FAIL_FAST_CANCELLED
                self.pending = []
                self.records += [_Record(j.src, j.dst, status="cancelled", error=FAIL_FAST_CANCELLED)
                                 for j in jobs[k + 1 :] if j.kind in ("file", "link")]
                after += [j for j in jobs[k + 1 :] if j.kind == "dirmeta"]
                return [], after
        return files, after

    def _below_failed_dir(self, job: _Job) -> bool:
        """Whether ``job`` lies in a directory this copy could not make. By
        name, not by where links lead: a failed directory that is a link to /
        or to an ancestor would otherwise take every file with it."""
        return any(job.dst.startswith(bad.rstrip(os.sep) + os.sep) for bad in self.failed_dirs)

    def unfinished(self, jobs: list[_Job], message: str) -> list[_Record]:
        """Every record, once a failure or interrupt (``message``) has ended
        the copy part-way: each file and link of ``jobs`` that it did not
        copy (its job never started, or it was not reached) cancelled."""
        why = f"not copied: {message}"
        for record in self.pending:  # (bytes: none yet, or what went through a descriptor)
            record.status, record.error = "cancelled", why
        self.pending = []
        seen = {(r.source, r.destination) for r in self.records}
        self.records += [_Record(j.src, j.dst, status="cancelled", error=why) for j in jobs
                         if j.kind in ("file", "link") and (j.src, j.dst) not in seen and not self._below_failed_dir(j)]
        return self.records

    def finish(self, jobs: list[_Job]) -> None:
        """The modes and times of every directory of ``jobs`` made (or, with
        --preserve, merged into) so far, once their contents are in; those
        made, wherever they went with the destination (``_open_made``). An
        interrupt that lands meanwhile, even as they are picked out, ends the
        command once they are all set (each takes a few system calls)."""
        after: list[_Job] = []

        def pick() -> None:
            after[:] = [job for job in jobs if job.kind == "dirmeta"
                        and (job.dst in self.created_dirs or (self.preserve and os.path.isdir(job.dst)))]

        try:
            interrupt = through_interrupts(pick)
            for job in after:
                caught = through_interrupts(lambda job=job: self._step(job, _Record(job.src, job.dst)))
                interrupt = interrupt or caught
        finally:
            for fd in (self.home_fd, self.top_fd):
                if fd is not None:
                    os.close(fd)
            self.home_fd = self.top_fd = None
        if interrupt is not None:
            raise interrupt

    def _step(self, job: _Job, record: _Record) -> None:
        """A directory or a link: made here, one at a time."""
        try:
            if job.kind == "mkdir":
                self._mkdir(job)
            elif job.kind == "dirmeta":
                self._dirmeta(job)
            else:
                self._link(job, record)
        except Exception as exc:  # noqa: BLE001 - one failure must not stop the others
            record.status, record.error = "failed", describe(exc)[0]
            self.out.error(record.error)
            if job.kind == "mkdir":
                self.failed_dirs.append(job.dst)
        if job.kind == "link" or record.status == "failed":
            self.records.append(record)

    def _copy_files(self, files: list[tuple[_Job, _Record]], progress: TransferProgress) -> None:
        job = copy_files(
            [(j.src, j.dst) for j, _ in files],
            device=None if self.devices else self.device,
            devices=self.devices,
            no_clobber=self.no_clobber,
            preserve=self.preserve,
            verify=self.verify,
            fail_fast=self.fail_fast,
            staging_size=self.staging_size,
            sizes=[j.st.st_size for j, _ in files],
            # With -r each file is the one lstat found (a link met is copied
            # as a link): one swapped for a link or a FIFO since is not read.
            # Not in /proc, whose files nobody swaps and where a name can be
            # another file on another thread (/proc/thread-self).
            _source_ids=[(j.st.st_dev, j.st.st_ino)
                         if self.recursive and stat.S_ISREG(j.st.st_mode) and j.st.st_dev != _proc_device() else None
                         for j, _ in files],
        )

        def failed(result: FileResult) -> None:
            src, record = files[result.index]
            if result.errno is None:
                record.error = result.error  # a sentence of its own: "'a' and 'b' are the same file"
            else:
                # The engine names the file it wrote; say which copy it was.
                record.error = f"cannot copy '{src.src}' to '{src.dst}': {result.error}"
            record.status = "failed"
            self.out.error(record.error)

        try:
            results = run_job(job, progress, failed)
        except BaseException as exc:
            # The job stopped (its wait cancelled it): each file's outcome,
            # for the document of what ends the command.
            self._settle(job, files, _stopped(job), failed, f"not copied: {describe(exc)[0]}")
            raise
        why = " (--fail-fast)" if self.fail_fast else ", and the copy could not go on"
        self._settle(job, files, results, failed, f"not copied: an earlier file failed{why}")

    def _settle(self, job: BulkJob, files: list[tuple[_Job, _Record]], results: list[FileResult],
                failed: Callable[[FileResult], None], cancelled: str) -> None:
        """The records of ``files`` given the outcomes of ``job`` (finished):
        ``cancelled`` says why a file it cancelled was not copied."""
        for d, n in job.device_bytes().items():
            self.device_bytes[d] = self.device_bytes.get(d, 0) + n
        for (_, record), result in zip(files, results):
            # A file not put in place left nothing at its destination.
            record.bytes = result.bytes if result.status == "done" else 0
            record.seconds = result.seconds
            record.read_backend, record.write_backend = result.read_backend, result.write_backend
            if result.status == "done":
                record.status = "copied"
            elif result.status == "skipped":
                record.status = "skipped"
                when = "it appeared during the copy" if result.note == "appeared" else "it exists"
                self.out.note(f"not replacing '{record.destination}' ({when}; --no-clobber)")
            elif result.status == "failed":
                if record.status != "failed":  # not yet said: the job was stopped before its failures were read
                    failed(result)
            else:
                record.status, record.error = "cancelled", cancelled
        self.pending = []

    def _foreign_link(self, path: str) -> bool:
        """A symbolic link inside the destination: as cp, never followed (only
        DST as the command line names it is)."""
        return path != self.named_dst and os.path.islink(path)

    def _mkdir(self, job: _Job) -> None:
        if self._merges_into(job.dst):
            return
        # Counted as made before it is (an interrupt may land in between): the
        # modes at the end go to those that exist.
        self.created_dirs.add(job.dst)
        if self.home_fd is None:
            try:
                self.home_fd = os.open(self.home, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                pass  # the directories are then found by their paths alone
        try:
            os.mkdir(job.dst, self._first_mode(job))
        except FileExistsError:
            self.created_dirs.discard(job.dst)
            if self._merges_into(job.dst):
                return  # made meanwhile, by another copy into the same tree
            # A file, or a link (to a directory too): the tree would land
            # wherever it points.
            raise Failure(f"cannot overwrite non-directory '{job.dst}' with directory '{job.src}'") from None
        except OSError as exc:
            self.created_dirs.discard(job.dst)
            raise Failure(f"cannot create directory '{job.dst}': {exc.strerror}") from None
        try:
            made = os.lstat(job.dst)
            self.made[job.dst] = (made.st_dev, made.st_ino)
        except OSError:
            return  # gone at once: whatever its path leads to at the end is taken for it
        if self.top_fd is None and os.path.normpath(job.dst) == os.path.normpath(self.named_dst):
            self._hold_top(job.dst, (made.st_dev, made.st_ino))

    def _first_mode(self, job: _Job) -> int:
        """The mode directory ``job`` is made with (less the umask, which
        mkdir takes off), as cp makes it: writable by us until its contents
        are in, and already readable and searchable by those its source lets
        in, so that a copy killed before the end (SIGKILL, a crash) leaves
        directories they can use, as a killed cp does. Until the end, when
        the real mode comes: no write permission for the group or others, nor
        a special bit; with --preserve no permission at all for them (the
        directory's group is not yet the source's)."""
        omitted = 0o077 if self.preserve else 0o022
        return (stat.S_IMODE(job.st.st_mode) & 0o777 & ~omitted) | 0o700

    def _hold_top(self, path: str, made: tuple[int, int]) -> None:
        """Holds a descriptor of DST, just made by this copy at ``path``: the
        directories made in it are found there at the end, however DST was
        renamed meanwhile (``home`` holds only what DST was made in)."""
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return  # moved at once: the directories are then found through home alone
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != made:
            os.close(fd)  # another directory, made there since
            return
        self.top, self.top_fd = path, fd

    def _open_made(self, path: str) -> Optional[int]:
        """A descriptor of the directory this copy made at ``path``, wherever
        it is now: where ``path`` leads, else where it went with the directory
        that holds the destinations (``home``: DST, or what holds it, moved or
        renamed during the copy), or in DST where this copy made it (``top``).
        None where it is at none of them (removed, or moved away on its own)."""
        places: list[tuple[str, Optional[int]]] = [(path, None)]
        if self.top_fd is not None:
            places.append((os.path.relpath(path, self.top), self.top_fd))
        if self.home_fd is not None:
            places.append((os.path.relpath(path, self.home), self.home_fd))
        for name, folder in places:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            except OSError:
                continue
            st = os.fstat(fd)
            if self.made.get(path, (st.st_dev, st.st_ino)) == (st.st_dev, st.st_ino):
                return fd
            os.close(fd)  # another directory, made there since
        return None

    def _merges_into(self, path: str) -> bool:
        """Whether ``path`` is a directory the tree merges into, as cp does
        (not a link to one: the tree would land wherever it points)."""
        return os.path.isdir(path) and not self._foreign_link(path)

    def _dirmeta(self, job: _Job) -> None:
        if job.dst in self.failed_dirs:
            return  # not ours to change (see _mkdir)
        if job.dst in self.created_dirs:
            fd = self._open_made(job.dst)
            if fd is None:
                return  # no longer anywhere this copy can find it
            try:
                self._give_meta(fd, job)
            finally:
                os.close(fd)
        elif self.preserve and not self._foreign_link(job.dst):
            self._give_meta(job.dst, job)

    def _give_meta(self, where: "str | int", job: _Job) -> None:
        """Directory ``where`` (a path, or a descriptor) given the mode of
        ``job``'s source, and with --preserve its owner and times."""
        if self.preserve:
            mode = give_owner(where, job.st.st_uid, job.st.st_gid, stat.S_IMODE(job.st.st_mode))
            os.chmod(where, mode)
            os.utime(where, ns=(job.st.st_atime_ns, job.st.st_mtime_ns))
        else:
            # As cp without -p: the permission bits, less the umask, and the
            # sticky bit (a shared directory's restricted deletion); no set-ID
            # bit of the source's, but the set-group-ID bit the directory took
            # from its parent when made (its files keep taking the group).
            inherited = os.stat(where).st_mode & stat.S_ISGID
            os.chmod(where, (stat.S_IMODE(job.st.st_mode) & 0o1777 & ~self.umask) | inherited)

    def _link(self, job: _Job, record: _Record) -> None:
        if _core.is_temporary_name(os.path.basename(job.dst)):
            # As the engine refuses such a name for a file: the next run into
            # the directory would remove the link as a dead run's.
            raise Failure(f"will not write '{job.dst}': its name is that of a gdscp temporary file, which the "
                          "next run into its directory would remove as a dead run's")
        if os.path.lexists(job.dst):
            if self.no_clobber:
                record.status = "skipped"
                self.out.note(f"not replacing '{job.dst}' (it exists; --no-clobber)")
                return
            if _leads_to(job.src, job.dst):
                # As cp: the link put over the file it leads to would lead to
                # itself, and the file's bytes be gone.
                raise Failure(f"'{job.src}' and '{job.dst}' are the same file")
            if os.path.isdir(job.dst) and not os.path.islink(job.dst):
                raise Failure(f"cannot overwrite directory '{job.dst}' with a symbolic link")
        target = os.readlink(job.src)
        # The errors below name DST, not the temporary link (a name the user
        # never gave, gone by the time it is read): a directory that takes no
        # new name (procfs, sysfs) refuses it, not DST.
        try:
            tmp = make_temp_link(target, job.dst)
        except OSError as exc:
            raise Failure(f"cannot create symbolic link '{job.dst}': no temporary link can be made beside it, to "
                          f"be renamed over it ({exc.strerror})") from None
        try:
            if self.preserve:
                give_owner(tmp, job.st.st_uid, job.st.st_gid, 0, follow_symlinks=False)
                os.utime(tmp, ns=(job.st.st_atime_ns, job.st.st_mtime_ns), follow_symlinks=False)
            commit(tmp, job.dst)
            self.link_dirs.add(os.path.dirname(os.path.abspath(job.dst)))
        except OSError as exc:
            reason = exc.strerror
            if isinstance(exc, DirectoryMoved) or moved(tmp, job.dst):
                reason = (f"the destination directory '{os.path.dirname(job.dst) or '.'}' was moved or removed "
                          "during the copy")
            discard(tmp)
            raise Failure(f"cannot create symbolic link '{job.dst}': {reason}") from None
        except BaseException:
            discard(tmp)
            raise


def _stopped(job: BulkJob) -> list[FileResult]:
    """The results of ``job``, cancelled (and waited for) first, through any
    further interrupt meanwhile (the exception on its way is the one
    reported)."""
    got: list[FileResult] = []

    def results() -> None:
        job.cancel()
        got[:] = job.results()

    through_interrupts(results)
    return got


def _leads_to(link: str, path: str) -> bool:
    """Whether symbolic link ``link`` leads to ``path``, which is no link."""
    try:
        return not os.path.islink(path) and os.path.samestat(os.stat(link), os.lstat(path))
    except OSError:  # a dangling link, or a loop
        return False


def _clean(dst: str) -> int:
    """Remove dead runs' temporary files in ``dst`` (a directory, and everything
    below it, however deep: the folders to clean are a list, not calls)."""
    removed = 0
    folders = [dst]
    while folders:
        folder = folders.pop()
        removed += clean_temporaries(folder)
        try:
            with os.scandir(folder) as entries:
                folders += [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        except OSError:
            pass  # as os.walk: a folder that cannot be read is passed over
    return removed


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
        bool,
        typer.Option(
            "--preserve",
            "-p",
            help="Keep mode and access/modification times (and the owner, where permitted). A device or FIFO "
            "written in place keeps its own, with a warning; through a descriptor of this process (/dev/stdout, "
            "/dev/fd/N) only a regular file that holds the copy alone gets them, and a terminal, pipe, device or "
            "file the copy was added to keeps its own, with a warning.",
        ),
    ] = False,
    verify: Annotated[
        bool,
        typer.Option("--verify", help="Compare each copy with its source (read from storage) before it replaces DST."),
    ] = False,
    fail_fast: Annotated[
        bool, typer.Option("--fail-fast", help="Stop at the first file that fails (the others are not copied).")
    ] = False,
    clean: Annotated[
        bool,
        typer.Option(
            "--clean",
            help="First remove the temporary files that killed runs left anywhere in DST (each directory "
            "copied into is cleaned anyway).",
        ),
    ] = False,
    device: options.CopyDevice = None,
    devices: options.Devices = None,
    host: options.CopyHost = False,
    chunk_size: options.ChunkSize = None,
    threads: options.Threads = None,
    task_size: options.TaskSize = None,
    compat_mode: options.CompatModeOpt = None,
    json: options.Json = False,
    quiet: options.Quiet = False,
    debug: options.Debug = False,
) -> None:
    """Copy SRC to DST, or SRCs into the directory DST; through GPU memory with --device or --devices.

    cp's semantics: file to file, files into a directory, -r for trees (empty
    files and directories included). With -r a symbolic link, named as SRC or
    met inside a tree, is copied as a link (pointing where it points, even
    nowhere), never followed; name LINK/ to copy the directory it points at.
    With -r a FIFO or device is not copied (cp -r would make it anew).
    Without -r, SRC is followed to the file it names. By default no GPU is
    used: regular files are copied inside the kernel, as cp copies them, and
    other files (devices, FIFOs) through host memory. --device N moves every
    file through that GPU's memory (storage -> GPU -> storage, with cuFile
    where GPUDirect Storage works). Many files move at once, each worker
    taking whole small files; large files are split among the workers, in
    chunks of at most the buffer size. Each file goes to a temporary file
    beside DST and is renamed into place only when complete and durable, so a
    failed or interrupted copy never leaves a partial file or spoils an
    existing DST. A failed file does not stop the others (unless --fail-fast).
    Exit code 0 only if every file was copied (or skipped by -n).

    Example: gdscp copy -r --verify /data/checkpoints /mnt/nvme/
    """
    out = Output("copy", json=json, quiet=quiet, debug=debug)
    with out.guard(), options.settings(threads, task_size, compat_mode):
        srcs, dst = options.sources_and_destination(paths)
        out.writes_data_to([dst])
        copier = _Copier(
            out, recursive=recursive, no_clobber=no_clobber, preserve=preserve, verify=verify, fail_fast=fail_fast
        )
        # One SRC into a descriptor of this process (/dev/stdout, /dev/fd/N)
        # goes through it, front to back (see gdscp.cli.special); with -n it
        # is there already, and kept.
        descriptor = own_descriptor(dst) if len(srcs) == 1 and not no_clobber else None
        world = ranks.join(out, threads)
        if world is not None:  # one rank of an MPI job: the job is shared among the ranks
            through = f"'{dst}' is a descriptor of this process: under MPI only regular files are written"
            ranks.refuse_options(world, out, {"--devices": devices is not None},
                                 through if descriptor is not None else None)
            with ranks.protocol(world):
                ranks.copy(world, out, copier, srcs, dst, host=host, device=device, chunk_size=chunk_size,
                            clean=clean, report=report)
            return
        jobs = copier.plan(srcs, dst)
        if descriptor is not None:
            jobs = _through_descriptor(copier, jobs, dst)

        def so_far(message: str) -> dict[str, Any]:
            """Once the copy has started, what ends it part-way (Ctrl-C,
            SIGTERM, a failure of the command) lists every file all the
            same, each with its outcome."""
            return summary(out, copier.unfinished(jobs, message), copier.device, verify,
                           time.perf_counter() - start, spread=copier.devices,
                           device_bytes=copier.device_bytes if copier.devices else None)

        if copier.stopped(jobs):
            report(out, copier.records, None if host else device, verify, 0.0)
            return
        files = [j for j in jobs if j.kind == "file"]
        total = sum(j.st.st_size for j in files)
        spread = options.choose_devices(host, device, devices)
        if descriptor is not None and [j.kind for j in jobs] == ["file"]:
            where = spread[0] if spread else options.copy_memory(out, host, device)
            copier.device, start = where, time.perf_counter()
            out.so_far(so_far)
            seconds = _copy_through(out, copier, files[0], descriptor, where, chunk_size, verify)
            report(out, copier.records, where, verify, seconds)
            return
        copier.devices = spread
        if files:
            where = options.copy_memory(out, host, device) if spread is None else spread[0]
            # Devices and FIFOs have no size to go by; where a regular file's says
            # too little (procfs files say 0), its chunks are only smaller.
            largest = None if any(not stat.S_ISREG(j.st.st_mode) for j in files) else max(j.st.st_size for j in files)
            copier.staging_size = options.staging_size(chunk_size, len(spread) if spread else 1, largest)
            options.check_staging(copier.staging_size, spread or ([] if where is None else [where]))
        else:
            where = None if host else device  # nothing to move through memory
            if where is not None:
                from .. import _gpus  # noqa: PLC0415 - only to check the GPU asked for

                _gpus.check_device(where)
        copier.device = where
        if preserve:
            for j in files:  # a device or FIFO is written in place (see _kept_in_place)
                try:
                    there = writes_in_place(j.dst)
                except Failure:
                    continue  # the copy itself reports a destination it cannot stat
                if there is not None:
                    _kept_in_place(out, j, there)
        if clean and os.path.isdir(dst):
            removed = _clean(dst)
            if removed:
                out.note(f"removed {removed} temporary file{'s' if removed != 1 else ''} of earlier runs")
        start = time.perf_counter()
        out.so_far(so_far)
        with TransferProgress(out, total, len(files), "copy", enabled=out.show_progress) as progress:
            copier.run(jobs, progress)
        seconds = time.perf_counter() - start

        report(out, copier.records, where, verify, seconds, spread=spread,
               device_bytes=copier.device_bytes if spread else None)


def _through_descriptor(copier: _Copier, jobs: list[_Job], dst: str) -> list[_Job]:
    """``jobs`` for a DST that names a descriptor of this process, less a
    symbolic link (-r copies one as a link): put in place by a rename, it
    would replace the name DST, the descriptor's own (/dev/stdout, when this
    process may write /dev) or a link of the caller's to it, and nothing
    would go through the descriptor. Refused, as a file that cannot go
    through one is."""
    kept = []
    for job in jobs:
        if job.kind == "link" and job.dst == dst:
            copier.problem(f"cannot overwrite '{dst}' with symbolic link '{job.src}': '{dst}' names a descriptor of "
                           "this process, written through, never replaced (without -r, the file the link leads to "
                           "goes through it)", job.src, dst)
        else:
            kept.append(job)
    return kept


def _copy_through(out: Output, copier: _Copier, job: _Job, descriptor: int, where: Optional[int],
                  chunk_size: Optional[int], verify: bool) -> float:
    """``job``'s source written through ``descriptor`` of this process (its
    DST), front to back from where it stands, as ``cat SRC >> FILE`` writes:
    what it refers to is the caller's, never replaced. Through GPU ``where``'s
    memory where one is asked for (gdscp.cli.special.copy_through says the
    rest). The seconds it took."""
    # Pending (in copier.pending) until it ends; what went through the
    # descriptor stays there, also where the copy stops part-way.
    record = _Record(job.src, job.dst, read_backend="posix", write_backend="posix")
    copier.pending.append(record)
    copier.records.append(record)
    from .. import memory  # noqa: PLC0415  (numpy: only this route of copy needs it)

    # No larger than a regular source (a page at least: procfs files say 0):
    # "--chunk-size 1T" for a small file would otherwise allocate all of it,
    # as the bulk path's staging never does (options.staging_size).
    size = chunk_size or _THROUGH_CHUNK
    if stat.S_ISREG(job.st.st_mode):
        size = min(size, max(job.st.st_size, options.MIN_CHUNK_SIZE))
    buffer = memory.allocate(size, where)
    with TransferProgress(out, job.st.st_size, 1, "copy", enabled=out.show_progress) as progress:
        start = time.perf_counter()
        try:
            with SequentialWriter(job.dst, descriptor) as writer:
                record.bytes = copy_through(job.src, writer, buffer, progress, verify)
                if copier.preserve:
                    _preserve_through(out, job, writer.fileno(), record.bytes)
        except Failure as exc:
            record.status, record.error, record.bytes = "failed", str(exc), progress.bytes_done
            out.error(record.error)
        except BaseException:
            record.bytes = progress.bytes_done  # the record is cancelled by copier.unfinished
            raise
        finally:
            record.seconds = time.perf_counter() - start
        copier.pending.remove(record)
        progress.file_done()
    return record.seconds


def _preserve_through(out: Output, job: _Job, fd: int, nbytes: int) -> None:
    """--preserve through descriptor ``fd`` (``job``'s DST), once its
    ``nbytes`` are in and durable: a regular file that holds the copy alone
    (``> FILE``, or an empty file appended to) is the copy, and gets the
    source's owner (where this process may give it), mode and times as cp -p
    gives them. Anything else is not the copy's to change: a terminal, pipe
    or device (its mode decides who may write to it), a file the bytes were
    added to (its times say when that was). It keeps its own, with a
    warning."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        _kept_in_place(out, job, st)
        return
    if st.st_size != nbytes:
        out.warn(f"--preserve: '{job.dst}' keeps its own mode and times: the file holds more than the copy of "
                 f"'{job.src}' (it was written from offset {os.lseek(fd, 0, os.SEEK_CUR) - nbytes})")
        return
    try:
        mode = give_owner(fd, job.st.st_uid, job.st.st_gid, stat.S_IMODE(job.st.st_mode))
        os.chmod(fd, mode)
        os.utime(fd, ns=(job.st.st_atime_ns, job.st.st_mtime_ns))
        os.fsync(fd)
    except OSError as exc:
        raise Failure(f"cannot give '{job.dst}' the mode and times of '{job.src}': {exc.strerror}") from None


def _kept_in_place(out: Output, job: _Job, st: os.stat_result) -> None:
    """--preserve's warning for ``job``'s DST, written in place (``st``):
    a pipe, terminal or device is no copy of the source, and keeps its mode
    (which decides who may write to it) and times."""
    kind = ("a pipe or FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a terminal or character device" if stat.S_ISCHR(st.st_mode) else "a device")
    out.warn(f"--preserve: '{job.dst}' keeps its own mode and times: it is {kind}, not a copy of '{job.src}'")


def summary(out: Output, records: list[_Record], where: Optional[int], verify: bool, seconds: float,
            extra: Optional[dict[str, Any]] = None, *, spread: Optional[list[int]] = None,
            device_bytes: Optional[dict[int, int]] = None) -> dict[str, Any]:
    """The JSON document of a copy: its counts, and each file's record.
    ``spread``: the GPUs a job spread over, and ``device_bytes`` each one's share."""
    copied = [r for r in records if r.status == "copied"]
    skipped = [r for r in records if r.status == "skipped"]
    failed = [r for r in records if r.status in ("failed", "cancelled")]
    nbytes = sum(r.bytes for r in records)  # what the copy left at the destinations
    return {
        "command": "copy",
        "ok": not failed,
        "memory": "host" if where is None else "gpu",
        "device": where,
        "devices": spread,
        "device_bytes": {str(d): n for d, n in device_bytes.items()} if device_bytes else None,
        "copied": len(copied),
        "skipped": len(skipped),
        "failed": len(failed),
        "bytes": nbytes,
        "seconds": seconds,
        "gb_per_s": gb_per_s(nbytes, seconds),
        "verified": verify and not failed,  # every copy made was read back and matched
        # Per file only where it is printed: thousands of records cost time.
        "files": [r.as_dict() for r in records] if out.json else [],
        **(extra or {}),
    }


def report(out: Output, records: list[_Record], where: Optional[int], verify: bool, seconds: float,
           extra: Optional[dict[str, Any]] = None, *, spread: Optional[list[int]] = None,
           device_bytes: Optional[dict[int, int]] = None) -> None:
    """The summary (a table, or the JSON document); exit code 1 if any file failed."""
    data = summary(out, records, where, verify, seconds, extra, spread=spread, device_bytes=device_bytes)
    nbytes = data["bytes"]

    def render() -> Table:
        on_ranks = f" on each of {data['ranks']} ranks" if data.get("ranks") else ""
        if spread is not None:
            how = f"through {options.devices_name(spread)}"
        elif where is not None:
            how = f"through {options.memory_name(where)}"
        else:  # regular files inside the kernel, the rest through host memory
            how = "without a GPU"
        from rich.table import Table  # noqa: PLC0415 - only for a table shown

        table = Table(title=f"copy {how}{on_ranks}", title_justify="left")
        for name in ("copied", "skipped", "failed", "bytes", "time", "rate"):
            table.add_column(name, justify="right")
        table.add_row(str(data["copied"]), str(data["skipped"]), str(data["failed"]), format_bytes(nbytes),
                      format_seconds(seconds), format_rate(nbytes, seconds))
        if verify and not data["failed"]:
            table.caption = "every copy was compared with its source"
        elif verify:
            table.caption = f"the copies made were compared with their sources; {data['failed']} failed"
        return table

    out.result(data, render)
    if data["failed"]:
        raise typer.Exit(EXIT_FAILURE)
