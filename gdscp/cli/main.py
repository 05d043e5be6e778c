"""The ``gdscp`` console script (and ``python -m gdscp``): guards the start
of the command, then runs it.

Loading the command line (Typer, Rich, numpy, the engine) takes a few hundred
milliseconds. A Ctrl-C in that time would print a traceback from whichever
import it landed in; here it ends the command as a Ctrl-C during a command
does: "gdscp: interrupted" and exit status 130. A bad ``GDSCP_*`` environment
variable is one line naming it and its accepted values, exit status 2. Until
the guard is in place nothing is imported but the standard library's
``os``, ``signal`` and ``sys`` and gdscp's light package and exception
modules.
"""

import os
import signal
import sys

from .._errors import EnvironmentVariableError
from .exits import EXIT_INTERRUPTED, EXIT_USAGE, INTERRUPTED

__all__ = ["main"]


def _interrupted_while_loading(signum: int, frame: object) -> None:
    # Nothing has started that needs cleaning up: leave at once, without
    # unwinding through half-imported modules.
    os.write(2, INTERRUPTED.encode())
    os._exit(EXIT_INTERRUPTED)


def _guard() -> object:
    """Installs the loading-time SIGINT handler; returns the one to restore
    (None: nothing installed, as where SIGINT is ignored or off the main thread)."""
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN:  # started in the background: Ctrl-C is not ours
            return None
        signal.signal(signal.SIGINT, _interrupted_while_loading)
        return previous
    except ValueError:  # not the main thread: signals are not ours either
        return None


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


def _run() -> int:
    _raise_open_file_limit()
    previous = _guard()
    try:
        try:
            from .app import run
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        return run()
    except KeyboardInterrupt:  # raised by an import, or before run() took over
        sys.stderr.write(INTERRUPTED)
        return EXIT_INTERRUPTED
    except EnvironmentVariableError as exc:
        sys.stderr.write(f"gdscp: error: {exc}\n")
        return EXIT_USAGE


def main() -> None:
    """The ``gdscp`` console script."""
    sys.exit(_run())
