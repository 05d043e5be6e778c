"""The communicator of a job of several ranks, and the one way ranks agree.

Every rank goes through the same phases in the same order; after each phase
the ranks ``agree()``: each brings its status (done, failed, interrupted,
with its messages), and all of them leave with everyone's. A rank that fails
therefore never leaves the others blocked in a collective: it arrives with
its failure. The wait is a nonblocking barrier polled from Python, so that
Ctrl-C and SIGTERM are seen while waiting; a rank interrupted there goes on
waiting for the others (they were interrupted too, or will learn of it from
this agreement) up to ``GDSCP_MPI_ABORT_AFTER`` seconds (60; at most a
day), then calls MPI_Abort as a last resort. ``said()`` gives the ranks'
messages as rank 0 says them, each text once. While a phase's work runs,
an ``Alarm`` carries one word among the ranks (a file failed, under
--fail-fast), which the agreement that ends the phase closes. Only here is
mpi4py imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator, Mapping, NamedTuple, Optional

from .._errors import invalid_variable
from .launch import Launch

__all__ = ["Alarm", "Status", "Unavailable", "World", "abort_after", "connect", "job_code", "said", "spans", "worst"]

_POLL = 0.005  # seconds between looks at a pending barrier
_ABORT_AFTER = 60.0
_MOST_ABORT_AFTER = 86400.0  # a day: a longer wait for ranks that do not come is a mistake
_ALARM_TAG = 7  # an alarm's word; the agreements themselves are collectives, which no tag matches
_WORD = b"\x01"


class Unavailable(Exception):
    """A launcher started several ranks, but MPI cannot be used here."""


class Status(NamedTuple):
    rank: int
    code: int  # the rank's exit code so far: 0, 1 failure, 2 usage, 130/143 interrupted
    messages: list  # what went wrong there, complete sentences
    data: Any  # what the phase hands on (results, a plan)


class World:
    """``rank`` and ``size`` of the job; ``agree``, ``bcast``, ``abort``."""

    def __init__(self, comm: Any, launch: Launch):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.launch = launch
        self.interrupted = 0  # 130 or 143 once a signal arrived
        self.signals = 0  # how many arrived
        self._alarm: Optional[Alarm] = None
        try:
            self.abort_after = abort_after()
        except ValueError:  # checked as the command started: this rank joins only to say so (gdscp.cli.main)
            self.abort_after = _ABORT_AFTER

    @property
    def root(self) -> bool:
        return self.rank == 0

    def note_signal(self, code: int) -> None:
        """A signal arrived (130 for Ctrl-C, 143 for SIGTERM): the rank's
        code from now on, and a wait in progress becomes one with a limit."""
        self.interrupted = self.interrupted or code
        self.signals += 1

    def _wait(self, request: Any) -> None:
        """Wait for ``request``, seeing Ctrl-C and SIGTERM while waiting
        (raised here, or noted by a handler through ``note_signal``)."""
        deadline = None
        seen = self.signals
        while True:
            try:
                while not request.Test():
                    if deadline is None and self.signals != seen:
                        deadline = time.monotonic() + self.abort_after
                    if deadline is not None and time.monotonic() > deadline:
                        self.abort(self.interrupted or 1)
                    time.sleep(_POLL)
                return
            except BaseException as exc:  # noqa: BLE001 - a signal: note it, keep the protocol
                code = _signal_code(exc)
                if code is None:
                    raise
                self.note_signal(code)

    def agree(self, code: int, messages: Optional[list] = None, data: Any = None) -> list[Status]:
        """Everyone's status after a phase (in rank order), on every rank; the
        phase's alarm, where it had one, closed."""
        self._wait(self.comm.Ibarrier())
        code = code or self.interrupted
        mine = Status(self.rank, code, list(messages or []), data)
        alarm, self._alarm = self._alarm, None
        gathered = self.comm.allgather((tuple(mine), alarm is not None and alarm.sent))
        if alarm is not None:
            alarm.close(sum(sent for rank, (_, sent) in enumerate(gathered) if rank != self.rank))
        return [Status(*s) for s, _ in gathered]

    def alarm(self) -> "Alarm":
        """The alarm of the phase about to run, which its agreement closes:
        every rank opens one for the same phase, or none does."""
        self._alarm = Alarm(self)
        return self._alarm

    def bcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (after an agreement, so no rank is missing)."""
        return self.comm.bcast(obj, root=0)

    def barrier(self) -> None:
        self._wait(self.comm.Ibarrier())

    def abort(self, code: int) -> None:
        """The last resort: end every rank of the job now."""
        self.comm.Abort(code)


class Alarm:
    """One word among the ranks while a phase's work runs: ``sound()`` sends
    it to every other rank at once, ``sounded()`` says whether any rank has
    (this one, or one whose word has come). Under --fail-fast a rank whose
    file fails sounds it, and the others stop their jobs on it, as a file
    that fails stops a process's own job. Only the main thread calls MPI, so
    the ranks look for the word as they wait for their work. The phase's
    agreement receives every word sent (``close``): none outlives its phase
    to be taken for the next one's."""

    def __init__(self, world: World):
        from mpi4py import MPI  # noqa: PLC0415 - imported already, by connect

        self._world = world
        self._byte, self._anyone = MPI.BYTE, MPI.ANY_SOURCE
        self._inbox = bytearray(1)
        self._listening = world.comm.Irecv([self._inbox, MPI.BYTE], source=MPI.ANY_SOURCE, tag=_ALARM_TAG)
        self._heard = False
        self._sends: list[Any] = []
        self.sent = False

    def sound(self) -> None:
        """Tell every other rank (once)."""
        if self.sent:
            return
        self.sent = True
        world = self._world
        self._sends = [world.comm.Isend([_WORD, self._byte], dest=rank, tag=_ALARM_TAG)
                       for rank in range(world.size) if rank != world.rank]

    def sounded(self) -> bool:
        if not self._heard and not self.sent:
            self._heard = self._listening.Test()
        return self.sent or self._heard

    def close(self, words: int) -> None:
        """After the phase's barrier, with ``words`` the number of other ranks
        that sounded it (each has sent by now): this rank takes in every word
        sent to it, and one of its own, which the receive still posted takes
        where no other word came; then its own sends are done."""
        world, comm = self._world, self._world.comm
        own = comm.Isend([_WORD, self._byte], dest=world.rank, tag=_ALARM_TAG)
        world._wait(self._listening)  # one of words + 1 (done already where a word was heard)
        for _ in range(words):
            world._wait(comm.Irecv([self._inbox, self._byte], source=self._anyone, tag=_ALARM_TAG))
        for request in [own, *self._sends]:
            world._wait(request)


def job_code(statuses: list[Status]) -> int:
    """The job's exit code from every rank's (``worst``)."""
    return worst(*(s.code for s in statuses))


def worst(*codes: int) -> int:
    """The code that wins: interrupted first (130 or 143), then usage errors
    (2), then failures (1), else 0."""
    for wanted in (130, 143, 2, 1):
        if wanted in codes:
            return wanted
    return max(codes, default=0)


def said(statuses: list[Status]) -> list[str]:
    """The ranks' messages, each text once, in order: "rank 3: ..." or
    "ranks 0-2, 5: ..." where it came from some ranks, and as one process
    would say it where every rank of several said it (a command line all of
    them refused)."""
    ranks_of: dict[str, list[int]] = {}
    for s in statuses:
        for message in s.messages:
            text = message.removeprefix(f"rank {s.rank}: ")
            ranks_of.setdefault(text, [])
            if s.rank not in ranks_of[text]:
                ranks_of[text].append(s.rank)
    lines = []
    for text, ranks in ranks_of.items():
        if len(ranks) == len(statuses) > 1:
            lines.append(text)
        else:
            lines.append(f"rank{'s' if len(ranks) > 1 else ''} {spans(sorted(ranks))}: {text}")
    return lines


def spans(ranks: list[int]) -> str:
    """[0, 1, 2, 5] as "0-2, 5"."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def abort_after(environ: Optional[Mapping[str, str]] = None) -> float:
    """``GDSCP_MPI_ABORT_AFTER``: the seconds a rank signalled while it waits
    for the others goes on waiting before it ends the job (MPI_Abort); 60
    where unset. ``EnvironmentVariableError`` for anything but a number of
    seconds from 0 to a day (not a number, negative, NaN, infinite, more)."""
    env = os.environ if environ is None else environ
    raw = env.get("GDSCP_MPI_ABORT_AFTER")
    if raw is None or not raw.strip():
        return _ABORT_AFTER
    text = raw.strip()
    try:
        seconds = float(text)
    except ValueError:
        seconds, why = None, f"{text!r} is not a number"
    else:
        if seconds != seconds or seconds in (float("inf"), float("-inf")):
            why = f"{text!r} is not a finite number"
        elif seconds < 0:
            why = f"{text} is negative"
        else:
            why = f"{text} seconds is more than a day"
    if seconds is None or not 0 <= seconds <= _MOST_ABORT_AFTER:  # NaN fails both comparisons
        raise invalid_variable("GDSCP_MPI_ABORT_AFTER", raw, why,
                               f"a number of seconds from 0 to {_MOST_ABORT_AFTER:.0f} (default {_ABORT_AFTER:.0f})")
    return seconds


def _signal_code(exc: BaseException) -> Optional[int]:
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if type(exc).__name__ == "Terminated":  # gdscp.cli.output's, raised by its SIGTERM handler
        return 143
    return None


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# What a rank says, and its exit code, for a signal that ends it while MPI
# starts: under MPI a SIGHUP ends the job as SIGTERM does (docs/cluster.md).
_ENDED = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated", 143),
          signal.SIGHUP: ("terminated", 143)}


class _Watcher:
    """While MPI starts, with Ctrl-C, SIGTERM and SIGHUP blocked: a thread
    that takes them as they come (``sigtimedwait``) and ends the process at
    once with 130 or 143 and one line. Nothing has started that needs
    cleaning up, and MPI's start may wait for ever (for a rank that never
    comes), which no signal would otherwise end. ``stop()`` hands a signal
    taken after the start is done to the main thread, where it stays
    pending until the handlers are back."""

    def __init__(self, signals: tuple) -> None:
        self.signals = signals  # those not ignored (nohup's SIGHUP stays ignored)
        self.lock = threading.Lock()
        self.done = False
        self.main = threading.main_thread().ident
        self.thread = threading.Thread(target=self._watch, name="gdscp-mpi-start", daemon=True)

    def start(self) -> None:
        self.thread.start()  # with the signals blocked, as the caller has them

    def stop(self) -> None:
        with self.lock:
            self.done = True
        self.thread.join()

    def _watch(self) -> None:
        if not self.signals:
            return
        while True:
            got = signal.sigtimedwait(self.signals, _POLL * 4)  # stop() waits for this at most
            with self.lock:
                if self.done:
                    if got is not None:  # the start is over: the main thread's, for its handlers
                        signal.pthread_kill(self.main, got.si_signo)
                    return
                if got is not None:
                    word, code = _ENDED[got.si_signo]
                    os.write(2, f"gdscp: {word}\n".encode())
                    os._exit(code)


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """Around MPI's start: the handlers this process had for Ctrl-C, SIGTERM
    and SIGHUP are theirs again afterwards. MPI's libraries may take a signal
    for themselves as they start (UCX, under MPICH and Open MPI, takes SIGHUP
    to turn on its debug log, written on stdout), and a rank would then no
    longer end its job on it. The signals are blocked meanwhile (and so in
    the threads MPI starts); one that comes during the start ends the rank
    at once (``_Watcher``), one that comes after it reaches the handlers put
    back."""
    if threading.current_thread() is not threading.main_thread():
        yield  # the main thread's signals are not this one's to keep
        return
    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    watcher = _Watcher(tuple(sig for sig, handler in handlers.items() if handler is not signal.SIG_IGN))
    try:
        watcher.start()
        yield
    finally:
        watcher.stop()
        for sig, handler in handlers.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _start(MPI: Any) -> None:
    """MPI_Init_thread, called through ctypes, which lets go of the
    interpreter while it runs: MPI's start waits for every rank of the job
    (for ever, for one that never comes), and ``_Watcher`` must be able to
    run meanwhile; mpi4py's own ``Init_thread`` holds the interpreter. As
    mpi4py starts MPI, errors in the predefined communicators are
    exceptions. Where the library cannot be found so, mpi4py starts it."""
    if MPI.Is_initialized():
        return
    level = MPI.THREAD_SERIALIZED  # MPI is called from the main thread only
    try:
        import ctypes  # noqa: PLC0415

        init = ctypes.CDLL(MPI.__file__).MPI_Init_thread  # found in the libraries mpi4py's module uses
    except (OSError, AttributeError):
        MPI.Init_thread(level)
        return
    init.restype = ctypes.c_int
    init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    provided = ctypes.c_int(0)
    if init(None, None, level, ctypes.byref(provided)) != 0:
        raise Unavailable("MPI cannot start (MPI_Init_thread failed); set GDSCP_MPI=0 to run each process on its own")
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
        comm.Set_errhandler(MPI.ERRORS_RETURN)


def connect(launch: Launch) -> Optional[World]:
    """The job's world, or None where MPI finds a world of one (a singleton)."""
    try:
        with _signals_kept():
            import mpi4py  # noqa: PLC0415

            mpi4py.rc.threads = True
            mpi4py.rc.thread_level = "serialized"  # MPI is called from the main thread only
            mpi4py.rc.initialize = False  # started by _start, the interpreter free meanwhile
            mpi4py.rc.finalize = True
            from mpi4py import MPI  # noqa: PLC0415

            _start(MPI)
    except ImportError as exc:
        raise Unavailable(
            f"started as rank {launch.rank} of {launch.size} ({launch.launcher} is set), but mpi4py cannot be "
            f"imported ({exc}); install gdscp[mpi], or set GDSCP_MPI=0 to run each process on its own"
        ) from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() <= 1:
        # The launcher started several ranks, but this MPI sees a world of one:
        # mpi4py's MPI is not the launcher's (an Open MPI mpirun, an MPICH
        # mpi4py). Each rank would do the whole job.
        library = " ".join(MPI.Get_library_version().splitlines()[0].split())
        raise Unavailable(
            f"started as rank {launch.rank} of {launch.size} ({launch.launcher} is set), but MPI ({library}) sees "
            "a world of one: mpi4py is built for another MPI than the launcher's; launch with that MPI's mpiexec, "
            "or set GDSCP_MPI=0 to run each process on its own"
        )
    return World(comm, launch)
