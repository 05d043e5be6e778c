"""Exit codes of the ``gdscp`` command, and the line an interrupted command
ends with. Imports nothing: the entry point uses them before anything else of
the command line is loaded."""

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_TERMINATED", "EXIT_USAGE", "INTERRUPTED"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM

INTERRUPTED = "gdscp: interrupted\n"
