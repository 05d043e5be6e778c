"""Sizes and rates for people: parse "64KiB" into bytes, print bytes and GB/s.

Only the command line parses sizes; everything below it takes integer bytes.
Suffixes: K, k, Ki and KiB mean 1024 (as in dd and most storage tools); KB and
kB mean 1000. The same holds for M, G, T and P. A bare number, or one ending
in B, is bytes. Fractions are allowed when the result is a whole number of
bytes ("1.5GiB", "0.5K").
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

import typer
from rich import filesize

__all__ = [
    "SIZE_HELP",
    "parse_size",
    "size_option",
    "format_bytes",
    "format_rate",
    "format_seconds",
    "gb_per_s",
]

SIZE_HELP = "sizes: 4096, 4K, 64KiB, 1M, 10G, 1.5GiB (K/Ki/KiB = 1024, KB = 1000)"

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
        raise ValueError(f"{str(text)!r} is not a size (examples: 4096, 4K, 64KiB, 1M, 10G, 1.5GiB)")
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


def size_option(text: str) -> int:
    """Typer ``parser=`` for size options: bad input becomes a usage error naming it."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


_BINARY_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]


def format_bytes(n: int) -> str:
    """``1536`` -> ``"1.50 KiB"``; exact counts below 1 KiB (``"512 B"``)."""
    if n < 1024:
        return f"{n} B"
    unit, suffix = filesize.pick_unit_and_suffix(n, _BINARY_UNITS, 1024)
    return f"{n / unit:.2f} {suffix}"


def gb_per_s(nbytes: int, seconds: float) -> float:
    """Throughput in GB/s (10^9 bytes per second, as storage is rated); 0 for no time."""
    if seconds <= 0 or not math.isfinite(seconds):
        return 0.0
    return nbytes / seconds / 1e9


def format_rate(nbytes: int, seconds: float) -> str:
    """``"3.21 GB/s"``; MB/s or kB/s for small rates, so that they stay readable."""
    rate = gb_per_s(nbytes, seconds) * 1e9
    if rate <= 0:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.2f} {unit}"
    return f"{rate:.0f} B/s"


def format_seconds(seconds: float) -> str:
    """``"0.012 s"``, ``"4.57 s"``, ``"2m 05s"``."""
    if seconds < 1:
        return f"{seconds:.3f} s"
    if seconds < 120:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m {rest:02d}s"
