"""Sizes written for people ("64KiB", "1.5G") as integer bytes.

Read by the command line's size options and by ``gdscp.defaults`` for the
``GDSCP_*`` size variables, so both accept the same spellings. Suffixes: K, k,
Ki and KiB mean 1024 (as in dd and most storage tools); KB and kB mean 1000.
The same holds for M, G, T and P. A bare number, or one ending in B, is bytes.
Fractions are allowed when the result is a whole number of bytes ("1.5GiB",
"0.5K").
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["EXAMPLES", "parse_size"]

EXAMPLES = "4096, 4K, 64KiB, 1M, 10G, 1.5GiB"

_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kKmMgGtTpP]?)(i?)([bB]?)\s*$")


def parse_size(text: str | int) -> int:
    """``text`` as a number of bytes; ``ValueError`` naming ``text`` if it is not a size."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text} is not a size (sizes cannot be negative)")
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{str(text)!r} is not a size (examples: {EXAMPLES})")
    number, prefix, binary, byte = match.groups()
    power = _POWERS[prefix.lower()]
    if binary and not prefix:
        raise ValueError(f"{text!r} is not a size (a lone 'i' needs a prefix such as Ki)")
    # "KB" (with a B and no i) is decimal; K, k, Ki, KiB are binary.
    base = 1000 if (byte and not binary and power) else 1024
    try:
        value = Decimal(number) * (base**power)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{text!r} is not a size") from None
    if value != value.to_integral_value():
        raise ValueError(f"{str(text)!r} is not a whole number of bytes ({value} bytes)")
    return int(value)
