"""The ``gdscp`` console script (and ``python -m gdscp``): guards the start
of the command, runs it, and leaves without the interpreter's teardown.

Loading the command line (Typer, Rich, the engine) takes a few hundred
milliseconds; for a command that will use a GPU the NVIDIA driver loads on a
thread of its own meanwhile. A Ctrl-C in that time would print a traceback from whichever
import it landed in; here it ends the command as a Ctrl-C during a command
does: "gdscp: interrupted", with ``--json`` the failure document, and exit
status 130; a SIGTERM or SIGHUP likewise ("terminated", 143; "hung up",
129) until the command's own handler takes over. A bad ``GDSCP_*`` environment
variable is one line naming it and its accepted values, exit status 2 (under
an MPI launcher the ranks that have it meet the others all the same, and
rank 0 says it once for the job: ``_refused_rank``); the help, the
version and the shell's completion, which use no setting, are printed all
the same, the line then a warning (``_despite_variables``; none in an
answer to the completion); any other failure
to load (an import short of memory or address space, an engine that can
start no worker thread) is one line too, "gdscp CMD: error: cannot start:
...", with ``--json`` the failure document, exit status 1 (``_cannot_load``).
Warnings given while the command line loads (the engine's, where the system
refuses some of its worker threads) come out as the command's own warning
lines. ``--threads`` is the count the engine's workers start at, before
``GDSCP_NUM_THREADS``; numpy's OpenBLAS runs on one thread
(``_one_blas_thread``). Until
the guard is in place nothing is imported but the standard library's
``os``, ``signal`` and ``sys`` and gdscp's light package and exception
modules. Once the command is done, the process ends as soon as its threads,
``atexit`` functions and output are (``_leave``); a signal from the moment
the command is over ends the process at once, quietly (``_interrupt``,
``_signals_end_quietly``).
"""

import os
import signal
import sys

from .._errors import EnvironmentVariableError
from .exits import (COMMANDS, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, INTERRUPTED,
                    asks_only_to_print, command_first, early_result, named, options_given)

__all__ = ["main"]


def _interrupted_while_loading(signum: int, frame: object) -> None:
    # Nothing has started that needs cleaning up: leave at once, without
    # unwinding through half-imported modules (early_result imports nothing).
    os.write(2, INTERRUPTED.encode())
    early_result(sys.argv[1:], "interrupted", EXIT_INTERRUPTED)
    os._exit(EXIT_INTERRUPTED)


_STOPPED = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}


def _stopped_while_loading(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP before the command's own handler is in place (it
    puts this one back when done): as a Ctrl-C then, said, with --json the
    document, exit 128 + the signal; nothing has started that needs
    cleaning up. Once the command is over, the quiet end."""
    if _Command.over:
        _leave_quietly(signum, frame)
    word = _STOPPED.get(signum, "terminated")
    os.write(2, f"gdscp: {word}\n".encode())
    early_result(sys.argv[1:], word, 128 + signum)
    os._exit(128 + signum)


class _Loading:
    """A Ctrl-C, SIGTERM or SIGHUP while a rank of an MPI job loads the
    command line: noted (``_noted_while_loading``), not the end of the process
    at once; once loaded, the rank meets the others to end the job with it,
    130 or 143 (a rank that left at once would leave them waiting for it in
    MPI's start, for ever)."""

    interrupted = False  # a Ctrl-C
    stopped = False  # a SIGTERM or SIGHUP
    noting: list = []  # the signals noted so, given their default action back once loaded
    held: list = []  # signals that came before the guard knew what they do (``_guard``)


def _noted_while_loading(signum: int, frame: object) -> None:
    if signum == signal.SIGINT:
        _Loading.interrupted = True
    else:
        _Loading.stopped = True


def _held_while_loading(signum: int, frame: object) -> None:
    """A signal before it is known whether this process is one rank of
    several (which decides what it does): kept, and acted on once known."""
    _Loading.held.append(signum)


class _Command:
    """Whether the command is over: set with no call between the command's
    return and the setting, so that no signal handler runs in between."""

    over = False


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C once the command line is loaded: ``KeyboardInterrupt`` while the
    command runs (as Python's own handler), and once it is over the quiet end
    of ``_signals_end_quietly``, which a Ctrl-C landing before that is in
    place would otherwise turn into a traceback."""
    if _Command.over:
        _leave_quietly(signum, frame)
    raise KeyboardInterrupt


def _guard() -> object:
    """Installs the loading-time SIGINT handler (and, for a process on its
    own, SIGTERM's and SIGHUP's where they have their default action: kept
    until the command's own takes over); returns the SIGINT handler to
    restore (None: nothing installed, as where SIGINT is ignored or off the
    main thread)."""
    try:
        # Held from the first moment: whether the process is a rank of an MPI
        # job (what they do then) is known only once gdscp.mpi.launch, and
        # the typing module under it, have loaded.
        previous = signal.getsignal(signal.SIGINT)
        stopping = [sig for sig in _STOPPED if signal.getsignal(sig) is signal.SIG_DFL]
        for sig in stopping + ([] if previous is signal.SIG_IGN else [signal.SIGINT]):
            signal.signal(sig, _held_while_loading)
        from ..mpi.launch import launched  # noqa: PLC0415

        alone = launched() is None
        for sig in stopping:
            signal.signal(sig, _stopped_while_loading if alone else _noted_while_loading)
        if not alone:
            _Loading.noting = stopping
        if previous is not signal.SIG_IGN:  # (ignored: started in the background, Ctrl-C is not ours)
            signal.signal(signal.SIGINT, _interrupted_while_loading if alone else _noted_while_loading)
        for signum in _Loading.held:
            if not alone:
                _noted_while_loading(signum, None)
            elif signum == signal.SIGINT:
                _interrupted_while_loading(signum, None)
            else:
                _stopped_while_loading(signum, None)
        return None if previous is signal.SIG_IGN else previous
    except ValueError:  # not the main thread: signals are not ours either
        return None


def _hold_standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 that the shell left closed (``2>&-``) are given
    /dev/null: otherwise the first file the command opens takes the number,
    and what is read from stdin, or written to stderr, is that file's. A closed stdout stays ``sys.stdout is None`` to the command (its
    result cannot be written: a failure, said on stderr); a closed stderr
    becomes one whose lines are lost, not the command (a warning, or an
    error, then ends in nothing worse than its exit code)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
                os.set_inheritable(fd, True)
            except OSError:
                return
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")  # noqa: SIM115 - for the process


def _raise_open_file_limit() -> None:
    """The soft limit on open descriptors raised to the hard one: a bulk job
    keeps a temporary file open for each file waiting for its batch's sync and
    rename, and larger batches cost fewer syncs (docs/durability.md)."""
    try:
        import resource  # noqa: PLC0415 (POSIX only)

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, OSError, ValueError):
        pass  # the engine sizes its batches to whatever limit there is


# Commands that may move data through a GPU (copy only when one is named).
_GPU_COMMANDS = ("copy", "read", "write")


def _named_device(args: list[str]) -> object:
    """The GPU ``--device N`` names; None without one; False where the
    command spreads over several (``--devices``) or names it unreadably."""
    for name, value in options_given(args):
        if name == "--devices":
            return False
        if name == "--device":
            return int(value) if value is not None and value.isdecimal() else False
    return None


def _load_gpu_driver(argv: list[str]) -> object:
    """For a command that will likely use a GPU, load the NVIDIA driver and
    make the GPU's context (on an H200 machine a quarter of a second and a
    tenth) on a thread of its own while Python loads the command line; the
    command then finds both made. The GPU: the one ``--device`` names, else
    the one the command would choose (GPU 0; copy uses none unless one is
    named); none for ``--devices``. Not
    for one rank of an MPI job, whose MPI library starts up meanwhile and
    may use the GPU itself. Returns the thread (None where the command will
    not need it). Whatever goes wrong there, the command meets again and
    reports."""
    if len(argv) < 2 or argv[1] not in _GPU_COMMANDS:
        return None
    args = argv[1:]
    if not named(args).isdisjoint(("--host", "--help", "-h")):
        return None
    device = _named_device(args)
    if argv[1] == "copy" and device is None:
        return None
    from ..mpi.launch import launched  # noqa: PLC0415 - the standard library only

    if launched() is not None:
        return None
    import threading  # noqa: PLC0415

    def load() -> None:
        try:
            from .. import _core  # noqa: PLC0415

            info = _core.cuda_info()  # releases the GIL while the driver loads
            if not info["available"] or not info["gpus"] or device is False:
                return
            _core.DeviceBuffer(1, 0 if device is None else device)  # the context stays, retained for the process
        except BaseException:  # noqa: BLE001, S110 - the command reports it
            pass

    thread = threading.Thread(target=load, name="gdscp-driver")
    thread.start()
    return thread


def _one_blas_thread() -> None:
    """numpy's OpenBLAS held to the calling thread, unless the user has said
    otherwise (OPENBLAS_NUM_THREADS): the command does no linear algebra, and
    OpenBLAS starts its threads as numpy loads, and raises SIGINT where the
    system refuses one (a pids limit), which would end the command as a
    Ctrl-C. Set before any other thread runs, and before numpy can load."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


# The commands that take --threads, the count of the engine's workers.
_THREADS_COMMANDS = ("copy", "read", "write")


def _threads_asked(args: list) -> object:
    """The count ``--threads`` gives a copy, read or write (the last given);
    None without one, or where it is no whole number (the command then says
    so)."""
    if not args or args[0] not in _THREADS_COMMANDS:
        return None
    text = None
    for name, value in options_given(args):
        if name == "--threads":
            text = value
    try:
        return int(text.strip(), 10) if text is not None else None
    except ValueError:
        return None


def _despite_variables(args: list, step: object) -> None:
    """``step()``, which reads ``GDSCP_*`` variables. For a command line that
    only prints the help or the version (``asks_only_to_print``), which use
    no setting, a bad one is a warning, not the end: it is left out of the
    environment and ``step`` runs again (each error names one variable).
    Any other command line stops at it, as ``_run`` says."""
    import warnings  # noqa: PLC0415 - loaded with the interpreter

    while True:
        try:
            step()
            return
        except EnvironmentVariableError as exc:
            if not asks_only_to_print(args) or os.environ.pop(exc.variable, None) is None:
                raise
            warnings.warn(f"{exc} (a command that runs stops at it)", RuntimeWarning, stacklevel=1)


def _load(args: list, check_environment: object, load: object, caught: list) -> None:
    """``check_environment()``, then ``load(args)``: the command's module, and
    with it the engine, and the settings from their ``GDSCP_*`` variables
    (``_despite_variables``). The engine's workers start at the count
    --threads gives (``gdscp._preset``), not first at GDSCP_NUM_THREADS,
    which the system may have no threads for. The warnings given meanwhile
    (the worker pool's, where the system refused it threads; a bad variable
    under --help) go to ``caught``, for ``_say_warnings``."""
    import warnings  # noqa: PLC0415 - loaded with the interpreter

    threads = _threads_asked(args)
    if threads is not None:
        from .._preset import PRESET  # noqa: PLC0415

        PRESET["num_threads"] = threads
    with warnings.catch_warnings(record=True) as recorded:
        try:
            _despite_variables(args, check_environment)
            _despite_variables(args, lambda: load(args))
        finally:
            caught.extend(recorded)


def _where(args: list) -> str:
    """How the command's lines begin: "gdscp copy", or "gdscp" where the
    command line names no command."""
    return f"gdscp {args[0]}" if args and args[0] in COMMANDS else "gdscp"


def _say_warnings(args: list, caught: list) -> None:
    """The warnings given while the command line loaded, each one line on
    stderr as the command's own (none with --quiet, nor in an answer to the
    shell's completion, which would print them under the prompt at every
    Tab)."""
    if not named(args).isdisjoint(("--quiet", "-q")) or os.environ.get("_GDSCP_COMPLETE"):
        return
    for warning in caught:
        sys.stderr.write(f"{_where(args)}: warning: {' '.join(str(warning.message).split())}\n")


def _load_failure(exc: BaseException) -> str:
    """The line that says why the command line could not load: its deepest
    cause (numpy's ImportError wraps the loader's reason in a page of
    advice), by type as the command names an unexpected error, in one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, MemoryError):
        text = f"out of memory: {exc}" if str(exc) else "out of memory"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return "cannot start: " + " ".join(text.split())


def _cannot_load(args: list, exc: BaseException) -> int:
    """A command line that could not load (an import that failed for want
    of memory or address space, an engine with no worker thread): one line,
    with --json the failure document, exit 1; with --debug the traceback
    first."""
    message = _load_failure(exc)
    final = _refused_rank(message, EXIT_FAILURE)
    if final is not None:
        return final
    if "--debug" in named(args):
        try:
            import traceback  # noqa: PLC0415

            traceback.print_exception(exc)
        except Exception:  # noqa: BLE001, S110 - the line below still says it
            pass
    sys.stderr.write(f"{_where(args)}: error: {message}\n")
    early_result(args, message, EXIT_FAILURE)
    return EXIT_FAILURE


def _run() -> int:
    previous = _guard()
    _raise_open_file_limit()
    _load_gpu_driver(sys.argv)
    args = sys.argv[1:]
    try:
        failed = None
        caught: list = []
        try:
            from ..mpi import check_environment
            from .app import load, run

            _load(args, check_environment, load, caught)
        except (KeyboardInterrupt, EnvironmentVariableError):
            raise
        except Exception as exc:  # noqa: BLE001 - said in one line, below
            failed = exc
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, _interrupt if previous is signal.default_int_handler else previous)
            for sig in _Loading.noting:  # the command's own handler comes next
                signal.signal(sig, signal.SIG_DFL)
        if _Loading.interrupted or _Loading.stopped:
            raise KeyboardInterrupt
        _say_warnings(args, caught)
        if failed is not None:
            code = _cannot_load(args, failed)
            _Command.over = True
            return code
        code = run()
        _Command.over = True
        return code
    except KeyboardInterrupt:  # raised by an import, or before run() took over
        final = _interrupted_rank()
        _Command.over = True
        if final is not None:
            return final
        sys.stderr.write(INTERRUPTED)
        early_result(sys.argv[1:], "interrupted", EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except EnvironmentVariableError as exc:
        final = _refused_rank(str(exc), EXIT_USAGE)
        _Command.over = True
        if final is not None:
            return final
        sys.stderr.write(f"gdscp: error: {exc}\n")
        early_result(sys.argv[1:], str(exc), EXIT_USAGE)
        return EXIT_USAGE


def _interrupted_rank() -> object:
    """Under an MPI launcher, the job's exit code once this interrupted rank
    has met the others (``app.interrupted_rank``); None for a process on its
    own, which says so itself, importing nothing more."""
    from ..mpi.launch import launched  # noqa: PLC0415 - the standard library only

    if launched() is None:
        return None
    try:
        from .app import interrupted_rank  # noqa: PLC0415
    except BaseException:  # noqa: BLE001 - the command line cannot load: this rank speaks for itself
        return None
    return interrupted_rank(sys.argv[1:], EXIT_TERMINATED if _Loading.stopped else EXIT_INTERRUPTED)


def _refused_rank(message: str, code: int) -> object:
    """Under an MPI launcher, a rank whose command line cannot load (a bad
    ``GDSCP_*`` variable: ``code`` 2; an import that failed: 1) meets the
    other ranks all the same, as a rank whose command line is refused does,
    and they end the job with it: exit ``code`` everywhere, said once by rank 0
    (with --json the one document), nothing written. A rank that left alone
    left the others waiting for it in MPI's start for ever. Only modules that
    load without the settings are used here. The job's exit code; None for a
    process on its own, or where it cannot meet the others (it then speaks
    for itself)."""
    from ..mpi.launch import launched  # noqa: PLC0415 - the standard library only

    if launched() is None:
        return None
    args = sys.argv[1:]
    try:
        from .. import mpi  # noqa: PLC0415
        from ..mpi.comm import job_code, said  # noqa: PLC0415
        from .app import joins  # noqa: PLC0415

        world = mpi.world() if joins(args) else None
        if world is None:
            return None
        signalled = _Loading.interrupted or _Loading.stopped
        code = EXIT_INTERRUPTED if _Loading.interrupted else EXIT_TERMINATED if _Loading.stopped else code
        statuses = world.agree(code, [] if signalled else [f"rank {world.rank}: {message}"])
        final = job_code(statuses)
        if world.root:  # what ranks.join's first agreement has rank 0 say, with only what loads here
            lines = said(statuses)
            stopped = {130: "interrupted", 143: "terminated"}.get(final)
            sys.stderr.write("".join(f"gdscp: error: {line}\n" for line in lines))
            if stopped:
                sys.stderr.write(f"gdscp: {stopped}\n")
            early_result(args, stopped or (lines[0] if lines else "failed"), final)
        world.barrier()  # no rank leaves before rank 0 has spoken
        return final
    except BaseException:  # noqa: BLE001 - MPI unusable here, or a signal: this rank speaks for itself
        return None


def _must_finalize() -> bool:
    """Whether this process needs the interpreter's own exit: under MPI (a
    rank that ends at once after MPI_Finalize can reach MPICH's launcher as
    one that died, which then kills the others), a profiler or tracer
    (which writes its results then), or ``python -i``."""
    return "mpi4py.MPI" in sys.modules or sys.getprofile() is not None or sys.gettrace() is not None \
        or bool(sys.flags.inspect)


def _finalize_mpi() -> None:
    """Under MPI, MPI finalized here, with the command's signal handlers
    still in place. Left to mpi4py, it runs at the very end of the
    interpreter's exit, after Python has given every signal back its default
    action: a Ctrl-C while MPI_Finalize waits for the other ranks would kill
    the rank outright."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception:  # noqa: BLE001 - mpi4py tries again as the interpreter ends, and reports
        return
    # What is left is the interpreter's own exit, which at its end gives the
    # signals their default actions back: ignored from here, they can no
    # longer kill a rank whose command is over.
    _on_signals(signal.SIG_IGN)


def _leave(code: int) -> None:
    """Ends the process with ``code`` as the interpreter's exit would, less
    its teardown: the other threads joined, the ``atexit`` functions run,
    stdout and stderr flushed, then ``os._exit``. Tearing down the modules of
    the command line (Typer, Click, Rich: tens of thousands of objects, each
    visited by the exit's garbage collections) costs more than a small copy."""
    _finalize_mpi()
    if _must_finalize():
        sys.exit(code)
    import atexit  # noqa: PLC0415
    import threading  # noqa: PLC0415

    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:  # noqa: BLE001 - the interpreter's exit reports it as it always did
        sys.exit(code)
    os._exit(code)


def _signals_end_quietly() -> None:
    """Once the command is over, a signal ends the process at once, with 128
    plus its number and nothing more said: left to the interpreter, it would
    print a traceback from wherever it landed on the way out (and under MPI,
    kill the rank, whose launcher then reports the signal's number as its
    exit status: 2, a usage error, for Ctrl-C). Signals ignored stay ignored."""
    _on_signals(_leave_quietly)


def _leave_quietly(signum: int, frame: object) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - a flush this one interrupted: what it had is lost
            pass
    os._exit(128 + signum)


def _on_signals(handler: object) -> None:
    """``handler`` for Ctrl-C, SIGTERM and SIGHUP, but for those ignored (as
    under nohup); nothing off the main thread, whose signals are not ours."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                signal.signal(sig, handler)
        except ValueError:
            return


def main() -> None:
    """The ``gdscp`` console script."""
    sys.argv[1:] = command_first(sys.argv[1:])
    _hold_standard_descriptors()
    _one_blas_thread()
    code = _run()
    _signals_end_quietly()
    _leave(code)
