"""Exit codes of the ``gdscp`` command, its commands' names, the line an
interrupted command ends with, and the JSON document of a failure found
before a command's body runs.
Imports nothing beyond ``os`` and ``sys`` (not even json): the entry point
uses them before anything else of the command line is loaded (or where it
cannot be: a bad environment variable), and from its Ctrl-C handler, which
may run in the middle of any import."""

import os
import sys

__all__ = ["COMMANDS", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED", "EXIT_USAGE", "INTERRUPTED",
           "STDOUT_CLOSED", "TAKING_VALUES", "Documents", "asks_for_help", "asks_only_to_print", "early_result",
           "json_asked", "named", "options_given"]

# The commands, in the order --help lists them (each in gdscp/cli/NAME.py).
COMMANDS = ("copy", "read", "write", "info", "benchmark")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM

INTERRUPTED = "gdscp: interrupted\n"
# Why a result, the version or the help cannot be written, where the shell closed stdout (>&-).
STDOUT_CLOSED = "standard output is closed"


class Documents:
    """Whether the running command has written its JSON document: an early
    result after it (a Ctrl-C as the command line ends) would be a second
    document on stdout, where a script reads one."""

    written = False


# The options of each command that take a value; every other option is a
# flag. What follows one of them on the command line is its value, whatever it
# looks like, as Click reads it: ``--dir -h`` names a directory "-h" and asks
# for no help. (tests/test_cli.py holds this to the commands' definitions.)
TAKING_VALUES = {
    "copy": ("--device", "--devices", "--chunk-size", "--threads", "--task-size", "--compat-mode"),
    "read": ("--offset", "--length", "--device", "--devices", "--chunk-size", "--threads", "--task-size",
             "--compat-mode"),
    "write": ("--size", "-s", "--pattern", "--seed", "--device", "--devices", "--chunk-size", "--threads",
              "--task-size", "--compat-mode"),
    "info": ("--compat-mode",),
    "benchmark": ("--size", "--mode", "--threads", "--io-size", "--ops", "--runs", "--dir", "--device",
                  "--devices", "--task-size", "--compat-mode", "--plot", "--files", "--file-size", "--ranks"),
}


def options_given(args: "list[str]") -> "list[tuple[str, object]]":
    """The options the command line ``args`` (after ``gdscp``) gives, in
    order, as Click reads them: ``(name, value)`` each, the value None for a
    flag (and for an option whose value is missing at the end). A command's
    option that takes a value takes the next argument whatever it is
    (``TAKING_VALUES``); short flags may run together (``-rq``), a short
    option's value may follow it (``-s1K``); ``--`` ends the options (before
    the command's name, only those of ``gdscp`` itself)."""
    given: list = []
    taking: tuple = ()
    command = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":  # before the command's name, it ends gdscp's own options
            if command:
                break
            if i < len(args):
                command = True
                taking = TAKING_VALUES.get(args[i], ())
                i += 1
            continue
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if eq:
                given.append((name, value))
            elif name in taking:
                given.append((name, args[i] if i < len(args) else None))
                i += 1
            else:
                given.append((name, None))
        elif arg.startswith("-") and arg != "-":
            for k in range(1, len(arg)):
                name = "-" + arg[k]
                if name not in taking:
                    given.append((name, None))
                    continue
                if k + 1 < len(arg):
                    given.append((name, arg[k + 1:]))
                else:
                    given.append((name, args[i] if i < len(args) else None))
                    i += 1
                break
        elif not command:  # the command's name: its own options follow
            command = True
            taking = TAKING_VALUES.get(arg, ())
    return given


def command_first(args: "list[str]") -> "list[str]":
    """``args`` (after ``gdscp``) with a ``--`` before the command's name left
    out, which changes nothing for Click there (``gdscp -- read F`` runs
    ``gdscp read F``) and puts the command's name first, where the rest of
    the command line looks for it."""
    if len(args) > 1 and args[0] == "--" and not args[1].startswith("-"):
        return args[1:]
    return args


def named(args: "list[str]") -> "set[str]":
    """The names of the options the command line ``args`` gives
    (``options_given``)."""
    return {name for name, _ in options_given(args)}


def asks_for_help(args: "list[str]") -> bool:
    """Whether the command line ``args`` (after ``gdscp``) asks for help."""
    return not named(args).isdisjoint(("--help", "-h"))


# Options of ``gdscp`` itself, before a command's name, that print and run
# no command: the version, and the shell completion script (shown, or added
# to the shell's start-up file).
_ONLY_PRINTING = ("--version", "-V", "--show-completion", "--install-completion")


def asks_only_to_print(args: "list[str]") -> bool:
    """Whether the command line ``args`` (after ``gdscp``) runs no command and
    only prints the help (asked for, or shown for a bare ``gdscp``), the
    version or the shell completion script (``_ONLY_PRINTING``), or answers
    the shell's completion (it runs ``gdscp`` with ``_GDSCP_COMPLETE`` set),
    none of which uses a setting."""
    if not args or asks_for_help(args) or os.environ.get("_GDSCP_COMPLETE"):
        return True
    for arg in args:
        if arg == "--" or not arg.startswith("-"):  # the command's name: its own options follow
            return False
        if arg.partition("=")[0] in _ONLY_PRINTING:
            return True
    return False


def json_asked(args: "list[str]") -> bool:
    """Whether the command line ``args`` has --json (``options_given``)."""
    return "--json" in named(args)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _json_string(text: str) -> str:
    """``text`` as a JSON string, as ``json.dumps`` writes it (ASCII, the rest
    escaped), without importing json: a Ctrl-C handler that writes the
    document may have cut the import of json itself short."""
    out = []
    for ch in text:
        n = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= n < 0x7F:
            out.append(ch)
        elif n > 0xFFFF:  # a surrogate pair
            n -= 0x10000
            out.append(f"\\u{0xD800 | n >> 10:04x}\\u{0xDC00 | n & 0x3FF:04x}")
        else:
            out.append(f"\\u{n:04x}")
    return '"' + "".join(out) + '"'


def early_result(args: "list[str]", message: str, code: int) -> None:
    """With --json among ``args`` (the command line, before any ``--``), the
    JSON error document a command's own failure gives, for a failure found
    before its body runs (its arguments, the environment, an interrupt): a
    script that reads stdout always gets a document."""
    if not json_asked(args) or Documents.written:
        return
    command = _json_string(args[0]) if args and not args[0].startswith("-") else "null"
    text = (f'{{\n  "command": {command},\n  "ok": false,\n  "error": {_json_string(message)},\n'
            f'  "exit_code": {int(code)}\n}}\n')
    try:
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # not a descriptor (captured, replaced)
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        sys.stdout.flush()
        os.write(fd, text.encode())
    except (AttributeError, OSError, ValueError, RuntimeError):  # RuntimeError: a flush this handler cut short
        pass
