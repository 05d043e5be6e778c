"""Sizes and rates for people: size options parsed into bytes, bytes and GB/s
printed.

Sizes are parsed by ``gdscp._sizes`` (the same spellings as the ``GDSCP_*``
size variables); everything below the command line takes integer bytes.
"""

from __future__ import annotations

import math

import typer
from rich import filesize

from .._args import MAX_OFFSET
from .._sizes import EXAMPLES, parse_size

__all__ = [
    "SIZE_HELP",
    "parse_size",
    "size_option",
    "size_option_at_least",
    "format_bytes",
    "byte_count",
    "format_rate",
    "format_seconds",
    "gb_per_s",
]

SIZE_HELP = f"sizes: {EXAMPLES} (K/Ki/KiB = 1024, KB = 1000)"


def size_option(text: str) -> int:
    """Typer ``parser=`` for size options: bad input, or a size no file can
    have, becomes a usage error naming it."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if value > MAX_OFFSET:  # the largest size a file can have (off_t)
        raise typer.BadParameter(f"{text!r} is more than the largest size a file can have (2**63-1 bytes)")
    return value


def size_option_at_least(minimum: int):
    """``size_option`` that also refuses a size below ``minimum`` bytes, saying the minimum."""

    def parse(text: str) -> int:
        value = size_option(text)
        if value < minimum:
            raise typer.BadParameter(f"{text!r} is below the minimum of {minimum} bytes")
        return value

    return parse


_BINARY_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]


def format_bytes(n: int, places: int = 2) -> str:
    """``1536`` -> ``"1.50 KiB"`` (``places`` decimals); exact counts below 1 KiB (``"512 B"``)."""
    if n < 1024:
        return f"{n} B"
    unit, suffix = filesize.pick_unit_and_suffix(n, _BINARY_UNITS, 1024)
    return f"{n / unit:.{places}f} {suffix}"


def byte_count(n: int) -> str:
    """``n`` bytes, exactly, in words: "1 byte", "4096 bytes"."""
    return f"{n} byte" if n == 1 else f"{n} bytes"


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
