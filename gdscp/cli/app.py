"""The ``gdscp`` command: one Typer app, one module per command, registered here.

``run(argv)`` runs the command line and returns the exit code (the console
script, ``gdscp.cli.main``, exits with it). Usage errors found while parsing
come out as one line on stderr, exit code 2.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional, Sequence

import typer

import gdscp

from . import copy, info, read, write
from .exits import EXIT_INTERRUPTED, EXIT_USAGE, INTERRUPTED

__all__ = ["app", "run"]

app = typer.Typer(
    name="gdscp",
    help="Move data between files and GPU memory, fast: copy, read, write and check storage "
    "with NVIDIA GPUDirect Storage (cuFile) where it works, and a parallel pinned POSIX path "
    "where it does not.",
    epilog="Sizes accept 4096, 4K, 64KiB, 1M, 10G, 1.5GiB (K, Ki, KiB = 1024; KB = 1000). "
    "Exit codes: 0 success, 1 failure, 2 usage error, 130 interrupted.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"gdscp {gdscp.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", help="Print the version and exit.", callback=_show_version, is_eager=True),
    ] = None,
) -> None:
    """Move data between files and GPU memory."""


# The commands, in the order --help lists them. Each module defines one function
# named after its command; its docstring is the command's help.
app.command("copy")(copy.copy)
app.command("read")(read.read)
app.command("write")(write.write)
app.command("info")(info.info)
# `gdscp benchmark` lives in gdscp/cli/benchmark.py, which defines `def benchmark(...)`.
from . import benchmark  # noqa: E402
app.command("benchmark")(benchmark.benchmark)


def _is_click_error(exc: BaseException) -> bool:
    # Typer re-exports Click's exceptions (and from 0.26 on carries its own copy
    # of Click), so they are recognised by shape rather than by importing Click.
    return hasattr(exc, "exit_code") and hasattr(exc, "format_message")


def run(argv: Optional[Sequence[str]] = None) -> int:
    """Run the gdscp command line on ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=args, prog_name="gdscp", standalone_mode=False)
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if type(exc).__name__ == "Abort":  # Click's wrapper of a Ctrl-C outside a command body
            sys.stderr.write(INTERRUPTED)
            return EXIT_INTERRUPTED
        if not _is_click_error(exc):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `gdscp`: Typer has shown the help
            return EXIT_USAGE
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "gdscp"
        hint = f" (see '{where} --help')" if exc.exit_code == EXIT_USAGE else ""
        message = " ".join(exc.format_message().split())
        sys.stderr.write(f"{where}: error: {message}{hint}\n")
        return int(exc.exit_code)
    return code if isinstance(code, int) else 0

