"""``copy``, ``read`` and ``write`` as one job over the ranks of an MPI launch
(``mpiexec -n N gdscp ...``, ``srun gdscp ...``; gdscp.mpi).

Every rank runs the same phases and the ranks agree after each one
(``World.agree``), so a rank that fails or is interrupted never leaves the
others waiting: the job fails (or ends as interrupted) everywhere, and every
rank exits with the job's code. Rank 0 walks the sources, makes the
directories and links, and creates one locked temporary file for each file
that is shared among ranks; the files and large files' chunks are shared by
bytes (gdscp.mpi.split). Each rank copies its whole files as a single process
does (temporary file, durable, renamed) and writes its ranges of the shared
files in place, each range fsynced. Only once every rank has reported its
ranges durable does rank 0 give a shared file its mode and times and rename it
into place; a failure or an interruption anywhere removes it instead. Rank 0
prints the one summary (``--json``: the one document) and every failure with
the rank and path where it happened; the progress bar on stderr is rank 0's
own share. For ``read`` and ``write`` each rank uses its node-local GPU
unless ``--device`` or ``--host`` says otherwise; ``copy`` uses a GPU only
where ``--device`` names one, as in a single process.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import stat
import sys
import threading
import time
from typing import Any, Iterator, Optional

import typer

from .. import _core, mpi
from ..bulk import clean_temporaries, copy_files, stop_running_jobs, stream_files
from ..mpi.split import split_by_bytes
from ..mpi.comm import Alarm, Status, Unavailable, World, job_code, said, spans, worst
from . import options
from .atomic import (DirectoryMoved, commit, discard, fsync_dir, give_owner, keep_owner, link_into_place, make_temp,
                     moved, remove_pending)
from .exits import EXIT_USAGE
from .output import Failure, Output, Terminated, UsageError, describe
from .progress import TransferProgress

__all__ = ["join", "copy", "fail_before_joining", "read", "choose_memory", "run", "phase", "conclude", "protocol", "launched"]


class _Signals:
    """A rank's Ctrl-C, SIGTERM and SIGHUP from the moment it joins its job.
    Each is noted at once (the rank's code becomes 130, or 143 for the other
    two) and raised only inside a phase's own work (``_run``), where it stops
    that work as in a process on its own (a bulk job cancels, its temporary
    files go). Anywhere else (joining, waiting for the others, between
    phases, putting files in place) it waits for the next agreement, which
    carries it to every rank: a rank never leaves the protocol on a signal
    while the others wait for it in an agreement."""

    def __init__(self) -> None:
        self.code = 0
        self.armed = False
        self.world: Optional[World] = None
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python runs handlers in the main thread only
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                self.previous[sig] = signal.signal(sig, self._handler)

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handler(self, signum: int, frame: object) -> None:
        code = 130 if signum == signal.SIGINT else 143
        self.code = self.code or code
        if self.world is not None:
            self.world.note_signal(code)
        if self.armed:
            # A SIGHUP ends the job as SIGTERM does, on any rank (docs/cluster.md).
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signal.SIGTERM)

    def interrupt(self) -> BaseException:
        """The exception of the first signal noted."""
        return KeyboardInterrupt() if self.code == 130 else Terminated(signal.SIGTERM)


_signals = _Signals()
_LOOK = 0.05  # seconds between a waiting rank's looks at its alarm


def join(out: Output, threads: Optional[int] = None) -> Optional[World]:
    """The world of this job, or None for a process on its own. Ranks other
    than 0 print nothing but what cannot wait for rank 0 (their Output goes
    quiet). Without ``--threads`` or GDSCP_NUM_THREADS, the ranks of a node
    share its cores: each gets its share of the default worker count (at least 2).
    From here on a rank's signals go through the protocol (``_Signals``)."""
    if mpi.launched() is not None:
        _signals.install()
    try:
        world = mpi.world()
    except Unavailable as exc:
        _signals.uninstall()
        if _signals.code:
            raise _signals.interrupt() from None
        raise UsageError(str(exc)) from None
    except BaseException:
        _signals.uninstall()
        raise
    if world is None:
        _signals.uninstall()
        if _signals.code:
            raise _signals.interrupt()
        return None
    _signals.world = world
    world.interrupted = _signals.code
    if not world.root:
        out.quiet = True
        out.json = False
    _same_command_line(world, out)
    local = world.launch.local_size or 1
    if threads is None and local > 1 and not os.environ.get("GDSCP_NUM_THREADS"):
        from .. import defaults  # noqa: PLC0415

        defaults.set("num_threads", max(2, -(-(os.cpu_count() or 1) // local)))
    if world.root:
        warn_if_bound_tightly(out)
    return world


def meet(args: list[str]) -> Optional[int]:
    """A command line that does not run as one job (help, the version,
    ``info``) under a launch of several ranks: the rank meets the others all
    the same and they compare their command lines (``_same_command_line``),
    so that a rank given ``--help`` among ranks given a copy does not leave
    them waiting for it in MPI's start for ever. Where every rank was given
    the same, None: each goes on as a process on its own; else the usage
    error's code (2), said once by rank 0. None too where MPI cannot be used
    here (the rank then runs on its own, as it did)."""
    from .exits import COMMANDS  # noqa: PLC0415

    try:
        world = mpi.world()
    except Unavailable:
        return None
    if world is None:
        return None
    out = Output(args[0] if args and args[0] in COMMANDS else "", quiet=not world.root)
    try:
        _same_command_line(world, out, where=False)  # no path is opened: any directory will do
    except typer.Exit as exc:
        return int(exc.exit_code)
    return None


def _same_command_line(world: World, out: Output, where: bool = True) -> None:
    """The job's first agreement: every rank brings a digest of its command
    line, and where one differs from rank 0's every rank ends with a usage
    error (exit 2), said once by rank 0. Rank 0 plans the job from its own
    command line alone: a rank given another command would wait in
    agreements the others never reach, and one given other options (another
    --size, --seed or --verify) would do its share of another job. With
    ``where``, the ranks' working directories too: rank 0 sends the paths
    as they were typed, and a relative one names another file in another
    directory (the directory as os.getcwd() spells it, so the same
    directory mounted under another name on some node counts as another).
    A rank that failed before joining arrives here with its failure."""
    from .app import Running  # noqa: PLC0415

    args = Running.args or sys.argv[1:]
    mine = (args[0] if args else "", hashlib.sha256("\0".join(args).encode()).hexdigest(),
            _working_directory() if where else None)
    statuses = world.agree(0, data=mine)
    _settle(world, out, statuses)
    others = [s.rank for s in statuses if s.data[:2] != statuses[0].data[:2]]
    if others:
        command = statuses[0].data[0]
        differ = [statuses[r].data[0] for r in others if statuses[r].data[0] != command]
        what = f" ('gdscp {differ[0]}', rank 0 'gdscp {command}')" if differ and len(others) == 1 else ""
        message = (f"{_ranks_were(others)} given another command line than rank 0{what}: every rank of a job must "
                   "be given the same one (rank 0 plans the job from its own)")
    else:
        here = statuses[0].data[2]
        others = [s.rank for s in statuses if s.data[2] != here]
        if not others:
            return
        theirs = sorted({statuses[r].data[2] for r in others})
        message = (f"{_ranks_were(others)} started in another working directory than rank 0 "
                   f"({', '.join(map(repr, theirs))}, rank 0 {here!r}): every rank of a job must start in the same "
                   "one, where the paths it was given are (rank 0 plans the job from its own; mpiexec -wdir, srun "
                   "--chdir)")
    _end(world, out, [Status(s.rank, EXIT_USAGE, [message], None) for s in statuses], EXIT_USAGE)
    raise typer.Exit(EXIT_USAGE)


def _ranks_were(ranks: list[int]) -> str:
    """"rank 2 was" or "ranks 1-3 were"."""
    return f"ranks {spans(ranks)} were" if len(ranks) > 1 else f"rank {spans(ranks)} was"


def _working_directory() -> str:
    """This rank's working directory as os.getcwd() spells it ('' where it was removed)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def warn_if_bound_tightly(out: Output) -> None:
    """A warning when the launcher bound this rank to far fewer CPUs than it
    has workers (Open MPI binds each rank to one core when there are at most
    two): the workers would take turns on those CPUs, a fraction of the speed."""
    if not hasattr(os, "sched_getaffinity"):
        return
    from .. import defaults  # noqa: PLC0415

    cpus = len(os.sched_getaffinity(0))
    workers = int(defaults.get("num_threads"))
    if 2 * cpus <= min(workers, os.cpu_count() or 1):
        out.warn(f"this rank may run on {cpus} CPU{'s' if cpus != 1 else ''} only (the launcher's binding), "
                 f"shared by its {workers} workers: start the ranks unbound (Open MPI: --bind-to none) or with "
                 "a NUMA node each (--bind-to numa)")


def launched() -> bool:
    """Whether a launcher started this process as one rank of several."""
    return mpi.launched() is not None


def choose_memory(out: Output, host: bool, device: Optional[int]) -> Optional[int]:
    """This rank's memory: ``--host`` or ``--device`` as given, else its
    node-local GPU (local rank modulo the GPUs it sees), else host memory."""
    if host or device is not None:
        return options.choose_memory(out, host, device)
    from .. import _gpus  # noqa: PLC0415

    if not _gpus.gpu_available():
        return options.choose_memory(out, host, device)  # host memory, with its warning (or compat mode's error)
    return options.choose_memory(out, False, mpi.node_device(_gpus.device_count()))


def _run(world: World, step, *args: Any, interruptible: bool = True) -> tuple[int, list[str], Any]:
    """``step(*args)`` on this rank: (exit code, messages, its result). A
    signal stops an ``interruptible`` step (one already noted: it does not
    start); the others (putting files in place, or removing them, and the
    report) run to their end, the signal noted for the next agreement."""
    if interruptible and world.interrupted:
        return world.interrupted, [], None
    try:
        _signals.armed = interruptible
        try:
            return 0, [], step(*args)
        finally:
            _signals.armed = False
    except typer.Exit as exc:
        return int(exc.exit_code), [], None
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the agreement
        if isinstance(exc, (SystemExit, GeneratorExit)):
            raise
        stop_running_jobs()  # one the step started and did not get to wait on
        message, code = describe(exc)
        if code in (130, 143):
            message = ""
        return code, [f"rank {world.rank}: {message}"] if message else [], None


def refuse_options(world: World, out: Output, given: dict[str, bool], problem: Optional[str] = None) -> None:
    """A usage error (exit 2) for options that work in one process only, or
    for ``problem``, found once the ranks have joined. The ranks agree on it,
    so that rank 0 says it once (as one process would, where every rank found
    it) and no rank leaves while others wait for it (a rank whose node sees a
    path otherwise than rank 0's)."""
    names = [name for name, on in given.items() if on]
    if names:
        problem = (f"{' and '.join(names)} work in one process; under MPI each rank uses the GPU of its node "
                   "that --device names (or its node-local one)")

    def check() -> None:
        if problem:
            raise UsageError(problem)

    phase(world, out, check)


@contextlib.contextmanager
def protocol(world: World) -> Iterator[None]:
    """Around a command's phases: an exception that escapes them (a bug, or a
    signal between two phases) would leave the other ranks waiting in an
    agreement this rank never reaches, so it ends the whole job (MPI_Abort)."""
    try:
        yield
    except (typer.Exit, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the last resort
        message, code = describe(exc)
        sys.stderr.write(f"gdscp: error: rank {world.rank}: {message}; ending the job (MPI_Abort)\n")
        sys.stderr.flush()
        remove_pending()
        world.abort(code)
        raise


def run(world: World, step: Any, *args: Any) -> tuple[int, list[str], Any]:
    """``step(*args)`` on this rank: (exit code, messages for rank 0, its result)."""
    return _run(world, step, *args)


def phase(world: World, out: Output, step: Any) -> Any:
    """``step()`` on every rank, then the agreement: its result here, or, where
    any rank failed, the end of the command on every rank with the job's code."""
    code, messages, got = _run(world, step)
    _settle(world, out, world.agree(code, messages))
    return got


def conclude(world: World, out: Output, step: Any, everyone: list[Status]) -> None:
    """The last phase: rank 0 prints what the ranks reported and runs
    ``step(ok)`` (ok: every rank did its share), then every rank leaves with
    the job's code."""
    code, messages = 0, []
    if world.root:
        for message in said(everyone):
            out.error(message)
        before = job_code(everyone)
        code, messages, _ = _run(world, step, before == 0, interruptible=False)
        code = worst(code, before)
    _finish(world, out, code, messages)


def _settle(world: World, out: Output, statuses: list[Status]) -> None:
    """After an agreement: stop everywhere, with the job's code, if any rank failed
    the phase (rank 0 says what went wrong where)."""
    code = job_code(statuses)
    if code == 0:
        return
    _end(world, out, statuses, code)
    raise typer.Exit(code)


def _end(world: World, out: Output, statuses: list[Status], code: int, hint: str = "") -> None:
    """A failed job's last words: rank 0 says them, and no rank leaves before
    it has (a launcher may end the whole job as soon as one rank exits with
    a failure, Open MPI's does, and rank 0 with its document unwritten)."""
    if world.root:
        _say(out, statuses, code, hint)
    world.barrier()


def fail_before_joining(out: Output, code: int, message: str, hint: str = "") -> Optional[int]:
    """A failure of a rank before it joined its job (every rank checks its own
    command line first, and an argument Typer refuses fails before the
    command runs): the rank joins all the same and the ranks agree, so that
    rank 0 speaks for the job, one line per rank that failed and, with
    --json, the one document, and no rank ends the job before rank 0 has
    spoken. An interrupted rank joins too, bringing its code alone (a rank
    that left at once would leave the others waiting for it in MPI's start,
    for ever). The job's exit code; None where this process is not a rank of
    such a job, has joined already, or cannot join (it then speaks for
    itself). ``hint`` ends rank 0's last line on stderr for a usage error
    (where to read more), as it ends a process's own."""
    from .app import JOINING  # noqa: PLC0415

    if out.command not in JOINING or mpi.launched() is None or mpi.connected():
        return None
    if code == 128 + signal.SIGHUP:  # a rank's SIGHUP ends the job as SIGTERM does (docs/cluster.md)
        code = 128 + signal.SIGTERM
    try:
        world = mpi.world()
    except Exception:  # noqa: BLE001 - MPI unusable here: each rank says its own failure
        return None
    if world is None:
        return None
    if not world.root:
        out.quiet = True
        out.json = False
    statuses = world.agree(code, [] if code in (130, 143) else [f"rank {world.rank}: {message}"])
    final = job_code(statuses)
    _end(world, out, statuses, final, hint if final == EXIT_USAGE else "")
    return final


def _say(out: Output, statuses: list[Status], code: int, hint: str = "") -> None:
    """Rank 0: every rank's messages, ``hint`` ending the last, then how the
    job ended (with --json, as its document)."""
    messages = said(statuses)
    for i, message in enumerate(messages):
        out.error(message + (hint if i == len(messages) - 1 else ""))
    if code in (130, 143):
        stop = KeyboardInterrupt() if code == 130 else Terminated()  # 143: a rank's SIGHUP counts as SIGTERM
        out.fail(stop)
    elif code and out.json and not out.result_written:
        out.result({"command": out.command, "ok": False, "error": messages[0] if messages else "failed",
                    "exit_code": code})


def _finish(world: World, out: Output, code: int, messages: list[str]) -> None:
    """The last agreement: every rank leaves with the job's code."""
    statuses = world.agree(code, messages)
    final = job_code(statuses)
    if final:
        _end(world, out, statuses, final)
        raise typer.Exit(final)
    if world.root:
        _say(out, statuses, final)


# -- copy ------------------------------------------------------------------------------


def _shared_destination(copier: Any, job: Any) -> tuple[Optional[str], int, Optional[str]]:
    """For a file that several ranks write: (the path it lands at, its final
    mode, why it cannot be shared, or None). Mirrors the engine's checks."""
    dst = job.dst
    try:
        st = os.stat(dst)
    except FileNotFoundError:
        st = None
    if os.path.islink(dst):
        if st is None:  # as one process and GNU cp: not through a link that points at nothing
            return None, 0, f"not writing through dangling symbolic link '{dst}'"
        dst = os.path.realpath(dst)
    src = job.st
    mode = stat.S_IMODE(src.st_mode) if copier.preserve else stat.S_IMODE(src.st_mode) & 0o777 & ~copier.umask
    if st is None:
        return dst, mode, None
    if stat.S_ISDIR(st.st_mode):
        return None, 0, f"cannot overwrite directory '{dst}' with non-directory '{job.src}'"
    if copier.no_clobber:
        return dst, mode, None  # kept, as the engine keeps it (even the source itself)
    if (st.st_dev, st.st_ino) == (src.st_dev, src.st_ino):
        return None, 0, f"'{job.src}' and '{job.dst}' are the same file"
    if not stat.S_ISREG(st.st_mode):
        return None, 0, ""  # a device or FIFO: one rank writes it front to back
    if not copier.preserve:
        mode = stat.S_IMODE(st.st_mode)
    return dst, mode, None


def _copy_plan(world: World, copier: Any, jobs: list[Any]) -> dict[str, Any]:
    """Rank 0: make the directories and links of ``jobs`` (its walk), share the files out, create the shared
    temporary files."""
    try:
        return _share_out(world, copier, jobs)
    except BaseException:
        # Stopped short (an interrupt, a failure): as a process on its own, no
        # directory made is left at the mode it was made with.
        copier.finish(jobs)
        raise


def _largest(jobs: list[Any]) -> Optional[int]:
    """The most bytes one chunk of the files of ``jobs`` need hold (see
    options.staging_size): their largest size; None where a device or FIFO,
    which has no size to go by, is among them."""
    files = [j for j in jobs if j.kind == "file"]
    if any(not stat.S_ISREG(j.st.st_mode) for j in files):
        return None
    return max((j.st.st_size for j in files), default=0)


def _share_out(world: World, copier: Any, jobs: list[Any]) -> dict[str, Any]:
    """Rank 0's plan of ``jobs``: the directories and links made, the files shared out."""
    files, after = copier.prepare(jobs)
    # Dead runs' temporary files in the directories written into go first, as
    # a process on its own removes them: here, before any rank of this job has
    # made one (the ranks' own jobs do not clean, whose locks other nodes may
    # not see). As there, the job's own sources so named stay.
    named_temporary = [j.src for j, _ in files if _core.is_temporary_name(os.path.basename(j.src))]
    for folder in sorted({os.path.dirname(os.path.abspath(j.dst)) for j, _ in files}):
        clean_temporaries(folder, named_temporary)
    shares = split_by_bytes([j.st.st_size for j, _ in files], world.size)
    # The files cut among several ranks: one temporary file each, made here.
    owners: dict[int, list[int]] = {}
    for rank, pieces in enumerate(shares):
        for p in pieces:
            if not p.whole:
                owners.setdefault(p.index, []).append(rank)
    shared: dict[int, dict[str, Any]] = {}
    for index, ranks in owners.items():
        job, record = files[index]
        target, mode, problem = _shared_destination(copier, job)
        if problem == "":  # written front to back by the first of its ranks
            for rank in ranks:
                shares[rank] = [p for p in shares[rank] if p.index != index]
            shares[ranks[0]].append(split_by_bytes([job.st.st_size], 1)[0][0]._replace(index=index))
            continue
        if problem is None and copier.no_clobber and os.path.lexists(job.dst):
            record.status = "skipped"
            copier.out.note(f"not replacing '{job.dst}' (it exists; --no-clobber)")
        elif problem is None:
            try:
                tmp = make_temp(target)
                reserve(tmp, job.st.st_size)
            except OSError as exc:
                problem = f"cannot copy '{job.src}' to '{job.dst}': {describe(exc)[0]}"
            else:
                shared[index] = {"tmp": tmp, "dst": target, "mode": mode, "ranks": ranks}
        if problem:
            record.status, record.error = "failed", problem
            copier.out.error(problem)
        if index not in shared:
            for rank in ranks:
                shares[rank] = [p for p in shares[rank] if p.index != index]
    if copier.fail_fast and any(record.status == "failed" for _, record in files):
        # A file failed before any rank began: --fail-fast copies none of the others.
        from .copy import FAIL_FAST_CANCELLED  # noqa: PLC0415

        for info in shared.values():
            discard(info["tmp"])
        for _, record in files:
            if record.status not in ("failed", "skipped"):
                record.status, record.error = "cancelled", FAIL_FAST_CANCELLED
        shares, shared = [[] for _ in shares], {}
    return {
        # With each file, its size and time as rank 0 found them (_as_found).
        "files": [(j.src, j.dst, *_as_found(j.st)) for j, _ in files],
        "shares": shares,
        "shared": {i: s["tmp"] for i, s in shared.items()},
        # Rank 0's own, kept off the broadcast:
        "_records": files,
        "_after": after,
        "_shared": shared,
    }


def reserve(path: str, size: int) -> None:
    """Give a shared temporary file its size, its blocks allocated where the
    filesystem can (the ranks then write into allocated space: no allocation
    under the file's lock for each of their writes; a full disk fails here),
    else as a sparse file. fallocate(2) itself, not posix_fallocate, which
    where the filesystem cannot allocate writes a byte into every block."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if size and _fallocate(fd, size):
            return
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def _fallocate(fd: int, size: int) -> bool:
    """fallocate(fd, 0, 0, size); False where the filesystem (or libc) cannot."""
    import ctypes  # noqa: PLC0415

    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    while call(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        if err == errno.EINTR:
            continue
        if err in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return False
        raise OSError(err, os.strerror(err))
    return True


def _copy_share(world: World, out: Output, plan: dict[str, Any], where: Optional[int], copier: Any,
                staging_size: Optional[int], alarm: Optional[Alarm]) -> list[tuple]:
    """This rank's share: its whole files and its ranges of shared ones, in one bulk job.
    Returns (file index, whole, status, bytes, seconds, error, read backend, write backend) per piece.
    ``alarm`` (--fail-fast): sounded where a file fails here, and stops this rank's job where it sounds."""
    files, shared = plan["files"], plan["shared"]
    pieces = plan["shares"][world.rank]
    if not pieces:
        return []
    refused = _not_as_rank_0_saw(world, {p.index: (files[p.index][0], *files[p.index][2:]) for p in pieces})
    done = [(p.index, p.whole, "failed", 0, 0.0, refused[p.index], None, None, p.offset)
            for p in pieces if p.index in refused]
    pieces = [p for p in pieces if p.index not in refused]
    if alarm is not None and refused:
        alarm.sound()
    if alarm is not None and alarm.sounded():
        return done + [(p.index, p.whole, "cancelled", 0, 0.0, None, None, None, p.offset) for p in pieces]
    if not pieces:
        return done
    pairs, ranges, sizes = [], [], []
    for p in pieces:
        src, dst, _, _ = files[p.index]
        if p.whole:
            pairs.append((src, dst))
            ranges.append(None)
        else:
            pairs.append((src, shared[p.index]))
            ranges.append((p.offset, p.length))
        sizes.append(p.length)
    _test_fault(world)
    job = copy_files(pairs, device=where, no_clobber=copier.no_clobber, preserve=copier.preserve,
                     verify=copier.verify, fail_fast=copier.fail_fast, staging_size=staging_size, sizes=sizes,
                     ranges=ranges, clean=False)
    total = sum(sizes)
    with TransferProgress(out, total, len(pieces), f"copy (rank 0 of {world.size})",
                          enabled=world.root and out.show_progress) as progress:
        progress.follow(job)
        with job:  # Ctrl-C while waiting cancels the job: its temporary files go
            _test_pause(world)
            results = _results(job, alarm)
    return done + [
        (p.index, p.whole, r.status, r.bytes, r.seconds, r.error, r.read_backend, r.write_backend, p.offset)
        for p, r in zip(pieces, results)
    ]


def _results(job: Any, alarm: Optional[Alarm]) -> list[Any]:
    """The results of this rank's ``job`` once it has ended. With an
    ``alarm`` (--fail-fast): a file failed here sounds it, and its sounding
    anywhere cancels the job, as a failure cancels a process's own job (its
    files not yet in place are not copied)."""
    if alarm is not None:
        cancelled = False
        while not job.wait(_LOOK):
            if job.progress().files_failed:
                alarm.sound()
            elif not cancelled and alarm.sounded():
                job.cancel()
                cancelled = True
        if job.progress().files_failed:
            alarm.sound()
    return job.results()


def _as_found(st: os.stat_result) -> tuple[int, Optional[int]]:
    """A source's size and st_mtime_ns as rank 0 found it, which every other
    rank checks the file it opens against (``_not_as_rank_0_saw``); the
    time None where it is not a regular file (not checked)."""
    return st.st_size, st.st_mtime_ns if stat.S_ISREG(st.st_mode) else None


def _found_at(path: str) -> Optional[tuple[int, Optional[int]]]:
    """``_as_found`` of the file at ``path``; None where it cannot be stat'ed (its read fails)."""
    try:
        return _as_found(os.stat(path))
    except OSError:
        return None


def _not_as_rank_0_saw(world: World, sources: dict[int, tuple[str, int, Optional[int]]]) -> dict[int, str]:
    """The ``sources`` (by index: the path, and ``_as_found`` on rank 0) that
    this rank sees otherwise than rank 0 did, and how: its bytes are not the
    ones rank 0 planned (another file of that name on this node, or one
    changed since), and such a file fails on this rank, nothing of it moved.
    Rank 0 planned from its own."""
    refused = {}
    if not world.root:
        for index, (path, size, mtime) in sorted(sources.items()):
            why = _not_rank_0s(path, size, mtime)
            if why:
                refused[index] = f"rank {world.rank} sees another '{path}' than rank 0 ({why})"
    return refused


def _not_rank_0s(src: str, size: int, mtime: Optional[int]) -> str:
    """How the regular file this rank opens at ``src`` differs from rank 0's
    (its size and st_mtime_ns there; ``mtime`` None: not a regular file, not
    checked): '' where it does not, or where it cannot be opened (the copy
    then fails on it as usual)."""
    if mtime is None:
        return ""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    differ = []
    if st.st_size != size:
        differ.append(f"size {st.st_size}, rank 0's {size}")
    if st.st_mtime_ns != mtime:
        differ.append(f"modified {_when(st.st_mtime_ns)}, rank 0's {_when(mtime)}")
    return "; ".join(differ)


def _when(ns: int) -> str:
    """A file time in nanoseconds, as local time to the nanosecond."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns // 10**9)) + f".{ns % 10**9:09d}"


def _copy_commit(world: World, copier: Any, plan: dict[str, Any], everyone: list[Status], interrupted: bool) -> None:
    """Rank 0: the records of every file, and the shared files put in place
    (mode, times, rename) where every range of them is done, removed otherwise.
    With --fail-fast, a file failed anywhere keeps every shared file from its
    place (none is in place yet), as a failure stops a process's own copy."""
    from .copy import FAIL_FAST_CANCELLED  # noqa: PLC0415

    files, shared = plan["_records"], plan["_shared"]
    for rank, pieces in enumerate(plan["shares"]):
        for p in pieces:
            if p.whole:  # until its rank's result says otherwise
                files[p.index][1].status = "cancelled"
                files[p.index][1].error = f"rank {rank}: not copied (that rank ended early)"
    parts: dict[int, list[tuple]] = {}
    for s in everyone:
        for piece in s.data or []:
            index, whole, status, nbytes, seconds, error, rb, wb, offset = piece
            record = files[index][1]
            if whole:
                record.bytes, record.seconds, record.read_backend, record.write_backend = nbytes, seconds, rb, wb
                record.error = None
                if status == "done":
                    record.status = "copied"
                elif status == "skipped":
                    record.status = "skipped"
                elif status == "failed":
                    record.status = "failed"
                    record.error = f"rank {s.rank}: cannot copy '{record.source}' to '{record.destination}': {error}"
                    copier.out.error(record.error)
                elif copier.fail_fast and status == "cancelled":
                    record.status, record.error = "cancelled", FAIL_FAST_CANCELLED
                else:
                    record.status, record.error = "cancelled", f"rank {s.rank}: not copied ({status})"
            else:
                parts.setdefault(index, []).append((s.rank, status, nbytes, seconds, error, rb, wb, offset))
    stop = copier.fail_fast and (any(r.status == "failed" for r in copier.records)
                                 or any(g[1] == "failed" for got in parts.values() for g in got))
    for index, info in shared.items():
        record = files[index][1]
        got = parts.get(index, [])
        bad = [g for g in got if g[1] != "done"]
        ok = not interrupted and len(got) == len(info["ranks"]) and not bad and not stop
        record.ranks = sorted(g[0] for g in got)
        record.bytes = sum(g[2] for g in got)
        record.seconds = max((g[3] for g in got), default=0.0)
        record.read_backend, record.write_backend = (got[0][5], got[0][6]) if got else (None, None)
        if ok:
            try:
                _put_in_place(copier, info, files[index][0])
                record.status = "copied"
                continue
            except FileExistsError:
                record.status = "skipped"
                copier.out.note(f"not replacing '{record.destination}' (it appeared during the copy; --no-clobber)")
            except (OSError, Failure) as exc:
                record.status = "failed"
                record.error = f"rank 0: cannot copy '{record.source}' to '{record.destination}': {describe(exc)[0]}"
                copier.out.error(record.error)
                stop = copier.fail_fast
        else:
            record.status = "failed" if any(g[1] == "failed" for g in bad) else "cancelled"
            for rank, status, _n, _s, error, _rb, _wb, offset in bad:
                if status == "failed":
                    # The rank's job wrote into the temporary file, and its error
                    # names that file, a name the user never gave, removed below.
                    error = str(error).replace(info["tmp"], record.destination)
                    record.error = (f"rank {rank}: cannot copy '{record.source}' to '{record.destination}' "
                                    f"(its part at offset {offset}): {error}")
                    copier.out.error(record.error)
            if record.error is None:
                record.error = ("not copied: the job was interrupted" if interrupted
                                else FAIL_FAST_CANCELLED if stop else "not copied")
        discard(info["tmp"])
    for _, record in files:
        if record.status != "copied":
            record.bytes = 0  # not put in place: nothing of it left at the destination


def _put_in_place(copier: Any, info: dict[str, Any], job: Any) -> None:
    """A shared file whose every range is durable: its mode and times, then its name."""
    tmp, dst = info["tmp"], info["dst"]
    # What fails is said of DST, as a process on its own says it: the
    # temporary file is a name the user never gave, and is removed.
    doing = "give the copy its mode and times at"
    try:
        mode = info["mode"]
        if copier.preserve:
            mode = give_owner(tmp, job.st.st_uid, job.st.st_gid, mode)
        else:
            keep_owner(tmp, dst)
        os.chmod(tmp, mode)
        if copier.preserve:
            os.utime(tmp, ns=(job.st.st_atime_ns, job.st.st_mtime_ns))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the mode and times
        finally:
            os.close(fd)
        doing = "rename the copy into place at"
        if copier.no_clobber:
            link_into_place(tmp, dst)  # FileExistsError: something took the name meanwhile
        else:
            commit(tmp, dst)
        doing = "fsync the directory of"
        fsync_dir(os.path.dirname(os.path.abspath(dst)))
    except FileExistsError:
        raise
    except OSError as exc:
        if isinstance(exc, DirectoryMoved) or moved(tmp, dst):  # its temporary file is removed, wherever it went
            raise Failure(f"cannot {doing} '{dst}': the destination directory '{os.path.dirname(dst) or '.'}' was "
                          "moved or removed during the copy") from None
        raise Failure(f"cannot {doing} '{dst}': {exc.strerror or exc}") from None


def copy(world: World, out: Output, copier: Any, srcs: list[str], dst: str, *, host: bool, device: Optional[int],
         chunk_size: Optional[int], clean: bool, report: Any) -> None:
    """``gdscp copy`` on every rank of ``world``."""
    # 1. Rank 0 walks.
    def walk() -> Optional[list]:
        if not world.root:
            return None
        if clean and os.path.isdir(dst):
            from .copy import _clean  # noqa: PLC0415

            removed = _clean(dst)
            if removed:
                out.note(f"removed {removed} temporary file{'s' if removed != 1 else ''} of earlier runs")
        jobs = copier.plan(srcs, dst)
        return [] if copier.stopped(jobs) else jobs  # --fail-fast, a source failed: nothing is made

    jobs = phase(world, out, walk)
    staging = options.staging_size(chunk_size, 1, world.bcast(_largest(jobs) if world.root else None))

    # 2. Every rank picks its memory and checks that it can hold its staging,
    # as a process on its own does (the GPU's own refusal, in the middle of
    # the copy, would name only a cuMemAlloc); rank 0 then makes the tree and
    # shares the files out.
    def setup() -> tuple[Optional[int], Optional[dict]]:
        where = options.copy_memory(out, host, device)
        options.check_staging(staging, [] if where is None else [where])
        return where, _copy_plan(world, copier, jobs) if world.root else None

    code, messages, got = _run(world, setup)
    where, plan = got if got else (None, None)
    statuses = world.agree(code, messages)
    if job_code(statuses):
        if world.root and plan:
            for tmp in plan["shared"].values():
                discard(tmp)
            # No directory made is left at the mode it was made with:
            _run(world, copier.finish, plan["_after"], interruptible=False)
        _settle(world, out, statuses)
    public = {k: v for k, v in plan.items() if not k.startswith("_")} if world.root else None
    shared_plan = world.bcast(public)
    if world.root:
        shared_plan = plan
    # The job's time, as docs/cluster.md gives it: from every rank having its
    # plan (rank 0's walk before it, as a process on its own walks before its clock).
    start = time.perf_counter()
    # 3. Every rank copies its share; with --fail-fast, a file failed on any
    # rank stops every rank's (the alarm; it is opened on every rank, the
    # share's work runs or not).
    alarm = world.alarm() if copier.fail_fast else None
    code, messages, pieces = _run(world, _copy_share, world, out, shared_plan, where, copier, staging, alarm)
    everyone = world.agree(code, messages, data=pieces)
    # 4. Rank 0 puts the shared files in place (or removes them), and reports.
    code, messages = 0, []
    if world.root:
        for message in said(everyone):
            out.error(message)
        interrupted = job_code(everyone) in (130, 143)

        def conclude() -> None:
            try:
                _copy_commit(world, copier, plan, everyone, interrupted)
            finally:  # no directory made is left at the mode it was made with, interrupted or not
                copier.finish(plan["_after"])
            # Interrupted or not, what was put in place is durable.
            copier.sync_names(strict=not interrupted)
            if interrupted:
                raise typer.Exit(job_code(everyone))
            extra = {"ranks": world.size}
            report(out, copier.records, where, copier.verify, time.perf_counter() - start, extra)

        code, messages, _ = _run(world, conclude, interruptible=False)
        code = worst(code, job_code(everyone))
    _finish(world, out, code, messages)


# -- read ------------------------------------------------------------------------------


def _read_share(world: World, out: Output, plan: list[Any], found: list[Optional[tuple[int, Optional[int]]]],
                where: Optional[int], verify: bool, staging_size: Optional[int]) -> list[tuple]:
    """This rank's ranges of the files, in one bulk job: (file index, status,
    bytes, seconds, error, errno, backend, reason, offset) per range.
    ``found``: each file as rank 0 found it (``_as_found``; None: not checked)."""
    sized = [i for i, f in enumerate(plan) if not f.stream]
    shares = split_by_bytes([plan[i].length for i in sized], world.size)
    pieces = [(sized[p.index], plan[sized[p.index]].offset + p.offset, p.length) for p in shares[world.rank]]
    streams = [i for i, f in enumerate(plan) if f.stream]
    pieces += [(i, 0, plan[i].length) for k, i in enumerate(streams) if k % world.size == world.rank]
    refused = _not_as_rank_0_saw(world, {i: (plan[i].path, *found[i]) for i, _, _ in pieces if found[i]})
    done = [(i, "failed", 0, 0.0, refused[i], None, None, None, o) for i, o, _ in pieces if i in refused]
    pieces = [piece for piece in pieces if piece[0] not in refused]
    if not pieces:
        return done
    job = stream_files([plan[i].path for i, _, _ in pieces], ranges=[(o, n) for _, o, n in pieces], device=where,
                       verify=verify, staging_size=staging_size)
    total = sum(n or 0 for _, _, n in pieces)
    with TransferProgress(out, total, len(pieces), f"read (rank 0 of {world.size})",
                          enabled=world.root and out.show_progress) as progress:
        progress.follow(job)
        results = job.results()
    return done + [(i, r.status, r.bytes, r.seconds, r.error, r.errno, r.read_backend, r.backend_reason, o)
                   for (i, o, _), r in zip(pieces, results)]


def read(world: World, out: Output, make_plan: Any, *, host: bool, device: Optional[int],
         chunk_size: Optional[int], verify: bool, report: Any, unusable: Optional[list] = None,
         range_offset: int = 0) -> None:
    """``gdscp read`` on every rank of ``world``: each file's range shared by
    bytes. ``unusable``: where rank 0's ``make_plan`` puts the files it cannot
    read, reported as failed files in their places."""
    from ..bulk import FileResult  # noqa: PLC0415

    from .read import put_back, ready_gpus  # noqa: PLC0415

    ready: list[Any] = []

    def setup() -> tuple[Optional[int], Optional[int], Any, float]:
        where = choose_memory(out, host, device)
        begun = time.perf_counter()
        ready.extend(ready_gpus([] if where is None else [where]))  # this rank's GPU context, before the clock
        return where, make_plan() if world.root else None, time.perf_counter() - begun

    code, messages, got = _run(world, setup)
    where, plan, setup_seconds = got if got else (None, None, 0.0)
    _settle(world, out, world.agree(code, messages))
    # With each file, its size and time as rank 0 finds them, which every
    # other rank checks the file it reads against; not for a file read front
    # to back, which has no size to go by.
    plan, found = world.bcast((plan, [None if f.stream else _found_at(f.path) for f in plan]) if world.root else None)
    known = not any(f.length is None for f in plan)
    staging = options.staging_size(chunk_size, 1, max((f.length for f in plan), default=0) if known else None)
    # Every rank's GPU can hold its staging, as a process on its own checks
    # (see copy), before any byte is read.
    phase(world, out, lambda: options.check_staging(staging, [] if where is None else [where]))
    world.barrier()
    start = time.perf_counter()
    code, messages, pieces = _run(world, _read_share, world, out, plan, found, where, verify, staging)
    everyone = world.agree(code, messages, data=pieces)
    seconds = time.perf_counter() - start
    code, messages = 0, []
    if world.root:
        for message in said(everyone):
            out.error(message)
        ranges: dict[int, list[tuple]] = {}
        for s in everyone:
            for piece in s.data or []:
                ranges.setdefault(piece[0], []).append((s.rank, *piece[1:]))

        def conclude() -> None:
            for _, _, why in unusable or []:
                out.error(why)
            results = []
            for i, f in enumerate(plan):
                got = ranges.get(i, [])
                bad = [g for g in got if g[1] != "done"]
                error = None
                for rank, status, _n, _s, err, _code, _b, _r, offset in bad:
                    if status == "failed":
                        error = f"rank {rank}: cannot read '{f.path}' (from offset {offset}): {err}"
                        out.error(error)
                status = "done" if got and not bad else ("failed" if error else "cancelled")
                first = got[0] if got else None
                results.append(FileResult(
                    i, f.path, None, status, sum(g[2] for g in got), max((g[3] for g in got), default=0.0), error,
                    None, first[6] if first else None, None, first[7] if first else None, None))
            if job_code(everyone) in (130, 143):
                raise typer.Exit(job_code(everyone))
            put_back(plan, results, unusable, range_offset)
            report(out, plan, results, where, verify, seconds, {"ranks": world.size, "setup_seconds": setup_seconds})

        code, messages, _ = _run(world, conclude, interruptible=False)
        code = worst(code, job_code(everyone))
    _finish(world, out, code, messages)


# -- test hooks ------------------------------------------------------------------------
# The tests make one rank fail in the middle of its copy, and interrupt a copy
# in flight, through these variables; unset, each is one environment lookup.


def _test_fault(world: World) -> None:
    """GDSCP_MPI_TEST_FAIL=RANK:SKIP: that rank's writes fail with EIO after
    SKIP of them. GDSCP_MPI_TEST_HOLD=RANK: that rank's workers wait at their
    first chunk until its job is cancelled (or a minute)."""
    hook = os.environ.get("GDSCP_MPI_TEST_FAIL")
    if hook:
        rank, skip = (int(v) for v in hook.split(":"))
        if rank == world.rank:
            _core.testing.arm_fault("pwrite", skip, 1 << 30, errno.EIO)
    hold = os.environ.get("GDSCP_MPI_TEST_HOLD")
    if hold and int(hold) == world.rank:
        _core.testing.arm_hold(0)


def _test_pause(world: World) -> None:
    """GDSCP_MPI_TEST_PAUSE=SECONDS: each rank waits that long with its copy in
    flight; with GDSCP_MPI_TEST_PAUSED=DIR, it first writes its process id
    to DIR/rank-N, and waits only until DIR/go exists, which a rank whose
    pause a signal ends makes."""
    pause = os.environ.get("GDSCP_MPI_TEST_PAUSE")
    if not pause:
        return
    where = os.environ.get("GDSCP_MPI_TEST_PAUSED")
    if not where:
        time.sleep(float(pause))
        return
    path = os.path.join(where, f"rank-{world.rank}")
    with open(path + ".part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".part", path)
    until, go = time.monotonic() + float(pause), os.path.join(where, "go")
    try:
        while time.monotonic() < until and not os.path.exists(go):
            time.sleep(0.02)
    except BaseException:
        open(go, "w").close()
        raise
