"""Exit codes of the ``gdscp`` command, the line an interrupted command ends
with, and the JSON document of a failure found before a command's body runs.
Imports nothing heavy: the entry point uses them before anything else of the
command line is loaded (or where it cannot be: a bad environment variable)."""

import os
import sys
from typing import Sequence

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED", "EXIT_USAGE", "INTERRUPTED",
           "early_result", "json_asked"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM

INTERRUPTED = "gdscp: interrupted\n"


def json_asked(args: Sequence[str]) -> bool:
    """Whether the command line ``args`` has --json (before any ``--``)."""
    args = list(args)
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def early_result(args: Sequence[str], message: str, code: int) -> None:
    """With --json among ``args`` (the command line, before any ``--``), the
    JSON error document a command's own failure gives, for a failure found
    before its body runs (its arguments, the environment, an interrupt): a
    script that reads stdout always gets a document."""
    if not json_asked(args):
        return
    import json  # noqa: PLC0415 - only on this failure

    command = args[0] if args and not args[0].startswith("-") else None
    text = json.dumps({"command": command, "ok": False, "error": message, "exit_code": code}, indent=2) + "\n"
    try:
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # not a descriptor (captured, replaced)
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        sys.stdout.flush()
        os.write(fd, text.encode())
    except (AttributeError, OSError, ValueError):
        pass
