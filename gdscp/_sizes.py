"""Sizes written for people ("64KiB", "1.5G") as integer bytes, and whole
numbers ("8") as ints.

Read by the command line's size and count options and by ``gdscp.defaults``
for the ``GDSCP_*`` variables, so both accept the same spellings. Suffixes: K,
k, Ki and KiB mean 1024 (as in dd and most storage tools); KB and kB mean 1000.
The same holds for M, G, T and P. A bare number, or one ending in B, is bytes.
Fractions are allowed when the result is a whole number of bytes ("1.5GiB",
"0.5K"), computed exactly. Digits are ASCII digits, as a shell or a scheduler
writes a number (Python's ``int()`` also takes other scripts' digits, "٨" for
8, and "1_0"). A text of more than 100 characters is refused unread.
"""

from __future__ import annotations

import re

from ._args import shown

__all__ = ["EXAMPLES", "parse_integer", "parse_size"]

EXAMPLES = "4096, 4K, 64KiB, 1M, 10G, 1.5GiB"

_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtTpP]?)(i?)([bB]?)\s*$", re.ASCII)
# Far more than any size or count takes (2**64 has 20 digits; a fraction of a
# P is whole within 50 decimals), and few enough that no text is slow to read.
_MAX_LENGTH = 100
_SPACE = " \t\n\r\f\v"


def _length_checked(text: str, what: str) -> str:
    """``text``, or a ValueError quoting its start if it is too long to read."""
    if len(text) > _MAX_LENGTH:
        raise ValueError(f"{text[:20]!r}... is not {what}: {len(text)} characters, more than the {_MAX_LENGTH} read")
    return text


def parse_size(text: str | int) -> int:
    """``text`` as a number of bytes; ``ValueError`` naming ``text`` if it is not a size."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{shown(text)} is not a size (sizes cannot be negative)")
        return text
    text = _length_checked(str(text), "a size")
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (examples: {EXAMPLES})")
    number, prefix, binary, byte = match.groups()
    power = _POWERS[prefix.lower()]
    if binary and not prefix:
        raise ValueError(f"{text!r} is not a size (a lone 'i' needs a prefix such as Ki)")
    # "KB" (with a B and no i) is decimal; K, k, Ki, KiB are binary.
    base = 1000 if (byte and not binary and power) else 1024
    # In integers: the digits times the unit, over 10 per decimal place.
    whole, _, decimals = number.partition(".")
    value, rest = divmod(int(whole + decimals) * base**power, 10 ** len(decimals))
    if rest:
        fraction = str(rest).rjust(len(decimals), "0").rstrip("0")
        raise ValueError(f"{text!r} is not a whole number of bytes ({value}.{fraction} bytes)")
    return value


def parse_integer(text: str) -> int:
    """``text`` as an int: ASCII digits, after a sign if any; ``ValueError``
    naming ``text`` otherwise."""
    digits = _length_checked(str(text), "a whole number").strip(_SPACE)
    unsigned = digits[1:] if digits.startswith(("+", "-")) else digits
    if not (unsigned.isascii() and unsigned.isdigit()):
        raise ValueError(f"{text!r} is not a whole number")
    return int(digits)
