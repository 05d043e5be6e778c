"""Summaries of repeated measurements: median with min and max, percentiles."""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

import numpy as np

__all__ = ["spread", "rated", "percentile", "GB", "threads_text"]

GB = 1e9  # figures are decimal GB/s, as disk and PCIe rates are quoted


def spread(values: Iterable[float], digits: int = 4) -> dict:
    """``{"median", "min", "max"}`` of ``values`` (rounded to ``digits`` significant digits)."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("spread() needs at least one value")
    return {
        "median": _round(statistics.median(data), digits),
        "min": _round(min(data), digits),
        "max": _round(max(data), digits),
    }


def rated(nbytes: int, seconds: Iterable[float]) -> tuple[list[float], dict]:
    """Runs' seconds, to the nanosecond, and the GB/s of ``nbytes`` in each (a
    ``spread``) computed from those same rounded figures, so that a document's
    seconds and rates agree with each other."""
    rounded = [round(s, 9) for s in seconds]
    return rounded, spread(nbytes / s / GB for s in rounded)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, by linear interpolation (numpy's default)."""
    if len(values) == 0:
        raise ValueError("percentile() needs at least one value")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    return float(np.percentile(values, q))


def _round(value: float, digits: int) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))


def threads_text(count: int) -> str:
    """ "1 thread", "4 threads"."""
    return f"{count} thread" if count == 1 else f"{count} threads"
