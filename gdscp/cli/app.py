"""The ``gdscp`` command: one Typer app, one module per command, registered here.

``run(argv)`` runs the command line and returns the exit code (the console
script, ``gdscp.cli.main``, exits with it). Usage errors found while parsing
come out as one line on stderr, exit code 2.

A command's module is imported only when that command runs (or when help
lists them all): the benchmark's numpy, for one, is no part of a copy's start.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import Annotated, Optional, Sequence

import typer

import gdscp

from .exits import (COMMANDS, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, INTERRUPTED, STDOUT_CLOSED, Documents,
                    asks_for_help, command_first, early_result, json_asked)

__all__ = ["JOINING", "Running", "app", "asks_for_help", "interrupted_rank", "joins", "load", "run"]

app = typer.Typer(
    name="gdscp",
    help="Move data between files and GPU memory, fast: copy, read, write and check storage "
    "with NVIDIA GPUDirect Storage (cuFile) where it works, and a parallel pinned POSIX path "
    "where it does not.",
    epilog="Sizes accept 4096, 4K, 64KiB, 1M, 10G, 1.5GiB (K, Ki, KiB = 1024; KB = 1000). "
    "Exit codes: 0 success, 1 failure, 2 usage error, 130 interrupted (129/143: SIGHUP/SIGTERM).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        # As cp: a version that cannot be written (stdout closed, full) is an error.
        try:
            if sys.stdout is None:
                raise OSError(9, STDOUT_CLOSED)
            sys.stdout.write(f"gdscp {gdscp.__version__}\n")
            sys.stdout.flush()
        except OSError as exc:
            sys.stderr.write(f"gdscp: error: cannot write the version: {exc.strerror or exc}\n")
            raise typer.Exit(EXIT_FAILURE) from None
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", help="Print the version and exit.", callback=_show_version, is_eager=True),
    ] = None,
) -> None:
    """Move data between files and GPU memory."""


# The commands (exits.COMMANDS), in the order --help lists them. Each lives in
# the module of its name (gdscp/cli/NAME.py), which defines one function named
# after it; its docstring is the command's help.
# The commands that run as one job over the ranks of a launch, and benchmark,
# which refuses to: its refusal, too, is said once, by rank 0.
JOINING = ("copy", "read", "write", "benchmark")


def joins(args: Sequence[str]) -> bool:
    """Whether the command line ``args`` (after ``gdscp``), run by one rank of
    several, meets the other ranks: a command of ``JOINING``, unless it asks
    for its help, which each rank prints on its own and leaves."""
    return bool(args) and args[0] in JOINING and not asks_for_help(args)


def _register(names: Sequence[str]) -> None:
    """Adds the commands ``names`` to the app (once each), in help order."""
    have = {c.name for c in app.registered_commands}
    for name in names:
        if name not in have:
            module = importlib.import_module(f".{name}", __package__)
            app.command(name)(getattr(module, name))
    app.registered_commands.sort(key=lambda c: COMMANDS.index(c.name))


def load(args: Sequence[str]) -> None:
    """Imports the module of the command ``args`` names (every command's, for
    the help), as ``run`` does first. The entry point calls it while a Ctrl-C
    still ends the process at once: the engine's extension module, which the
    commands load, cannot be interrupted by an exception while it loads."""
    args = list(args)
    _register([args[0]] if args and args[0] in COMMANDS else COMMANDS)


def _is_click_error(exc: BaseException) -> bool:
    # Typer re-exports Click's exceptions (and from 0.26 on carries its own copy
    # of Click), so they are recognised by shape rather than by importing Click.
    return hasattr(exc, "exit_code") and hasattr(exc, "format_message")


def _fail_before_joining(args: list[str], code: int, message: str, hint: str = "") -> Optional[int]:
    """Under an MPI launcher, a command line refused before the command runs
    is said once, by rank 0, for the whole job (``ranks.fail_before_joining``);
    None for a process on its own."""
    from ..mpi.launch import launched  # noqa: PLC0415 - only on a failure

    if launched() is None or not joins(args):
        return None
    from .output import Output  # noqa: PLC0415
    from .ranks import fail_before_joining  # noqa: PLC0415

    return fail_before_joining(Output(args[0], json=json_asked(args)), code, message, hint)


def interrupted_rank(args: list[str], code: int = EXIT_INTERRUPTED) -> Optional[int]:
    """Under an MPI launcher, a Ctrl-C (``code`` 130) or SIGTERM or SIGHUP
    (143) before the command's body joined its job: the rank meets the others
    all the same, and they end the job with it, said once by rank 0 (a rank
    that left at once would leave them waiting for it in MPI's start, for
    ever). The job's exit code; None for a process on its own, or where it
    cannot meet them (it then speaks for itself)."""
    try:
        return _fail_before_joining(args, code, "interrupted" if code == EXIT_INTERRUPTED else "terminated")
    except BaseException:  # noqa: BLE001 - another Ctrl-C on the way: this rank speaks for itself
        return None


def _meet(args: list[str]) -> Optional[int]:
    """Under an MPI launcher, a command line that does not join a job (help,
    the version, ``info``) meets the other ranks first, to compare command
    lines with them (``ranks.meet``): the usage error's code where they
    differ, else None (the command runs on its own)."""
    from ..mpi.launch import launched  # noqa: PLC0415 - the standard library only

    if launched() is None or joins(args) or os.environ.get("_GDSCP_COMPLETE"):
        return None
    from .ranks import meet  # noqa: PLC0415

    return meet(args)


class Running:
    """The arguments of the command line ``run`` is running (after ``gdscp``):
    the ranks of an MPI job compare theirs (gdscp.cli.ranks.join)."""

    args: list[str] = []


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the gdscp command line on ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    args = command_first(list(sys.argv[1:] if argv is None else argv))
    Running.args = args
    Documents.written = False
    load(args)
    # Help (asked for, or shown for a bare `gdscp`) that cannot be written, its
    # stdout closed or full, is a failure said in one line, as cp's is.
    help_shown = (not args and not os.environ.get("_GDSCP_COMPLETE")) or asks_for_help(args)
    help_failed = EXIT_FAILURE if args else EXIT_USAGE
    if help_shown and sys.stdout is None:
        sys.stderr.write(f"gdscp: error: cannot write the help: {STDOUT_CLOSED}\n")
        return help_failed
    try:
        met = _meet(args)
        if met is not None:
            return met
        code = app(args=args, prog_name="gdscp", standalone_mode=False)
    except OSError as exc:
        if not help_shown:
            raise
        sys.stderr.write(f"gdscp: error: cannot write the help: {exc.strerror or exc}\n")
        return help_failed
    except SystemExit as exc:
        # Rich, which prints the help, ends the process with status 1 and
        # nothing said where the reader of a pipe has gone (| head); that is
        # the one exit on the help's way.
        if not help_shown or exc.code != 1:
            raise
        sys.stderr.write(f"gdscp: error: cannot write the help: {os.strerror(errno.EPIPE)}\n")
        return help_failed
    except KeyboardInterrupt:
        final = interrupted_rank(args)
        if final is not None:
            return final
        sys.stderr.write(INTERRUPTED)
        early_result(args, "interrupted", EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if type(exc).__name__ == "Abort":  # Click's wrapper of a Ctrl-C outside a command body
            final = interrupted_rank(args)
            if final is not None:
                return final
            sys.stderr.write(INTERRUPTED)
            early_result(args, "interrupted", EXIT_INTERRUPTED)
            return EXIT_INTERRUPTED
        if not _is_click_error(exc):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `gdscp`: Typer has shown the help
            return EXIT_USAGE
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            where = ctx.command_path
        else:
            # Click's parser gives some errors no context (an option's value
            # missing at the end of the line): the command is still the one named.
            where = f"gdscp {args[0]}" if args and args[0] in COMMANDS else "gdscp"
        hint = f" (see '{where} --help')" if exc.exit_code == EXIT_USAGE else ""
        message = exc.format_message()
        if getattr(exc, "command_name", None) is not None and "Did you mean" in str(getattr(exc, "message", "")):
            # An unknown command: Typer has named the ones it may mean in the
            # message, and Click (8.4 on) names them again as it formats it.
            message = exc.message
        message = " ".join(message.split())
        code = int(exc.exit_code)
        final = _fail_before_joining(args, code, message, hint)
        if final is not None:
            return final
        sys.stderr.write(f"{where}: error: {message}{hint}\n")
        early_result(args, message, code)
        return code
    return code if isinstance(code, int) else 0
