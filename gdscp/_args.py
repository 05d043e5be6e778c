"""Checks of what callers pass to gdscp's functions, raising the exception
types KvikIO raises for the same mistakes, with gdscp's own messages:
a negative or too large offset or size is an ``OverflowError`` (KvikIO's
binding converts them to ``size_t``), a value of the wrong type a
``TypeError``, a path with a NUL byte a ``ValueError`` (as ``open()``).
"""

from __future__ import annotations

import io
import operator
import os
from typing import Any

from ._errors import ArgumentError, RangeEndError

__all__ = ["FALSE_WORDS", "MAX_OFFSET", "MAX_SIZE", "TRUE_WORDS", "file_descriptor", "integer", "offset", "path",
           "shown", "size"]

# File offsets are off_t in the engine; sizes size_t.
MAX_OFFSET = 2**63 - 1
MAX_SIZE = 2**64 - 1

# The words a true or false setting takes (GDSCP_* variables, in any case).
TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", "n"})

# Python writes no int of more than 4300 digits as text (sys.int_info), so a
# message cannot name every number a caller may pass: one past this many
# digits is named by its length.
_SHOWN_DIGITS = 40
_EXACT_DIGITS = 100_000  # past this, a message counts digits from the bit length alone


def shown(value: Any) -> str:
    """``value`` as a message names it: an int by its digits, or for one too
    long to read (or for Python to write) by how many digits it has; anything
    else by its repr."""
    if not isinstance(value, int):
        return repr(value)
    number = int(value)  # a bool, an IntEnum member: its number
    if -(10**_SHOWN_DIGITS) < number < 10**_SHOWN_DIGITS:
        return repr(value)
    size = abs(number)
    sign = "negative " if number < 0 else ""
    # The bit length gives the digit count, or one short of it; a comparison
    # settles it, where a power of ten that long is quick to make.
    digits = max(_SHOWN_DIGITS, int((size.bit_length() - 1) * 0.30102999566398120) + 1)
    if digits > _EXACT_DIGITS:
        return f"(a {sign}number of about {digits} digits)"
    while size >= 10**digits:
        digits += 1
    while size < 10 ** (digits - 1):
        digits -= 1
    return f"(a {sign}number of {digits} digits)"


def integer(value: Any, name: str) -> int:
    """``value`` as an int: Python and numpy integers, not floats or strings."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None


def _bounded(value: Any, name: str, limit: int, limit_text: str) -> int:
    if type(value) is int and 0 <= value <= limit:  # the common case, without a conversion
        return value
    number = integer(value, name)
    if number < 0:
        raise OverflowError(f"{name} {shown(number)} is negative")
    if number > limit:
        raise OverflowError(f"{name} {shown(number)} is out of range (at most {limit_text})")
    return number


def c_int(value: int, name: str, what: str) -> int:
    """An integer that a system call takes as a C int (OverflowError past it);
    ``what`` says what takes it."""
    if not -(2**31) <= value < 2**31:
        raise OverflowError(f"{name} {shown(value)} is out of range ({what})")
    return value


def uint32(value: Any, name: str) -> int:
    """An unsigned 32-bit integer: 0 to 2**32-1."""
    return _bounded(value, name, 2**32 - 1, "2**32-1")


def offset(value: Any, name: str = "file_offset") -> int:
    """A file or buffer offset: 0 to 2**63-1."""
    return _bounded(value, name, MAX_OFFSET, "2**63-1")


def file_span(value: Any, size: int) -> int:
    """A file offset (see ``offset``) from which ``size`` bytes still end
    within the largest offset a file can have; a range that ends past it is
    a ``RangeEndError`` (an ``OverflowError`` and a ``RuntimeError``)."""
    start = offset(value)
    if size > MAX_OFFSET - start:
        raise RangeEndError(f"file_offset {start} plus size {size} is out of range (a file ends by 2**63-1)")
    return start


def size(value: Any, name: str = "size") -> int:
    """A byte count: 0 to 2**64-1."""
    return _bounded(value, name, MAX_SIZE, "2**64-1")


def path(file: Any) -> str:
    """A path-like argument (str, bytes, ``os.PathLike``) as a str. A NUL byte
    is refused as ``open()`` refuses it: the OS would read the path only up
    to it and open (or truncate) another file."""
    text = file if type(file) is str else os.fsdecode(os.fspath(file))
    if "\0" in text:
        raise ValueError("embedded null byte")
    return text


def file_descriptor(file: Any) -> tuple[int, bool]:
    """(descriptor, opened here) for a path-like, an int descriptor or a file
    object; the caller closes a descriptor it opened. A path is opened
    without blocking (a FIFO would wait for a writer)."""
    if isinstance(file, (str, bytes, os.PathLike)):
        return os.open(path(file), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK), True
    if isinstance(file, int) and not isinstance(file, bool):
        return c_int(file, "file descriptor", "a descriptor is an int"), False
    if isinstance(file, io.IOBase) or callable(getattr(file, "fileno", None)):
        try:
            return file.fileno(), False
        except io.UnsupportedOperation:  # io.BytesIO, io.StringIO: memory, not a file
            raise ArgumentError(f"file object {type(file).__name__} has no file descriptor") from None
    raise ArgumentError(
        f"file must be a path, a file descriptor or a file object, not {type(file).__name__}"
    )
