"""The one output object of a command, and the table that turns exceptions
into one-line messages and exit codes.

Results go to stdout: a Rich table for people, or exactly one JSON document
with ``--json``. Everything else (progress, notes, warnings, errors) goes to
stderr, so ``gdscp read f --json | jq`` always sees valid JSON.

Exit codes: 0 success, 1 failure (missing file, I/O error, a file not copied),
2 usage error (bad option value, unknown GPU), 129 hung up (SIGHUP, unless
ignored as under nohup), 130 interrupted (SIGINT), 143 terminated (SIGTERM).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import signal
import stat
import sys
import threading
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import typer

from .. import CudaError, CuFileError
from .._gpus import DeviceError
from .atomic import remove_pending
from .exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE, STDOUT_CLOSED, Documents

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

__all__ = [
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "UsageError",
    "Failure",
    "Terminated",
    "describe",
    "Output",
    "shown",
    "signals_held",
]



class UsageError(Exception):
    """The command line asks for something impossible (exit 2)."""


class Failure(Exception):
    """The work failed; the message is complete as it stands (exit 1)."""


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) arrived. A BaseException, like KeyboardInterrupt,
    so that only cleanup code (``finally``) runs on its way out."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = int(signum)


def _os_message(exc: OSError) -> str:
    # The engine's OS errors already carry a full sentence with the path.
    if type(exc).__module__ == "gdscp":
        return str(exc)
    reason = exc.strerror or str(exc)
    if exc.filename is not None and exc.filename2 is not None:
        return f"'{os.fsdecode(exc.filename)}' -> '{os.fsdecode(exc.filename2)}': {reason}"
    if exc.filename is not None:
        return f"'{os.fsdecode(exc.filename)}': {reason}"
    return reason


def _memory_message(exc: BaseException) -> str:
    text = str(exc)
    return f"out of memory: {text}" if text else "out of memory"


# Checked in order; the first matching type wins.
_TABLE: list[tuple[type, int, Callable[[Any], str]]] = [
    (UsageError, EXIT_USAGE, str),
    (DeviceError, EXIT_USAGE, str),
    (Failure, EXIT_FAILURE, str),
    (OSError, EXIT_FAILURE, _os_message),
    (MemoryError, EXIT_FAILURE, _memory_message),
    (CudaError, EXIT_FAILURE, lambda e: f"CUDA error: {e}"),
    (CuFileError, EXIT_FAILURE, lambda e: f"cuFile error: {e}"),
    (KeyboardInterrupt, EXIT_INTERRUPTED, lambda e: "interrupted"),
    (Terminated, EXIT_TERMINATED, lambda e: "hung up" if e.signum == signal.SIGHUP else "terminated"),
]


def describe(exc: BaseException) -> tuple[str, int]:
    """(one-line message, exit code) for an exception raised by a command."""
    for types, code, message in _TABLE:
        if isinstance(exc, types):
            text = message(exc)
            if isinstance(exc, Terminated):
                code = 128 + exc.signum  # as a shell reports the signal
            break
    else:
        # Anything else is unexpected; name its type so that a bug report says something.
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        code = EXIT_FAILURE
    # One line on stderr comes from shown(), which escapes a line break; the
    # text itself keeps every character, so that a file name in it is exact.
    return text.strip(), code


@contextlib.contextmanager
def _stdout_errors() -> Iterator[None]:
    """A result that cannot be written is a failure of the command, said on
    stderr: stdout closed, a full disk, a reader gone (``| head``)."""
    if sys.stdout is None:
        raise Failure(f"cannot write the result: {STDOUT_CLOSED}")
    try:
        yield
    except OSError as exc:
        # What is still buffered must not fail again, with a traceback, at exit.
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass
        raise Failure(f"cannot write the result to standard output: {exc.strerror or exc}") from None


def _write_stdout(text: str) -> None:
    """``text`` to stdout with write(2) itself where stdout is a descriptor:
    a large write through ``sys.stdout`` to a pipe whose reader has gone can
    fail without Python raising, and the command would exit 0 with half a
    document. (``text`` is ASCII: the JSON escapes everything else.)"""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a descriptor (captured output)
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    view = memoryview(text.encode("ascii"))
    while view:
        view = view[os.write(fd, view):]


def _stop_jobs() -> None:
    """Cancel the bulk jobs still running, and wait for them to stop: a
    signal may land after a job has started and before the command waits on
    it (where the wait would have cancelled it)."""
    bulk = sys.modules.get("gdscp.bulk")
    if bulk is not None:
        bulk.stop_running_jobs()


class _CommandSignals:
    """Ctrl-C, SIGTERM and SIGHUP while a command runs (``with``, in the main
    thread). Ctrl-C raises ``KeyboardInterrupt``, as Python's own handler
    does; SIGTERM and SIGHUP (a closed terminal or a dropped ssh login) raise
    ``Terminated``: either way ``finally`` blocks (temporary files, cancelled
    transfers) run. Once ``reporting`` is set, while a failure is said, the
    next one is noted and waits, so that the line on stderr and the JSON
    document come out whole (the process is ending anyway, with the
    failure's exit code); a further one ends the process at once (a report
    stuck on a stream nobody reads). A signal ignored on entry (SIGHUP under
    nohup) stays ignored. While ``held()`` the command's result is being
    written: a signal then waits until the document is whole."""

    active: Optional["_CommandSignals"] = None  # the running command's

    def __init__(self) -> None:
        self.reporting = False
        self.holding = False
        self.pending: Optional[int] = None
        self.noted = 0
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> "_CommandSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                old = signal.getsignal(sig)
                if old is not signal.SIG_IGN and old is not None:  # None: not Python's to restore
                    self.previous[sig] = signal.signal(sig, self._handler)
            _CommandSignals.active = self
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)
        if _CommandSignals.active is self:
            _CommandSignals.active = None

    def _handler(self, signum: int, frame: object) -> None:
        if self.reporting or self.holding:
            self.noted += 1
            if self.noted > 1:
                os._exit(128 + signum)
            if not self.reporting:
                self.pending = signum
            return
        _raise_for(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A signal in the block waits for its end, and is then raised there
        (a second one ends the process at once, as while reporting)."""
        if self.reporting or self.holding:
            yield
            return
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            pending, self.pending = self.pending, None
            if pending is not None:
                self.noted = 0
                _raise_for(pending)


def _raise_for(signum: int) -> None:
    """What a command sees of Ctrl-C (``KeyboardInterrupt``), SIGTERM or SIGHUP (``Terminated``)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """The running command's signals held through the block (a result being
    written, a step whose outcome must be known): one that lands meanwhile
    is raised at its end (none to hold outside a command, or off the main
    thread)."""
    signals = _CommandSignals.active
    if signals is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    with signals.held():
        yield


# A backslash is escaped too: otherwise a name holding a backslash and an "n"
# would show as the one holding a line break.
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]} | {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r", 0x5C: "\\\\"}


def shown(text: str) -> str:
    """``text`` as a terminal can print it, on one line, each name in it
    unambiguous. A file name's bytes that are not UTF-8 reach Python as lone
    surrogates, which a UTF-8 stream refuses to write, and control characters
    (a newline in a name) would break the line or the terminal: both appear
    as C-style escapes (``\\xNN``, ``\\n``), and a backslash as ``\\\\``, as
    ``ls -b`` writes them (though it writes a byte in octal)."""
    # First: the escapes made below start with backslashes of their own.
    text = text.translate(_ESCAPES)
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _flat(value: Any) -> bool:
    """A JSON object whose values are all scalars or lists of scalars."""
    return isinstance(value, dict) and all(
        not isinstance(v, (dict, list)) or (isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v))
        for v in value.values()
    )


def json_text(data: dict[str, Any]) -> str:
    """``data`` as JSON indented by two, but for a list of flat objects (a
    record per file): one object to a line. The json module indents through
    its Python encoder; such a list goes through its C one, compact, several
    times faster for thousands of records, and is then cut into lines where
    one object ends and the next begins with the first one's first key. That
    text cannot occur inside a string, whose quotes are escaped; and a line
    break between two tokens leaves the document as valid as before."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], dict) and value[0] and _flat(value[0]):
            start = "{" + json.dumps(next(iter(value[0]))) + ": "
            text = "[\n    " + json.dumps(value)[1:-1].replace("}, " + start, "},\n    " + start) + "\n  ]"
        else:
            text = json.dumps(value, indent=2).replace("\n", "\n  ")
        lines.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}" if lines else "{}"


# What a write to stderr fails with once the stream itself is gone for good:
# closed, a reader gone, a terminal hung up, a full disk or quota. Nothing of
# the line was written (or part of it, on a full disk, which a second try
# would repeat). Anything else (EMFILE, ENFILE, ENOMEM) comes from inside
# Rich, before it writes: the line can still go out plain.
_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.EBADF, errno.EIO, errno.ENXIO, errno.ENOSPC,
                   errno.EDQUOT, errno.EFBIG})


def _stream_gone(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _GONE


def _write_plain(text: str) -> None:
    """``text`` to stderr with write(2) itself, past Rich and ``sys.stderr``
    (flushed first, so that the lines keep their order)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    view = memoryview(text.encode(getattr(sys.stderr, "encoding", None) or "utf-8", "backslashreplace"))
    while view:
        view = view[os.write(2, view):]


@functools.lru_cache(maxsize=None)
def _console_class() -> type:
    """Rich's Console, but a reader gone (a broken pipe) is an ``OSError`` for
    the command to handle (stdout: a failure said on stderr; stderr: lines
    lost), where Rich's own would end the process at once with status 1 and
    nothing said."""
    from rich.console import Console  # noqa: PLC0415

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console


def _launched() -> bool:
    from ..mpi.launch import launched  # noqa: PLC0415 - only on a failure

    return launched() is not None


def _other_rank() -> Optional[int]:
    """This process's rank where a launcher started it as a rank other than
    0 of several; None otherwise."""
    from ..mpi.launch import launched  # noqa: PLC0415 - only on a failure

    launch = launched()
    return launch.rank if launch is not None and launch.rank != 0 else None


class Output:
    """Where a command's words go. ``json``: stdout gets one JSON document;
    ``quiet``: nothing on success (no progress, notes, warnings or table; the
    JSON document still, since it was asked for; errors always);
    ``debug``: errors come with their traceback."""

    def __init__(self, command: str, *, json: bool = False, quiet: bool = False, debug: bool = False):
        self.command = command
        self.json = json
        self.quiet = quiet
        self.debug = debug
        self._result_written = False
        self._stderr_lost = False
        self._table_on_stderr = False
        self._so_far: Optional[Callable[[str], dict[str, Any]]] = None

    # Rich's consoles are made when first used: a command whose only output is
    # its JSON document (--json -q) never imports Rich's console.
    @cached_property
    def stdout(self) -> Console:
        Console = _console_class()  # noqa: N806

        # No markup or emoji codes: text in tables (a path with "[/]" or
        # ":smile:" in its name) is shown as it is.
        console = Console(highlight=False, soft_wrap=False, markup=False, emoji=False)
        if not console.is_terminal and "COLUMNS" not in os.environ:
            # Piped or captured: wide enough that tables keep one line per row.
            console = Console(highlight=False, soft_wrap=False, markup=False, emoji=False, width=160)
        return console

    @cached_property
    def stderr(self) -> Console:
        return _console_class()(stderr=True, highlight=False, markup=False, emoji=False)

    # -- stderr -------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return f"gdscp {self.command}" if self.command else "gdscp"

    @property
    def show_progress(self) -> bool:
        """Progress bars only for a person watching: stderr is a terminal, not --quiet."""
        return not self.quiet and self.stderr.is_terminal

    def note(self, message: str) -> None:
        """Something worth knowing, not a problem (hidden by --quiet)."""
        if not self.quiet:
            self._say(f"{self.prefix}: {shown(message)}", "dim")

    def warn(self, message: str) -> None:
        """A problem that does not stop the command (hidden by --quiet)."""
        if not self.quiet:
            self._say(f"{self.prefix}: warning: {shown(message)}", "yellow")

    def error(self, message: str) -> None:
        self._say(f"{self.prefix}: error: {shown(message)}", "bold red")

    def _say(self, line: str, style: str) -> None:
        """One line on stderr. A stderr that cannot be written (closed, a full
        disk, a reader gone) loses its lines, not the command: the transfer and
        the result on stdout go on, as cp's do. Rich failing on its own (a
        module it imports on first use, refused a descriptor while a job holds
        nearly all that ``ulimit -n`` allows) is not stderr lost: the line goes
        out plain, by write(2), which opens nothing."""
        if self._stderr_lost or sys.stderr is None:  # None: closed before Python started
            return
        try:
            self.stderr.print(line, markup=False, style=style, soft_wrap=True)
            sys.stderr.flush()
        except (OSError, ValueError, ImportError, MemoryError) as exc:
            if not _stream_gone(exc):
                try:
                    _write_plain(line + "\n")
                    return
                except OSError:
                    pass
            self._lose_stderr()

    def _lose_stderr(self) -> None:
        self._stderr_lost = True
        # What is still buffered must not fail again, with a traceback, at exit.
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        except OSError:
            pass

    # -- stdout -------------------------------------------------------------------
    def writes_data_to(self, paths: list[str]) -> None:
        """The command is about to write its data to ``paths``: where one of them
        is stdout itself (``/dev/stdout``, or what stdout is redirected to),
        the table goes to stderr, as dd's figures do, not among the data; a
        JSON document has nowhere to go: a usage error, before any data is
        written, said on stderr alone. Its failure document is not written
        either, neither to stdout (among the data, in a file the command was
        to write) nor to stderr, which carries lines, not documents: as for
        a stdout that cannot be written (``_stdout_errors``), the line is
        all. Not for a character device (a terminal, /dev/null), which
        keeps nothing to be mixed up."""
        try:
            out = os.fstat(1)
        except OSError:
            return
        if stat.S_ISCHR(out.st_mode):
            return
        for path in paths:
            try:
                st = os.stat(path)
            except (OSError, ValueError):
                continue
            if (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino):
                if self.json:
                    # No document from here on: neither the failure's nor
                    # an early one, for a signal on the way out.
                    self.json = False
                    Documents.written = True
                    raise UsageError(f"--json: '{path}' is standard output, where the document would land among "
                                     "the data written to it")
                self._table_on_stderr = True
                return

    def result(self, data: dict[str, Any], render: Optional[Callable[[], RenderableType]] = None) -> None:
        """The command's result: ``data`` as JSON with --json, else what ``render()``
        returns (a table, a line) on stdout. Called once per command."""
        if self._result_written:
            raise RuntimeError("a command writes one result")
        if self.json:
            text = json_text(data) + "\n"  # a signal meanwhile: no document yet, the failure's comes
            # Whole or not at all: a signal from here waits until the document is written.
            with signals_held():
                self._result_written = Documents.written = True
                with _stdout_errors():
                    _write_stdout(text)
            return
        self._result_written = True
        if render is not None and not (self.quiet and data.get("ok", True)):
            if self._table_on_stderr:
                if not self._stderr_lost and sys.stderr is not None:
                    with contextlib.suppress(OSError, ValueError):  # lost, as _say's lines are
                        self.stderr.print(render())
                        sys.stderr.flush()
                return
            with _stdout_errors():
                self.stdout.print(render())
                sys.stdout.flush()

    @property
    def result_written(self) -> bool:
        return self._result_written

    def so_far(self, work: Callable[[str], dict[str, Any]]) -> None:
        """From here on, a failure or interrupt that ends the command adds
        ``work(message)`` (what the command did until then, each file and how
        it ended) to its JSON document, after ``error`` and ``exit_code``."""
        self._so_far = work

    # -- failures -----------------------------------------------------------------
    def fail(self, exc: BaseException) -> int:
        """Report ``exc`` on stderr (and as the JSON result with --json); its exit code."""
        message, code = describe(exc)
        if self.debug and not isinstance(exc, (KeyboardInterrupt, Terminated)):
            self.stderr.print_exception()
        if _launched():  # one rank of several, perhaps not yet joined to the others
            from .ranks import fail_before_joining  # noqa: PLC0415

            final = fail_before_joining(self, code, message)
            if final is not None:
                return final
        rank = _other_rank()
        self.error(message if rank is None else f"rank {rank}: {message}")
        # Under a launcher whose ranks cannot connect, still one document: rank 0's.
        if self.json and not self._result_written and rank is None:
            doc: dict[str, Any] = {"command": self.command, "ok": False, "error": message, "exit_code": code}
            if self._so_far is not None:
                try:
                    doc.update((k, v) for k, v in self._so_far(message).items() if k not in doc)
                except Exception as lost:  # noqa: BLE001 - the failure's own document still goes out
                    self.error(f"cannot list what was done before the failure: {describe(lost)[0]}")
            try:
                self.result(doc)
            except Failure as lost:  # stdout gone too: said, and the first failure's code stands
                self.error(str(lost))
        return code

    @contextlib.contextmanager
    def guard(self) -> Iterator["Output"]:
        """Run a command body: any exception becomes one line on stderr and
        ``typer.Exit`` with its code; SIGTERM is turned into ``Terminated``
        meanwhile (``_CommandSignals``), and a signal while the failure is
        said waits until it is said. ``typer.Exit`` raised inside passes
        through."""
        with _CommandSignals() as signals:
            try:
                try:
                    yield self
                finally:
                    # While SIGTERM still raises (a second one must not kill
                    # the process with a job running): jobs stopped, then the
                    # temporary files removed.
                    _stop_jobs()
                    remove_pending()
                return
            except (typer.Exit, typer.Abort):
                raise
            except BaseException as exc:  # noqa: BLE001 - this is the one place that reports
                # First, before any call (where a pending signal's handler
                # would run): from here a signal waits for the report.
                signals.reporting = True
                if isinstance(exc, (SystemExit, GeneratorExit)):
                    raise
                code = self.fail(exc)
        raise typer.Exit(code)
